// In-register transpose of a square block of floats on x86, shared by the
// SIMD engines to pack Q and unpack the transposed output of a tile: v[i] is
// row i going in and column i coming out. 16 x 16 with AVX-512 (64 shuffles
// against 16 gathers of 16 lanes), 8 x 8 with AVX (24 shuffles). Per 128-bit
// block, rows are first transposed 4 x 4 (unpack, then shuffle); the blocks
// are then transposed across vectors.
//
// Deliberately no include guard: an engine includes this inside its own
// per-target namespace (Highway compiles its engine once per target, each
// pass under that target's attributes), once per target. The includer sets
// QKV_TRANSPOSE_BITS to 512 or 256 for the overload it wants and has
// <immintrin.h> in scope. It also gets SumRegisters, the lane sums of 16
// (8) vectors in the order the transpose and a tree of adds give, and
// SumRegisters4, the lane sums of 4 vectors in an engine's own reduction
// order.
#if QKV_TRANSPOSE_BITS == 512

static inline __attribute__((always_inline)) void TransposeRegisters(
    __m512* v) {
  __m512 a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
    a[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
  }
  // b[4g + m], 128-bit block k: column 4k + m of rows 4g..4g+3.
  for (int g = 0; g < 16; g += 4) {
    b[g] = _mm512_shuffle_ps(a[g], a[g + 2], 0x44);
    b[g + 1] = _mm512_shuffle_ps(a[g], a[g + 2], 0xEE);
    b[g + 2] = _mm512_shuffle_ps(a[g + 1], a[g + 3], 0x44);
    b[g + 3] = _mm512_shuffle_ps(a[g + 1], a[g + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    const __m512 c0 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x44);
    const __m512 c1 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xEE);
    const __m512 c2 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x44);
    const __m512 c3 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xEE);
    v[m] = _mm512_shuffle_f32x4(c0, c2, 0x88);
    v[4 + m] = _mm512_shuffle_f32x4(c0, c2, 0xDD);
    v[8 + m] = _mm512_shuffle_f32x4(c1, c3, 0x88);
    v[12 + m] = _mm512_shuffle_f32x4(c1, c3, 0xDD);
  }
}

// Lane i of the result: the sum of v[i]'s 16 lanes, added as a 16 x 16
// transpose followed by a tree of adds would add them (((l0 + l1) +
// (l2 + l3)) + ((l4 + l5) + (l6 + l7))) + (the same for lanes 8..15), so the
// same bits, in 30 shuffles and 15 adds instead of 64 and 15. Each step
// adds the even and odd elements (or 128-bit blocks) of two vectors, side
// by side.
static inline __attribute__((always_inline)) __m512 SumRegisters(
    const __m512* v) {
  // Per 128-bit block k of p[i]: v[2i] lanes 4k+(0+1), 4k+(2+3), then
  // v[2i+1]'s.
  __m512 p[8];
  for (int i = 0; i < 8; ++i) {
    p[i] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0x88),
                         _mm512_shuffle_ps(v[2 * i], v[2 * i + 1], 0xDD));
  }
  // Block k of s[i]: lanes 4k..4k+3 of v[4i], v[4i+1], v[4i+2], v[4i+3].
  __m512 s[4];
  for (int i = 0; i < 4; ++i) {
    s[i] = _mm512_add_ps(_mm512_shuffle_ps(p[2 * i], p[2 * i + 1], 0x88),
                         _mm512_shuffle_ps(p[2 * i], p[2 * i + 1], 0xDD));
  }
  // Blocks of h[i]: lanes 0..7 then 8..15 of v[8i..8i+3], the same of
  // v[8i+4..8i+7].
  __m512 h[2];
  for (int i = 0; i < 2; ++i) {
    h[i] = _mm512_add_ps(_mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(s[2 * i], s[2 * i + 1], 0xDD));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(h[0], h[1], 0x88),
                       _mm512_shuffle_f32x4(h[0], h[1], 0xDD));
}

