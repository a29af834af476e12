// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the engine entry: the
// call's tasks, each worker's workspace and the one switch on the path a task
// takes, each following the call's plan (PlanCall, plan-inl.h). Included by
// flash-inl.h inside its per-target namespace, after the struct.

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
      const KvSource src = KeySource(p, b, kvh);
      if (p.kv_dtype == QKV_DTYPE_F32) {
        for (int64_t j = 0; j < p.kv_len; ++j) {
          RowScores<kDot>(F32RowAt(src, j), p.w_k, d, d, hidden, 1.0f,
                          nullptr, keys);
          keys += hidden;
        }
        continue;
      }
      // Low precision: each key row dequantized, then projected.
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

// Task `task` of the plan: SplitTaskAt's, or splits_per_task splits of
// one kv head.
template <class O>
inline TileTask Flash<O>::TaskAt(const Problem& p, const CallPlan& c,
                                 size_t task) {
  const int64_t g = c.splits_per_task;
  if (g == 1) return SplitTaskAt(p, task, c.task_rows);
  const int64_t n = KeySplits(p), per_head = (n + g - 1) / g;
  const int64_t t = static_cast<int64_t>(task);
  TileTask r = TileTaskAt(p, static_cast<size_t>(t / per_head), c.task_rows);
  const int64_t first = (t % per_head) * g;
  SetSplits(p, first, n - first < g ? n - first : g, &r);
  return r;
}

template <class O>
inline size_t Flash<O>::NumTasks(const Problem& p) {
  const CallPlan c = PlanCall(p);
  const int64_t g = c.splits_per_task;
  if (g > 1) {
    return NumTileTasks(p, c.task_rows) *
           static_cast<size_t>((KeySplits(p) + g - 1) / g);
  }
  return SplitTasks(p, c.task_rows);
}

template <class O>
inline size_t Flash<O>::WorkspacePerWorker(const Problem& p) {
  switch (PlanCall(p).path) {
    case kPathTiny:
      return LayoutTiny(p, O::Lanes(), nullptr, nullptr);
    case kPathRowsHeads:
      return static_cast<size_t>(HeadGroup(p)) *
             LayoutRowTile(p, O::Lanes(), nullptr, nullptr);
    case kPathTileGroup:
      return static_cast<size_t>(kGroupTiles) *
             LayoutTile(p, O::Lanes(), nullptr, nullptr);
    default:
      return LayoutTile(p, O::Lanes(), nullptr, nullptr);
  }
}

// The one switch on a task's path (TaskPath, plan-inl.h).
template <class O>
inline void Flash<O>::RunTask(const Problem& p, size_t task,
                              const unsigned char* shared,
                              unsigned char* workspace) {
  const CallPlan c = PlanCall(p);
  const TileTask t = TaskAt(p, c, task);
  const Operands op = OperandsFor(p, shared, t.b, t.kvh);
  const PathBit path = TaskPath(c, p, op, t);
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
#if defined(__x86_64__) || defined(__i386__)  // not compiled elsewhere
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
