#!/usr/bin/env python3
"""Writes the seed corpus of the qkv fuzz target (tests/reliability/corpus/).

Each seed is one input in the byte format that fuzz_attention.cc's RunOne()
decodes, field by field in this order (missing bytes read as 0):

   1 flags      bit0 weights, bit1 lse, bits2-3 workspace (exact, one byte
                short, none, larger at an odd offset), bits4-5 pool (none,
                forward, backward, evens-then-odds), bit6 NULL-pointer byte
                follows, bit7 struct_size byte follows
   2 sizes      batch, q_heads, kv_heads, q_len, kv_len, head_dim, value_dim:
                one byte each; < 0xF0 is a small size (1 + b % limit; for
                kv_heads an index into the divisors of q_heads), 0xF0..0xFD a
                hostile value from a table, 0xFE/0xFF a raw int64 follows
   3 score      < 0xF0: b % 3; 0xF0..0xF7 a bad value; >= 0xF8 raw int32
   4 scale      b % 16 picks default, 0, NaN, +Inf, -Inf, raw float (4 bytes
                follow), 1e4, -1, 0.5, 1e-30, FLT_MAX, sNaN, subnormal, or
                default * (1 + (b >> 4) / 4)
   5 mask       < 0xF0: b & 7; 0xF0..0xF5 a bad value; >= 0xF6 raw uint32
   6 valid_lens bit0 per query, bits1-2 random/zeros/full/one bad, bit3 NULL
   7 bias       bits0-1 batch stride, bits2-3 head stride (0, dense, a byte
                follows, hostile: a byte follows [+ raw int64]), bit4 NULL,
                bits5-7 values (uniform, -inf quarter, -inf rows, NaN/Inf,
                +-1e4, all -inf, +-100, small ints)
   8 additive   hidden = 1 + b % 24, or a bad value for b >= 0xF0
   9 w          bits3-5 magnitude of W_q, W_k, w_v; bit7 with bits0-2: NULL
  10 data       bits0-2 magnitude of q, k; bits3-5 of v; bit6 small integers
  11 specials   count (b % 16), then per special: buffer (q k v bias wq wk
                wv), uint32 index, kind (NaN +Inf -Inf 1e4 -1e4 1e30 -FLT_MAX
                1e-40 -0 3e38)
  12 workers    b % 9, or a hostile count for b >= 0xF0
  13 backend    0 NULL, 1 "", < 0xF0 qkv_backend_name((b - 2) % count),
                else a garbage name (length byte and bytes follow)
  14 struct_size  (if flags bit7) index into 0, 1, 4, 7, 8, every field's end
                and end - 1, sizeof + 1, sizeof + 8, sizeof + 8 with a
                non-zero byte, 4096, 4096 non-zero, 4097, 8192
  15 nulls      (if flags bit6) bit0 desc, bit1 q, bit2 k, bit3 v, bit4 out,
                bit5 NULL workspace with a non-zero size
  16 seed       uint64 for the data

Usage: make_corpus.py [OUTPUT_DIR]   (default: the corpus/ beside this file)
"""
import os
import re
import struct
import sys

WEIGHTS, LSE = 1, 2
WS_EXACT, WS_SHORT, WS_NONE, WS_ODD = 0, 4, 8, 12
POOL_FWD, POOL_BACK, POOL_EVENS = 16, 32, 48
NULLS, STRUCT = 64, 128
CAUSAL, VALID, BIAS = 1, 2, 4
DOT, GAUSS, ADD = 0, 1, 2

# struct_size table indices (see item 14): field k's end is 5 + 2k, end - 1
# is 6 + 2k; fields in declaration order.
FIELDS = ["struct_size", "batch", "q_heads", "kv_heads", "q_len", "kv_len",
          "head_dim", "value_dim", "score", "scale", "mask", "valid_lens",
          "valid_lens_per_query", "bias", "bias_batch_stride",
          "bias_head_stride", "additive_hidden", "additive_w_q",
          "additive_w_k", "additive_w_v", "parallel_for", "parallel_ctx",
          "num_workers", "backend"]
