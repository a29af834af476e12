// The pipeline (Flash<O>, src/pipeline/flash-inl.h): tile kernels, softmax and
// output: the online softmax of a tile's block and o = o * alpha + p V with
// rows in lanes. Included by flash-inl.h inside its per-target namespace, after
// the struct.

// ot[c][*] = ot[c][*] * alpha + sum_{j < nb} pt[j][*] * v[j][c] for the U
// value columns starting at c = 0 of v and ot.
// kGuard: lanes whose probability is 0 (a hidden key) leave the output
// untouched, so a NaN or Inf in a value row that a query cannot see never
// reaches it (0 * NaN is NaN). Used only in blocks that hide some keys.
template <class O>
template <int RV, int U, bool kGuard>
__attribute__((noinline)) void Flash<O>::OutputColumns(
    const float* __restrict pt, const float* __restrict v, int64_t vs,
    int64_t nb, V alpha0, V alpha1, float* __restrict ot) {
  const size_t N = O::Lanes(), R = RV * N;  // constant where N is
  const V zero = O::Zero();
#define QKV_DECL(u)                                                  \
  V o##u##0 = O::Zero(), o##u##1 = O::Zero();                        \
  if (u < U) {                                                       \
    o##u##0 = O::Mul(O::Load(ot + u * R), alpha0);                   \
    if (RV > 1) o##u##1 = O::Mul(O::Load(ot + u * R + N), alpha1);   \
  }
  QKV_UNROLL8(QKV_DECL)
#undef QKV_DECL
  for (int64_t j = 0; j < nb; ++j) {
    const float* __restrict vj = v + j * vs;
    const V p0 = O::Load(pt + j * R);
    const V p1 = RV > 1 ? O::Load(pt + j * R + N) : p0;
    const auto read0 = O::Gt(p0, zero);
    const auto read1 = O::Gt(p1, zero);
#define QKV_STEP(u)                                                          \
  if (u < U) {                                                               \
    const V b = O::Set(vj[u]);                                               \
    if (kGuard) {                                                            \
      o##u##0 = O::IfThenElse(read0, O::MulAdd(p0, b, o##u##0), o##u##0);    \
      if (RV > 1) {                                                          \
        o##u##1 = O::IfThenElse(read1, O::MulAdd(p1, b, o##u##1), o##u##1);  \
      }                                                                      \
    } else {                                                                 \
      o##u##0 = O::MulAdd(p0, b, o##u##0);                                   \
      if (RV > 1) o##u##1 = O::MulAdd(p1, b, o##u##1);                       \
    }                                                                        \
  }
    QKV_UNROLL8(QKV_STEP)
#undef QKV_STEP
  }
#define QKV_STORE(u)                                   \
  if (u < U) {                                         \
    O::Store(o##u##0, ot + u * R);                     \
    if (RV > 1) O::Store(o##u##1, ot + u * R + N);     \
  }
  QKV_UNROLL8(QKV_STORE)
#undef QKV_STORE
}

template <class O>
template <int RV, bool kGuard>
QKV_FLASH_INLINE void Flash<O>::AccumulateOutput(
    const float* __restrict pt, size_t R, const float* __restrict v, int64_t dv,
    int64_t vs, int64_t nb, V alpha0, V alpha1, float* __restrict ot,
    PrefetchStream* pf) {
  if (vs > dv && nb > kStridedValueKeys) {
    const V one = O::Set(1.0f);
    for (int64_t j = 0; j < nb; j += kStridedValueKeys) {
      const int64_t n = nb - j < kStridedValueKeys ? nb - j : kStridedValueKeys;
      AccumulateColumns<RV, kGuard>(pt + j * R, R, v + j * vs, dv, vs, n,
                                    j == 0 ? alpha0 : one,
                                    j == 0 ? alpha1 : one, ot, pf);
    }
    return;
  }
  AccumulateColumns<RV, kGuard>(pt, R, v, dv, vs, nb, alpha0, alpha1, ot,
                                pf);
}

template <class O>
template <int RV, bool kGuard>
QKV_FLASH_INLINE void Flash<O>::AccumulateColumns(
    const float* __restrict pt, size_t R, const float* __restrict v, int64_t dv,
    int64_t vs, int64_t nb, V alpha0, V alpha1, float* __restrict ot,
    PrefetchStream* pf) {
  constexpr int U = OutputUnroll<RV, kGuard>();
  int64_t c = 0;
  for (; c + U <= dv; c += U) {
    pf->Step();
    OutputColumns<RV, U, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                 ot + c * R);
  }
  if (U > 4 && c + 4 <= dv) {
    OutputColumns<RV, 4, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                 ot + c * R);
    c += 4;
  }
  if (c + 2 <= dv) {
    OutputColumns<RV, 2, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                 ot + c * R);
    c += 2;
  }
  for (; c < dv; ++c) {
    OutputColumns<RV, 1, kGuard>(pt, v + c, vs, nb, alpha0, alpha1,
                                 ot + c * R);
  }
}

