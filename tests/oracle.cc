#include "oracle.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>

namespace qkv_test {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// `d` with the fields that lie past its struct_size at their defaults (the
// 0.2 fields are all zero by default; the sizes are always there).
qkv_attention_desc WithDefaults(const qkv_attention_desc& d) {
  qkv_attention_desc r = d;
  const size_t size = d.struct_size;
  if (size >= sizeof(qkv_attention_desc)) return r;
  qkv_attention_desc zero;
  std::memset(&zero, 0, sizeof zero);
  const size_t from = std::max(size, offsetof(qkv_attention_desc, kv_dtype));
  // Every 0.2 field starts at or after kv_dtype; the earlier ones are the
  // caller's business (the existing tests pass full descriptors).
  std::memcpy(reinterpret_cast<unsigned char*>(&r) + from,
              reinterpret_cast<const unsigned char*>(&zero) + from,
              sizeof r - from);
  return r;
}

bool IsDense(const qkv_strides& s) {
  return s.batch == 0 && s.head == 0 && s.token == 0;
}

// Whether query row i of batch b, at position pos, sees key j under the
// masks that do not depend on the score (the bias is handled by the caller
// because it also adds to s).
bool StructurallyVisible(const qkv_attention_desc& d, int64_t b, int64_t i,
                         int64_t pos, int64_t j) {
  if ((d.mask & QKV_MASK_CAUSAL) != 0) {
    if (j > pos) return false;
  }
  if ((d.mask & QKV_MASK_VALID_LENS) != 0) {
    const int64_t len = d.valid_lens_per_query != 0
                            ? d.valid_lens[b * d.q_len + i]
                            : d.valid_lens[b];
    if (j >= len) return false;
  }
  if ((d.mask & QKV_MASK_WINDOW) != 0) {
    // p - left <= j <= p + right, written as distances so that a huge side
    // cannot overflow (|pos| and |j| are below 2^33).
    if (d.window_left >= 0 && pos - j > d.window_left) return false;
    if (d.window_right >= 0 && j - pos > d.window_right) return false;
  }
  if ((d.mask & QKV_MASK_KV_START) != 0) {
    if (j < d.kv_start[b]) return false;
  }
  return true;
}

}  // namespace

int64_t OraclePosition(const qkv_attention_desc& desc, int64_t b, int64_t i) {
  const qkv_attention_desc d = WithDefaults(desc);
  return d.q_pos != nullptr ? int64_t{d.q_pos[b]} + i
                            : d.kv_len - d.q_len + i;
}

int64_t OracleOffset(const qkv_strides& s, int64_t n_heads, int64_t n_tokens,
                     int64_t dim, int64_t b, int64_t h, int64_t t) {
  if (IsDense(s)) return ((b * n_heads + h) * n_tokens + t) * dim;
  return b * s.batch + h * s.head + t * s.token;
}

