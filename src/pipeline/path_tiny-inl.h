// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the tiny path: at most one
// vector of keys, keys in lanes. Included by flash-inl.h inside its per-target
// namespace, after the struct.

// dst[u] = base[u * stride] for lanes u < count, 0 for the others.
template <class O>
inline void Flash<O>::TransposeRows(const float* base, int64_t stride,
                                    int32_t count, float* dst) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  if (stride * N < (int64_t{1} << 30)) {
    O::StoreRows(base, static_cast<int32_t>(stride), count, dst);
    return;
  }
  for (int64_t u = 0; u < N; ++u) dst[u] = u < count ? base[u * stride] : 0.0f;
}

// K and V of the task's (batch, kv head) transposed into tile.kt and
// tile.vt, keys in lanes; lanes of keys j >= kv_len are 0, never garbage:
// they are masked later, and a 0 keeps every lane's arithmetic finite.
template <class O>
QKV_FLASH_INLINE void Flash<O>::TinyTranspose(const Problem& p,
                                              const Operands& op,
                                              const TinyTile& tile) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const int64_t d = op.dim, dv = p.value_dim, lk = p.kv_len;
  const int32_t count = static_cast<int32_t>(lk);
  const float* k = KeysInPlace(op, 0);  // f32, else dequantized below
  const float* v = ValuesInPlace(op, 0);
  if (op.convert_k) {  // low precision: dequantized first (a few rows)
    for (int64_t j = 0; j < lk; ++j) {
      DequantizeRow(op.ksrc, j, d, tile.kblk + j * d);
    }
    k = tile.kblk;
  }
  if (op.convert_v) {
    for (int64_t j = 0; j < lk; ++j) {
      DequantizeRow(op.vsrc, j, dv, tile.vblk + j * dv);
    }
    v = tile.vblk;
  }
  for (int64_t t = 0; t < d; ++t) {
    TransposeRows(k + t, op.k_st, count, tile.kt + t * N);
  }
  for (int64_t c = 0; c < dv; ++c) {
    TransposeRows(v + c, op.v_st, count, tile.vt + c * N);
  }
}

// Row q's scores of every key, keys in lanes, for each score kind, with
// the kind's finishing factor.
template <class O>
QKV_FLASH_INLINE typename Flash<O>::V Flash<O>::TinyScores(
    const Problem& p, const Operands& op, const TinyTile& tile,
    const float* q) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  const int64_t d = op.dim;
  const V zero = O::Zero();
  V s = zero;
  if (op.kind == kAdditive) {
    for (int64_t t = 0; t < d; ++t) {
      s = ScoreTerm<kAdditive>(O::Set(q[t]), O::Load(tile.kt + t * N),
                               O::Set(p.w_v[t]), s);
    }
  } else if (op.kind == kGaussian) {
    for (int64_t t = 0; t < d; ++t) {
      s = ScoreTerm<kGaussian>(O::Set(q[t]), O::Load(tile.kt + t * N),
                               zero, s);
    }
    s = O::Mul(s, O::Set(op.finish));
  } else {
    for (int64_t t = 0; t < d; ++t) {
      s = O::MulAdd(O::Set(q[t] * op.q_scale), O::Load(tile.kt + t * N),
                    s);
    }
    if (op.kind == kDotScaled) s = O::Mul(s, O::Set(op.finish));
  }
  return s;
}

