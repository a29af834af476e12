// The fixed parts of the C ABI: version, backend list, descriptor defaults,
// pinned enum values and the descriptor layout.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "qkv/qkv.h"

namespace qkv_test {
namespace {

// Pinned values.
static_assert(QKV_VERSION_MAJOR == 0 && QKV_VERSION_MINOR == 3 &&
                  QKV_VERSION_PATCH == 0,
              "version macros");
static_assert(QKV_OK == 0 && QKV_ERR_INVALID_ARGUMENT == 1 &&
                  QKV_ERR_WORKSPACE_TOO_SMALL == 2 && QKV_ERR_UNSUPPORTED == 3,
              "status values are pinned forever");
static_assert(QKV_SCORE_DOT == 0 && QKV_SCORE_GAUSSIAN == 1 &&
                  QKV_SCORE_ADDITIVE == 2,
              "score values are pinned");
static_assert(QKV_MASK_NONE == 0 && QKV_MASK_CAUSAL == 1 &&
                  QKV_MASK_VALID_LENS == 2 && QKV_MASK_BIAS == 4,
              "mask flags are pinned");
static_assert(QKV_MASK_WINDOW == 8 && QKV_MASK_KV_START == 16,
              "mask flags added in 0.2 are pinned");
static_assert(QKV_DTYPE_F32 == 0 && QKV_DTYPE_F16 == 1 &&
                  QKV_DTYPE_BF16 == 2 && QKV_DTYPE_I8 == 3,
              "element type values are pinned");
static_assert(std::is_standard_layout<qkv_strides>::value &&
                  sizeof(qkv_strides) == 3 * sizeof(int64_t),
              "qkv_strides is three int64_t");
// The entry points keep their signatures (a mismatch fails to compile).
static_assert(std::is_same<decltype(&qkv_attention),
                           qkv_status (*)(const qkv_attention_desc*,
                                          const float*, const void*,
                                          const void*, float*, float*, float*,
                                          void*, size_t)>::value,
              "qkv_attention signature");
static_assert(
    std::is_same<decltype(&qkv_attention_explain),
                 qkv_status (*)(const qkv_attention_desc*, const float*,
                                const void*, const void*, const float*,
                                const float*, const float*, const void*,
                                size_t, char*, size_t)>::value,
    "qkv_attention_explain signature");
static_assert(std::is_same<decltype(&qkv_attention_f32),
                           qkv_status (*)(const qkv_attention_desc*,
                                          const float*, const float*,
                                          const float*, float*, float*, float*,
                                          void*, size_t)>::value,
              "qkv_attention_f32 signature");
static_assert(std::is_standard_layout<qkv_attention_desc>::value &&
                  std::is_trivially_copyable<qkv_attention_desc>::value,
              "the descriptor is a plain C struct");
static_assert(offsetof(qkv_attention_desc, struct_size) == 0,
              "struct_size comes first");

// The descriptor only grows at its end: on LP64 the contract fields sit at
// these offsets for good, and `backend` (added in 0.1) comes after them.
#if defined(__LP64__) || defined(_WIN64)
static_assert(offsetof(qkv_attention_desc, batch) == 8, "layout");
static_assert(offsetof(qkv_attention_desc, value_dim) == 56, "layout");
static_assert(offsetof(qkv_attention_desc, score) == 64, "layout");
static_assert(offsetof(qkv_attention_desc, scale) == 68, "layout");
static_assert(offsetof(qkv_attention_desc, mask) == 72, "layout");
static_assert(offsetof(qkv_attention_desc, valid_lens) == 80, "layout");
static_assert(offsetof(qkv_attention_desc, bias) == 96, "layout");
static_assert(offsetof(qkv_attention_desc, additive_hidden) == 120, "layout");
static_assert(offsetof(qkv_attention_desc, parallel_for) == 152, "layout");
static_assert(offsetof(qkv_attention_desc, num_workers) == 168, "layout");
static_assert(offsetof(qkv_attention_desc, backend) == 176, "layout");
// 0.2 (tests/reliability/abi_layout.h pins every field on every data model).
static_assert(offsetof(qkv_attention_desc, kv_dtype) == 184, "layout");
static_assert(offsetof(qkv_attention_desc, q_strides) == 208, "layout");
static_assert(offsetof(qkv_attention_desc, window_left) == 352, "layout");
static_assert(offsetof(qkv_attention_desc, softcap) == 376, "layout");
static_assert(offsetof(qkv_attention_desc, kv_start) == 400, "layout");
static_assert(sizeof(qkv_attention_desc) == 408, "layout");
#endif
static_assert(offsetof(qkv_attention_desc, backend) >
                  offsetof(qkv_attention_desc, num_workers),
              "backend was appended after the fixed contract");
// The 0.2 fields follow backend, in the order.
static_assert(offsetof(qkv_attention_desc, kv_dtype) >
                      offsetof(qkv_attention_desc, backend) &&
                  offsetof(qkv_attention_desc, k_scales) >
                      offsetof(qkv_attention_desc, kv_dtype) &&
                  offsetof(qkv_attention_desc, v_scales) >
                      offsetof(qkv_attention_desc, k_scales) &&
                  offsetof(qkv_attention_desc, q_strides) >
                      offsetof(qkv_attention_desc, v_scales) &&
                  offsetof(qkv_attention_desc, k_strides) >
                      offsetof(qkv_attention_desc, q_strides) &&
                  offsetof(qkv_attention_desc, v_strides) >
                      offsetof(qkv_attention_desc, k_strides) &&
                  offsetof(qkv_attention_desc, out_strides) >
                      offsetof(qkv_attention_desc, v_strides) &&
                  offsetof(qkv_attention_desc, k_scale_strides) >
                      offsetof(qkv_attention_desc, out_strides) &&
                  offsetof(qkv_attention_desc, v_scale_strides) >
                      offsetof(qkv_attention_desc, k_scale_strides) &&
                  offsetof(qkv_attention_desc, window_left) >
                      offsetof(qkv_attention_desc, v_scale_strides) &&
                  offsetof(qkv_attention_desc, window_right) >
                      offsetof(qkv_attention_desc, window_left) &&
                  offsetof(qkv_attention_desc, alibi_slopes) >
                      offsetof(qkv_attention_desc, window_right) &&
                  offsetof(qkv_attention_desc, softcap) >
                      offsetof(qkv_attention_desc, alibi_slopes) &&
                  offsetof(qkv_attention_desc, q_pos) >
                      offsetof(qkv_attention_desc, softcap) &&
                  offsetof(qkv_attention_desc, sinks) >
                      offsetof(qkv_attention_desc, q_pos) &&
                  offsetof(qkv_attention_desc, kv_start) >
                      offsetof(qkv_attention_desc, sinks),
              "0.2 fields appended in order");

TEST(AbiTest, VersionMatchesMacros) {
  EXPECT_EQ(qkv_version(), (0u << 16) | (3u << 8) | 0u);
  EXPECT_EQ(qkv_version(), (uint32_t{QKV_VERSION_MAJOR} << 16) |
                               (uint32_t{QKV_VERSION_MINOR} << 8) |
                               uint32_t{QKV_VERSION_PATCH});
}

TEST(AbiTest, BackendIsFirstOfTheList) {
  const char* chosen = qkv_backend();
  ASSERT_NE(chosen, nullptr);
  EXPECT_GT(std::strlen(chosen), 0u);
  ASSERT_GE(qkv_backend_count(), 1u);
  ASSERT_NE(qkv_backend_name(0), nullptr);
  EXPECT_STREQ(chosen, qkv_backend_name(0));
  // Chosen once: stable across calls.
  EXPECT_STREQ(qkv_backend(), chosen);
}

TEST(AbiTest, BackendListIsWellFormed) {
  const size_t n = qkv_backend_count();
  std::set<std::string> names;
  bool has_reference = false;
  for (size_t i = 0; i < n; ++i) {
    const char* name = qkv_backend_name(i);
    ASSERT_NE(name, nullptr) << "index " << i;
    EXPECT_GT(std::strlen(name), 0u);
    EXPECT_TRUE(names.insert(name).second) << "duplicate backend " << name;
    if (std::string(name) == "reference") has_reference = true;
    std::printf("backend %zu: %s\n", i, name);
  }
  EXPECT_TRUE(has_reference) << "the portable reference backend is listed";
  EXPECT_EQ(qkv_backend_name(n), nullptr);
  EXPECT_EQ(qkv_backend_name(n + 1), nullptr);
  EXPECT_EQ(qkv_backend_name(static_cast<size_t>(-1)), nullptr);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// Every Highway target this CPU runs is listed, not only the best one.
TEST(AbiTest, HighwayTargetsOfThisCpuAreListed) {
  std::set<std::string> names;
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    names.insert(qkv_backend_name(i));
  }
  bool any_highway = false;
  for (const std::string& n : names) {
    any_highway = any_highway || n.rfind("highway:", 0) == 0;
  }
  if (!any_highway) GTEST_SKIP() << "this build has no Highway backend";
  __builtin_cpu_init();
  if (__builtin_cpu_supports("sse4.2")) {
    EXPECT_TRUE(names.count("highway:SSE4")) << "highway:SSE4 missing";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    EXPECT_TRUE(names.count("highway:AVX2")) << "highway:AVX2 missing";
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl")) {
    EXPECT_TRUE(names.count("highway:AVX3")) << "highway:AVX3 missing";
  }
}
#endif

#if defined(QKV_TEST_HAVE_HIGHWAY)
// A build with the Highway engine lists at least its static target: on 32-bit
// ARM built for NEON, Debian's libhwy reports only scalar targets, and the
// engine once dropped out of the list there without any test failing.
TEST(AbiTest, HighwayBuildListsHighwayBackends) {
  bool any_highway = false, neon = false;
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    const std::string n = qkv_backend_name(i);
    any_highway = any_highway || n.rfind("highway:", 0) == 0;
    neon = neon || n == "highway:NEON";
  }
  EXPECT_TRUE(any_highway);
#if defined(__ARM_NEON) || defined(__ARM_NEON__)
  EXPECT_TRUE(neon) << "built for NEON, but highway:NEON is not listed";
#else
  (void)neon;
#endif
}
#endif

TEST(AbiTest, DescInitDefaults) {
  qkv_attention_desc d;
  std::memset(&d, 0xAB, sizeof d);
  qkv_attention_desc_init(&d, 2, 8, 4, 5, 7, 64, 32);
  EXPECT_EQ(d.struct_size, sizeof(qkv_attention_desc));
  EXPECT_EQ(d.batch, 2);
  EXPECT_EQ(d.q_heads, 8);
  EXPECT_EQ(d.kv_heads, 4);
  EXPECT_EQ(d.q_len, 5);
  EXPECT_EQ(d.kv_len, 7);
  EXPECT_EQ(d.head_dim, 64);
  EXPECT_EQ(d.value_dim, 32);
  EXPECT_EQ(d.score, QKV_SCORE_DOT);
  EXPECT_FLOAT_EQ(d.scale, 0.125f);
  EXPECT_EQ(d.mask, 0u);
  EXPECT_EQ(d.valid_lens, nullptr);
  EXPECT_EQ(d.valid_lens_per_query, 0);
  EXPECT_EQ(d.bias, nullptr);
  EXPECT_EQ(d.bias_batch_stride, 0);
  EXPECT_EQ(d.bias_head_stride, 0);
  EXPECT_EQ(d.additive_hidden, 0);
  EXPECT_EQ(d.additive_w_q, nullptr);
  EXPECT_EQ(d.additive_w_k, nullptr);
  EXPECT_EQ(d.additive_w_v, nullptr);
  EXPECT_EQ(d.parallel_for, nullptr);
  EXPECT_EQ(d.parallel_ctx, nullptr);
  EXPECT_EQ(d.num_workers, 0u);
  EXPECT_EQ(d.backend, nullptr);
  // 0.2: f32, dense, no window, no ALiBi, no softcap, default positions, no
  // sinks, no kv_start.
  EXPECT_EQ(d.kv_dtype, QKV_DTYPE_F32);
  EXPECT_EQ(d.k_scales, nullptr);
  EXPECT_EQ(d.v_scales, nullptr);
  const qkv_strides* strides[] = {&d.q_strides,   &d.k_strides,
                                  &d.v_strides,   &d.out_strides,
                                  &d.k_scale_strides, &d.v_scale_strides};
  for (const qkv_strides* s : strides) {
    EXPECT_EQ(s->batch, 0);
    EXPECT_EQ(s->head, 0);
    EXPECT_EQ(s->token, 0);
  }
  EXPECT_EQ(d.window_left, 0);
  EXPECT_EQ(d.window_right, 0);
  EXPECT_EQ(d.alibi_slopes, nullptr);
  EXPECT_EQ(d.softcap, 0.0f);
  EXPECT_EQ(d.q_pos, nullptr);
  EXPECT_EQ(d.sinks, nullptr);
  EXPECT_EQ(d.kv_start, nullptr);
}

// The exported initializer of 0.2's binaries writes 0.2's struct and not
// one byte more (408 bytes on 64-bit targets), whatever the library's
// descriptor has grown to. This source calls it by its exported name, past
// the header's inline spelling.
#pragma push_macro("qkv_attention_desc_init")
#undef qkv_attention_desc_init
void (*const kExportedInit)(qkv_attention_desc*, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t,
                            int64_t) = &qkv_attention_desc_init;
#pragma pop_macro("qkv_attention_desc_init")

TEST(AbiTest, DescInitOf02WritesOnly02Bytes) {
  const size_t size02 = sizeof(void*) == 8 ? 408 : sizeof(qkv_attention_desc);
  unsigned char block[sizeof(qkv_attention_desc) + 64];
  std::memset(block, 0xA5, sizeof block);
  kExportedInit(reinterpret_cast<qkv_attention_desc*>(block), 1, 2, 1, 3, 5,
                16, 8);
  for (size_t i = size02; i < sizeof block; ++i) {
    ASSERT_EQ(block[i], 0xA5) << "byte " << i << " written";
  }
  qkv_attention_desc d;
  std::memcpy(&d, block, size02);
  EXPECT_EQ(d.struct_size, size02);
  EXPECT_EQ(d.q_heads, 2);
  EXPECT_EQ(d.value_dim, 8);
  EXPECT_FLOAT_EQ(d.scale, 0.25f);
}

// The sized initializer writes exactly struct_size bytes: the defaults of
// the fields that fit, zeros past this library's struct, nothing after.
TEST(AbiTest, DescInitSizedWritesExactlyItsSize) {
  constexpr size_t kMax = sizeof(qkv_attention_desc) + 96;
  const size_t sizes[] = {sizeof(size_t),
                          offsetof(qkv_attention_desc, value_dim) + 8,
                          offsetof(qkv_attention_desc, kv_dtype),
                          sizeof(qkv_attention_desc) - 8,
                          sizeof(qkv_attention_desc),
                          sizeof(qkv_attention_desc) + 8,
                          sizeof(qkv_attention_desc) + 40};
  for (size_t size : sizes) {
    unsigned char block[kMax + 32];
    std::memset(block, 0xA5, sizeof block);
    auto* d = reinterpret_cast<qkv_attention_desc*>(block);
    qkv_attention_desc_init_sized(d, size, 2, 8, 4, 5, 7, 64, 32);
    for (size_t i = size; i < sizeof block; ++i) {
      ASSERT_EQ(block[i], 0xA5) << "size " << size << ": byte " << i;
    }
    EXPECT_EQ(d->struct_size, size);
    qkv_attention_desc full;
    qkv_attention_desc_init(&full, 2, 8, 4, 5, 7, 64, 32);
    full.struct_size = size;
    const size_t known = size < sizeof full ? size : sizeof full;
    EXPECT_EQ(std::memcmp(block, &full, known), 0) << size;
    for (size_t i = known; i < size; ++i) {
      ASSERT_EQ(block[i], 0) << "size " << size << ": byte " << i;
    }
  }
  // Too small to hold struct_size, or NULL: nothing written.
  unsigned char small[sizeof(size_t)];
  std::memset(small, 0xA5, sizeof small);
  qkv_attention_desc_init_sized(reinterpret_cast<qkv_attention_desc*>(small),
                                sizeof(size_t) - 1, 1, 1, 1, 1, 1, 1, 1);
  for (unsigned char c : small) EXPECT_EQ(c, 0xA5);
  qkv_attention_desc_init_sized(nullptr, sizeof(qkv_attention_desc), 1, 1, 1,
                                1, 1, 1, 1);
}

// A descriptor the sized initializer made larger than this library's struct
// (a newer header) is served while its extra bytes stay zero.
TEST(AbiTest, DescInitSizedLargerStructIsServed) {
  struct Newer {
    qkv_attention_desc d;
    int64_t future;
  } n;
  qkv_attention_desc_init_sized(&n.d, sizeof n, 1, 1, 1, 2, 3, 4, 4);
  EXPECT_EQ(n.future, 0);
  const float q[8] = {1, 2, 3, 4, 5, 6, 7, 8}, k[12] = {1}, v[12] = {2};
  float out[8];
  std::vector<unsigned char> ws(qkv_attention_workspace_size(&n.d) + 1);
  EXPECT_EQ(qkv_attention_f32(&n.d, q, k, v, out, nullptr, nullptr, ws.data(),
                              ws.size()),
            QKV_OK);
  n.future = 3;
  EXPECT_EQ(qkv_attention_f32(&n.d, q, k, v, out, nullptr, nullptr, ws.data(),
                              ws.size()),
            QKV_ERR_UNSUPPORTED);
}

// This header's spelling is the sized initializer with this header's size.
TEST(AbiTest, DescInitOfThisHeaderIsSized) {
  qkv_attention_desc d;
  std::memset(&d, 0xAB, sizeof d);
  qkv_attention_desc_init(&d, 1, 1, 1, 1, 1, 4, 4);
  EXPECT_EQ(d.struct_size, sizeof(qkv_attention_desc));
  void (*init)(qkv_attention_desc*, int64_t, int64_t, int64_t, int64_t,
               int64_t, int64_t, int64_t) = &qkv_attention_desc_init;
  EXPECT_NE(init, kExportedInit);
  std::memset(&d, 0xAB, sizeof d);
  init(&d, 1, 1, 1, 1, 1, 4, 4);
  EXPECT_EQ(d.struct_size, sizeof(qkv_attention_desc));
}

// The 0.2 entry points are exported and callable: a trivially valid call
// through each (batch 0: nothing to do).
TEST(AbiTest, EntryPointsOf02Exist) {
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 0, 1, 1, 1, 1, 1, 1);
  EXPECT_EQ(qkv_attention(&d, nullptr, nullptr, nullptr, nullptr, nullptr,
                          nullptr, nullptr, 0),
            QKV_OK);
  char message[16] = "x";
  EXPECT_EQ(qkv_attention_explain(&d, nullptr, nullptr, nullptr, nullptr,
                                  nullptr, nullptr, nullptr, 0, message,
                                  sizeof message),
            QKV_OK);
  EXPECT_STREQ(message, "ok");
}

TEST(AbiTest, DescInitScaleIsInverseSqrtHeadDim) {
  for (int64_t head_dim : {1, 2, 3, 7, 16, 80, 128, 255}) {
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, 1, 1, 1, 1, 1, head_dim, 1);
    EXPECT_NEAR(d.scale, 1.0 / std::sqrt(static_cast<double>(head_dim)), 1e-7)
        << head_dim;
  }
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 1, 1, 1, 1, 1, 0, 1);
  EXPECT_EQ(d.scale, 0.0f);
  qkv_attention_desc_init(&d, 1, 1, 1, 1, 1, -4, 1);
  EXPECT_EQ(d.scale, 0.0f);
}

TEST(AbiTest, WorkspaceSizeOfTheDefaultDescriptorIsSane) {
  qkv_attention_desc d;
  qkv_attention_desc_init(&d, 1, 1, 1, 16, 16, 16, 16);
  // Bounded: a 16x16 problem does not need megabytes.
  EXPECT_LT(qkv_attention_workspace_size(&d), size_t{1} << 24);
}

}  // namespace
}  // namespace qkv_test
