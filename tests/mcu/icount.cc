// Executed-instruction counts of one attention call per backend on the same
// board: 64 queries x 64 keys, head_dim = value_dim = 32, DOT, no mask, one
// head; f32 K and V (qkv_attention_f32), and F16, BF16 and I8 caches of the
// same values (qkv_attention) when the library serves them
// (QKV_LOW_PRECISION_KV). Run under `qemu-system-arm -icount shift=0` (one
// instruction = one nanosecond of virtual time), where SysTick, clocked by
// the CPU clock in virtual time, counts instructions / (ns per tick). The
// ratio is calibrated on a loop of a known instruction count, so the board's
// clock frequency need not be known. toolchains/icount.sh runs it.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "qkv/qkv.h"

namespace {

constexpr int kL = 64, kD = 32;
float g_q[kL * kD], g_k[kL * kD], g_v[kL * kD], g_out[kL * kD];
unsigned char g_ws[QKV_REFERENCE_WORKSPACE_SIZE(kL, 0, 1)];
// The caches: F16 or BF16 in the 16-bit arrays, I8 in the bytes.
uint16_t g_k16[kL * kD], g_v16[kL * kD];
int8_t g_k8[kL * kD], g_v8[kL * kD];
float g_k_scales[kL], g_v_scales[kL];

const qkv_dtype kTypes[] = {QKV_DTYPE_F32, QKV_DTYPE_F16, QKV_DTYPE_BF16,
                            QKV_DTYPE_I8};
const char* const kTypeNames[] = {"f32", "f16", "bf16", "i8"};

// d with K and V of type t (converted from g_k, g_v), and its k and v.
void UseType(qkv_dtype t, qkv_attention_desc* d, const void** k,
             const void** v) {
  d->kv_dtype = t;
  *k = g_k;
  *v = g_v;
  if (t == QKV_DTYPE_F16 || t == QKV_DTYPE_BF16) {
    qkv_quantize_rows(t, kL, kD, g_k, 0, g_k16, 0, nullptr);
    qkv_quantize_rows(t, kL, kD, g_v, 0, g_v16, 0, nullptr);
    *k = g_k16;
    *v = g_v16;
  } else if (t == QKV_DTYPE_I8) {
    qkv_quantize_rows(t, kL, kD, g_k, 0, g_k8, 0, g_k_scales);
    qkv_quantize_rows(t, kL, kD, g_v, 0, g_v8, 0, g_v_scales);
    *k = g_k8;
    *v = g_v8;
    d->k_scales = g_k_scales;
    d->v_scales = g_v_scales;
  }
}

volatile uint32_t* const kSystCsr = reinterpret_cast<uint32_t*>(0xE000E010u);
volatile uint32_t* const kSystRvr = reinterpret_cast<uint32_t*>(0xE000E014u);
volatile uint32_t* const kSystCvr = reinterpret_cast<uint32_t*>(0xE000E018u);

void StartTicks() {
  *kSystCsr = 0;
  *kSystRvr = 0x00FFFFFFu;
  *kSystCvr = 0;
  *kSystCsr = 5;  // enable, processor clock, no interrupt
  while (*kSystCvr == 0) {
  }  // the first tick loads the reload value
}
// Ticks since StartTicks (the counter counts down from 2^24 - 1; the calls
// here stay well below 2^24 ticks).
uint32_t Ticks() { return 0x00FFFFFFu - *kSystCvr; }

// 2 * n + 1 instructions.
__attribute__((noinline)) void KnownLoop(uint32_t n) {
  __asm__ volatile("1: subs %0, %0, #1\n bne 1b" : "+r"(n));
}

}  // namespace

int main() {
  uint32_t seed = 1;
  for (int i = 0; i < kL * kD; ++i) {
    seed = seed * 1664525u + 1013904223u;
    g_q[i] = static_cast<float>(seed >> 8) / 16777216.0f - 0.5f;
    g_k[i] = g_q[i] * 0.5f + 0.1f;
    g_v[i] = static_cast<float>(i % 7) - 3.0f;
  }
  const uint32_t kLoop = 1000000;
  StartTicks();
  const uint32_t t0 = Ticks();
  KnownLoop(kLoop);
  const uint32_t calib = Ticks() - t0;
  const double per_tick = (2.0 * kLoop + 1) / calib;
  printf("calibration: %u ticks for %u instructions (%.3f instructions/tick)\n",
         static_cast<unsigned>(calib), static_cast<unsigned>(2 * kLoop + 1),
         per_tick);

  double reference = 0;
  int status = 0;
  for (size_t i = 0; i < qkv_backend_count(); ++i) {
    for (size_t t = 0; t < sizeof kTypes / sizeof kTypes[0]; ++t) {
      qkv_attention_desc d;
      qkv_attention_desc_init(&d, 1, 1, 1, kL, kL, kD, kD);
      d.backend = qkv_backend_name(i);
      const void *k, *v;
      UseType(kTypes[t], &d, &k, &v);
      const size_t ws = qkv_attention_workspace_size(&d);
      // Warm-up call (first use builds the backend list), then the measured
      // one; f32 through qkv_attention_f32, as f32 firmware calls it.
      qkv_status st =
          qkv_attention(&d, g_q, k, v, g_out, nullptr, nullptr, g_ws, ws);
      if (st == QKV_ERR_UNSUPPORTED && t > 0) {
        printf("%-10s %-4s: not built (QKV_LOW_PRECISION_KV=OFF)\n", d.backend,
               kTypeNames[t]);
        continue;
      }
      StartTicks();
      const uint32_t a = Ticks();
      st = t == 0 ? qkv_attention_f32(&d, g_q, g_k, g_v, g_out, nullptr,
                                      nullptr, g_ws, ws)
                  : qkv_attention(&d, g_q, k, v, g_out, nullptr, nullptr, g_ws,
                                  ws);
      const uint32_t ticks = Ticks() - a;
      const double insns = ticks * per_tick;
      if (st != QKV_OK) status = 1;
      if (t == 0 && strcmp(d.backend, "reference") == 0) reference = insns;
      printf(
          "%-10s %-4s 64x64 d32: %9.0f instructions (%u ticks), %.1f per "
          "(query, key)\n",
          d.backend, kTypeNames[t], insns, static_cast<unsigned>(ticks),
          insns / (kL * kL));
    }
  }
  for (size_t i = 0; i < qkv_backend_count() && reference > 0; ++i) {
    if (strcmp(qkv_backend_name(i), "reference") == 0) continue;
    qkv_attention_desc d;
    qkv_attention_desc_init(&d, 1, 1, 1, kL, kL, kD, kD);
    d.backend = qkv_backend_name(i);
    const size_t ws = qkv_attention_workspace_size(&d);
    StartTicks();
    const uint32_t a = Ticks();
    qkv_attention_f32(&d, g_q, g_k, g_v, g_out, nullptr, nullptr, g_ws, ws);
    printf("reference / %s (f32) = %.2fx fewer instructions\n", d.backend,
           reference / ((Ticks() - a) * per_tick));
  }
  return status;
}
