// The pipeline (Flash<O>, src/pipeline/flash-inl.h): building blocks for tests:
// exp, tanh, transposes, lane sums, the epilogue and the finisher on one block
// (PipelineBlocks, src/engine.h). Included by flash-inl.h inside its per-target
// namespace, after the struct.

template <class O>
inline void Flash<O>::BlockExp(const float* x, float* y, size_t n) {
  const size_t N = O::Lanes();
  alignas(64) float tail[kMaxLanes];
  size_t i = 0;
  for (; i + N <= n; i += N) {
    O::StoreU(ExpNonPositive(O::LoadU(x + i)), y + i);
  }
  if (i < n) {
    for (size_t u = 0; u < N; ++u) tail[u] = i + u < n ? x[i + u] : 0.0f;
    O::Store(ExpNonPositive(O::Load(tail)), tail);
    for (size_t u = 0; i + u < n; ++u) y[i + u] = tail[u];
  }
}

template <class O>
inline void Flash<O>::BlockTanh(const float* x, float* y, size_t n) {
  const size_t N = O::Lanes();
  alignas(64) float tail[kMaxLanes];
  size_t i = 0;
  for (; i + N <= n; i += N) O::StoreU(SoftcapTanh(O::LoadU(x + i)), y + i);
  if (i < n) {
    for (size_t u = 0; u < N; ++u) tail[u] = i + u < n ? x[i + u] : 0.0f;
    O::Store(SoftcapTanh(O::Load(tail)), tail);
    for (size_t u = 0; i + u < n; ++u) y[i + u] = tail[u];
  }
}

template <class O>
inline void Flash<O>::BlockTranspose(float* m) {
  if constexpr (O::kTransposeLanes != 0) {
    constexpr size_t kN = O::kTransposeLanes;
    V blk[kN];
    for (size_t i = 0; i < kN; ++i) blk[i] = O::LoadU(m + i * kN);
    O::Transpose(blk);
    for (size_t i = 0; i < kN; ++i) O::StoreU(blk[i], m + i * kN);
  } else {
    (void)m;
  }
}

template <class O>
inline void Flash<O>::BlockSumLanes(const float* m, float* sums) {
  if constexpr (O::kTransposeLanes != 0) {
    constexpr size_t kN = O::kTransposeLanes;
    V blk[kN];
    for (size_t i = 0; i < kN; ++i) blk[i] = O::LoadU(m + i * kN);
    O::StoreU(O::SumLanes(blk), sums);
  } else {
    (void)m, (void)sums;
  }
}

template <class O>
inline void Flash<O>::BlockSumLanes4(const float* m, float* sums,
                                     float* reduced) {
  const size_t N = O::Lanes();
  const V a = O::LoadU(m), b = O::LoadU(m + N), c = O::LoadU(m + 2 * N),
          d = O::LoadU(m + 3 * N);
  O::SumLanes4(a, b, c, d, sums);
  reduced[0] = O::ReduceSum(a);
  reduced[1] = O::ReduceSum(b);
  reduced[2] = O::ReduceSum(c);
  reduced[3] = O::ReduceSum(d);
}

template <class O>
inline void Flash<O>::BlockEpilogue(const int32_t* lo, const int32_t* hi,
                                    const float* const* bias, int64_t rows,
                                    int rv, int64_t kv_len, int64_t j0,
                                    int64_t nb, float* st) {
  alignas(64) int32_t lo_buf[2 * kMaxLanes], hi_buf[2 * kMaxLanes];
  alignas(64) float rel_lo[2 * kMaxLanes] = {}, rel_hi[2 * kMaxLanes] = {};
  const float* bias_buf[2 * kMaxLanes];
  const size_t R = static_cast<size_t>(rv) * O::Lanes();
  RowsSpan span;
  span.begin = kv_len;
  span.end = 0;
  span.full_begin = 0;
  span.full_end = kv_len;
  bool any_bias = false;
  for (size_t r = 0; r < R; ++r) {
    const bool real = static_cast<int64_t>(r) < rows;
    lo_buf[r] = real ? lo[r] : 0;
    hi_buf[r] = real ? hi[r] : 0;
    bias_buf[r] = real ? bias[r] : nullptr;
    any_bias = any_bias || bias_buf[r] != nullptr;
    if (real) span.Add(KeyInterval{lo[r], hi[r]});
  }
  Tile tile = {};
  tile.lo = lo_buf;
  tile.hi = hi_buf;
  tile.rel_lo = rel_lo;
  tile.rel_hi = rel_hi;
  tile.bias = bias_buf;
  const bool masks = span.Masks(j0, nb);
  EpilogueTerms terms;
  terms.softcap = 0.0f;
  terms.bias = any_bias;
  terms.alibi = false;
  if (rv == 1) {
    Epilogue<1>(tile, rows, R, j0, nb, terms, masks, st);
  } else {
    Epilogue<2>(tile, rows, R, j0, nb, terms, masks, st);
  }
}

template <class O>
inline void Flash<O>::BlockFinishRow(const Problem& p, int64_t row, float m,
                                     float l, const float* o, size_t stride,
                                     int64_t c_begin, int64_t w_lo,
                                     int64_t w_hi) {
  alignas(64) float tail[kMaxLanes];
  RowState s;
  s.row = row;
  s.out = p.out + row * p.value_dim;  // the tests' dense layout
  s.m = m;
  s.l = l;
  s.sink = -INFINITY;
  s.o = o;
  s.o_stride = stride;
  s.c_begin = c_begin;
  s.w_lo = w_lo;
  s.w_hi = w_hi;
  FinishRow(p, s, tail);
}

template <class O>
inline size_t Flash<O>::LanesOf() { return O::Lanes(); }
