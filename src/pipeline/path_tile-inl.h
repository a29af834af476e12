// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the tile path: a tile of
// query rows of one kv head's GQA group over its keys, groups of tiles sharing
// K/V blocks, and tiles at 8 lanes on wider targets. Included by flash-inl.h
// inside its per-target namespace, after the struct.

// The key block of a tile that starts at j0 (up to kBlockKeys keys, not
// past span.end): scores, epilogue, online softmax (running max and sum
// in *m0, *l0 and, for RV 2, *m1, *l1), the output update, and with
// `prefetch` the prefetches that go with the block. Low-precision rows
// are dequantized into the tile's kblk and vblk, or given already
// dequantized (kb, vb: rows from j0 on, as many as the block has or more).
template <class O>
template <int RV>
QKV_FLASH_INLINE void Flash<O>::TileBlock(const Problem& p, const Operands& op,
                                          const Tile& tile, int64_t rows,
                                          size_t R, const RowsSpan& span,
                                          const EpilogueTerms& terms,
                                          int64_t j0, bool prefetch, V* m0,
                                          V* l0, V* m1, V* l1, const float* kb,
                                          const float* vb) {
  const int64_t dv = p.value_dim, lk = p.kv_len;
  const int64_t nb = BlockKeys(j0, span.end);
  BlockPrefetch pf(prefetch, op, dv, j0, nb, span.end,
                   nb / TileUnroll<RV>(), dv / OutputUnroll<RV, false>(),
                   PrefetchTo::kL2);
  float* st = tile.st;
  Scores<RV>(op, p.w_v, tile.qt, R,
             kb != nullptr ? kb : KeyBlock(op, j0, nb, tile.kblk), nb, st,
             &pf.v);
  const bool masks = span.Masks(j0, nb);
  Epilogue<RV>(tile, rows, R, j0, nb, terms, masks, st);
  if (p.weights != nullptr) {  // raw masked scores; normalized at the end
    for (int64_t r = 0; r < rows; ++r) {
      float* w = p.weights + tile.row[r] * lk + j0;
      for (int64_t j = 0; j < nb; ++j) w[j] = st[j * R + r];
    }
  }
  V alpha0, alpha1 = O::Zero();
  SoftmaxBlock<RV>(st, R, nb, m0, l0, &alpha0, m1, l1, &alpha1);
  if (RV == 1) alpha1 = alpha0;
  const float* v = vb != nullptr ? vb : ValueBlock(op, dv, j0, nb, tile.vblk);
  const int64_t vs = op.v_st;
  // Keys that every row of the tile sees, [a, b) of the block, need no
  // guard (a bias can hide any key: all guarded). In a causal diagonal
  // block that leaves the guard to the keys past the first row's end. The
  // block's output is the same sequence of operations in one call or in
  // three (the later ones rescale by 1, exactly), so the bits are too.
  int64_t a = 0, b = nb;
  if (terms.bias) {
    b = 0;
  } else if (masks) {
    a = span.full_begin - j0;
    b = span.full_end - j0;
    a = a < 0 ? 0 : (a > nb ? nb : a);
    b = b < a ? a : (b > nb ? nb : b);
  }
  const V one = O::Set(1.0f);
  if (a > 0) {
    AccumulateOutput<RV, true>(st, R, v, dv, vs, a, alpha0, alpha1, tile.ot,
                               &pf.k);
  }
  if (b > a) {
    AccumulateOutput<RV, false>(st + a * R, R, v + a * vs, dv, vs, b - a,
                                a > 0 ? one : alpha0, a > 0 ? one : alpha1,
                                tile.ot, &pf.k);
  }
  if (nb > b) {
    AccumulateOutput<RV, true>(st + b * R, R, v + b * vs, dv, vs, nb - b,
                               b > 0 ? one : alpha0, b > 0 ? one : alpha1,
                               tile.ot, &pf.k);
  }
}