SS_FIXED = 5 + 2 * len(FIELDS)
SS = {"0": 0, "1": 1, "4": 2, "7": 3, "8": 4,
      "plus1": SS_FIXED, "plus8": SS_FIXED + 1, "plus8_nonzero": SS_FIXED + 2,
      "4096": SS_FIXED + 3, "4096_nonzero": SS_FIXED + 4, "4097": SS_FIXED + 5,
      "8192": SS_FIXED + 6}


def ss_end(field, minus_one=False):
    return 5 + 2 * FIELDS.index(field) + (1 if minus_one else 0)


def size(n):
    """A small positive size (1 + b % limit with b = n - 1)."""
    if isinstance(n, bytes):
        return n
    assert 1 <= n <= 0xF0
    return bytes([n - 1])


def hostile(idx):
    assert 0 <= idx < 14
    return bytes([0xF0 + idx])


def raw64(value):
    return bytes([0xFE]) + struct.pack("<q", value)


def case(flags=WEIGHTS | LSE, batch=1, q_heads=1, kv_div=0, q_len=4, kv_len=4,
         head_dim=2, value_dim=2, score=DOT, scale=0, scale_raw=None, mask=0,
         mask_raw=None, vl=0, bias=0, bias_extra=b"", hidden=0, w=0, data=0,
         specials=(), workers=0, backend=0, garbage=None, struct_idx=None,
         nulls=None, seed=1, score_raw=None):
    out = bytearray([flags])
    out += size(batch) + size(q_heads)
    out += kv_div if isinstance(kv_div, bytes) else bytes([kv_div])
    out += size(q_len) + size(kv_len) + size(head_dim) + size(value_dim)
    if score_raw is not None:
        out += bytes([0xF8]) + struct.pack("<i", score_raw)
    else:
        out += bytes([score])
    out += bytes([scale])
    if scale % 16 == 5:
        out += struct.pack("<f", scale_raw)
    if mask_raw is not None:
        out += bytes([0xF6]) + struct.pack("<I", mask_raw)
    else:
        out += bytes([mask])
    out += bytes([vl, bias]) + bias_extra
    out += bytes([hidden, w, data, len(specials)])
    for buf, index, kind in specials:
        out += bytes([buf]) + struct.pack("<I", index) + bytes([kind])
    out += bytes([workers, backend])
    if backend >= 0xF0:
        out += bytes([len(garbage)]) + garbage
    if flags & STRUCT:
        out += bytes([struct_idx])
    if flags & NULLS:
        out += bytes([nulls])
    out += struct.pack("<Q", seed)
    return bytes(out)


