// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the plan, where the
// forward pipeline's choices of path and schedule are made. PlanCall gives a
// call's plan (the path its tasks take, the rows of a task, the key splits of a
// task), which NumTasks, WorkspacePerWorker, TaskAt and RunTask switch on
// (entry-inl.h); TaskPath adds a tile task's width; PlanRows and HeadsStep are
// the plans of the row and interleaved-heads paths. Apart from the shape
// predicates these call (UsesRowPath, KeySplits, GroupsTiles, InterleavesHeads,
// SplitsHeadMajor: pipeline/tasks.h; UsesTinyPath: workspace.h; PrefetchesKv:
// prefetch.h), no other code reads the element type, the lane count, the CPU
// vendor (KeysPrefetchedLate, src/engine.h) or the architecture (kX86) to
// choose a path or schedule; the kernels' register unrolls stay with the
// kernels. Each rule names its measurement; the figures are in bench/README.md,
// "The plan's rules and the figures behind them". Included by flash-inl.h
// inside its per-target namespace, after the struct.

// The call's plan. Rules, first match: token-major decoding caches
// interleave heads (InterleavesHeads: "Interleaved heads for token-major
// decoding"); toy widths take the tiny path (UsesTinyPath: "Path
// boundaries: the tiny path's widths"); decoding rows take the row path
// (UsesRowPath) in RowSchedule's schedule; strided or converted K/V
// group tiles (GroupsTiles: "Tile groups and the softcap tanh"); the rest
// are tiles, each task's width its own (TaskPath).
template <class O>
QKV_FLASH_INLINE typename Flash<O>::CallPlan Flash<O>::PlanCall(
    const Problem& p) {
  CallPlan c;
  c.task_rows = TileRows();
  c.splits_per_task = 1;
  if (InterleavesHeads(p)) {
    c.path = kPathRowsHeads;
  } else if (UsesTinyPath(p, O::Lanes())) {
    c.path = kPathTiny;
  } else if (UsesRowPath(p)) {
    c.path = RowSchedule(p);
    if (c.path == kPathRowPipelined) c.splits_per_task = SplitsPerTask(p);
  } else if (GroupsTiles(p) || (ForcedPath() == kPathTileGroup &&
                                 KeySplits(p) == 1 && !DecodesRows8(p) &&
                                 p.score != QKV_SCORE_ADDITIVE)) {
    c.path = kPathTileGroup;
    c.task_rows = static_cast<size_t>(kGroupTiles) * TileRows();
  } else {
    c.path = kPathTile2;  // TaskPath narrows it by the task's rows
  }
  return c;
}

// The row path's schedule: a forced one (ForcePath, pipeline/paths.h)
// where the rows can take it, else phases for 1-2 rows of f32 K/V and the
// pipelined row for int8 where keys are prefetched late (RowInPhases,
// PipelinesInt8), else RunRows. Every task of a call has the call's rows.
template <class O>
inline PathBit Flash<O>::RowSchedule(const Problem& p) {
  const int64_t rows = p.group * p.q_len;
  const bool f32 = p.kv_dtype == QKV_DTYPE_F32;
  const uint32_t forced = ForcedPath();
  if (forced == kPathRows) return kPathRows;
  if (kX86 && forced == kPathRowPhases && rows <= 2 && f32) {
    return kPathRowPhases;
  }
  if (kX86 && forced == kPathRowPipelined && rows == 1 && !f32 &&
      p.score == QKV_SCORE_DOT) {
    return kPathRowPipelined;
  }
  if (kX86 && RowInPhases(p)) return kPathRowPhases;
  if (kX86 && RowPipelined(p)) return kPathRowPipelined;
  return kPathRows;
}

