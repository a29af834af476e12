// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the row path: decoding
// rows (few queries per kv head), one at a time or scored jointly, with fused
// readers of f16, bf16 and int8 rows. Included by flash-inl.h inside its
// per-target namespace, after the struct.

// Scores of one row for keys [j, j + nb), the kind chosen once.
template <class O>
inline void Flash<O>::RowScoresFor(const Problem& p, const Operands& op,
                                   const float* q, const float* k, int64_t nb,
                                   float* st, BlockPrefetch* pf) {
  const int64_t d = op.dim, ks = op.k_st;
  if (op.kind == kAdditive) {
    RowScores<kAdditive>(q, k, d, ks, nb, 1.0f, p.w_v, st, pf);
  } else if (op.kind == kGaussian) {
    RowScores<kGaussian>(q, k, d, ks, nb, op.finish, p.w_v, st, pf);
  } else {  // op.finish: 1 when the scale is folded into the queries
    RowScores<kDot>(q, k, d, ks, nb, op.finish, p.w_v, st, pf);
  }
}

// Row r's scores st[0, nb) of keys [lo, lo + nb) of a block to
// probabilities: the epilogue, the raw scores into weights (when asked),
// the online softmax. Returns the rescale factor of the row's output.
template <class O>
QKV_FLASH_INLINE float Flash<O>::RowProbabilities(const Problem& p,
                                                  const Tile& tile, int64_t r,
                                                  int64_t lo, int64_t nb,
                                                  float* st) {
  if (p.softcap > 0.0f || p.alibi_slopes != nullptr) {
    RowEpilogue(p, tile, r, lo, nb, st);
  } else if (tile.bias[r] != nullptr) {
    AddBias(tile.bias[r], lo, nb, 1, st);
  }
  if (p.weights != nullptr) {
    memcpy(p.weights + tile.row[r] * p.kv_len + lo, st, nb * sizeof(float));
  }
  return RowSoftmaxBlock(st, nb, &tile.m[r], &tile.sum[r]);
}

// The finisher for the row path's rows of one kv head, after merging
// the flash-decoding splits (false: another split merges them).
template <class O>
inline void Flash<O>::FinishRows(const Problem& p, const TileTask& task,
                                 const unsigned char* shared,
                                 const Tile& tile) {
  const int64_t dv = p.value_dim;
  if (KeySplits(p) > 1 &&
      !MergeSplits(p, task, shared, tile, tile.o_rows, dv, 1)) {
    return;
  }
  for (int64_t r = 0; r < task.rows; ++r) {
    RowState s = RowStateOf(tile, r);
    s.o = tile.o_rows + r * dv;
    s.o_stride = 1;
    s.c_begin = 0;
    s.w_lo = tile.lo[r];
    s.w_hi = tile.hi[r];
    FinishRow(p, s, tile.tail);
  }
}

// Joint rows' scores of nb f32 key rows k (k_st apart) into st (a row
// every s_stride floats).
template <class O>
inline void Flash<O>::JointScoresOnly(const Operands& op, const Tile& tile,
                                      int64_t rows, const float* k, int64_t nb,
                                      float* st, int64_t s_stride,
                                      BlockPrefetch* pf) {
  if (rows == 2) {
    RowScoresRows<2, kDot, F32Rows>(tile.q_rows, k, op.dim, op.k_st, nb,
                                    op.finish, nullptr, st, s_stride, pf);
  } else if (rows == 4) {
    RowScoresRows<4, kDot, F32Rows>(tile.q_rows, k, op.dim, op.k_st, nb,
                                    op.finish, nullptr, st, s_stride, pf);
  } else {
    RowScores8(tile.q_rows, k, op.dim, op.k_st, nb, op.finish, st, s_stride,
               pf);
  }
}

