// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the row finisher: out = o
// / l, lse = m + log(l) and the weights normalized from their raw scores, for
// every path. Included by flash-inl.h inside its per-target namespace, after
// the struct.

// w[j] = exp(w[j] - m) * inv_l for j < n, in place (raw scores to
// weights).
template <class O>
inline void Flash<O>::NormalizeWeights(float* __restrict w, int64_t n, float m,
                                       float inv_l, float* __restrict tail) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const V vm = O::Set(m), vs = O::Set(inv_l);
  int64_t j = 0;
  for (; j + N <= n; j += N) {
    O::StoreU(O::Mul(ExpNonPositive(O::Sub(O::LoadU(w + j), vm)), vs),
              w + j);
  }
  if (j < n) {  // never touch memory past the row: go through a scratch
    const size_t rest = static_cast<size_t>(n - j);
    for (int64_t u = 0; u < N; ++u) tail[u] = -INFINITY;
    memcpy(tail, w + j, rest * sizeof(float));
    O::Store(O::Mul(ExpNonPositive(O::Sub(O::Load(tail), vm)), vs), tail);
    memcpy(w + j, tail, rest * sizeof(float));
  }
}

// Row r's indices, running max and sum, and sink, from a tile.
template <class O>
inline typename Flash<O>::RowState Flash<O>::RowStateOf(const Tile& tile,
                                                        int64_t r) {
  RowState s;
  s.row = tile.row[r];
  s.out = tile.out[r];
  s.m = tile.m[r];
  s.l = tile.sum[r];
  s.sink = tile.sink[r];
  return s;
}

// Writes the row's out, lse and weights (the latter two when asked), by
// semantics.h's FinishRow: a row that saw no key gets zeros, and -inf or
// its sink.
template <class O>
inline void Flash<O>::FinishRow(const Problem& p, const RowState& s,
                                float* tail) {
  const RowFinish f = qkv::FinishRow(s.m, s.l, s.sink);
  const int64_t dv = p.value_dim, lk = p.kv_len;
  float* out = s.out;
  if (!(s.l > 0.0f)) {
    for (int64_t c = 0; c < dv; ++c) out[c] = 0.0f;
  } else if (s.o != nullptr) {
    const int64_t N = static_cast<int64_t>(O::Lanes());
    const V scale = O::Set(f.scale);
    int64_t c = s.c_begin;
    if (s.o_stride == 1) {
      for (; c + N <= dv; c += N) {
        O::StoreU(O::Mul(O::LoadU(s.o + c), scale), out + c);
      }
    } else if constexpr (O::kGatherTiles) {
      const int32_t stride = static_cast<int32_t>(s.o_stride);
      for (; c + N <= dv; c += N) {
        O::StoreU(O::Mul(O::GatherStrided(s.o + c * s.o_stride, stride),
                         scale),
                  out + c);
      }
    }
    for (; c < dv; ++c) out[c] = s.o[c * s.o_stride] * f.scale;
  }
  if (p.lse != nullptr) p.lse[s.row] = RowLse(f);
  if (p.weights != nullptr) {
    float* w = p.weights + s.row * lk;
    for (int64_t j = 0; j < s.w_lo; ++j) w[j] = 0.0f;
    if (s.l > 0.0f) {
      NormalizeWeights(w + s.w_lo, s.w_hi - s.w_lo, f.m, f.inv_l, tail);
    } else {
      for (int64_t j = s.w_lo; j < s.w_hi; ++j) w[j] = 0.0f;
    }
    for (int64_t j = s.w_hi; j < lk; ++j) w[j] = 0.0f;
  }
}

// The tile's rows: whole N x N blocks of (columns, rows) of the
// transposed output by in-register transposes where the ops have them,
// then the finisher for the rest of each row.
template <class O>
template <int RV>
inline void Flash<O>::FinishTile(const Problem& p, const Tile& tile,
                                 int64_t rows, size_t R, const RowsSpan& span) {
  const int64_t dv = p.value_dim;
  int64_t c_done = 0;
  if constexpr (O::kTransposeLanes != 0) {
    constexpr size_t kN = O::kTransposeLanes;
    for (int64_t r = 0; r < rows; ++r) {
      tile.inv_l[r] = qkv::FinishRow(tile.m[r], tile.sum[r], tile.sink[r])
                          .scale;
    }
    V blk[kN];
    for (; c_done + static_cast<int64_t>(kN) <= dv; c_done += kN) {
      for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
        if (static_cast<int64_t>(h * kN) >= rows) break;
        for (size_t i = 0; i < kN; ++i) {
          blk[i] = O::Load(tile.ot + (c_done + i) * R + h * kN);
        }
        O::Transpose(blk);
        for (size_t i = 0; i < kN; ++i) {
          const int64_t r = static_cast<int64_t>(h * kN + i);
          if (r >= rows) break;
          O::StoreU(O::Mul(blk[i], O::Set(tile.inv_l[r])),
                    tile.out[r] + c_done);
        }
      }
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    RowState s = RowStateOf(tile, r);
    s.o = tile.ot + r;
    s.o_stride = R;
    s.c_begin = c_done;
    s.w_lo = span.begin;
    s.w_hi = span.end;
    FinishRow(p, s, tile.tail);
  }
}