// A task's path: the call's, and for tiles the task's width: a forced one
// where the rows fit it, else two row vectors, the 8 rows of GQA-8
// decoding as rows (ScoresRows8: "GQA-8 decoding on the row path"), a
// narrow tile of 8 lanes on 16-lane targets ("Tiles for 16 registers, L2
// prefetch, 8-lane tiles"), or one vector.
template <class O>
inline PathBit Flash<O>::TaskPath(const CallPlan& c, const Problem& p,
                                  const Operands& op, const TileTask& t) {
  if (c.path != kPathTile2) return c.path;
  if (DecodesRows8(p) && t.r0 == 0 &&
      t.rows <= static_cast<int64_t>(O::Lanes()) &&
      (op.kind == kDot || op.kind == kDotScaled) && ScoresRows8(op)) {
    return kPathRows8;
  }
  using O8 = typename O::Narrow8;
  constexpr bool kNarrow = !std::is_same<O8, O>::value;
  const uint32_t forced = ForcedPath();
  if (forced == kPathTile2) return kPathTile2;
  if (forced == kPathTile1 && t.rows <= static_cast<int64_t>(O::Lanes())) {
    return kPathTile1;
  }
  if (kNarrow && forced == kPathTileNarrow &&
      t.rows <= static_cast<int64_t>(O8::Lanes())) {
    return kPathTileNarrow;
  }
  if (t.rows > static_cast<int64_t>(O::Lanes())) return kPathTile2;
  if (kNarrow && t.rows <= static_cast<int64_t>(O8::Lanes())) {
    return kPathTileNarrow;
  }
  return kPathTile1;
}

// GQA-8 decoding: 8 rows of one query each, which a tile may give to the
// row path (TaskPath; its arithmetic is the row path's, so no forced tile
// shape takes it).
template <class O>
inline bool Flash<O>::DecodesRows8(const Problem& p) {
  return p.q_len == 1 && p.group == kRowStateRows;
}

// Phases for one or two rows streaming f32 K and V from memory where keys
// are prefetched late (AMD), x86 only ("One row in phases of key blocks").
template <class O>
inline bool Flash<O>::RowInPhases(const Problem& p) {
  return p.group * p.q_len <= 2 && p.kv_dtype == QKV_DTYPE_F32 &&
         PrefetchesKv(p) && KeysPrefetchedLate();
}

// The pipelined row: int8 K and V, dot scores, streaming, keys prefetched
// late, 8 lanes or more (bench/README.md, "Decoding splits in cache order;
// int8 and token-major on Zen 5": "int8 decoding pipelined").
template <class O>
inline bool Flash<O>::PipelinesInt8(const Problem& p) {
  return p.kv_dtype == QKV_DTYPE_I8 && p.score == QKV_SCORE_DOT &&
         PrefetchesKv(p) && KeysPrefetchedLate() && O::Lanes() >= 8;
}

template <class O>
inline bool Flash<O>::RowPipelined(const Problem& p) {
  return p.group * p.q_len == 1 && PipelinesInt8(p);
}

// A call whose every task takes the pipelined row, split into key splits
// whose tasks follow the cache (head-major): a task may take several
// consecutive splits of its kv head (SplitsPerTask), the pipeline running
// on across their boundaries, each split finished as its own task would
// be (the same partials, merged the same way: the same bits).
template <class O>
inline bool Flash<O>::DecodesPipelined(const Problem& p) {
  return PipelinesInt8(p) && UsesRowPath(p) && p.group * p.q_len == 1 &&
         !InterleavesHeads(p) && !UsesTinyPath(p, O::Lanes()) &&
         KeySplits(p) > 1 && SplitsHeadMajor(p);
}

// Consecutive splits per pipelined task: as many as leave at least 4
// tasks a worker (one worker: a kv head's splits in one task), x86 only
// ("Decoding splits in cache order; int8 and token-major on Zen 5").
template <class O>
inline int64_t Flash<O>::SplitsPerTask(const Problem& p) {
  if (!kX86 || !DecodesPipelined(p)) return 1;
  const int64_t n = KeySplits(p);
  const int64_t heads = static_cast<int64_t>(NumTileTasks(p, TileRows()));
  const int64_t want = 4 * (p.workers > 1 ? p.workers : 1);
  int64_t g = n;
  while (g > 1 && heads * ((n + g - 1) / g) < want) g = (g + 1) / 2;
  return g;
}

// 8 rows of dot scores take RowScores8: an x86 target with its
// full-width transpose (16 or 8 lanes), f32 keys, d whole vectors.
template <class O>
inline bool Flash<O>::ScoresRows8(const Operands& op) {
  return O::kTransposeLanes != 0 && O::Lanes() == O::kTransposeLanes &&
         !op.convert_k && op.dim % static_cast<int64_t>(O::Lanes()) == 0;
}