// The lane sums of 4 vectors, [sum a, sum b, sum c, sum d], in the order of
// the engine's own single-vector reduction, so the same bits as 4 of them
// in about a third of the shuffles: lanes i + (i + 8), then i + (i + 4),
// then per 4 lanes t either (t0 + t2) + (t1 + t3) (Highway's SumOfLanes,
// kAdjacent false) or (t0 + t1) + (t2 + t3) (xsimd's hadd, kAdjacent true).
template <bool kAdjacent>
static inline __attribute__((always_inline)) __m128 SumRegisters4(
    __m512 a, __m512 b, __m512 c, __m512 d) {
  // 256-bit halves of ab: the 8-lane sums of a, then of b.
  const __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44),
                                  _mm512_shuffle_f32x4(a, b, 0xEE));
  const __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44),
                                  _mm512_shuffle_f32x4(c, d, 0xEE));
  // 128-bit block k: the 4-lane sums of a, b, c, d.
  const __m512 t = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88),
                                 _mm512_shuffle_f32x4(ab, cd, 0xDD));
  const int kFirst = kAdjacent ? 0xB1 : 0x4E, kSecond = kAdjacent ? 0x4E : 0xB1;
  const __m512 u = _mm512_add_ps(t, _mm512_permute_ps(t, kFirst));
  const __m512 r = _mm512_add_ps(u, _mm512_permute_ps(u, kSecond));
  return _mm512_castps512_ps128(_mm512_permutexvar_ps(
      _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), r));
}

#elif QKV_TRANSPOSE_BITS == 256

static inline __attribute__((always_inline)) void TransposeRegisters(
    __m256* v) {
  __m256 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm256_unpacklo_ps(v[i], v[i + 1]);
    a[i + 1] = _mm256_unpackhi_ps(v[i], v[i + 1]);
  }
  for (int g = 0; g < 8; g += 4) {
    b[g] = _mm256_shuffle_ps(a[g], a[g + 2], 0x44);
    b[g + 1] = _mm256_shuffle_ps(a[g], a[g + 2], 0xEE);
    b[g + 2] = _mm256_shuffle_ps(a[g + 1], a[g + 3], 0x44);
    b[g + 3] = _mm256_shuffle_ps(a[g + 1], a[g + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    v[m] = _mm256_permute2f128_ps(b[m], b[4 + m], 0x20);
    v[4 + m] = _mm256_permute2f128_ps(b[m], b[4 + m], 0x31);
  }
}

// Lane i of the result: the sum of v[i]'s 8 lanes as ((l0 + l1) + (l2 +
// l3)) + ((l4 + l5) + (l6 + l7)), in 14 shuffles and 7 adds (as the 512-bit
// SumRegisters: even and odd elements, then 128-bit blocks, side by side).
static inline __attribute__((always_inline)) __m256 SumRegisters(
    const __m256* v) {
  // Per 128-bit block k of p[i]: v[2i] lanes 4k+(0+1), 4k+(2+3), then
  // v[2i+1]'s.
  __m256 p[4];
  for (int i = 0; i < 4; ++i) {
    p[i] = _mm256_add_ps(_mm256_shuffle_ps(v[2 * i], v[2 * i + 1], 0x88),
                         _mm256_shuffle_ps(v[2 * i], v[2 * i + 1], 0xDD));
  }
  // Block k of s[i]: lanes 4k..4k+3 of v[4i], v[4i+1], v[4i+2], v[4i+3].
  __m256 s[2];
  for (int i = 0; i < 2; ++i) {
    s[i] = _mm256_add_ps(_mm256_shuffle_ps(p[2 * i], p[2 * i + 1], 0x88),
                         _mm256_shuffle_ps(p[2 * i], p[2 * i + 1], 0xDD));
  }
  return _mm256_add_ps(_mm256_permute2f128_ps(s[0], s[1], 0x20),
                       _mm256_permute2f128_ps(s[0], s[1], 0x31));
}

// As the 512-bit SumRegisters4: lanes i + (i + 4), then per 4 lanes t
// (t0 + t2) + (t1 + t3) (kAdjacent false) or (t0 + t1) + (t2 + t3).
template <bool kAdjacent>
static inline __attribute__((always_inline)) __m128 SumRegisters4(
    __m256 a, __m256 b, __m256 c, __m256 d) {
  // Block 0 of ab: the 4-lane sums of a; block 1: of b.
  const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20),
                                  _mm256_permute2f128_ps(a, b, 0x31));
  const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20),
                                  _mm256_permute2f128_ps(c, d, 0x31));
  // Per block: [pair sums of ab's block, pair sums of cd's block].
  const int kLo = kAdjacent ? 0x88 : 0x44, kHi = kAdjacent ? 0xDD : 0xEE;
  const __m256 u = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, kLo),
                                 _mm256_shuffle_ps(ab, cd, kHi));
  // Lane 0 of block 0: a's sum, lane 2: c's; block 1: b's, d's.
  const __m256 r = _mm256_add_ps(u, _mm256_permute_ps(u, 0xB1));
  return _mm256_castps256_ps128(
      _mm256_permutevar8x32_ps(r, _mm256_set_epi32(0, 0, 0, 0, 6, 2, 4, 0)));
}

#endif