def seeds():
    s = {}
    # ---- valid calls, every score kind, mask and path
    s["dot_small"] = case()
    s["dot_tile_causal"] = case(batch=2, q_heads=4, kv_div=1, q_len=19,
                                kv_len=150, head_dim=32, value_dim=24,
                                mask=CAUSAL, seed=2)
    s["dot_decode_gqa"] = case(batch=2, q_heads=6, kv_div=1, q_len=1,
                               kv_len=160, head_dim=40, value_dim=17, seed=3)
    s["gauss_valid_per_query_causal"] = case(
        batch=2, q_heads=3, kv_div=1, q_len=33, kv_len=65, head_dim=5,
        value_dim=3, score=GAUSS, mask=VALID | CAUSAL, vl=1, seed=5)
    s["additive_all_masks"] = case(batch=2, q_heads=4, kv_div=1, q_len=20,
                                   kv_len=66, head_dim=9, value_dim=4,
                                   score=ADD, mask=CAUSAL | VALID | BIAS,
                                   vl=1, bias=1 | 4 | 64, hidden=3, seed=7)
    s["dot_bias_small_strides"] = case(batch=3, q_heads=2, q_len=5, kv_len=9,
                                       head_dim=3, value_dim=3, mask=BIAS,
                                       bias=2 | 8 | 96, bias_extra=bytes([7, 3]),
                                       seed=9)
    s["dot_causal_q_longer"] = case(q_heads=2, q_len=40, kv_len=10,
                                    head_dim=7, value_dim=5, mask=CAUSAL,
                                    seed=11)
    s["dot_scale_zero_pooling"] = case(q_len=6, kv_len=50, scale=1,
                                       mask=CAUSAL, seed=12)
    s["dot_huge_logits"] = case(q_len=6, kv_len=50, head_dim=4, scale=6,
                                data=3, seed=13)
    s["pool_backward_3_gauss"] = case(flags=LSE | POOL_BACK, batch=2,
                                      q_heads=2, q_len=31, kv_len=64,
                                      head_dim=16, score=GAUSS, workers=3,
                                      seed=16)
    s["pool_evens_8_additive"] = case(flags=WEIGHTS | POOL_EVENS, q_heads=3,
                                      q_len=10, kv_len=30, head_dim=4,
                                      score=ADD, hidden=4, workers=8, seed=17)
    s["pool_hostile_workers"] = case(flags=WEIGHTS | POOL_FWD, workers=0xF0)
    s["pool_1000_workers"] = case(flags=POOL_FWD, q_len=3, kv_len=5,
                                  workers=0xF2)
    for i in range(5):
        s["backend_%d_causal_valid" % i] = case(
            batch=2, q_heads=2, q_len=21, kv_len=77, head_dim=11,
            value_dim=13, mask=CAUSAL | VALID, vl=1, backend=2 + i,
            score=i % 3, hidden=5, seed=20 + i)
    s["backend_garbage"] = case(backend=0xF0, garbage=b"highway:NOPE")
    s["workspace_short"] = case(flags=WEIGHTS | WS_SHORT, q_len=9,
                                kv_len=20)
    s["workspace_odd_offset"] = case(flags=WEIGHTS | LSE | WS_ODD, q_len=9,
                                     kv_len=20, score=ADD, hidden=2)
    # ---- struct_size
    s["struct_size_zero"] = case(flags=LSE | STRUCT, struct_idx=SS["0"])
    s["struct_size_before_backend"] = case(
        flags=WEIGHTS | STRUCT, backend=0xF0, garbage=b"ignored",
        struct_idx=ss_end("num_workers"))
    s["struct_size_mid_scale"] = case(flags=STRUCT, scale=2,
                                      struct_idx=ss_end("scale", True))
    s["struct_size_only_sizes"] = case(flags=STRUCT, q_len=5, kv_len=9,
                                       mask=BIAS, struct_idx=ss_end("value_dim"))
    s["struct_size_newer_zero"] = case(flags=STRUCT, struct_idx=SS["plus8"])
    s["struct_size_newer_nonzero"] = case(flags=STRUCT,
                                          struct_idx=SS["plus8_nonzero"])
    s["struct_size_4097"] = case(flags=STRUCT, struct_idx=SS["4097"])
    # ---- NULL pointers
    s["null_q_and_out"] = case(flags=NULLS, nulls=2 | 16)
    s["null_workspace_nonzero_size"] = case(flags=NULLS, nulls=32)
    # ---- invalid descriptors
    s["batch_zero"] = case(batch=hostile(0))
    s["kv_heads_not_divisor"] = case(q_heads=4, kv_div=raw64(3))
    s["counts_overflow"] = case(batch=hostile(13), q_heads=hostile(13))
    s["q_len_above_int32"] = case(q_len=hostile(4))
    s["huge_but_valid_no_buffers"] = case(q_len=hostile(10), kv_len=hostile(11))
    s["score_unknown"] = case(score=0xF0)
    s["scale_nan"] = case(scale=2)
    s["scale_flt_max"] = case(scale=10, q_len=3, kv_len=7)
    s["scale_subnormal"] = case(scale=12, q_len=3, kv_len=7)
    s["mask_raw_high_bit"] = case(mask_raw=0x80000004)
    s["valid_lens_bad_value"] = case(batch=2, mask=VALID, vl=6)
    s["bias_negative_stride"] = case(batch=2, mask=BIAS, bias=3,
                                     bias_extra=bytes([0]))
    s["bias_overflowing_stride"] = case(batch=2, q_heads=2, mask=BIAS,
                                        bias=3 | 12, bias_extra=bytes([2, 1]))
    s["additive_hidden_zero"] = case(score=ADD, hidden=0xF0)
    s["additive_null_w_k"] = case(score=ADD, hidden=3, w=0x80 | 2)
    # ---- non-finite and extreme data
    s["nan_in_q_inf_in_k"] = case(q_heads=2, q_len=20, kv_len=90, head_dim=8,
                                  mask=CAUSAL,
                                  specials=[(0, 17, 0), (1, 300, 1),
                                            (1, 5, 2)], seed=40)
    s["inf_in_v_hidden_by_bias"] = case(q_len=10, kv_len=70, head_dim=4,
                                        mask=BIAS, bias=1 | 4 | 32,
                                        specials=[(2, 3, 1), (2, 99, 0)],
                                        seed=41)
    s["nan_bias_and_weights"] = case(q_len=5, kv_len=12, score=ADD, hidden=4,
                                     mask=BIAS, bias=1 | 4 | 96,
                                     specials=[(4, 1, 0), (6, 2, 1)], seed=42)
    s["big_magnitudes"] = case(q_len=8, kv_len=40, head_dim=16, data=6 | 56,
                               seed=43)
    return s