// Joint rows' scores for keys [lo, lo + nb) of f32 rows k (k_st apart)
// into tile.s_row (a row every s_stride floats), then their
// probabilities; alpha[r] the rescale factors.
template <class O>
inline void Flash<O>::JointScores(const Problem& p, const Operands& op,
                                  const Tile& tile, int64_t rows,
                                  const float* k, int64_t lo, int64_t nb,
                                  int64_t s_stride, BlockPrefetch* pf,
                                  float* alpha) {
  JointScoresOnly(op, tile, rows, k, nb, tile.s_row, s_stride, pf);
  for (int64_t r = 0; r < rows; ++r) {
    alpha[r] =
        RowProbabilities(p, tile, r, lo, nb, tile.s_row + r * s_stride);
  }
}

// Joint rows' output from f32 value rows v (v_st apart), probabilities
// at pr (a row every s_stride floats); pk (or NULL) steps as the output
// goes (4 and 8 rows from DRAM: the next block's keys, RunRows).
template <class O>
inline void Flash<O>::JointOutput(const Problem& p, const Operands& op,
                                  const Tile& tile, int64_t rows,
                                  const float* pr, const float* v, int64_t nb,
                                  int64_t s_stride, const float* alpha,
                                  PrefetchStream* pk) {
  if (rows == 2) {
    RowOutputRows<2>(pr, s_stride, v, p.value_dim, op.v_st, nb, alpha,
                     tile.o_rows);
  } else {
    for (int64_t r = 0; r < rows; r += 4) {
      RowOutputRows<4>(pr + r * s_stride, s_stride, v, p.value_dim, op.v_st,
                       nb, alpha + r, tile.o_rows + r * p.value_dim, pk);
    }
  }
}

// How often 4 or 8 joint rows step the next block's key prefetch over
// a block of nb keys: every 4 keys of RowScoresRows<4> (4 rows), then
// every 8 keys of each column pass of RowOutputRowsColumns (JointOutput:
// dv / (U * lanes) passes per 4 rows). Spread over all of them, not
// issued in the first passes (on 8-lane targets 8 passes per 4 rows:
// the 512 lines of a 64-key block of d 128 went out in the first eighth
// of the output): measured faster for GQA-4 and GQA-8 decoding from DRAM
// on highway:AVX2 and xsimd:avx2
// (bench/README.md, "Joint rows' key prefetch spread over the whole output");
// 16-lane targets step as before (2 passes: the same count).
template <class O>
inline int64_t Flash<O>::JointKeySteps(int64_t rows, int64_t nb, int64_t dv) {
  const int64_t pass =
      RowOutputUnroll<4>() * static_cast<int64_t>(O::Lanes());
  const int64_t out = (nb + 7) / 8 * (dv / pass) * (rows / 4);
  const int64_t scores = rows == 4 ? (nb + 3) / 4 : 0;
  return out + scores > 0 ? out + scores : nb / 2;
}

// Row r's keys [*lo, *hi) of the block [j0, j1), up to `end` (a split's
// last key): empty when *hi <= *lo.
template <class O>
QKV_FLASH_INLINE void Flash<O>::RowKeysOfBlock(const Tile& tile, int64_t r,
                                               int64_t j0, int64_t j1,
                                               int64_t end, int64_t* lo,
                                               int64_t* hi) {
  *lo = tile.lo[r] > j0 ? tile.lo[r] : j0;
  const int64_t h = j1 < tile.hi[r] ? j1 : tile.hi[r];
  *hi = h < end ? h : end;
}

