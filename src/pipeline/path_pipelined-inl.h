// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the pipelined int8 row
// path: a decoding row's scores of a block interleaved with the output of the
// block before. Included by flash-inl.h inside its per-target namespace, after
// the struct.

template <class O>
__attribute__((noinline)) void Flash<O>::RunRowPipelined(
    const Problem& p, const Operands& op, const TileTask& task,
    const unsigned char* shared, const Tile& tile) {
  const int64_t d = op.dim, dv = p.value_dim;
  const RowsSpan span = SetUpRowPath(p, op, task.b, task.kvh, 1, tile);
  const int64_t s_floats = static_cast<int64_t>(RowScoreFloats(O::Lanes()));
  float* const buf[2] = {tile.s_row, tile.s_row + s_floats};
  float* const o = tile.o_rows;
  // The pending block: its keys [p_lo, p_lo + p_nb), its probabilities
  // in buf[cur], its rescale factor p_alpha.
  int cur = 0;
  int64_t p_lo = 0, p_nb = 0;
  float p_alpha = 1.0f;
  auto output = [&](int64_t b, int64_t n) {
    RowOutputLowPrecision(buf[cur] + b, op.vsrc, p_lo + b, dv, n,
                          b == 0 ? p_alpha : 1.0f, o, nullptr);
  };
  // Split s of the task as a task of its own.
  auto split_task = [&](int64_t s) {
    TileTask t = task;
    SetSplits(p, s, 1, &t);
    return t;
  };
  // Finishes the splits before `to` (their outputs complete), each
  // leaving the row's state as a task's SetUpRowPath does.
  int64_t next = task.split;
  const int64_t s_end = task.split + task.splits;
  auto finish_to = [&](int64_t to) {
    for (; next < to; ++next) {
      FinishRows(p, split_task(next), shared, tile);
      tile.m[0] = -INFINITY;
      tile.sum[0] = 0.0f;
      for (int64_t c = 0; c < dv; ++c) o[c] = 0.0f;
    }
  };
  int64_t j_first = -1;  // the task's first block
  for (int64_t s = task.split; s < s_end; ++s) {
    const TileTask sp = split_task(s);
    const int64_t start =
        span.begin > sp.key_begin ? span.begin : sp.key_begin;
    const int64_t stop = span.end < sp.key_end ? span.end : sp.key_end;
    for (int64_t j0 = start; j0 < stop; j0 += kBlockKeys) {
      const int64_t nb_all = BlockKeys(j0, stop);
      int64_t lo, hi;
      RowKeysOfBlock(tile, 0, j0, j0 + nb_all, sp.key_end, &lo, &hi);
      const int64_t nb = hi - lo;
      if (nb <= 0) continue;
      // As RunRows, the next block's keys up to the row's last visible
      // key, past the split's end; in the task's first kPipeWarmKeys.
      if (j_first < 0) j_first = j0;
      BlockPrefetch pf(j0 - j_first < kPipeWarmKeys, op, dv, j0, nb_all,
                       span.end, nb_all / 4, nb_all / 4, PrefetchTo::kL2);
      float* const st = buf[cur ^ 1];
      for (int64_t a = 0, b = 0; a < nb || b < p_nb;) {
        if (a < nb) {
          const int64_t n = nb - a < kPipeKeys ? nb - a : kPipeKeys;
          RowDotScoresLowPrecision(tile.q_rows, op.ksrc, lo + a, d, n,
                                   op.finish, st + a, &pf);
          a += n;
        }
        if (b < p_nb) {
          const int64_t n = p_nb - b < kPipeKeys ? p_nb - b : kPipeKeys;
          output(b, n);
          b += n;
        }
      }
      finish_to(s);  // the pending block was the last of an earlier split
      p_alpha = RowProbabilities(p, tile, 0, lo, nb, st);
      p_lo = lo;
      p_nb = nb;
      cur ^= 1;
    }
  }
  if (p_nb > 0) output(0, p_nb);
  finish_to(s_end);
}