def regressions():
    """Minimized inputs of bugs the fuzzer found, each written once per
    backend index 0..7 (a backend byte picks qkv_backend_name(i % count), and
    the builds differ in their backend lists)."""
    r = {}
    # highway:EMU128 (clang builds) took the all -inf max of a query with no
    # visible key for -FLT_MAX and gave NaN out and weights.
    r["no_visible_key_tiny"] = dict(batch=3, q_heads=4, kv_div=0, q_len=1,
                                    kv_len=1, head_dim=1, value_dim=1,
                                    mask=VALID, vl=1, seed=3)
    # highway:EMU128 converted NaN to int32 inside Highway's Tanh (UBSan).
    r["additive_nan_query_tanh"] = dict(q_len=5, kv_len=12, head_dim=2,
                                        score=ADD, hidden=6,
                                        specials=[(0, 3, 0), (1, 7, 0)],
                                        seed=42)
    # Every SIMD backend folded scale = FLT_MAX into the queries: scale * q
    # overflowed, inf * 0 made NaN scores (keys -0 give scores of 0).
    r["scale_flt_max_zero_keys"] = dict(q_len=1, kv_len=2, head_dim=1,
                                        value_dim=1, scale=10,
                                        specials=[(0, 0, 3), (1, 0, 8),
                                                  (1, 1, 8)], seed=4)
    return r


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "corpus")
    os.makedirs(outdir, exist_ok=True)
    # Inputs kept as the fuzzer found them (regress-<what>-a, -b, ...: the
    # harness's own bugs, and findings whose bytes matter as they are) stay;
    # the generated files are rewritten.
    for old in os.listdir(outdir):
        if old.startswith("seed-") or re.match(r"regress-.*-b[0-7]$", old):
            os.remove(os.path.join(outdir, old))
    for i, (name, data) in enumerate(sorted(seeds().items())):
        with open(os.path.join(outdir, "seed-%02d-%s" % (i, name)), "wb") as f:
            f.write(data)
    for name, fields in sorted(regressions().items()):
        for b in range(8):
            with open(os.path.join(outdir, "regress-%s-b%d" % (name, b)),
                      "wb") as f:
                f.write(case(backend=2 + b, **fields))
    print("wrote %d seeds and %d regression inputs to %s" %
          (len(seeds()), 8 * len(regressions()), outdir))


if __name__ == "__main__":
    main()
