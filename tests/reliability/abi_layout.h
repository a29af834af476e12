/* Pins the layout of qkv_attention_desc: its size and the offset of every
 * field, on every data model qkv ships to. Included by abi_layout_c.c
 * (compiled as C99) and abi_layout_cxx.cc (as C++11); a layout change stops
 * the build. The CTest tests `reliability_abi_layout_*` also compile it for
 * 32-bit targets (i386, ARMv7 and Cortex-M) with -fsyntax-only.
 *
 * Three data models, all with 32-bit int, 32-bit float and 32-bit enums:
 *  - 64-bit (LP64 and LLP64: size_t and pointers are 8 bytes);
 *  - 32-bit with 8-byte int64_t alignment (ARM AAPCS: Cortex-A and Cortex-M,
 *    RISC-V ilp32, and most other 32-bit ABIs);
 *  - 32-bit with 4-byte int64_t alignment inside structs (i386 System V).
 * The descriptor only ever grows at its end, so these offsets never change;
 * a new field adds a line and changes only the size (0.2 added the lines
 * from kv_dtype on). */
#ifndef QKV_TESTS_RELIABILITY_ABI_LAYOUT_H_
#define QKV_TESTS_RELIABILITY_ABI_LAYOUT_H_

#include <stddef.h>
#include <stdint.h>

#include "qkv/qkv.h"

/* C99 has no static_assert: a negative array size stops the compile. */
#if defined(__cplusplus)
#define QKV_LAYOUT_ASSERT(name, cond) static_assert(cond, #name)
#else
#define QKV_LAYOUT_ASSERT(name, cond) \
  typedef char qkv_layout_assert_##name[(cond) ? 1 : -1]
#endif

/* Alignment of int64_t as a struct member on this target. */
struct qkv_layout_i64_probe {
  char c;
  int64_t x;
};
#define QKV_LAYOUT_I64_ALIGN offsetof(struct qkv_layout_i64_probe, x)

#define QKV_PIN(field, off) \
  QKV_LAYOUT_ASSERT(field, offsetof(qkv_attention_desc, field) == (off))

QKV_LAYOUT_ASSERT(enum_is_32_bit, sizeof(qkv_score) == 4);
QKV_LAYOUT_ASSERT(status_is_32_bit, sizeof(qkv_status) == 4);
QKV_LAYOUT_ASSERT(float_is_32_bit, sizeof(float) == 4);
QKV_LAYOUT_ASSERT(struct_size_first,
                  offsetof(qkv_attention_desc, struct_size) == 0);
QKV_LAYOUT_ASSERT(dtype_is_32_bit, sizeof(qkv_dtype) == 4);
/* qkv_strides (0.2): three int64_t on every data model. */
QKV_LAYOUT_ASSERT(strides_size, sizeof(qkv_strides) == 24);
QKV_LAYOUT_ASSERT(strides_batch, offsetof(qkv_strides, batch) == 0);
QKV_LAYOUT_ASSERT(strides_head, offsetof(qkv_strides, head) == 8);
QKV_LAYOUT_ASSERT(strides_token, offsetof(qkv_strides, token) == 16);

#if UINTPTR_MAX == 0xffffffffffffffffu
/* ---- 64-bit: LP64 (Linux, macOS) and LLP64 (Windows) ---- */
QKV_LAYOUT_ASSERT(pointers_are_64_bit,
                  sizeof(void *) == 8 && sizeof(size_t) == 8);
QKV_PIN(struct_size, 0);
QKV_PIN(batch, 8);
QKV_PIN(q_heads, 16);
QKV_PIN(kv_heads, 24);
QKV_PIN(q_len, 32);
QKV_PIN(kv_len, 40);
QKV_PIN(head_dim, 48);
QKV_PIN(value_dim, 56);
QKV_PIN(score, 64);
QKV_PIN(scale, 68);
QKV_PIN(mask, 72);
QKV_PIN(valid_lens, 80);
QKV_PIN(valid_lens_per_query, 88);
QKV_PIN(bias, 96);
QKV_PIN(bias_batch_stride, 104);
QKV_PIN(bias_head_stride, 112);
QKV_PIN(additive_hidden, 120);
QKV_PIN(additive_w_q, 128);
QKV_PIN(additive_w_k, 136);
QKV_PIN(additive_w_v, 144);
QKV_PIN(parallel_for, 152);
QKV_PIN(parallel_ctx, 160);
QKV_PIN(num_workers, 168);
QKV_PIN(backend, 176);
/* 0.2 */
QKV_PIN(kv_dtype, 184);
QKV_PIN(k_scales, 192);
QKV_PIN(v_scales, 200);
QKV_PIN(q_strides, 208);
QKV_PIN(k_strides, 232);
QKV_PIN(v_strides, 256);
QKV_PIN(out_strides, 280);
QKV_PIN(k_scale_strides, 304);
QKV_PIN(v_scale_strides, 328);
QKV_PIN(window_left, 352);
QKV_PIN(window_right, 360);
QKV_PIN(alibi_slopes, 368);
QKV_PIN(softcap, 376);
QKV_PIN(q_pos, 384);
QKV_PIN(sinks, 392);
QKV_PIN(kv_start, 400);
QKV_LAYOUT_ASSERT(size, sizeof(qkv_attention_desc) == 408);