OracleOutput OracleAttention(const qkv_attention_desc& desc, const float* q,
                             const float* k, const float* v) {
  const qkv_attention_desc d = WithDefaults(desc);
  const int64_t batch = d.batch, q_heads = d.q_heads, kv_heads = d.kv_heads;
  const int64_t q_len = d.q_len, kv_len = d.kv_len;
  const int64_t head_dim = d.head_dim, value_dim = d.value_dim;
  const int64_t group = q_heads / kv_heads;
  const int64_t hidden =
      d.score == QKV_SCORE_ADDITIVE ? d.additive_hidden : int64_t{0};
  const double softcap = static_cast<double>(d.softcap);

  OracleOutput r;
  const size_t rows = static_cast<size_t>(batch * q_heads * q_len);
  r.out.assign(rows * static_cast<size_t>(value_dim), 0.0);
  r.weights.assign(rows * static_cast<size_t>(kv_len), 0.0);
  r.lse.assign(rows, kNegInf);
  r.visible.assign(rows * static_cast<size_t>(kv_len), 0);

  auto q_row = [&](int64_t b, int64_t h, int64_t i) {
    return q + OracleOffset(d.q_strides, q_heads, q_len, head_dim, b, h, i);
  };
  auto k_row = [&](int64_t b, int64_t kvh, int64_t j) {
    return k + OracleOffset(d.k_strides, kv_heads, kv_len, head_dim, b, kvh, j);
  };
  auto v_row = [&](int64_t b, int64_t kvh, int64_t j) {
    return v +
           OracleOffset(d.v_strides, kv_heads, kv_len, value_dim, b, kvh, j);
  };

  // ADDITIVE: W_k k for every key, once.
  std::vector<double> k_proj;
  if (hidden > 0) {
    k_proj.resize(static_cast<size_t>(batch * kv_heads * kv_len * hidden));
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t kvh = 0; kvh < kv_heads; ++kvh) {
        for (int64_t j = 0; j < kv_len; ++j) {
          const float* kr = k_row(b, kvh, j);
          const int64_t row = (b * kv_heads + kvh) * kv_len + j;
          for (int64_t u = 0; u < hidden; ++u) {
            double acc = 0.0;
            for (int64_t c = 0; c < head_dim; ++c) {
              acc +=
                  static_cast<double>(d.additive_w_k[u * head_dim + c]) * kr[c];
            }
            k_proj[static_cast<size_t>(row * hidden + u)] = acc;
          }
        }
      }
    }
  }

  std::vector<double> scores(static_cast<size_t>(kv_len));
  std::vector<uint8_t> vis(static_cast<size_t>(kv_len));
  std::vector<double> q_proj(static_cast<size_t>(hidden));
  const double scale = static_cast<double>(d.scale);

  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t h = 0; h < q_heads; ++h) {
      const int64_t kvh = h / group;
      const double slope =
          d.alibi_slopes != nullptr ? static_cast<double>(d.alibi_slopes[h])
                                    : 0.0;
      const double sink =
          d.sinks != nullptr ? static_cast<double>(d.sinks[h]) : kNegInf;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t row = (b * q_heads + h) * q_len + i;
        const int64_t pos = d.q_pos != nullptr ? int64_t{d.q_pos[b]} + i
                                               : kv_len - q_len + i;
        const float* qr = q_row(b, h, i);
        for (int64_t u = 0; u < hidden; ++u) {
          double acc = 0.0;
          for (int64_t c = 0; c < head_dim; ++c) {
            acc +=
                static_cast<double>(d.additive_w_q[u * head_dim + c]) * qr[c];
          }
          q_proj[static_cast<size_t>(u)] = acc;
        }

        // The sink takes part in the max like a key that carries no value.
        double max_score = sink;
        bool any = false;
        for (int64_t j = 0; j < kv_len; ++j) {
          vis[static_cast<size_t>(j)] = 0;
          if (!StructurallyVisible(d, b, i, pos, j)) continue;
          double bias = 0.0;
          if ((d.mask & QKV_MASK_BIAS) != 0) {
            const float bv = d.bias[b * d.bias_batch_stride +
                                    h * d.bias_head_stride + i * kv_len + j];
            if (std::isinf(bv) && bv < 0) continue;  // -inf hides the key
            bias = bv;
          }
          const float* kr = k_row(b, kvh, j);
          double s = 0.0;
          switch (d.score) {
            case QKV_SCORE_DOT: {
              double dot = 0.0;
              for (int64_t c = 0; c < head_dim; ++c) {
                dot += static_cast<double>(qr[c]) * kr[c];
              }
              s = scale * dot;
              break;
            }
            case QKV_SCORE_GAUSSIAN: {
              double dist2 = 0.0;
              for (int64_t c = 0; c < head_dim; ++c) {
                const double diff = static_cast<double>(qr[c]) - kr[c];
                dist2 += diff * diff;
              }
              s = -scale * dist2;
              break;
            }
            case QKV_SCORE_ADDITIVE: {
              const double* kp =
                  k_proj.data() + ((b * kv_heads + kvh) * kv_len + j) * hidden;
              for (int64_t u = 0; u < hidden; ++u) {
                s += static_cast<double>(d.additive_w_v[u]) *
                     std::tanh(q_proj[static_cast<size_t>(u)] + kp[u]);
              }
              break;
            }
          }
          if (softcap > 0.0) s = softcap * std::tanh(s / softcap);
          s += bias;
          if (d.alibi_slopes != nullptr) {
            s -= slope * static_cast<double>(pos > j ? pos - j : j - pos);
          }
          scores[static_cast<size_t>(j)] = s;
          vis[static_cast<size_t>(j)] = 1;
          max_score = std::max(max_score, s);
          any = true;
        }
        if (!any) {  // zeros in out and weights, lse = the sink or -inf
          r.lse[static_cast<size_t>(row)] = sink;
          continue;
        }

        double sum = sink == kNegInf ? 0.0 : std::exp(sink - max_score);
        for (int64_t j = 0; j < kv_len; ++j) {
          if (vis[static_cast<size_t>(j)] == 0) continue;
          const double e = std::exp(scores[static_cast<size_t>(j)] - max_score);
          scores[static_cast<size_t>(j)] = e;
          sum += e;
        }
        r.lse[static_cast<size_t>(row)] = max_score + std::log(sum);
        double* out_row = r.out.data() + row * value_dim;
        double* w_row = r.weights.data() + row * kv_len;
        uint8_t* vis_row = r.visible.data() + row * kv_len;
        for (int64_t j = 0; j < kv_len; ++j) {
          if (vis[static_cast<size_t>(j)] == 0) continue;
          const double p = scores[static_cast<size_t>(j)] / sum;
          w_row[j] = p;
          vis_row[j] = 1;
          const float* vr = v_row(b, kvh, j);
          for (int64_t c = 0; c < value_dim; ++c) out_row[c] += p * vr[c];
        }
      }
    }
  }
  return r;
}

}  // namespace qkv_test
