// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the engine entry: how a
// call divides into tasks, each worker's workspace, and the one switch on the
// path a task takes (TaskPath, RunTask). Included by flash-inl.h after the
// struct; per-target include guard.
#if defined(QKV_PIPELINE_ENTRY_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_PIPELINE_ENTRY_INL_H_
#undef QKV_PIPELINE_ENTRY_INL_H_
#else
#define QKV_PIPELINE_ENTRY_INL_H_
#endif

#ifdef HWY_BEFORE_NAMESPACE
HWY_BEFORE_NAMESPACE();
#endif
namespace qkv {
namespace QKV_SIMD_NAMESPACE {

// Consecutive splits per task: as many as leave at least 4 tasks a
// worker (one worker: a kv head's splits in one task). Each split's first
// and last blocks then overlap their neighbours' instead of reading K
// alone and V alone (S1 int8 decoding from DRAM on Zen 5, one worker:
// 0.95-0.98x the time on the AVX-512 and AVX2 backends; heads not split
// at all measured 0.92-0.93x, f32 and f16 0.96-0.98x, for reasons not
// found: the splits' partials and merge take under 1% of the samples).
template <class O>
inline int64_t Flash<O>::SplitsPerTask(const Problem& p) {
#if defined(__x86_64__) || defined(__i386__)
  if (!DecodesPipelined(p)) return 1;
  const int64_t n = KeySplits(p);
  const int64_t heads = static_cast<int64_t>(NumTileTasks(p, TaskRows(p)));
  const int64_t want = 4 * (p.workers > 1 ? p.workers : 1);
  int64_t g = n;
  while (g > 1 && heads * ((n + g - 1) / g) < want) g = (g + 1) / 2;
  return g;
#else
  (void)p;
  return 1;
#endif
}

// Task `task`: SplitTaskAt's, or SplitsPerTask() splits of one kv head.
template <class O>
inline TileTask Flash<O>::TaskAt(const Problem& p, size_t task) {
  const int64_t g = SplitsPerTask(p);
  if (g == 1) return SplitTaskAt(p, task, TaskRows(p));
  const int64_t n = KeySplits(p), per_head = (n + g - 1) / g;
  const int64_t t = static_cast<int64_t>(task);
  TileTask r = TileTaskAt(p, static_cast<size_t>(t / per_head), TaskRows(p));
  const int64_t first = (t % per_head) * g;
  SetSplits(p, first, n - first < g ? n - first : g, &r);
  return r;
}

template <class O>
inline bool Flash<O>::Supports(const Problem&) { return true; }

// Zeroes the flash-decoding split counters; additive scores: projects
// every key (W_k k) and query (W_q q) once per call.
template <class O>
inline void Flash<O>::Prepare(const Problem& p, unsigned char* shared) {
  ResetSplitCounters(p, shared);
  if (p.score != QKV_SCORE_ADDITIVE) return;
  const int64_t d = p.head_dim, hidden = p.additive_hidden;
  float* keys = reinterpret_cast<float*>(shared);
  float* queries = reinterpret_cast<float*>(shared + ProjectedKeysBytes(p));
  float* key_row = reinterpret_cast<float*>(
      shared + ProjectedKeysBytes(p) + ProjectedQueriesBytes(p));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t kvh = 0; kvh < p.kv_heads; ++kvh) {
      if (p.kv_dtype == QKV_DTYPE_F32) {
        const float* k = KeysOf(p, b, kvh);
        for (int64_t j = 0; j < p.kv_len; ++j) {
          RowScores<kDot>(k + j * p.k_st, p.w_k, d, d, hidden, 1.0f,
                          nullptr, keys);
          keys += hidden;
        }
        continue;
      }
      // Low precision: each key row dequantized, then projected.
      const KvSource src = KeySource(p, b, kvh);
      for (int64_t j = 0; j < p.kv_len; ++j) {
        DequantizeRows(src, j, 1, d, key_row);
        RowScores<kDot>(key_row, p.w_k, d, d, hidden, 1.0f, nullptr, keys);
        keys += hidden;
      }
    }
    for (int64_t h = 0; h < p.q_heads; ++h) {
      for (int64_t i = 0; i < p.q_len; ++i) {
        RowScores<kDot>(QueryRow(p, b, h, i), p.w_q, d, d, hidden, 1.0f,
                        nullptr, queries);
        queries += hidden;
      }
    }
  }
}

template <class O>
inline size_t Flash<O>::TileRows() { return 2 * O::Lanes(); }

// Rows per task: a tile, or a group of them (GroupsTiles).
template <class O>
inline size_t Flash<O>::TaskRows(const Problem& p) {
  return GroupsTiles(p) ? static_cast<size_t>(kGroupTiles) * TileRows()
                        : TileRows();
}

template <class O>
inline size_t Flash<O>::NumTasks(const Problem& p) {
  const int64_t g = SplitsPerTask(p);
  if (g > 1) {
    return NumTileTasks(p, TaskRows(p)) *
           static_cast<size_t>((KeySplits(p) + g - 1) / g);
  }
  return SplitTasks(p, TaskRows(p));
}