// Row path for tiny problems, kv_len <= lanes (toy shapes, short caches):
// K and V are transposed once into the workspace and each row's scores,
// softmax and output are a handful of whole-vector operations with keys in
// lanes. Tiny calls are dominated by fixed costs, so this path sets up only
// what it uses (no Tile, no divisions). RunTiny may run it with narrower
// ops than the engine's, whose lanes still hold kv_len keys: it lays out
// the workspace for its own lanes, less than the engine asked for.
template <class O>
inline void Flash<O>::RunRowsTiny(const Problem& p, const Operands& op,
                                  const TileTask& task,
                                  unsigned char* workspace) {
  const int64_t N = static_cast<int64_t>(O::Lanes());
  TinyTile tile;
  LayoutTiny(p, O::Lanes(), workspace, &tile);
  const int64_t b = task.b, kvh = task.kvh;
  const int64_t dv = p.value_dim, lk = p.kv_len;
  TinyTranspose(p, op, tile);
  const float softcap = p.softcap;
  const V key = O::Load(kLaneIndex);
  const bool extras = p.lse != nullptr || p.weights != nullptr;
  // Without a per-row mask every row sees the same keys: one mask.
  const bool shared = RowsShareKeys(p);
  const KeyInterval common = RowKeys(p, 0, 0);
  const auto common_hi = O::Lt(key, O::Set(static_cast<float>(common.hi)));
  const V zero = O::Zero();
  const V neg_inf = O::Set(-INFINITY);
  RowWalker at(p, kvh);
  // Per head: its first query and output row, ALiBi slope and sink.
  int64_t head = -1;
  const float* q_head = nullptr;
  float* out_head = nullptr;
  float neg_slope = 0.0f, sink = -INFINITY;
  for (int64_t r = 0; r < task.rows; ++r) {
    if (at.h != head) {
      head = at.h;
      q_head = QueryOf(op, b, head, 0);
      out_head = OutRow(p, b, head, 0);
      neg_slope = -AlibiSlope(p, head);
      sink = RowSink(p, head);
    }
    const int64_t row = at.Row(p, b);
    const KeyInterval keys = shared ? common : RowKeys(p, b, at.i);
    const float* bias_row = BiasRow(p, b, at.h, at.i);
    const float* q = q_head + at.i * op.q_st;
    float* out = out_head + at.i * p.out_st;
    const int64_t pos = neg_slope != 0.0f ? QueryPos(p, b, at.i) : 0;
    at.Next(p);
    V s = TinyScores(p, op, tile, q);
    float* tail = tile.tail;
    if (softcap > 0.0f) {
      s = Softcapped(s, O::Set(softcap), O::Set(InvCap(softcap)));
    }
    if (bias_row != nullptr) {
      for (int64_t j = 0; j < N; ++j) tail[j] = j < lk ? bias_row[j] : 0.0f;
      const V bias = O::Load(tail);
      s = O::IfThenElse(O::Eq(bias, neg_inf), neg_inf, O::Add(s, bias));
    }
    if (neg_slope != 0.0f) {
      const V dist = Abs(O::Sub(O::Set(static_cast<float>(pos)), key));
      s = O::MulAdd(O::Set(neg_slope), dist, s);
    }
    const auto below_hi =
        shared ? common_hi : O::Lt(key, O::Set(static_cast<float>(keys.hi)));
    s = O::IfThenElse(below_hi, s, neg_inf);
    if (keys.lo > 0) {
      s = O::IfThenElse(O::Lt(key, O::Set(static_cast<float>(keys.lo))),
                        neg_inf, s);
    }
    const float m = O::ReduceMax(s);
    const V e = ExpNonPositive(O::Sub(s, O::Set(m)));
    float l = O::ReduceSum(e);
    // No visible key: the max is -inf, or on targets whose max of an all
    // -inf vector is -FLT_MAX (Highway's EMU128) every term is exp(-inf).
    if (m == -INFINITY) l = 0.0f;
    const auto read = O::Gt(e, zero);  // hidden keys' values are not read
    const bool seen = l > 0.0f;
    if (seen) {
      const float scale = qkv::FinishRow(m, l, sink).scale;
      for (int64_t c = 0; c < dv; ++c) {
        out[c] = O::ReduceSum(O::IfThenElseZero(
                     read, O::Mul(e, O::Load(tile.vt + c * N)))) *
                 scale;
      }
    }
    if (p.weights != nullptr) {  // the raw masked scores
      O::Store(s, tail);
      memcpy(p.weights + row * lk, tail, lk * sizeof(float));
    }
    // Tiny calls are a few ns per row: the finisher only when it has
    // something left to do.
    if (seen && !extras) continue;
    RowState st;
    st.row = row;
    st.out = out;
    st.m = m;
    st.l = l;
    st.sink = sink;
    st.o = nullptr;  // written above
    st.o_stride = 1;
    st.c_begin = 0;
    st.w_lo = 0;
    st.w_hi = lk;
    FinishRow(p, st, tail);
  }
}

// The tiny path with the narrowest vectors that hold kv_len keys.
template <class O>
inline void Flash<O>::RunTiny(const Problem& p, const Operands& op,
                              const TileTask& task, unsigned char* workspace) {
  using O4 = typename O::Narrow4;
  using O8 = typename O::Narrow8;
  if constexpr (!std::is_same<O4, O>::value) {
    if (p.kv_len <= 4) {
      return Flash<O4>::RunRowsTiny(p, op, task, workspace);
    }
  }
  if constexpr (!std::is_same<O8, O>::value) {
    if (p.kv_len <= 8) {
      return Flash<O8>::RunRowsTiny(p, op, task, workspace);
    }
  }
  RunRowsTiny(p, op, task, workspace);
}