#elif UINTPTR_MAX == 0xffffffffu
/* ---- 32-bit: size_t and pointers are 4 bytes ---- */
QKV_LAYOUT_ASSERT(pointers_are_32_bit,
                  sizeof(void *) == 4 && sizeof(size_t) == 4);
QKV_PIN(struct_size, 0);
#if defined(__i386__) || defined(_M_IX86)
/* i386 System V: int64_t members are 4-byte aligned, the struct too. */
QKV_LAYOUT_ASSERT(i386_int64_align, QKV_LAYOUT_I64_ALIGN == 4);
QKV_PIN(batch, 4);
QKV_PIN(q_heads, 12);
QKV_PIN(kv_heads, 20);
QKV_PIN(q_len, 28);
QKV_PIN(kv_len, 36);
QKV_PIN(head_dim, 44);
QKV_PIN(value_dim, 52);
QKV_PIN(score, 60);
QKV_PIN(scale, 64);
QKV_PIN(mask, 68);
QKV_PIN(valid_lens, 72);
QKV_PIN(valid_lens_per_query, 76);
QKV_PIN(bias, 80);
QKV_PIN(bias_batch_stride, 84);
QKV_PIN(bias_head_stride, 92);
QKV_PIN(additive_hidden, 100);
QKV_PIN(additive_w_q, 108);
QKV_PIN(additive_w_k, 112);
QKV_PIN(additive_w_v, 116);
QKV_PIN(parallel_for, 120);
QKV_PIN(parallel_ctx, 124);
QKV_PIN(num_workers, 128);
QKV_PIN(backend, 132);
/* 0.2 */
QKV_PIN(kv_dtype, 136);
QKV_PIN(k_scales, 140);
QKV_PIN(v_scales, 144);
QKV_PIN(q_strides, 148);
QKV_PIN(k_strides, 172);
QKV_PIN(v_strides, 196);
QKV_PIN(out_strides, 220);
QKV_PIN(k_scale_strides, 244);
QKV_PIN(v_scale_strides, 268);
QKV_PIN(window_left, 292);
QKV_PIN(window_right, 300);
QKV_PIN(alibi_slopes, 308);
QKV_PIN(softcap, 312);
QKV_PIN(q_pos, 316);
QKV_PIN(sinks, 320);
QKV_PIN(kv_start, 324);
QKV_LAYOUT_ASSERT(size, sizeof(qkv_attention_desc) == 328);
#else
/* ARM AAPCS (Cortex-A, Cortex-M), RISC-V ilp32, ...: int64_t members are
 * 8-byte aligned, so padding follows struct_size and the struct ends on a
 * multiple of 8. */
QKV_LAYOUT_ASSERT(int64_align_8, QKV_LAYOUT_I64_ALIGN == 8);
QKV_PIN(batch, 8);
QKV_PIN(q_heads, 16);
QKV_PIN(kv_heads, 24);
QKV_PIN(q_len, 32);
QKV_PIN(kv_len, 40);
QKV_PIN(head_dim, 48);
QKV_PIN(value_dim, 56);
QKV_PIN(score, 64);
QKV_PIN(scale, 68);
QKV_PIN(mask, 72);
QKV_PIN(valid_lens, 76);
QKV_PIN(valid_lens_per_query, 80);
QKV_PIN(bias, 84);
QKV_PIN(bias_batch_stride, 88);
QKV_PIN(bias_head_stride, 96);
QKV_PIN(additive_hidden, 104);
QKV_PIN(additive_w_q, 112);
QKV_PIN(additive_w_k, 116);
QKV_PIN(additive_w_v, 120);
QKV_PIN(parallel_for, 124);
QKV_PIN(parallel_ctx, 128);
QKV_PIN(num_workers, 132);
QKV_PIN(backend, 136);
/* 0.2 */
QKV_PIN(kv_dtype, 140);
QKV_PIN(k_scales, 144);
QKV_PIN(v_scales, 148);
QKV_PIN(q_strides, 152);
QKV_PIN(k_strides, 176);
QKV_PIN(v_strides, 200);
QKV_PIN(out_strides, 224);
QKV_PIN(k_scale_strides, 248);
QKV_PIN(v_scale_strides, 272);
QKV_PIN(window_left, 296);
QKV_PIN(window_right, 304);
QKV_PIN(alibi_slopes, 312);
QKV_PIN(softcap, 316);
QKV_PIN(q_pos, 320);
QKV_PIN(sinks, 324);
QKV_PIN(kv_start, 328);
QKV_LAYOUT_ASSERT(size, sizeof(qkv_attention_desc) == 336);
#endif

#else
#error "qkv: no pinned descriptor layout for this pointer size"
#endif

#endif /* QKV_TESTS_RELIABILITY_ABI_LAYOUT_H_ */
