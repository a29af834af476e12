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
// <immintrin.h> in scope.
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

#endif