template <class O>
template <int RV>
inline void Flash<O>::RunTile(const Problem& p, const Operands& op,
                              const TileTask& task, const unsigned char* shared,
                              const Tile& tile) {
  const size_t N = O::Lanes();
  const size_t R = RV * N;
  const int64_t rows = task.rows;
  const RowsSpan span =
      SetUpTileRows(p, op, task.b, task.kvh, task.r0, rows, R, tile);
  PackQueries<RV>(op, rows, R, tile);
  // A flash-decoding split walks its own keys of the rows' span.
  RowsSpan keys = span;
  keys.begin = span.begin > task.key_begin ? span.begin : task.key_begin;
  keys.end = span.end < task.key_end ? span.end : task.key_end;

  const V neg_inf = O::Set(-INFINITY);
  V m0 = neg_inf, m1 = neg_inf;
  V l0 = O::Zero(), l1 = O::Zero();
  const EpilogueTerms terms = TermsOf(p);
  // A loop with and one without prefetches (GCC unswitched it only while
  // the loop stayed under its size limit).
  if (PrefetchesKv(p)) {
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockKeys) {
      TileBlock<RV>(p, op, tile, rows, R, keys, terms, j0, true, &m0, &l0,
                    &m1, &l1);
    }
  } else {
    for (int64_t j0 = keys.begin; j0 < keys.end; j0 += kBlockKeys) {
      TileBlock<RV>(p, op, tile, rows, R, keys, terms, j0, false, &m0, &l0,
                    &m1, &l1);
    }
  }
  StoreRunning<RV>(tile, m0, l0, m1, l1);
  if (KeySplits(p) > 1 &&
      !MergeSplits(p, task, shared, tile, tile.ot, 1,
                   static_cast<int64_t>(R))) {
    return;
  }
  FinishTile<RV>(p, tile, rows, R, span);
}

// A tile's running max and sum into tile.m and tile.sum.
template <class O>
template <int RV>
QKV_FLASH_INLINE void Flash<O>::StoreRunning(const Tile& tile, V m0, V l0, V m1,
                                             V l1) {
  const size_t N = O::Lanes();
  O::Store(m0, tile.m);
  O::Store(l0, tile.sum);
  if (RV > 1) {
    O::Store(m1, tile.m + N);
    O::Store(l1, tile.sum + N);
  }
}

// A tile of a group: one key block, the running max and sum kept in
// tile.m and tile.sum between blocks; kb, vb as TileBlock's.
template <class O>
template <int RV>
inline void Flash<O>::GroupTileBlock(const Problem& p, const Operands& op,
                                     const Tile& tile, int64_t rows, size_t R,
                                     const RowsSpan& span,
                                     const EpilogueTerms& terms, int64_t j0,
                                     bool prefetch, const float* kb,
                                     const float* vb) {
  const size_t N = O::Lanes();
  V m0 = O::Load(tile.m), l0 = O::Load(tile.sum);
  V m1 = m0, l1 = l0;
  if (RV > 1) {
    m1 = O::Load(tile.m + N);
    l1 = O::Load(tile.sum + N);
  }
  TileBlock<RV>(p, op, tile, rows, R, span, terms, j0, prefetch, &m0, &l0,
                &m1, &l1, kb, vb);
  StoreRunning<RV>(tile, m0, l0, m1, l1);
}

