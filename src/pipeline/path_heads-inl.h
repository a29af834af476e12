// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the interleaved-heads
// path: decoding rows of several kv heads in one task. Included by flash-inl.h
// inside its per-target namespace, after the struct.

// Keys [sa, ea) of op's K (or V) rows, `n` elements each, into L2. A
// plain loop, not a PrefetchStream: one built and stepped per piece and
// head measured slower than these walks on every x86 backend
// (bench/README.md, "The plan's rules and the figures behind them").
template <class O>
QKV_FLASH_INLINE void Flash<O>::PrefetchPiece(const Operands& op, bool values,
                                              int64_t n, int64_t sa,
                                              int64_t ea) {
  const KvSource& src = values ? op.vsrc : op.ksrc;
  const int64_t bytes = n * KvElementBytes(src.dtype);
  for (int64_t t = sa; t < ea; ++t) {
    const unsigned char* row = KvRowAt(src, t);
    for (int64_t c = 0; c < bytes; c += 64) {
      __builtin_prefetch(row + c, 0, kL2Locality);
    }
  }
}

// Each head's rows' probabilities of block [j0, j1), their rescales into
// alphas[g * kRowPathMaxRows + r].
template <class O>
QKV_FLASH_INLINE void Flash<O>::HeadsProbabilities(
    const Problem& p, const Tile* tiles, int64_t heads, int64_t rows,
    int64_t j0, int64_t j1, int64_t key_end, float* alphas) {
  const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
  for (int64_t g = 0; g < heads; ++g) {
    const Tile& tile = tiles[g];
    for (int64_t r = 0; r < rows; ++r) {
      int64_t lo, hi;
      RowKeysOfBlock(tile, r, j0, j1, key_end, &lo, &hi);
      if (hi <= lo) continue;
      alphas[g * kRowPathMaxRows + r] = RowProbabilities(
          p, tile, r, lo, hi - lo, tile.s_row + r * s_floats);
    }
  }
}

