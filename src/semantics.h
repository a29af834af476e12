// What a query row sees and how its scores and results are finished: the
// definitions every engine shares (reference, Helium and the SIMD pipeline,
// src/pipeline/flash-inl.h), so that a new mask or score variant is defined
// once here and the engines differ only in how they compute it.
//
//   score  s_j = epilogue(a(q, k_j))  (the score kind's factor, then
//                                      softcap, bias, ALiBi; a -inf bias
//                                      hides the key)
//   keys   row (b, h, i) at position QueryPos sees keys j in [lo, hi)
//          (RowKeys: causal, window, valid lengths, kv_start), the bias may
//          hide more inside that interval
//   finish m = max_j s_j, l = sum_j exp(s_j - m), then the head's sink:
//          out = sum_j exp(s_j - m) v_j * scale, lse = m' + log(l')
//          (FinishRow); a row with no visible key gets out 0, weights 0 and
//          lse -inf, or its sink.
//
// ISA safety: this header is compiled into objects built for different
// instruction sets (the per-target SIMD engines). Everything here has
// internal linkage (an unnamed namespace), so no copy compiled with, say,
// AVX-512 flags can be the one the linker picks for code that runs on an
// AVX2 machine. tests/check_single_definition.sh checks libqkv.a for that.
#ifndef QKV_SRC_SEMANTICS_H_
#define QKV_SRC_SEMANTICS_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "engine.h"