// Up to kGroupTiles tiles of one kv head (GroupsTiles: strided or
// low-precision K/V), key block by key block: the k-th block of every
// tile, then the next. Each tile runs exactly the blocks, in the order,
// that RunTile would (its own span, from its own first key), so the
// results are RunTile's bits; only the interleaving differs, and with it
// how often a block of strided K/V rows comes from beyond L2 and how
// often a low-precision block is dequantized: once per group (the tiles
// whose block starts at the same key) instead of once per tile.
template <class O>
inline void Flash<O>::RunTileGroup(const Problem& p, const Operands& op,
                                   const TileTask& task,
                                   unsigned char* workspace) {
  const size_t N = O::Lanes(), R = 2 * N;
  const size_t tile_bytes = LayoutTile(p, N, nullptr, nullptr);
  Tile tiles[kGroupTiles];
  RowsSpan spans[kGroupTiles];
  int64_t rows[kGroupTiles];
  int64_t count = 0, blocks = 0;
  for (int64_t r0 = 0; r0 < task.rows && count < kGroupTiles;
       r0 += static_cast<int64_t>(R), ++count) {
    Tile& tile = tiles[count];
    LayoutTile(p, N, workspace + static_cast<size_t>(count) * tile_bytes,
               &tile);
    const int64_t left = task.rows - r0;
    rows[count] = left < static_cast<int64_t>(R) ? left
                                                 : static_cast<int64_t>(R);
    spans[count] = SetUpTileRows(p, op, task.b, task.kvh, task.r0 + r0,
                                 rows[count], R, tile);
    if (rows[count] <= static_cast<int64_t>(N)) {
      PackQueries<1>(op, rows[count], N, tile);
    } else {
      PackQueries<2>(op, rows[count], R, tile);
    }
    for (size_t i = 0; i < R; ++i) {
      tile.m[i] = -INFINITY;
      tile.sum[i] = 0.0f;
    }
    const int64_t n =
        (spans[count].end - spans[count].begin + kBlockKeys - 1) /
        kBlockKeys;
    blocks = n > blocks ? n : blocks;
  }
  const bool prefetch = PrefetchesKv(p);
  const EpilogueTerms terms = TermsOf(p);
  const bool convert = op.convert_k || op.convert_v;
  for (int64_t k = 0; k < blocks; ++k) {
    bool prefetched = false;  // the first tile still running prefetches
    // The dequantized rows [at, at + have) of the round, in kb and vb.
    int64_t at = -1, have = 0;
    const float *kb = nullptr, *vb = nullptr;
    for (int64_t g = 0; g < count; ++g) {
      const int64_t j0 = spans[g].begin + k * kBlockKeys;
      if (j0 >= spans[g].end) continue;
      if (convert && (j0 != at || BlockKeys(j0, spans[g].end) > have)) {
        // Enough rows for every tile of the round that starts at j0.
        at = j0;
        have = 0;
        for (int64_t h = g; h < count; ++h) {
          if (spans[h].begin + k * kBlockKeys != j0) continue;
          const int64_t nb = BlockKeys(j0, spans[h].end);
          have = nb > have ? nb : have;
        }
        kb = KeyBlock(op, j0, have, tiles[g].kblk);
        vb = ValueBlock(op, p.value_dim, j0, have, tiles[g].vblk);
      }
      if (rows[g] <= static_cast<int64_t>(N)) {
        GroupTileBlock<1>(p, op, tiles[g], rows[g], N, spans[g], terms, j0,
                          prefetch && !prefetched, kb, vb);
      } else {
        GroupTileBlock<2>(p, op, tiles[g], rows[g], R, spans[g], terms, j0,
                          prefetch && !prefetched, kb, vb);
      }
      prefetched = true;
    }
  }
  for (int64_t g = 0; g < count; ++g) {
    if (rows[g] <= static_cast<int64_t>(N)) {
      FinishTile<1>(p, tiles[g], rows[g], N, spans[g]);
    } else {
      FinishTile<2>(p, tiles[g], rows[g], R, spans[g]);
    }
  }
}

// A tile of one row vector (TaskPath). A decoding step at GQA 8 (8 rows that
// see the same keys, dot scores, f32 keys, head_dim whole vectors) on an x86
// target with full-width transposes takes the row path instead (RunRows:
// head_dim in lanes, the 8 rows scored together by RowScores8), measured
// faster than the 8-lane tile below for GQA-8 decoding on AVX-512 from L2
// and from DRAM (Emerald Rapids) and on highway:AVX2 from DRAM (Zen 4):
// bench/README.md, "GQA-8 decoding on the row path" and "GQA-8 scores with
// each query vector loaded once; the zero scan in vectors". Other tiles of
// at most 8 rows (a short prompt, other score kinds) on a 16-lane target
// take 8-lane vectors (the tiny path's Narrow8, the same target's
// AVX2-width code): a 512-bit vector half empty costs a full one, and on
// Zen 4, whose AVX-512 units are 256 bits wide, twice the 256-bit one
// (GQA-8 decoding from L2 measured slower on highway:AVX3 than on
// highway:AVX2: bench/README.md, "Tiles for 16 registers, L2 prefetch,
// 8-lane tiles"). Each lane does the same operations at either width, so
// the bits are the same. The narrower tile's layout is smaller than the
// full one the workspace was sized for.
template <class O>
inline void Flash<O>::RunNarrowTile(const Problem& p, const Operands& op,
                                    const TileTask& t,
                                    const unsigned char* shared,
                                    unsigned char* workspace) {
  using O8 = typename O::Narrow8;
  if constexpr (!std::is_same<O8, O>::value) {
    Tile narrow;
    LayoutTile(p, O8::Lanes(), workspace, &narrow);
    Flash<O8>::template RunTile<1>(p, op, t, shared, narrow);
  } else {
    (void)p, (void)op, (void)t, (void)shared, (void)workspace;
  }
}