// The row path over up to kHeadGroupMax kv heads of a token-major cache
// (InterleavesHeads): each key block is scored kInterleaveKeys (or
// kInterleaveKeysPrefetched) keys at a time for every head of the group
// in turn, then turned into probabilities head by head, then its values
// are read the same way. A head's scores, softmax and output are
// RunRows' on the same blocks (the output's later pieces rescale by 1,
// which is exact): the same bits.
template <class O>
inline void Flash<O>::RunRowsHeads(const Problem& p, const TileTask& task,
                                   const unsigned char* shared,
                                   unsigned char* workspace) {
  const int64_t heads = task.heads, rows = task.rows;
  const int64_t d = ScoreDim(p), dv = p.value_dim;
  const size_t tile_bytes = LayoutRowTile(p, O::Lanes(), nullptr, nullptr);
  const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
  Operands ops[kHeadGroupMax];
  Tile tiles[kHeadGroupMax];
  float alphas[kHeadGroupMax * kRowPathMaxRows];
  RowsSpan span = EmptySpan(p);
  for (int64_t g = 0; g < heads; ++g) {
    ops[g] = OperandsFor(p, shared, task.b, task.kvh + g);
    LayoutRowTile(p, O::Lanes(), workspace + g * tile_bytes, &tiles[g]);
    // Every head of a batch has the same key intervals (RowKeys): the
    // same span, so the same blocks as RunRows.
    span = SetUpRowPath(p, ops[g], task.b, task.kvh + g, rows, tiles[g]);
  }
  const bool fused = p.kv_dtype != QKV_DTYPE_F32;  // one row, dot scores
  // Every head's rows see the same keys or none does (RowKeys).
  const bool joint = !fused && JointRows(ops[0], tiles[0], rows);
  static constexpr float kOnes[kRowPathMaxRows] = {1.0f, 1.0f, 1.0f, 1.0f};
  bool lead;
  const int64_t step = HeadsStep(ops, heads, fused, joint, &lead);
  const int64_t start =
      span.begin > task.key_begin ? span.begin : task.key_begin;
  const int64_t stop = span.end < task.key_end ? span.end : task.key_end;
  // Row r's keys in block [j0, j1): [lo, hi), scores at s_row + r * s_floats.
  auto keys_of = [&](const Tile& tile, int64_t r, int64_t j0, int64_t j1,
                     int64_t* lo, int64_t* hi) {
    RowKeysOfBlock(tile, r, j0, j1, task.key_end, lo, hi);
  };
  // Its keys [a, e) in the step [s0, s1); false when there are none.
  auto piece = [&](const Tile& tile, int64_t r, int64_t j0, int64_t j1,
                   int64_t s0, int64_t s1, int64_t* lo, int64_t* a,
                   int64_t* e) {
    int64_t hi;
    keys_of(tile, r, j0, j1, lo, &hi);
    *a = *lo > s0 ? *lo : s0;
    *e = hi < s1 ? hi : s1;
    return *e > *a;
  };
  // f(op, tile, r, lo, a, e) for keys [a, e) of row r (-1: the joint
  // rows) in steps of `step` keys of block [j0, j1), every head of the
  // group in turn, step by step (with `lead`, the K or V rows of the
  // piece kPieceLead pieces on prefetched first); lo: the row's first key
  // of the block (its scores at s_row + r * s_floats + (a - lo)).
  auto each_piece = [&](int64_t j0, int64_t j1, bool values, auto&& f) {
    for (int64_t s0 = j0; s0 < j1; s0 += step) {
      const int64_t s1 = s0 + step < j1 ? s0 + step : j1;
      for (int64_t g = 0; g < heads; ++g) {
        if (lead) {  // the piece kPieceLead pieces on, into L2
          const int64_t ga = g + kPieceLead;
          const int64_t sa = s0 + (ga / heads) * step;
          if (sa < j1) {
            PrefetchPiece(ops[ga % heads], values, values ? dv : d, sa,
                          sa + step < j1 ? sa + step : j1);
          }
        }
        int64_t lo, a, e;
        if (joint) {  // the rows see the same keys
          if (piece(tiles[g], 0, j0, j1, s0, s1, &lo, &a, &e)) {
            f(ops[g], tiles[g], g, int64_t{-1}, lo, a, e);
          }
          continue;
        }
        for (int64_t r = 0; r < rows; ++r) {
          if (piece(tiles[g], r, j0, j1, s0, s1, &lo, &a, &e)) {
            f(ops[g], tiles[g], g, r, lo, a, e);
          }
        }
      }
    }
  };
  for (int64_t j0 = start; j0 < stop; j0 += kBlockKeys) {
    const int64_t j1 = j0 + kBlockKeys < stop ? j0 + kBlockKeys : stop;
    each_piece(j0, j1, false, [&](const Operands& op, const Tile& tile,
                                  int64_t, int64_t r, int64_t lo, int64_t a,
                                  int64_t e) {
      if (r < 0) {
        JointScoresOnly(op, tile, rows, KeysInPlace(op, a), e - a,
                        tile.s_row + (a - lo), s_floats, nullptr);
        return;
      }
      float* st = tile.s_row + r * s_floats + (a - lo);
      if (fused) {
        RowDotScoresLowPrecision(tile.q_rows + r * d, op.ksrc, a, d, e - a,
                                 op.finish, st, nullptr);
      } else {
        RowScoresFor(p, op, tile.q_rows + r * d, KeysInPlace(op, a), e - a,
                     st, nullptr);
      }
    });
    HeadsProbabilities(p, tiles, heads, rows, j0, j1, task.key_end, alphas);
    each_piece(j0, j1, true, [&](const Operands& op, const Tile& tile,
                                 int64_t g, int64_t r, int64_t lo,
                                 int64_t a, int64_t e) {
      // The output's first piece of a block rescales by alpha, the
      // others by 1 (exact).
      const float* alpha_g = alphas + g * kRowPathMaxRows;
      if (r < 0) {
        JointOutput(p, op, tile, rows, tile.s_row + (a - lo),
                    ValuesInPlace(op, a), e - a, s_floats,
                    a == lo ? alpha_g : kOnes);
        return;
      }
      const float alpha = a == lo ? alpha_g[r] : 1.0f;
      float* pr = tile.s_row + r * s_floats + (a - lo);
      if (fused) {
        RowOutputLowPrecision(pr, op.vsrc, a, dv, e - a, alpha,
                              tile.o_rows + r * dv, nullptr);
      } else {
        RowOutput(pr, ValuesInPlace(op, a), dv, op.v_st, e - a, alpha,
                  tile.o_rows + r * dv);
      }
    });
  }
  for (int64_t g = 0; g < heads; ++g) {
    TileTask one = task;
    one.kvh = task.kvh + g;
    one.heads = 1;
    FinishRows(p, one, shared, tiles[g]);
  }
}