namespace qkv {
namespace {  // NOLINT(build/namespaces): internal linkage, see above

// The keys a row may see before bias: [lo, hi), 0 <= lo <= hi <= kv_len;
// a row that sees nothing has lo = hi = 0.
struct KeyInterval {
  int64_t lo, hi;
};

// Where rows live (the boundary fills the strides for dense calls too):
// query i of (batch b, head h), its output row, and the first key and value
// row of (batch b, kv head kvh), whose row j is j * k_st (v_st) further.
inline const float* QueryRow(const Problem& p, int64_t b, int64_t h,
                             int64_t i) {
  return p.q + b * p.q_sb + h * p.q_sh + i * p.q_st;
}

inline float* OutRow(const Problem& p, int64_t b, int64_t h, int64_t i) {
  return p.out + b * p.out_sb + h * p.out_sh + i * p.out_st;
}

// F32 caches only (kv_dtype QKV_DTYPE_F32); KeySource/ValueSource read
// every type.
inline const float* KeysOf(const Problem& p, int64_t b, int64_t kvh) {
  return static_cast<const float*>(p.k) + b * p.k_sb + kvh * p.k_sh;
}

inline const float* ValuesOf(const Problem& p, int64_t b, int64_t kvh) {
  return static_cast<const float*>(p.v) + b * p.v_sb + kvh * p.v_sh;
}

// ------------------------------------------------ low-precision K and V
// Bytes of one element of kv_dtype.
inline int64_t KvElementBytes(qkv_dtype t) {
  return t == QKV_DTYPE_F32 ? 4 : (t == QKV_DTYPE_I8 ? 1 : 2);
}

// IEEE binary16 to f32, exactly (subnormals, infinities and NaN included),
// without subnormal f32 arithmetic (which ARMv7 NEON flushes to zero):
// a normal half's 15 magnitude bits shifted into f32's place with the
// exponent bias moved from 15 to 127; a subnormal half m * 2^-24 by an
// integer conversion (m < 1024: exact); exponent 31 (inf, NaN) becomes 255.
inline float F16ToF32(uint16_t h) {
  const uint32_t exp = h & 0x7c00u;
  const uint32_t mag = static_cast<uint32_t>(h & 0x7fffu) << 13;
  uint32_t bits;
  if (exp == 0) {
    const float f = static_cast<float>(h & 0x3ffu) * 5.9604644775390625e-8f;
    memcpy(&bits, &f, 4);  // 2^-24 above
  } else if (exp == 0x7c00u) {
    bits = mag | 0x7f800000u;
  } else {
    bits = mag + (112u << 23);
  }
  bits |= static_cast<uint32_t>(h & 0x8000u) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// bfloat16 to f32: the upper half of the f32's bits, exactly.
inline float BF16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

// The rows of one (batch, kv head) of K or V as stored: row j at
// base + j * row_bytes, its I8 scale at scales[j * scale_st] (scales NULL
// for the other types).
struct KvSource {
  const unsigned char* base;
  int64_t row_bytes;
  qkv_dtype dtype;
  const float* scales;
  int64_t scale_st;
};

// The source of one operand: base and strides in elements of it and of its
// scales (scales NULL for the types without).
inline KvSource SourceOf(const void* base, const float* scales, qkv_dtype t,
                         int64_t sb, int64_t sh, int64_t st, int64_t scale_sb,
                         int64_t scale_sh, int64_t scale_st, int64_t b,
                         int64_t kvh) {
  const int64_t e = KvElementBytes(t);
  KvSource s;
  s.base = static_cast<const unsigned char*>(base) + (b * sb + kvh * sh) * e;
  s.row_bytes = st * e;
  s.dtype = t;
  s.scales =
      scales != nullptr ? scales + b * scale_sb + kvh * scale_sh : nullptr;
  s.scale_st = scale_st;
  return s;
}

inline KvSource KeySource(const Problem& p, int64_t b, int64_t kvh) {
  return SourceOf(p.k, p.k_scales, p.kv_dtype, p.k_sb, p.k_sh, p.k_st,
                  p.ksc_sb, p.ksc_sh, p.ksc_st, b, kvh);
}

inline KvSource ValueSource(const Problem& p, int64_t b, int64_t kvh) {
  return SourceOf(p.v, p.v_scales, p.kv_dtype, p.v_sb, p.v_sh, p.v_st,
                  p.vsc_sb, p.vsc_sh, p.vsc_st, b, kvh);
}

// The one address of a K/V row and of its scale: every engine reads row j
// of a source at KvRowAt(s, j) and its I8 scale at KvScalesAt(s, j)[0]; rows
// [j, j + n) of a block are row_bytes apart (scales scale_st apart).
inline const unsigned char* KvRowAt(const KvSource& s, int64_t j) {
  return s.base + j * s.row_bytes;
}

// Row j of an f32 source, as floats.
inline const float* F32RowAt(const KvSource& s, int64_t j) {
  return reinterpret_cast<const float*>(KvRowAt(s, j));
}

inline const float* KvScalesAt(const KvSource& s, int64_t j) {
  return s.scales + j * s.scale_st;
}

// Row j's I8 scale (1 for the other types).
inline float RowScale(const KvSource& s, int64_t j) {
  return s.dtype == QKV_DTYPE_I8 ? KvScalesAt(s, j)[0] : 1.0f;
}

// Element c of row j, dequantized: F32 as stored, F16 and BF16 widened
// exactly, I8 scale * q (one f32 rounding).
inline float KvElement(const KvSource& s, int64_t j, int64_t c) {
  const unsigned char* row = KvRowAt(s, j);
  switch (s.dtype) {
    case QKV_DTYPE_F16: {
      uint16_t h;
      memcpy(&h, row + 2 * c, 2);
      return F16ToF32(h);
    }
    case QKV_DTYPE_BF16: {
      uint16_t h;
      memcpy(&h, row + 2 * c, 2);
      return BF16ToF32(h);
    }
    case QKV_DTYPE_I8:
      return KvScalesAt(s, j)[0] *
             static_cast<float>(reinterpret_cast<const int8_t*>(row)[c]);
    default: {
      float f;
      memcpy(&f, row + 4 * c, 4);
      return f;
    }
  }
}

// Row j dequantized into dst[0, n): the scalar engines' K/V block source
// (the SIMD pipeline converts vector-wise, src/pipeline/flash-inl.h).
inline void DequantizeRow(const KvSource& s, int64_t j, int64_t n,
                          float* dst) {
  for (int64_t c = 0; c < n; ++c) dst[c] = KvElement(s, j, c);
}

// The position of query i of batch b: q_pos[b] + i, or i + kv_len - q_len
// (the last query is at the last key). Causal, window and ALiBi use it.
inline int64_t QueryPos(const Problem& p, int64_t b, int64_t i) {
  return p.q_pos != nullptr ? int64_t{p.q_pos[b]} + i
                            : i + p.kv_len - p.q_len;
}

// Row i of batch b (any query head: the masks do not depend on it), at
// position pos = QueryPos(p, b, i): causal keeps keys j <= pos, the window
// pos - left <= j <= pos + right, valid lengths cut the suffix from the
// valid length, kv_start the prefix before it. The boundary bounds the
// window sides (|side| < 2^40), so nothing here overflows.
inline KeyInterval RowKeys(const Problem& p, int64_t b, int64_t i) {
  int64_t lo = 0, hi = p.kv_len;
  if (p.causal || p.window) {
    const int64_t pos = QueryPos(p, b, i);
    if (p.causal && pos + 1 < hi) hi = pos + 1;
    if (p.window) {
      if (p.window_left >= 0 && pos - p.window_left > lo) {
        lo = pos - p.window_left;
      }
      if (p.window_right >= 0 && pos + p.window_right + 1 < hi) {
        hi = pos + p.window_right + 1;
      }
    }
  }
  if (p.valid_lens != nullptr) {
    const int64_t vl =
        p.valid_lens[p.valid_lens_per_query ? b * p.q_len + i : b];
    hi = vl < hi ? vl : hi;
  }
  if (p.kv_start != nullptr && p.kv_start[b] > lo) lo = p.kv_start[b];
  KeyInterval k;
  if (lo >= hi) {
    k.lo = k.hi = 0;
  } else {
    k.lo = lo;
    k.hi = hi;
  }
  return k;
}

// True when every row of every batch sees the same keys (RowKeys does not
// depend on the row): then RowKeys(p, 0, 0) serves them all. Keep in step
// with RowKeys when a mask is added.
inline bool RowsShareKeys(const Problem& p) {
  return !p.causal && !p.window && p.valid_lens == nullptr &&
         p.kv_start == nullptr;
}

// Bias row for (batch b, query head h, query i), or NULL without a bias.
inline const float* BiasRow(const Problem& p, int64_t b, int64_t h, int64_t i) {
  if (p.bias == nullptr) return nullptr;
  return p.bias + b * p.bias_batch_stride + h * p.bias_head_stride +
         i * p.kv_len;
}

// The factor the score kind applies to its raw sum: scale for DOT, -scale
// for GAUSSIAN (s = -scale * |q - k|^2), 1 for ADDITIVE.
inline float ScoreFactor(const Problem& p) {
  if (p.score == QKV_SCORE_GAUSSIAN) return -p.scale;
  if (p.score == QKV_SCORE_ADDITIVE) return 1.0f;
  return p.scale;
}

// The score epilogue, in this order, for key j of a row of head h at
// position pos:
//   softcap  s = c * tanh(s / c) when c = p.softcap > 0 (Gemma 2)
//   bias     s = s + bias, or -inf when the bias is -inf (WithBias)
//   ALiBi    s = s - slope_h * |pos - j|
//   masks    -inf outside the row's KeyInterval
// SIMD paths compute the same terms vector-wise (tanh to a few ulp).
inline float Softcap(float s, float cap) { return cap * tanhf(s / cap); }

// A score plus its bias: a -inf bias hides the key whatever the score (even
// NaN from a key with NaN in it).
inline float WithBias(float s, float bias) {
  return bias == -INFINITY ? -INFINITY : s + bias;
}

// ALiBi's slope for query head h (0 without ALiBi) and its distance term.
inline float AlibiSlope(const Problem& p, int64_t h) {
  return p.alibi_slopes != nullptr ? p.alibi_slopes[h] : 0.0f;
}

inline float WithAlibi(float s, float slope, int64_t pos, int64_t j) {
  const int64_t dist = pos > j ? pos - j : j - pos;
  return s - slope * static_cast<float>(dist);
}

// The sink logit of head h, or -inf (none).
inline float RowSink(const Problem& p, int64_t h) {
  return p.sinks != nullptr ? p.sinks[h] : -INFINITY;
}

// How a row's results follow from its running max m and sum l over the
// visible keys (l = sum_j exp(s_j - m)) and the head's sink:
//   m' = max(m, sink), l' = l exp(m - m') + exp(sink - m')
//   out = (sum_j exp(s_j - m) v_j) * scale, scale = exp(m - m') / l'
//   weights_j = exp(s_j - m') * inv_l, inv_l = 1 / l'
//   lse = m' + log(l')
// Without a sink (-inf) m' = m, l' = l and scale = inv_l = 1 / l. A row
// with no visible key (l = 0) gets out 0, weights 0 and lse -inf, or the
// sink.
struct RowFinish {
  bool seen;    // l' > 0: a visible key or a sink
  float m, l;   // m', l'
  float scale;  // applied to the unnormalized output
  float inv_l;  // applied to exp(s_j - m') for the weights
};

inline RowFinish FinishRow(float m, float l, float sink) {
  RowFinish f;
  if (sink == -INFINITY) {
    f.seen = l > 0.0f;
    f.m = m;
    f.l = l;
    f.inv_l = f.seen ? 1.0f / l : 0.0f;
    f.scale = f.inv_l;
    return f;
  }
  const float m2 = m > sink ? m : sink;
  const float a = l > 0.0f ? expf(m - m2) : 0.0f;
  f.seen = true;
  f.m = m2;
  f.l = l * a + expf(sink - m2);
  f.inv_l = 1.0f / f.l;
  f.scale = a * f.inv_l;
  return f;
}

// The row's log-sum-exp from FinishRow's m' and l': m' + log(l'), or -inf
// when it saw no key and has no sink. Computed only when the caller asked
// for lse (a logf per row).
inline float RowLse(const RowFinish& f) {
  return f.l > 0.0f ? f.m + logf(f.l) : -INFINITY;
}

}  // namespace
}  // namespace qkv

#endif  // QKV_SRC_SEMANTICS_H_