// Online softmax over one block of nb scores per lane, for the RV row
// vectors of a tile: updates each running max m and sum l, turns st into
// probabilities relative to the new max and sets alpha to the factor
// exp(m_old - m_new) by which earlier sums and outputs scale. The row
// vectors are done together and the max and sum run in two chains each
// (one dependent chain per vector made this step latency-bound).
template <class O>
template <int RV>
QKV_FLASH_INLINE void Flash<O>::SoftmaxBlock(float* __restrict st, size_t R,
                                             int64_t nb, V* m0, V* l0,
                                             V* alpha0, V* m1, V* l1,
                                             V* alpha1) {
  const size_t N = O::Lanes();
  const V neg_inf = O::Set(-INFINITY);
  V max0a = neg_inf, max0b = neg_inf, max1a = neg_inf, max1b = neg_inf;
  int64_t j = 0;
  for (; j + 2 <= nb; j += 2) {
    max0a = O::Max(max0a, O::Load(st + j * R));
    max0b = O::Max(max0b, O::Load(st + (j + 1) * R));
    if (RV > 1) {
      max1a = O::Max(max1a, O::Load(st + j * R + N));
      max1b = O::Max(max1b, O::Load(st + (j + 1) * R + N));
    }
  }
  if (j < nb) {
    max0a = O::Max(max0a, O::Load(st + j * R));
    if (RV > 1) max1a = O::Max(max1a, O::Load(st + j * R + N));
  }
  // A lane that has seen no visible key keeps max -inf; exponentiate its
  // (-inf) scores against 0 so they give 0, not NaN.
  const V new0 = O::Max(*m0, O::Max(max0a, max0b));
  const V use0 = O::IfThenZeroElse(O::Eq(new0, neg_inf), new0);
  *alpha0 = ExpNonPositive(O::Sub(*m0, use0));
  *m0 = new0;
  V use1 = use0;
  if (RV > 1) {
    const V new1 = O::Max(*m1, O::Max(max1a, max1b));
    use1 = O::IfThenZeroElse(O::Eq(new1, neg_inf), new1);
    *alpha1 = ExpNonPositive(O::Sub(*m1, use1));
    *m1 = new1;
  }
  V sum0a = O::Zero(), sum0b = O::Zero();
  V sum1a = O::Zero(), sum1b = O::Zero();
  j = 0;
  for (; j + 2 <= nb; j += 2) {
    float* s = st + j * R;
    const V p0a = ExpNonPositive(O::Sub(O::Load(s), use0));
    const V p0b = ExpNonPositive(O::Sub(O::Load(s + R), use0));
    O::Store(p0a, s);
    O::Store(p0b, s + R);
    sum0a = O::Add(sum0a, p0a);
    sum0b = O::Add(sum0b, p0b);
    if (RV > 1) {
      const V p1a = ExpNonPositive(O::Sub(O::Load(s + N), use1));
      const V p1b = ExpNonPositive(O::Sub(O::Load(s + R + N), use1));
      O::Store(p1a, s + N);
      O::Store(p1b, s + R + N);
      sum1a = O::Add(sum1a, p1a);
      sum1b = O::Add(sum1b, p1b);
    }
  }
  if (j < nb) {
    float* s = st + j * R;
    const V p0 = ExpNonPositive(O::Sub(O::Load(s), use0));
    O::Store(p0, s);
    sum0a = O::Add(sum0a, p0);
    if (RV > 1) {
      const V p1 = ExpNonPositive(O::Sub(O::Load(s + N), use1));
      O::Store(p1, s + N);
      sum1a = O::Add(sum1a, p1);
    }
  }
  *l0 = O::MulAdd(*l0, *alpha0, O::Add(sum0a, sum0b));
  if (RV > 1) *l1 = O::MulAdd(*l1, *alpha1, O::Add(sum1a, sum1b));
}

// qt[t][r] = q_row(r)[t] * q_scale. A full tile: whole N x N blocks by
// in-register transposes where the ops have them, the other columns by
// strided gathers when the rows are equally spaced (dense q: the group's
// heads are adjacent), else by scalar code; partial tiles (and targets
// without gathers) by scalar code.
template <class O>
template <int RV>
QKV_FLASH_INLINE void Flash<O>::PackQueries(const Operands& op, int64_t rows,
                                            size_t R, const Tile& tile) {
  const int64_t d = op.dim;
  if (!O::kGatherTiles || rows != static_cast<int64_t>(R)) {
    PackQueriesScalar(op, rows, R, tile);
    return;
  }
  if constexpr (O::kGatherTiles) {
    const size_t N = O::Lanes();
    const V scale = O::Set(op.q_scale);
    int64_t t = 0;
    if constexpr (O::kTransposeLanes != 0) {
      constexpr size_t kN = O::kTransposeLanes;
      V blk[kN];
      for (; t + static_cast<int64_t>(kN) <= d; t += kN) {
        for (size_t h = 0; h < static_cast<size_t>(RV); ++h) {
          for (size_t i = 0; i < kN; ++i) {
            blk[i] = O::LoadU(tile.q[h * kN + i] + t);
          }
          O::Transpose(blk);
          for (size_t i = 0; i < kN; ++i) {
            O::Store(O::Mul(blk[i], scale), tile.qt + (t + i) * R + h * kN);
          }
        }
      }
    }
    if (t == d) return;
    // Equally spaced rows (in floats, within int32): gathers.
    const int64_t step = tile.q[1] - tile.q[0];
    bool even = step > 0 && step * static_cast<int64_t>(N) < (int64_t{1} << 30);
    for (size_t r = 2; even && r < R; ++r) {
      even = tile.q[r] - tile.q[r - 1] == step;
    }
    if (!even) {
      for (size_t r = 0; r < R; ++r) {
        for (int64_t u = t; u < d; ++u) {
          tile.qt[u * R + r] = tile.q[r][u] * op.q_scale;
        }
      }
      return;
    }
    const int32_t stride = static_cast<int32_t>(step);
    for (; t < d; ++t) {
      O::Store(O::Mul(O::GatherStrided(tile.q[0] + t, stride), scale),
               tile.qt + t * R);
      if (RV > 1) {
        O::Store(O::Mul(O::GatherStrided(tile.q[N] + t, stride), scale),
                 tile.qt + t * R + N);
      }
    }
  }
}
