// The pipeline (Flash<O>, src/pipeline/flash-inl.h): the K/V element types, one
// traits type each, and the one switch over them. KvType<O, t> says of element
// type t: its storage type T, whether its rows carry a scale (I8: the row's
// scale multiplies its score or probability, src/semantics.h), a vector load
// widened to f32 (the ops layer's) and the scalar decoding of one element,
// unscaled. The kernels are templates over these traits (the row readers
// F32Rows ... I8Rows of Flash); OnKvType is the one place that turns a run-time
// qkv_dtype into one. Adding a type touches this table, the ops layers' loads
// and the scalar definition (src/semantics.h: KvElementBytes, KvElement), not
// the paths. Included by flash-inl.h inside its per-target namespace, before
// the struct.

template <class O, int kType>
struct KvType;

template <class O>
struct KvType<O, QKV_DTYPE_F32> {
  using T = float;
  static constexpr bool kScaled = false;
  static inline __attribute__((always_inline)) typename O::V Load(
      const T* p) {
    return O::LoadU(p);
  }
  static float At(const T* p, int64_t c) { return p[c]; }
};

template <class O>
struct KvType<O, QKV_DTYPE_F16> {
  using T = uint16_t;
  static constexpr bool kScaled = false;
  static inline __attribute__((always_inline)) typename O::V Load(
      const T* p) {
    return O::LoadF16(p);
  }
  static float At(const T* p, int64_t c) { return F16ToF32(p[c]); }
};

template <class O>
struct KvType<O, QKV_DTYPE_BF16> {
  using T = uint16_t;
  static constexpr bool kScaled = false;
  static inline __attribute__((always_inline)) typename O::V Load(
      const T* p) {
    return O::LoadBF16(p);
  }
  static float At(const T* p, int64_t c) { return BF16ToF32(p[c]); }
};

template <class O>
struct KvType<O, QKV_DTYPE_I8> {
  using T = int8_t;
  static constexpr bool kScaled = true;
  static inline __attribute__((always_inline)) typename O::V Load(
      const T* p) {
    return O::LoadI8(p);
  }
  static float At(const T* p, int64_t c) { return static_cast<float>(p[c]); }
};

// f(KvType<O, t>{}) for a converted element type t (F16, BF16 or I8: f32
// rows are read in place and never dispatched here).
template <class O, class F>
inline __attribute__((always_inline)) void OnKvType(qkv_dtype t, F&& f) {
  switch (t) {
    case QKV_DTYPE_F16:
      return f(KvType<O, QKV_DTYPE_F16>{});
    case QKV_DTYPE_BF16:
      return f(KvType<O, QKV_DTYPE_BF16>{});
    default:
      return f(KvType<O, QKV_DTYPE_I8>{});
  }
}