// All rows (at most kRowPathMaxRows, or the 8 of kPathRows8) of one
// (batch, kv head), keys
// [task.key_begin, task.key_end) of them (one flash-decoding split). Keys
// are walked in blocks; each block of K and V is read from memory once and
// reused from L1 by the group's other rows, each of which takes the part
// of the block inside its own key interval.
template <class O>
inline void Flash<O>::RunRows(const Problem& p, const Operands& op,
                              const TileTask& task, const unsigned char* shared,
                              const Tile& tile) {
  const int64_t b = task.b, kvh = task.kvh, rows = task.rows;
  const int64_t d = op.dim, dv = p.value_dim;
  const RowsSpan span = SetUpRowPath(p, op, b, kvh, rows, tile);
  const int64_t start =
      span.begin > task.key_begin ? span.begin : task.key_begin;
  const int64_t stop = span.end < task.key_end ? span.end : task.key_end;
  const int64_t ks = op.k_st, vs = op.v_st;
  float* st = tile.s_row;
  const RowsPlan plan = PlanRows(p, op, tile, rows);
  const bool prefetch = plan.prefetch, fused_k = plan.fused_k;
  const bool fused_v = plan.fused_v, joint = plan.joint;
  const bool keys_late = plan.keys_late;
  TracePath(joint ? kPathRowsJoint : kPathRows);
  const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
  const int64_t key_stop = plan.keys_past_split ? span.end : stop;
  for (int64_t j0 = start; j0 < stop; j0 += kBlockKeys) {
    // The first row's scores prefetch this block's V (and the next K).
    const int64_t nb_all = BlockKeys(j0, stop);
    // With keys_late (one row at a time) the next block's keys stream in
    // during the first row's values instead (pk, a key's share a key).
    BlockPrefetch pf(prefetch, op, dv, j0, nb_all, key_stop, nb_all / 4,
                     joint && rows >= 4 ? JointKeySteps(rows, nb_all, dv)
                     : keys_late        ? 0
                                        : nb_all / 4,
                     PrefetchTo::kL2);
    BlockPrefetch late(keys_late && !plan.hardware_keys, op, dv, j0, nb_all,
                       key_stop, 0, nb_all, PrefetchTo::kL2);
    PrefetchStream* const pk = keys_late ? &late.k : nullptr;
    // For the scores that read the block's keys first (the first row's,
    // or the joint rows'), streaming them from memory and stepping the
    // prefetches; NULL from cache.
    BlockPrefetch* const lead = prefetch ? &pf : nullptr;
    // The block's keys and values, read once for all rows (low-precision
    // ones dequantized here): row j at k + (j - j0) * ks. Values are
    // converted after the first row's scores, which prefetch them.
    // A single row reads low-precision dot-score keys and values fused
    // (fused_k, fused_v); several rows share one dequantized block.
    const float* k =
        fused_k ? nullptr : KeyBlock(op, j0, nb_all, tile.kblk);
    const float* v = nullptr;
    if (joint) {  // every row sees the same keys
      int64_t lo, hi;
      RowKeysOfBlock(tile, 0, j0, j0 + nb_all, task.key_end, &lo, &hi);
      if (hi <= lo) continue;
      float alpha[kRowStateRows];
      JointScores(p, op, tile, rows, k + (lo - j0) * ks, lo, hi - lo,
                  s_floats, lead, alpha);
      v = ValueBlock(op, dv, j0, nb_all, tile.vblk);
      JointOutput(p, op, tile, rows, tile.s_row, v + (lo - j0) * vs,
                  hi - lo, s_floats, alpha,
                  prefetch && rows >= 4 ? &pf.k : nullptr);
      continue;
    }
    for (int64_t r = 0; r < rows; ++r) {
      int64_t lo, hi;
      RowKeysOfBlock(tile, r, j0, j0 + nb_all, task.key_end, &lo, &hi);
      const int64_t nb = hi - lo;
      if (nb <= 0) continue;
      if (fused_k) {
        RowDotScoresLowPrecision(tile.q_rows + r * d, op.ksrc, lo, d, nb,
                                 op.finish, st, r == 0 ? lead : nullptr);
      } else {
        RowScoresFor(p, op, tile.q_rows + r * d, k + (lo - j0) * ks, nb, st,
                     r == 0 ? lead : nullptr);
      }
      const float alpha = RowProbabilities(p, tile, r, lo, nb, st);
      if (fused_v) {
        RowOutputLowPrecision(st, op.vsrc, lo, dv, nb, alpha,
                              tile.o_rows + r * dv, r == 0 ? pk : nullptr);
        continue;
      }
      if (v == nullptr) v = ValueBlock(op, dv, j0, nb_all, tile.vblk);
      RowOutput(st, v + (lo - j0) * vs, dv, vs, nb, alpha,
                tile.o_rows + r * dv, r == 0 ? pk : nullptr);
    }
  }
  FinishRows(p, task, shared, tile);
}