// Rows scored and accumulated together (RowScoresRows or RowScores8,
// RowOutputRows): 2, 4 or 8 rows (a decoding step at GQA 2, 4 or 8) that
// see the same keys, dot scores. Other groups take their rows one at a
// time.
template <class O>
inline bool Flash<O>::JointRows(const Operands& op, const Tile& tile,
                                int64_t rows) {
  if ((rows != 2 && rows != 4 && (rows != 8 || !ScoresRows8(op))) ||
      (op.kind != kDot && op.kind != kDotScaled)) {
    return false;
  }
  for (int64_t r = 1; r < rows; ++r) {
    if (tile.lo[r] != tile.lo[0] || tile.hi[r] != tile.hi[0]) return false;
  }
  return true;
}

// RunRows' choices for a task's rows: the plan of the row path.
template <class O>
QKV_FLASH_INLINE typename Flash<O>::RowsPlan Flash<O>::PlanRows(
    const Problem& p, const Operands& op, const Tile& tile, int64_t rows) {
  RowsPlan r;
  r.prefetch = PrefetchesKv(p);
  r.fused_v = op.convert_v && rows == 1;
  r.fused_k =
      r.fused_v && op.convert_k && (op.kind == kDot || op.kind == kDotScaled);
  // Joint rows from cache; from DRAM 4 or 8, whose key prefetch spreads
  // over their output; 2 rows one at a time ("Joint rows for GQA-2 and
  // GQA-4 decoding", "Joint rows' key prefetch spread over the whole
  // output").
  r.joint = (!r.prefetch || rows >= 4) && JointRows(op, tile, rows);
  // Rows one at a time prefetch the next block's keys during the values
  // where KeysPrefetchedLate (AMD), not where converting the block is the
  // bound: int8 below 16 lanes, binary16 below 8 ("Keys prefetched during
  // the values on AMD").
  r.keys_late =
      r.prefetch && !r.joint && KeysPrefetchedLate() &&
      (op.ksrc.dtype != QKV_DTYPE_I8 || O::Lanes() >= 16) &&
      !(op.ksrc.dtype == QKV_DTYPE_F16 && O::Lanes() < 8);
  // With keys_late, f32 keys at 16 lanes are left to the hardware
  // prefetchers ("Keys read in order for the hardware prefetchers").
  r.hardware_keys =
      r.keys_late && op.ksrc.dtype == QKV_DTYPE_F32 && O::Lanes() >= 16;
  // The next block's keys prefetched past a split's end, up to the rows'
  // last visible key: the next head-major task's first block, x86 only
  // ("Decoding splits in cache order; int8 and token-major on Zen 5").
  r.keys_past_split = kX86;
  return r;
}

// Where RowScores streams its keys from memory (pf given: the first row
// of a block on the row path) it reads a step's 4 keys one after the
// other (the same bits as interleaved), for the hardware prefetchers' one
// stream; from cache the interleaved order loads each query vector once
// for 4 keys. x86 only, f32 everywhere and f16/bf16 at 16 lanes ("Keys
// read in order for the hardware prefetchers").
template <class O>
template <class E>
constexpr bool Flash<O>::KeyMajorScores() {
  return kX86 && (std::is_same<E, F32Rows>::value ||
                  (O::kTransposeLanes == 16 && !std::is_same<E, I8Rows>::value));
}

// The interleaved path's piece of keys and its prefetch: software
// prefetch (`lead`, kInterleaveKeysPrefetched keys a piece) where the
// hardware prefetchers alone fall short, joint rows and rows off 64-byte
// lines; else kInterleaveKeys, kInterleaveKeysWide for f32 at 16 lanes,
// unprefetched. x86 only ("Interleaved heads for token-major decoding").
template <class O>
QKV_FLASH_INLINE int64_t Flash<O>::HeadsStep(const Operands* ops,
                                             int64_t heads, bool fused,
                                             bool joint, bool* lead) {
  if (!kX86) {
    *lead = false;
    return kInterleaveKeys;
  }
  bool on_lines = true;
  auto lines = [](const KvSource& src) {
    return reinterpret_cast<uintptr_t>(src.base) % 64 == 0 &&
           src.row_bytes % 64 == 0;
  };
  for (int64_t g = 0; g < heads; ++g) {
    on_lines = on_lines && lines(ops[g].ksrc) && lines(ops[g].vsrc);
  }
  *lead = !fused && (joint || !on_lines);
  const bool wide = !fused && O::Lanes() >= 16;
  return *lead ? kInterleaveKeysPrefetched
               : wide ? kInterleaveKeysWide : kInterleaveKeys;
}