template <class O>
inline size_t Flash<O>::WorkspacePerWorker(const Problem& p) {
  if (UsesTinyPath(p, O::Lanes())) {
    return LayoutTiny(p, O::Lanes(), nullptr, nullptr);
  }
  if (InterleavesHeads(p)) {
    return static_cast<size_t>(HeadGroup(p)) *
           LayoutRowTile(p, O::Lanes(), nullptr, nullptr);
  }
  const size_t tile = LayoutTile(p, O::Lanes(), nullptr, nullptr);
  return GroupsTiles(p) ? static_cast<size_t>(kGroupTiles) * tile : tile;
}

// The row path's schedule a test forced (ForcedPath, pipeline/paths.h),
// where the task can take it: RunRows and RunRowPhases a task of one split
// (RunRowPhases: of f32 K and V, at most 2 rows), RunRowPipelined one row
// of fused low-precision dot scores; 0 where none is forced or it cannot.
template <class O>
inline PathBit Flash<O>::ForcedRowPath(const Operands& op, const TileTask& t) {
  const uint32_t forced = ForcedPath();
  if (forced == 0) return PathBit{};
  const bool one_split = t.splits == 1;
  if (forced == kPathRows && one_split) return kPathRows;
#if defined(__x86_64__) || defined(__i386__)
  if (forced == kPathRowPhases && one_split && t.rows <= 2 && !op.convert_k &&
      !op.convert_v) {
    return kPathRowPhases;
  }
  if (forced == kPathRowPipelined && t.rows == 1 && op.convert_k &&
      op.convert_v && (op.kind == kDot || op.kind == kDotScaled)) {
    return kPathRowPipelined;
  }
#else
  (void)op;
#endif
  return PathBit{};
}

// The path a task takes (pipeline/paths.h): RunTask's one choice. The
// rules are those of the functions named; their measurements are at those
// functions and in bench/README.md.
template <class O>
inline PathBit Flash<O>::TaskPath(const Problem& p, const Operands& op,
                                  const TileTask& t) {
  if (InterleavesHeads(p)) return kPathRowsHeads;
  if (UsesTinyPath(p, O::Lanes())) return kPathTiny;
  if (t.row_path) {
    const PathBit forced = ForcedRowPath(op, t);
    if (forced != PathBit{}) return forced;
#if defined(__x86_64__) || defined(__i386__)
    if (RowInPhases(p, op, t)) return kPathRowPhases;
    if (RowPipelined(p, t)) return kPathRowPipelined;
#endif
    return kPathRows;
  }
  if (GroupsTiles(p)) return kPathTileGroup;
  if (t.rows > static_cast<int64_t>(O::Lanes())) return kPathTile2;
  // A tile of one row vector: see RunNarrowTile.
  if (p.q_len == 1 && p.group == kRowStateRows && t.r0 == 0 &&
      (op.kind == kDot || op.kind == kDotScaled) && ScoresRows8(op)) {
    return kPathRows8;
  }
  using O8 = typename O::Narrow8;
  if (!std::is_same<O8, O>::value &&
      t.rows <= static_cast<int64_t>(O8::Lanes())) {
    return kPathTileNarrow;
  }
  return kPathTile1;
}

template <class O>
inline void Flash<O>::RunTask(const Problem& p, size_t task,
                              const unsigned char* shared,
                              unsigned char* workspace) {
  const TileTask t = TaskAt(p, task);
  const Operands op = OperandsFor(p, shared, t.b, t.kvh);
  const PathBit path = TaskPath(p, op, t);
  if (path != kPathRows) TracePath(path);  // RunRows says which rows
  switch (path) {
    case kPathRowsHeads:
      RunRowsHeads(p, t, shared, workspace);
      return;
    case kPathTiny:
      RunTiny(p, op, t, workspace);
      return;
    case kPathTileGroup:
      RunTileGroup(p, op, t, workspace);
      return;
    case kPathTileNarrow:
      RunNarrowTile(p, op, t, shared, workspace);
      return;
    default:
      break;
  }
  Tile tile;
  LayoutTile(p, O::Lanes(), workspace, &tile);
  switch (path) {
#if defined(__x86_64__) || defined(__i386__)
    case kPathRowPhases:
      RunRowPhases(p, op, t, shared, tile);
      return;
    case kPathRowPipelined:
      RunRowPipelined(p, op, t, shared, tile);
      return;
#endif
    case kPathRows:
    case kPathRows8:
      RunRows(p, op, t, shared, tile);
      return;
    case kPathTile1:
      RunTile<1>(p, op, t, shared, tile);
      return;
    default:
      RunTile<2>(p, op, t, shared, tile);
      return;
  }
}

}  // namespace QKV_SIMD_NAMESPACE
}  // namespace qkv
#ifdef HWY_AFTER_NAMESPACE
HWY_AFTER_NAMESPACE();
#endif

#endif  // per-target include guard
