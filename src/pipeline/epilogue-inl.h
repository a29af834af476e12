// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the block epilogue: bias,
// softcap, ALiBi and the rows' key intervals on a block of scores. Included by
// flash-inl.h inside its per-target namespace, after the struct.

// The block's epilogue, in semantics.h's order and only where needed:
// softcap, each row's bias, ALiBi, then the rows' key intervals (keys
// outside [lo, hi) become -inf). `masks`: some row's interval cuts this
// block (RowsSpan::Masks).
template <class O>
template <int RV>
QKV_FLASH_INLINE void Flash<O>::Epilogue(const Tile& tile, int64_t rows,
                                         size_t R, int64_t j0, int64_t nb,
                                         const EpilogueTerms& terms, bool masks,
                                         float* st) {
  const size_t N = O::Lanes();
  if (terms.softcap > 0.0f) {
    const V cap = O::Set(terms.softcap);
    const V inv_cap = O::Set(InvCap(terms.softcap));
    for (int64_t j = 0; j < nb; ++j) {
      float* s = st + j * R;
      O::Store(Softcapped(O::Load(s), cap, inv_cap), s);
      if (RV > 1) O::Store(Softcapped(O::Load(s + N), cap, inv_cap), s + N);
    }
  }
  if (terms.bias) {
    for (int64_t r = 0; r < rows; ++r) {
      if (tile.bias[r] != nullptr) AddBias(tile.bias[r], j0, nb, R, st + r);
    }
  }
  if (terms.alibi) {  // s -= slope * |pos - j|, pos - j0 per lane
    RelativePositions(tile, R, j0);
    const V pos0 = O::Load(tile.rel_pos), ns0 = O::Load(tile.neg_slope);
    const V pos1 = RV > 1 ? O::Load(tile.rel_pos + N) : pos0;
    const V ns1 = RV > 1 ? O::Load(tile.neg_slope + N) : ns0;
    for (int64_t j = 0; j < nb; ++j) {
      const V key = O::Set(static_cast<float>(j));
      float* s = st + j * R;
      O::Store(O::MulAdd(ns0, Abs(O::Sub(pos0, key)), O::Load(s)), s);
      if (RV > 1) {
        O::Store(O::MulAdd(ns1, Abs(O::Sub(pos1, key)), O::Load(s + N)),
                 s + N);
      }
    }
  }
  if (!masks) return;
  RelativeIntervals(tile, R, j0);
  const V neg_inf = O::Set(-INFINITY);
  const V lo0 = O::Load(tile.rel_lo), hi0 = O::Load(tile.rel_hi);
  const V lo1 = RV > 1 ? O::Load(tile.rel_lo + N) : lo0;
  const V hi1 = RV > 1 ? O::Load(tile.rel_hi + N) : hi0;
  for (int64_t j = 0; j < nb; ++j) {
    const V key = O::Set(static_cast<float>(j));
    float* s = st + j * R;
    V s0 = O::IfThenElse(O::Lt(key, hi0), O::Load(s), neg_inf);
    O::Store(O::IfThenElse(O::Lt(key, lo0), neg_inf, s0), s);
    if (RV > 1) {
      V s1 = O::IfThenElse(O::Lt(key, hi1), O::Load(s + N), neg_inf);
      O::Store(O::IfThenElse(O::Lt(key, lo1), neg_inf, s1), s + N);
    }
  }
}

// The same epilogue for one row's scores st[0, nb) of keys [j0, j0 + nb)
// (row path: the keys are inside the row's interval, no mask).
template <class O>
inline void Flash<O>::RowEpilogue(const Problem& p, const Tile& tile, int64_t r,
                                  int64_t j0, int64_t nb, float* st) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const int64_t padded = (nb + N - 1) / N * N;  // st has the room
  if (p.softcap > 0.0f) {
    const V cap = O::Set(p.softcap), inv_cap = O::Set(InvCap(p.softcap));
    for (int64_t j = 0; j < padded; j += N) {
      O::Store(Softcapped(O::Load(st + j), cap, inv_cap), st + j);
    }
  }
  if (tile.bias[r] != nullptr) AddBias(tile.bias[r], j0, nb, 1, st);
  if (p.alibi_slopes != nullptr) {
    const V ns = O::Set(tile.neg_slope[r]);
    const V pos = O::Set(static_cast<float>(tile.pos[r] - j0));
    const V lane = O::Load(kLaneIndex);
    for (int64_t j = 0; j < padded; j += N) {
      const V key = O::Add(lane, O::Set(static_cast<float>(j)));
      O::Store(O::MulAdd(ns, Abs(O::Sub(pos, key)), O::Load(st + j)),
               st + j);
    }
  }
}

template <class O>
inline typename Flash<O>::EpilogueTerms Flash<O>::TermsOf(const Problem& p) {
  EpilogueTerms terms;
  terms.softcap = p.softcap;
  terms.bias = p.bias != nullptr;
  terms.alibi = p.alibi_slopes != nullptr;
  return terms;
}
