// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the row path in phases:
// the scores of several key blocks, then their outputs, the values waiting in
// L2. Included by flash-inl.h inside its per-target namespace, after the
// struct.

template <class O>
inline int64_t Flash<O>::PhaseBlocks(int64_t dv) {
  const int64_t n = kPhaseValueBytes / (kBlockKeys * dv * 4);
  return n > kRowStateRows ? kRowStateRows : n < 1 ? 1 : n;
}

// One or two rows (S1, GQA-2 decoding) streaming f32 K and V from memory,
// where the plan says (RowInPhases, plan-inl.h): in phases of
// PhaseBlocks() key blocks (fewer for two rows: a score row per row and
// block), the scores of every block of the phase (the first row's keys
// read in order, left to the hardware prefetchers on every target; the
// phase's values prefetched into L2 as they go), then each row's
// probabilities block by block, then each block's output. Per row, a
// block's operations are RunRows' in the same order (raw scores do not
// depend on the running max; probabilities and outputs follow block by
// block): the same bits. Long phases of one stream suit the memory; the
// alternatives measured are in bench/README.md, "One row in phases of key
// blocks". Not compiled for AArch64, where it is never taken (its mere
// presence raised the instructions per pair there).
template <class O>
__attribute__((noinline)) void Flash<O>::RunRowPhases(
    const Problem& p, const Operands& op, const TileTask& task,
    const unsigned char* shared, const Tile& tile) {
  const int64_t rows = task.rows;
  const RowsSpan span = SetUpRowPath(p, op, task.b, task.kvh, rows, tile);
  const int64_t start =
      span.begin > task.key_begin ? span.begin : task.key_begin;
  const int64_t stop = span.end < task.key_end ? span.end : task.key_end;
  const int64_t d = op.dim, dv = p.value_dim, vs = op.v_st;
  const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
  int64_t phase = PhaseBlocks(dv);
  if (phase * rows > kRowStateRows) phase = kRowStateRows / rows;
  // Row r's keys [*lo, *hi) of the block at j (nb keys); false: none.
  auto keys_of = [&](int64_t r, int64_t j, int64_t nb, int64_t* lo,
                     int64_t* hi) {
    RowKeysOfBlock(tile, r, j, j + nb, stop, lo, hi);
    return *hi > *lo;
  };
  for (int64_t j0 = start; j0 < stop; j0 += phase * kBlockKeys) {
    int64_t jb[kRowStateRows], nb[kRowStateRows];
    float alpha[kRowStateRows];
    int64_t n = 0;
    for (int64_t j = j0; n < phase && j < stop; j += kBlockKeys, ++n) {
      jb[n] = j;
      nb[n] = BlockKeys(j, stop);
    }
    const int64_t keys = jb[n - 1] + nb[n - 1] - j0;
    // The phase's values, a step every 4 keys of the first row's scores.
    BlockPrefetch pf(true, op, dv, j0, keys, stop, keys / 4, 0,
                     PrefetchTo::kL2);
    int64_t lo, hi;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        if (!keys_of(r, jb[i], nb[i], &lo, &hi)) continue;
        RowScoresFor(p, op, tile.q_rows + r * d, KeysInPlace(op, lo), hi - lo,
                     tile.s_row + (r * phase + i) * s_floats,
                     r == 0 ? &pf : nullptr);
      }
    }
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < n; ++i) {
        if (!keys_of(r, jb[i], nb[i], &lo, &hi)) continue;
        alpha[r * phase + i] =
            RowProbabilities(p, tile, r, lo, hi - lo,
                             tile.s_row + (r * phase + i) * s_floats);
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        if (!keys_of(r, jb[i], nb[i], &lo, &hi)) continue;
        RowOutputWidth<F32Rows>(tile.s_row + (r * phase + i) * s_floats,
                                ValuesInPlace(op, lo), dv, vs, hi - lo,
                                alpha[r * phase + i], tile.o_rows + r * dv,
                                nullptr);
      }
    }
  }
  FinishRows(p, task, shared, tile);
}
