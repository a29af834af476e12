#include "oracle.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>

namespace qkv_test {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Whether query row i of (b, h) sees key j under the causal and valid-length
// masks (the bias is handled by the caller because it also adds to s).
bool StructurallyVisible(const qkv_attention_desc& d, int64_t b, int64_t i,
                         int64_t j) {
  if ((d.mask & QKV_MASK_CAUSAL) != 0) {
    // Bottom-right aligned: the last query row sees every key.
    if (j > i + d.kv_len - d.q_len) return false;
  }
  if ((d.mask & QKV_MASK_VALID_LENS) != 0) {
    const int64_t len = d.valid_lens_per_query != 0
                            ? d.valid_lens[b * d.q_len + i]
                            : d.valid_lens[b];
    if (j >= len) return false;
  }
  return true;
}

}  // namespace

OracleOutput OracleAttention(const qkv_attention_desc& d, const float* q,
                             const float* k, const float* v) {
  const int64_t batch = d.batch, q_heads = d.q_heads, kv_heads = d.kv_heads;
  const int64_t q_len = d.q_len, kv_len = d.kv_len;
  const int64_t head_dim = d.head_dim, value_dim = d.value_dim;
  const int64_t group = q_heads / kv_heads;
  const int64_t hidden =
      d.score == QKV_SCORE_ADDITIVE ? d.additive_hidden : int64_t{0};

  OracleOutput r;
  const size_t rows = static_cast<size_t>(batch * q_heads * q_len);
  r.out.assign(rows * static_cast<size_t>(value_dim), 0.0);
  r.weights.assign(rows * static_cast<size_t>(kv_len), 0.0);
  r.lse.assign(rows, kNegInf);
  r.visible.assign(rows * static_cast<size_t>(kv_len), 0);

  // ADDITIVE: W_k k for every key, once.
  std::vector<double> k_proj;
  if (hidden > 0) {
    k_proj.resize(static_cast<size_t>(batch * kv_heads * kv_len * hidden));
    for (int64_t row = 0; row < batch * kv_heads * kv_len; ++row) {
      const float* kr = k + row * head_dim;
      for (int64_t u = 0; u < hidden; ++u) {
        double acc = 0.0;
        for (int64_t c = 0; c < head_dim; ++c) {
          acc += static_cast<double>(d.additive_w_k[u * head_dim + c]) * kr[c];
        }
        k_proj[static_cast<size_t>(row * hidden + u)] = acc;
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
      const float* k_head = k + (b * kv_heads + kvh) * kv_len * head_dim;
      const float* v_head = v + (b * kv_heads + kvh) * kv_len * value_dim;
      for (int64_t i = 0; i < q_len; ++i) {
        const int64_t row = (b * q_heads + h) * q_len + i;
        const float* qr = q + row * head_dim;
        for (int64_t u = 0; u < hidden; ++u) {
          double acc = 0.0;
          for (int64_t c = 0; c < head_dim; ++c) {
            acc +=
                static_cast<double>(d.additive_w_q[u * head_dim + c]) * qr[c];
          }
          q_proj[static_cast<size_t>(u)] = acc;
        }

        double max_score = kNegInf;
        bool any = false;
        for (int64_t j = 0; j < kv_len; ++j) {
          vis[static_cast<size_t>(j)] = 0;
          if (!StructurallyVisible(d, b, i, j)) continue;
          double bias = 0.0;
          if ((d.mask & QKV_MASK_BIAS) != 0) {
            const float bv = d.bias[b * d.bias_batch_stride +
                                    h * d.bias_head_stride + i * kv_len + j];
            if (std::isinf(bv) && bv < 0) continue;  // -inf hides the key
            bias = bv;
          }
          const float* kr = k_head + j * head_dim;
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
          s += bias;
          scores[static_cast<size_t>(j)] = s;
          vis[static_cast<size_t>(j)] = 1;
          max_score = any ? std::max(max_score, s) : s;
          any = true;
        }
        if (!any) continue;  // zeros in out and weights, lse = -inf

        double sum = 0.0;
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
          const float* vr = v_head + j * value_dim;
          for (int64_t c = 0; c < value_dim; ++c) out_row[c] += p * vr[c];
        }
      }
    }
  }
  return r;
}

}  // namespace qkv_test
