#!/usr/bin/python3
"""Turns qkv_bench's Google Benchmark JSON into the report bench/run.sh prints.

    report.py REPORT_JSON OUT_DIR MODEL NPROC ELAPSED_S

Writes OUT_DIR/report.md (the tables printed here) and, when matplotlib is
there (Debian's python3-matplotlib), OUT_DIR/kv_sweep.png and
OUT_DIR/head_dim_sweep.png.

Every attention row is set against the machine limit that bounds it,
measured by the same binary in the same run (limits/...):
  - GFLOP/s against the multiply-add peak of the SIMD target the row's code
    uses, with as many threads as the row has workers: highway:AVX3 and
    xsimd:avx512* -> AVX3 (AVX-512), *AVX2 -> AVX2, *SSE4 -> SSE4, the scalar
    targets and the reference (scalar code) -> SCALAR, OpenBLAS -> AVX2 for
    its Haswell and Zen kernel sets, else the best target (SkylakeX's
    kernels are AVX-512);
  - S1 decode (one query per head: it streams K and V once) instead as GB/s
    of K+V read against the streaming-read limit, 1 thread for workers:1 and
    2 threads for workers:2.

The variants and layouts (vs_plain/...) get their own table: each one's
time over the plain call's, measured paired in time by the benchmark, the
median of its repetitions against the issue's target.

The backward pass (backward_f32/..., backward_paired/...,
scaling_backward/...) gets a section of its own: its time over the
forward's and the OpenBLAS backward's over its own (paired in time, medians
of the repetitions), its 2-worker speedup (paired), each against the issue's
target, then every backward row as measured.
"""
import json
import os
import re
import sys

TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
TARGET_ORDER = ["AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "NEON", "SVE",
                "SVE2", "WASM", "EMU128", "SCALAR"]
TARGET_LABEL = {"AVX3": "AVX-512", "AVX3_DL": "AVX-512 (DL)", "AVX2": "AVX2",
                "SSE4": "SSE4", "SCALAR": "scalar"}
SECTIONS = [
    ("S1-S4 and the other score kinds",
     lambda s: not s.startswith("sweep_")),
    ("kv_len sweep: q_len 128, 4 heads, d 64, f32 (shorter runs: 3 x 0.1 s)",
     lambda s: s.startswith("sweep_kv")),
    ("head_dim sweep: q_len = kv_len = 512, 4 heads, f32 (shorter runs: "
     "3 x 0.1 s)", lambda s: s.startswith("sweep_d")),
]


def time_us(b):
    return b["real_time"] * TO_US[b.get("time_unit", "ns")]


def fmt_time(us):
    if us < 1:
        return "%.0f ns" % (us * 1e3)
    if us < 1e3:
        return "%.3g us" % us
    if us < 1e6:
        return "%.3g ms" % (us / 1e3)
    return "%.3g s" % (us / 1e6)


def fmt_rate(x):
    return "%.2f" % x if x < 10 else "%.1f" % x


def fmt_limit(x):
    return "-" if x is None else fmt_rate(x)  # None: not in this run


def fmt_pct(x):
    return "%.1f%%" % x if x < 9.95 else "%.0f%%" % x


def fmt_speedup(base, t):
    return "-" if base is None else "%.2fx" % (base / t)


def load(report_path):
    with open(report_path) as f:
        report = json.load(f)
    medians, cvs, errors, order, scaling = {}, {}, {}, [], []
    vs_plain = {}  # (shape, variant, backend) -> {"reps", "median", "error"}
    kv_error = []  # (cache, dtype, run)
    bwd_paired = {}  # (shape, backend) -> {"reps", "median", "error"}
    bwd_scaling = []  # (shape, backend, run)

    def add_paired(table, key, b):
        # Paired rounds with repetitions: each repetition and the median.
        entry = table.setdefault(key, {"reps": []})
        if b.get("error_occurred"):
            entry["error"] = b.get("error_message", "error")
        elif b.get("run_type") != "aggregate":
            entry["reps"].append(b)
        elif b.get("aggregate_name") == "median":
            entry["median"] = b

    def add_scaling(rows, parts, b):
        # One run of paired scaling rounds, counters only.
        if b.get("error_occurred"):
            rows.append((parts[1], parts[2], {"error": b.get("error_message")}))
        elif b.get("run_type") != "aggregate":
            rows.append((parts[1], parts[2], b))

    for b in report.get("benchmarks", []):
        parts = b.get("run_name", b["name"]).split("/")
        if parts[0] == "backward_paired" and len(parts) >= 3:
            # backward_paired/<shape>/<backend>: as vs_plain
            add_paired(bwd_paired, tuple(parts[1:3]), b)
            continue
        if parts[0] == "scaling_backward" and len(parts) >= 3:
            # scaling_backward/<shape>/<backend>: as scaling
            add_scaling(bwd_scaling, parts, b)
            continue
        if parts[0] == "kv_error" and len(parts) >= 3:
            # kv_error/<cache>/<dtype>: one untimed run, counters only
            if b.get("run_type") != "aggregate":
                kv_error.append((parts[1], parts[2], b))
            continue
        if parts[0] == "vs_plain" and len(parts) >= 4:
            # vs_plain/<shape>/<variant>/<backend>: repetitions and their
            # aggregates, counters only
            add_paired(vs_plain, tuple(parts[1:4]), b)
            continue
        if parts[0] == "scaling" and len(parts) >= 3:
            # scaling/<shape>/<implementation>: one run, counters only
            add_scaling(scaling, parts, b)
            continue
        if parts[0] == "merge_f32" and len(parts) >= 3:
            # merge_f32/rows:<r>/value_dim:<v>
            key = ("merge", int(parts[1].split(":")[1]),
                   int(parts[2].split(":")[1]), 1)
        elif len(parts) < 4:
            continue
        elif parts[0] == "limits":
            # limits/<kind>/<what>/threads:<n>
            key = ("limits", parts[1], parts[2],
                   int(parts[3].split(":")[1]))
        elif parts[3].startswith("workers:"):
            # attention_f32/<shape>/<implementation>/workers:<n>
            key = (parts[0], parts[1], parts[2], int(parts[3].split(":")[1]))
        else:
            continue
        if key not in order:
            order.append(key)
        if b.get("error_occurred"):
            errors[key] = b.get("error_message", "error")
            continue
        if b.get("run_type") != "aggregate":
            continue
        if b.get("aggregate_name") == "median":
            medians[key] = b
        elif b.get("aggregate_name") == "cv":
            cvs[key] = b.get("real_time", 0.0)  # a fraction
    return (report.get("context", {}), medians, cvs, errors, order, scaling,
            vs_plain, kv_error, bwd_paired, bwd_scaling)


def engines_line(backends):
    """Which engines the measured library has, and the package of each missing one."""
    names = [b for b in backends.split(",") if b]
    have = [e for e in ("highway", "xsimd", "reference")
            if any(b == e or b.startswith(e + ":") for b in names)]
    missing = [e for e, pkg in (("highway", "libhwy-dev"), ("xsimd", "libxsimd-dev"))
               if e not in have]
    line = "- engines built: %s" % (", ".join(have) or "?")
    if missing:
        line += "; **not built: %s** (apt-get install %s, then rebuild)" % (
            ", ".join(missing), " ".join(
                {"highway": "libhwy-dev", "xsimd": "libxsimd-dev"}[e] for e in missing))
    return line


def merge_lines(medians, order, limits):
    """The merge of partial results (qkv_attention_merge_f32) as GB/s of out."""
    table = []
    read = limits.stream.get(1)
    for key in order:
        if key[0] != "merge" or key not in medians:
            continue
        b = medians[key]
        rate = b.get("bytes", 0.0) / 1e9
        mib = key[1] * key[2] * 4 / 2**20
        table.append(["%d x %d" % (key[1], key[2]), "%.2f MiB" % mib,
                      fmt_time(time_us(b)), "%.1f" % rate, "%.1f" % (3 * rate),
                      fmt_pct(300 * rate / read) if read else "-"])
    if not table:
        return []
    return (["## Merging partial results (qkv_attention_merge_f32, 1 thread)", "",
             "b := merge(a, b): reads two out buffers and their lse, writes "
             "one; GB/s of out counts one out buffer per call (the issue's "
             "measure), traffic the three (lse aside); % of read 1T: the "
             "traffic over the streaming read limit above.", ""]
            + markdown(table, ["rows x value_dim", "out size", "time",
                               "GB/s of out", "traffic GB/s", "% of read 1T"],
                       {1, 2, 3, 4, 5}) + [""])


def scaling_lines(rows):
    """The paired 2-worker table (see RunScaling in bench_attention.cc)."""
    if not rows:
        return []

    def num(b, k):
        v = b.get(k)
        return None if v is None or v != v else float(v)  # NaN -> None

    def x(v):
        return "-" if v is None else "%.2fx" % v

    table = []
    for shape, impl, b in rows:
        if "error" in b:
            table.append([shape, impl, "ERROR: %s" % b["error"]] + [""] * 5)
            continue
        full, rounds = num(b, "full_rounds"), num(b, "rounds")
        sf = num(b, "speedup_full")
        eff = num(b, "efficiency")
        table.append([
            shape, impl, fmt_time(num(b, "us_1w")), fmt_time(num(b, "us_2w")),
            x(num(b, "speedup")), x(num(b, "machine")),
            "-" if eff is None else "%.0f%%" % (100 * eff),
            "- (0 of %d rounds)" % rounds if sf is None
            else "%.2fx (%d of %d rounds)" % (sf, full, rounds)])
    header = ["shape", "implementation", "1 worker", "2 workers",
              "2 vs 1 worker", "machine: 2 copies vs 1",
              "efficiency", "2 vs 1 worker, machine >= %.1fx" % FULL_MACHINE]
    out = ["## Two workers against one, paired in time", "",
           "Rounds of (about 0.4 ms each): the shape on 1 worker, then two "
           "copies of the 1-worker call side by side on the pool's two "
           "threads (own output and workspace), and the shape on 2 workers, "
           "last and first in turn. machine = t1/t_copy_a + t1/t_copy_b: what "
           "this machine gives two threads for this work (2.00x: two full "
           "cores); efficiency = (2 vs 1 worker) / machine, round by round. "
           "Medians over the rounds. A VM does not always give its vCPUs a "
           "core each (for milliseconds to seconds they can share one core "
           "or a neighbour's caches): the last column keeps the rounds where "
           "the machine gave at least %.1fx." % FULL_MACHINE, ""]
    return out + markdown(table, header, {2, 3, 4, 5, 6, 7}) + [""]


# The targets for vs_plain/<shape>/<variant>: the most a variant's
# time may be, as a fraction of the plain call's.
VS_PLAIN_TARGETS = {
    "window_left255": 0.25,  # at least 4x faster than plain causal
    "alibi": 1.10,
    "sinks": 1.10,
    "softcap50": 1.30,
    "token_major": 1.05,
    "padded_cache": 1.05,
}
# Low-precision caches: per shape (S1 decode: f16 and bf16 at least 1.8x
# the f32 tokens per second, int8 3x; S2 prefill: f16 at least 90% of
# f32's GFLOP/s).
VS_PLAIN_SHAPE_TARGETS = {
    ("S1_decode", "f16"): 1 / 1.8,
    ("S1_decode", "bf16"): 1 / 1.8,
    ("S1_decode", "int8"): 1 / 3.0,
    ("S2_prefill", "f16"): 1 / 0.9,
}
# The S1 rows' K and V must also stream at this fraction of the read limit.
KV_READ_TARGET = 0.85
VS_PLAIN_LABELS = {
    "window_left255": "sliding window, window_left 255",
    "alibi": "ALiBi slopes",
    "sinks": "sinks",
    "softcap50": "softcap 50",
    "token_major": "token-major q, k, v, out",
    "padded_cache": "K, V in a cache of 1.5 x kv_len",
    "f16": "K, V as f16",
    "bf16": "K, V as bf16",
    "int8": "K, V as int8 (row scales)",
    "huge_pages": "K, V on 2 MiB pages (madvise)",
}
VS_PLAIN_SHAPES = {
    "causal_4096": "causal 4096 x 4096, 4 heads, d 64",
}


def is_number(x):
    return isinstance(x, (int, float)) and x == x  # not None, not NaN


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    if not n:
        return None
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def kv_error_lines(rows):
    """What a low-precision cache costs the result (RunKvError)."""
    if not rows:
        return []
    table = []
    for cache, dtype, b in rows:
        if b.get("error_occurred"):
            table.append([cache, dtype, "ERROR: %s" % b.get("error_message"),
                          "", ""])
            continue
        table.append([cache, dtype, "%.1e" % b.get("out_max", float("nan")),
                      "%.1e" % b.get("out_rms", float("nan")),
                      "%.1e" % b.get("weights_max", float("nan"))])
    header = ["cache", "K, V as", "max abs(out - f32 out) / max abs(v)",
              "rms(out - f32 out) / rms(f32 out)",
              "max abs(weights - f32 weights)"]
    out = ["## What a low-precision K/V cache costs the result", "",
           "One S1-shaped decoding step (32 heads, 4096 keys, d 128) on the "
           "default backend, K and V quantized by qkv_quantize_rows, against "
           "the same call on the f32 cache. random: q, k, v uniform in "
           "[-1, 1] (nearly flat attention); llm_like: keys N(0, 1) with 4 "
           "outlier channels per head at 12x, queries aligned with a few "
           "keys (peaked attention), values N(0, 1) with the first token at "
           "10x.", ""]
    return out + markdown(table, header, {2, 3, 4}) + [""]


def vs_plain_lines(rows, read_1t=None):
    """Variants and layouts against the plain call (RunPaired in
    bench_attention.cc): the median over the repetitions of each one's
    median ratio over its rounds."""
    if not rows:
        return []
    table, most_reps = [], 0
    for (shape, variant, backend), e in rows.items():
        label = VS_PLAIN_LABELS.get(variant, variant)
        shape_label = VS_PLAIN_SHAPES.get(shape, shape)
        if "error" in e:
            table.append([shape_label, label, backend,
                          "ERROR: %s" % e["error"]] + [""] * 6)
            continue
        reps = [r for r in e["reps"] if is_number(r.get("ratio"))]
        if not reps:
            continue
        most_reps = max(most_reps, len(reps))

        def agg(counter):
            if "median" in e and counter in e["median"]:
                return float(e["median"][counter])
            return median([float(r[counter]) for r in reps])

        ratio = agg("ratio")
        spread = [float(r["ratio"]) for r in reps]
        target = VS_PLAIN_SHAPE_TARGETS.get((shape, variant),
                                            VS_PLAIN_TARGETS.get(variant))
        if target is None:
            goal, met = "-", "-"
        elif target < 1:
            goal = "<= %.2f (%gx faster)" % (target, 1 / target)
            met = "yes" if ratio <= target else "**no**"
        else:
            goal = "<= %.2f" % target
            met = "yes" if ratio <= target else "**no**"
        diff = agg("max_diff")
        read = "-"
        # Decoding only: prefill reuses each K/V byte for every query.
        typed = variant in ("f16", "bf16", "int8") and shape == "S1_decode"
        if (typed or variant == "huge_pages") and \
                is_number(e["reps"][0].get("kv_gbs")):
            gbs = agg("kv_gbs")
            read = "%.1f" % gbs
            frac = None
            if is_number(e["reps"][0].get("read_frac")):
                frac = agg("read_frac")  # against the read timed beside it
            elif read_1t and shape == "S1_decode":
                frac = gbs / read_1t
            if frac is not None:
                read += " (%.0f%%%s)" % (
                    100 * frac, "" if frac >= KV_READ_TARGET or not typed
                    else ", **below 85%**")
            # Beside it, the plain f32 call's share of its own read of the
            # same round: what the VM's memory allowed f32 then.
            if is_number(e["reps"][0].get("read_frac_plain")):
                read += "; %s %.0f%%" % ("f32" if typed else "plain",
                                         100 * agg("read_frac_plain"))
            if is_number(e["reps"][0].get("huge_frac")):
                label += " (%.0f%% granted)" % (100 * agg("huge_frac"))
        table.append([
            shape_label, label, backend,
            fmt_time(agg("us_plain")), fmt_time(agg("us_variant")),
            "%.3f" % ratio + (" (%.2fx faster)" % (1 / ratio)
                              if ratio < 0.5 else ""),
            "%.3f-%.3f" % (min(spread), max(spread)),
            goal, met,
            "-" if diff < 0 else "0 (same bits)" if diff == 0
            else "%.1e" % diff, read])
    header = ["shape", "variant", "backend", "plain", "variant time",
              "time / plain", "over repetitions", "target", "met",
              "max diff", "K+V GB/s (of read)"]
    out = ["## Variants and layouts against the plain call, paired in time",
           "",
           "The default backend, one worker. Each pair is timed in rounds of "
           "(plain call, variant), in alternating order, each side at least "
           "2 ms of calls (the layouts, which read other buffers, after one "
           "untimed call); time / plain: the median over the rounds of each "
           "round's ratio, then the median over %d repetitions (their range "
           "beside it). The targets are the issue's: a window that hides "
           "all but 256 keys at least 4x faster than plain causal; ALiBi and "
           "sinks at most 10%% slower than S2 without them, softcap at most "
           "30%%; token-major q, k, v and out, and K and V in a cache with "
           "spare capacity (its unused rows NaN), within 5%% of the dense "
           "call; K and V as f16 or bf16 at least 1.8x faster than f32 in S1 "
           "decoding and int8 3x, their bytes (scales included) read at "
           "85%% or more of a streaming read (128 MiB, timed in each round "
           "beside the pair; f32: the plain call's share of the same "
           "reads), and f16 prefill (S2) "
           "at least 90%% of f32's speed. K and V on 2 MiB pages (Linux's "
           "transparent huge pages through madvise; granted: the share the "
           "kernel gave) against the same values on ordinary memory: no "
           "target, a measurement for users who allocate their own cache; "
           "each side's read fraction is against a read of its own kind of "
           "pages. "
           "max diff: max |out - dense out| / "
           "max |v| for the layouts (the same values in another layout) and "
           "the element types (what quantizing K and V cost)." % most_reps,
           ""]
    return out + markdown(table, header, {3, 4, 5, 6, 9, 10}) + [""]


# The targets for the backward pass (#18): its time at most 3x the
# forward's on S2 and S3, one worker, on AVX-512 and AVX2 (FlashAttention-2's
# backward does 2.5x the forward's FLOPs); at least 1.5x faster than the
# same backward as BLAS calls; 2 workers at least 1.8x one.
BWD_OVER_FWD_TARGET = 3.0
BWD_VS_BLAS_TARGET = 1.5
BWD_SCALING_TARGET = 1.8
BWD_BLAS = "openblas_5gemm"
BWD_SHAPES = {
    "S2_prefill": "S2 prefill: 8 heads, 1024 x 1024 causal, d 64",
    "S3_small": "S3 small: 4 heads, 128 x 128, d 64",
}


# The rounds with machine >= FULL_MACHINE give a verdict of their own only
# when there are this many of them.
MIN_FULL_ROUNDS = 10


def met(ok):
    return "yes" if ok else "**no**"


def backward_lines(medians, cvs, errors, order, limits, paired, scaling,
                   model, nproc, ctx):
    """The backward pass: the targets, then every backward_f32 row."""
    rows = [k for k in order if k[0] == "backward_f32"]
    if not rows and not paired and not scaling:
        return []

    def isa(impl):
        if impl == BWD_BLAS:
            return "OpenBLAS"
        t = limits.target_of(impl)
        if t is None:  # no limits in this run: guess from the name
            u = impl.upper()
            t = "AVX3" if ("AVX3" in u or "AVX512" in u) else \
                "AVX2" if "AVX2" in u else None
        return TARGET_LABEL.get(t, t or "?")

    out = ["## Backward (qkv_attention_backward_f32)", "",
           "Machine: %s, %s cores (nproc); OpenBLAS core %s, 1 thread per "
           "worker. One worker unless stated. Targets (issue #18): the "
           "backward at most %gx the forward's time on S2 and S3, one "
           "worker, on AVX-512 and AVX2 (FlashAttention-2's backward does "
           "2.5x the forward's FLOPs); at least %gx faster than the same "
           "backward written as OpenBLAS calls (%s: per head S = scale Q K^T, "
           "P = exp(S - lse) masked, dP = dO V^T, D = rowsum(dO * O), "
           "dS = scale P (dP - D), dV = P^T dO, dQ = dS K, dK = dS^T Q: five "
           "sgemms over the full q_len x kv_len, the loops vectorized by the "
           "compiler); 2 workers at least %gx one." % (
               model or "unknown CPU", nproc,
               ctx.get("openblas_corename", "?"), BWD_OVER_FWD_TARGET,
               BWD_VS_BLAS_TARGET, BWD_BLAS, BWD_SCALING_TARGET), ""]

    # The targets, paired in time.
    table, most_reps = [], 0
    for (shape, backend), e in paired.items():
        label = BWD_SHAPES.get(shape, shape)
        if "error" in e:
            table.append([label, backend, "ERROR: %s" % e["error"]]
                         + [""] * 8)
            continue
        reps = [r for r in e["reps"] if is_number(r.get("bwd_over_fwd"))]
        if not reps:
            continue
        most_reps = max(most_reps, len(reps))

        def agg(counter):
            if "median" in e and is_number(e["median"].get(counter)):
                return float(e["median"][counter])
            xs = [float(r[counter]) for r in reps if is_number(r.get(counter))]
            return median(xs)

        ratio = agg("bwd_over_fwd")
        spread = [float(r["bwd_over_fwd"]) for r in reps]
        blas_t, vs = agg("us_blas"), agg("blas_over_bwd")
        vs_spread = [float(r["blas_over_bwd"]) for r in reps
                     if is_number(r.get("blas_over_bwd"))]
        table.append([
            label, "%s (%s)" % (backend, isa(backend)),
            fmt_time(agg("us_fwd")), fmt_time(agg("us_bwd")),
            "%.2f (%.2f-%.2f)" % (ratio, min(spread), max(spread)),
            met(ratio <= BWD_OVER_FWD_TARGET),
            "-" if blas_t is None else fmt_time(blas_t),
            "-" if vs is None else "%.2fx (%.2f-%.2f)" % (
                vs, min(vs_spread), max(vs_spread)),
            "-" if vs is None else met(vs >= BWD_VS_BLAS_TARGET)])
    if table:
        out += ["### Against the forward and the OpenBLAS backward, paired "
                "in time", "",
                "Rounds of three slices in rotating order, each one untimed "
                "call then at least 2 ms of calls: the forward as a training "
                "step calls it (out and lse written), qkv's backward, the "
                "OpenBLAS backward (single-threaded, same out, lse and d_out). "
                "Per round: backward / forward and OpenBLAS / qkv backward; "
                "the median over the rounds, then over %d repetitions (their "
                "range in brackets)." % most_reps, ""]
        out += markdown(table, [
            "shape", "backend (ISA)", "forward", "backward",
            "backward / forward", "<= %g" % BWD_OVER_FWD_TARGET,
            "OpenBLAS backward", "OpenBLAS / qkv",
            ">= %gx" % BWD_VS_BLAS_TARGET], {2, 3, 4, 6, 7}) + [""]

    # Two workers, paired in time.
    table = []
    for shape, impl, b in scaling:
        label = BWD_SHAPES.get(shape, shape)
        if "error" in b:
            table.append([label, impl, "ERROR: %s" % b["error"]] + [""] * 6)
            continue
        sp = b.get("speedup")
        sf = b.get("speedup_full")
        eff = b.get("efficiency")
        mach = b.get("machine")
        ok = is_number(sp) and sp >= BWD_SCALING_TARGET
        verdict = met(ok)
        full = b.get("full_rounds", 0)
        if not ok and is_number(sf) and sf >= BWD_SCALING_TARGET and \
                full >= MIN_FULL_ROUNDS:
            verdict += " (yes with machine >= %.1fx)" % FULL_MACHINE
        elif not ok and is_number(mach) and mach < FULL_MACHINE:
            verdict += " (the machine gave %.2fx)" % mach
        table.append([
            label, impl, fmt_time(b.get("us_1w")), fmt_time(b.get("us_2w")),
            "%.2fx" % sp if is_number(sp) else "-",
            "%.2fx" % mach if is_number(mach) else "-",
            "%.0f%%" % (100 * eff) if is_number(eff) else "-",
            "- (0 of %d rounds)" % b.get("rounds", 0) if not is_number(sf)
            else "%.2fx (%d of %d rounds)" % (sf, b.get("full_rounds", 0),
                                              b.get("rounds", 0)),
            verdict])
    if table:
        out += ["### Two workers against one, paired in time", "",
                "As the forward's paired table above: rounds of the backward "
                "on 1 worker, two copies of it side by side (machine), and "
                "on 2 workers; medians over the rounds. One task per (batch, "
                "kv head): S2's 8 heads and S3's 4 split evenly.", ""]
        out += markdown(table, [
            "shape", "backend", "1 worker", "2 workers", "2 vs 1 worker",
            "machine: 2 copies vs 1", "efficiency",
            "2 vs 1 worker, machine >= %.1fx" % FULL_MACHINE,
            ">= %gx" % BWD_SCALING_TARGET], {2, 3, 4, 5, 6, 7}) + [""]

    # Every backward_f32 row, as Google Benchmark measured it.
    fwd = {k[1:]: time_us(b) for k, b in medians.items()
           if k[0] == "attention_f32"}
    blas = {(k[1], k[3]): time_us(b) for k, b in medians.items()
            if k[0] == "backward_f32" and k[2] == BWD_BLAS}
    table = []
    for key in rows:
        shape, impl, workers = key[1:]
        if key in errors and key not in medians:
            table.append([shape, impl, str(workers), "ERROR: " + errors[key]]
                         + [""] * 9)
            continue
        if key not in medians:
            continue
        b = medians[key]
        t = time_us(b)
        gflops = b.get("flop", 0.0) / 1e9
        target = limits.target_of(impl)
        peak = limits.peak_of(target, workers)
        f = fwd.get((shape, impl, workers)) if impl != BWD_BLAS else \
            fwd.get((shape, "openblas_3step", workers))
        err = b.get("max_err", -1.0)
        table.append([
            shape, impl, str(workers), fmt_time(t),
            "%.1f%%" % (100 * cvs[key]) if key in cvs else "",
            fmt_rate(gflops),
            "-" if not peak else fmt_pct(100 * gflops / peak),
            "%s %dT" % (target, workers) if peak else "-",
            "-" if f is None else fmt_time(f),
            "-" if f is None else "%.2f" % (t / f),
            "-" if impl == BWD_BLAS else fmt_speedup(
                blas.get((shape, workers)), t),
            "-" if impl == BWD_BLAS or err < 0 else "%.1e" % err,
            fmt_machine(b.get("machine")) if workers == 2 else ""])
    if table:
        out += ["### Every backward row (medians of the repetitions)", "",
                "GFLOP/s: the backward's five matrix products, "
                "2*batch*heads*q_len*kv_len*(3*d + 2*dv) per call (2.5x the "
                "forward's count), half with causal, for OpenBLAS too (it "
                "computes the masked half as well). forward: the "
                "attention_f32 row of the same shape, implementation and "
                "workers in this run (OpenBLAS: its three-step forward), "
                "timed apart, not paired. max err: max |grad - OpenBLAS "
                "grad| / max |OpenBLAS grad| over d_q, d_k and d_v, checked "
                "once outside the timing (the header's bound: 1e-3).", ""]
        out += markdown(table, [
            "shape", "implementation", "workers", "median time", "cv",
            "GFLOP/s", "% of peak", "peak used", "forward", "backward / "
            "forward", "vs OpenBLAS backward", "max err", "2 copies"],
            {2, 3, 4, 5, 6, 8, 9, 10, 11, 12}) + [""]
    return out


class Limits:
    def __init__(self, medians, blas_core=""):
        # OpenBLAS's kernel set: Haswell and Zen are AVX2 code, bounded by
        # the AVX2 peak even on an AVX-512 machine.
        self.blas_avx2 = blas_core.lower() in ("haswell", "zen")
        self.peak = {}    # (target, threads) -> GFLOP/s
        self.stream = {}  # threads -> GB/s
        for (kind, what, name, threads), b in medians.items():
            if kind != "limits":
                continue
            if what == "fma_peak":
                self.peak[(name, threads)] = b.get("flop", 0.0) / 1e9
            elif what == "stream_read":
                self.stream[threads] = b.get("bytes", 0.0) / 1e9
        self.targets = sorted({t for t, _ in self.peak},
                              key=lambda t: TARGET_ORDER.index(t)
                              if t in TARGET_ORDER else 99)

    def best(self):
        return self.targets[0] if self.targets else None

    def blas_target(self):
        if self.blas_avx2 and "AVX2" in self.targets:
            return "AVX2"
        return self.best()

    def target_of(self, impl):
        """The peak (a Highway target name) that bounds an implementation."""
        if impl in ("openblas_3step", BWD_BLAS):
            return self.blas_target()
        if impl == "reference":
            return "SCALAR" if "SCALAR" in self.targets else None
        engine, _, target = impl.partition(":")
        t = target.lower()
        if engine == "highway":
            name = target
        elif "avx512" in t or "avx3" in t:
            name = "AVX3"
        elif "avx2" in t or "fma3" in t or t == "avx":
            name = "AVX2"
        elif "sse" in t:
            name = "SSE4"
        elif "neon" in t:
            name = "NEON"
        elif "scalar" in t or "emu128" in t or "generic" in t:
            name = "SCALAR"
        else:
            name = target
        if name in self.targets:
            return name
        if name.startswith("AVX3") and "AVX3" in self.targets:
            return "AVX3"
        if name in ("SSSE3", "EMU128") and "SSE4" in self.targets:
            return "SSE4"
        return None

    def peak_of(self, target, threads):
        if target is None:
            return None
        p = self.peak.get((target, threads))
        if p is None and (target, 1) in self.peak:
            p = self.peak[(target, 1)] * threads
        return p

    def lines(self):
        out = ["## Machine limits (measured in this run, medians)", ""]
        if not self.peak and not self.stream:
            return out + ["(none measured: run without --benchmark_filter)", ""]
        head = "| limit | 1 thread | 2 threads |"
        out += [head, "|---|--:|--:|"]
        for t in self.targets:
            label = TARGET_LABEL.get(t, t)
            fma = "FMA" if t not in ("SSE4", "SSSE3", "SCALAR", "EMU128") \
                else "mul+add"
            out.append("| %s %s peak (%s), GFLOP/s | %s | %s |" % (
                label, fma, t,
                fmt_limit(self.peak.get((t, 1))),
                fmt_limit(self.peak.get((t, 2)))))
        out.append("| streaming read of 256 MiB, GB/s | %s | %s |" % (
            fmt_limit(self.stream.get(1)), fmt_limit(self.stream.get(2))))
        return out + [""]


def attention_rows(medians, cvs, errors, order, limits, keep):
    """The table rows of the attention benchmarks whose shape `keep` accepts."""
    att = {k[1:]: b for k, b in medians.items() if k[0] == "attention_f32"}
    blas = {(s, w): time_us(b) for (s, i, w), b in att.items()
            if i == "openblas_3step"}
    ref = {s: time_us(b) for (s, i, w), b in att.items() if i == "reference"}
    table = []
    for key in order:
        if key[0] != "attention_f32" or not keep(key[1]):
            continue
        shape, impl, workers = key[1:]
        if key in errors and key not in medians:
            table.append([shape, impl, str(workers), "ERROR: " + errors[key]]
                         + [""] * 11)
            continue
        if key not in medians:
            continue
        b = medians[key]
        t = time_us(b)
        err = b.get("max_err", -1.0)
        gflops = b.get("flop", 0.0) / 1e9
        decode = shape.startswith("S1")
        kv_gbs = b.get("kv_bytes", 0.0) / 1e9
        if decode:
            lim = limits.stream.get(workers)
            pct = "-" if not lim else fmt_pct(100 * kv_gbs / lim)
            bound = "read %dT" % workers if lim else "-"
        else:
            target = limits.target_of(impl)
            peak = limits.peak_of(target, workers)
            pct = "-" if not peak else fmt_pct(100 * gflops / peak)
            bound = "%s %dT" % (target, workers) if peak else "-"
        table.append([
            shape, impl, str(workers), fmt_time(t),
            "%.1f%%" % (100 * cvs[key]) if key in cvs else "",
            fmt_rate(gflops), fmt_rate(b.get("bytes", 0.0) / 1e9),
            fmt_rate(kv_gbs) if decode else "-",
            pct, bound,
            "-" if impl == "openblas_3step"
            else fmt_speedup(blas.get((shape, workers)), t),
            "-" if impl == "reference" else fmt_speedup(ref.get(shape), t),
            "-" if impl == "openblas_3step" or err < 0 else "%.1e" % err,
            fmt_machine(b.get("machine")) if workers == 2 else "",
        ])
    return table


HEADER = ["shape", "implementation", "workers", "median time", "cv",
          "GFLOP/s", "GB/s", "K+V GB/s", "% of peak", "peak used",
          "vs OpenBLAS 3-step", "vs reference", "max err", "2 copies"]
RIGHT = {2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13}
# The paired table's last column keeps the rounds where two copies of the
# 1-worker call ran at least this much faster than one (S2, S3: 1.96-2.0x
# while the VM gives its vCPUs a core each).
FULL_MACHINE = 1.9


def fmt_machine(x):
    """A 2-worker row's "machine" counter: 2 copies of its 1-worker call."""
    return "-" if x is None or x != x else "%.2fx" % x


def markdown(table, header=None, right=None):
    header = HEADER if header is None else header
    right = RIGHT if right is None else right
    widths = [max(len(r[i]) for r in table + [header])
              for i in range(len(header))]

    def line(cells):
        return "| " + " | ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i])
            for i, c in enumerate(cells)) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if i in right
                         else ("-" * (w + 2))
                         for i, w in enumerate(widths)) + "|"
    return [line(header), sep] + [line(r) for r in table]


def series(medians, prefix):
    """{(impl, workers): [(x, GFLOP/s)]} of one sweep, x from the shape."""
    out = {}
    for (kind, shape, impl, workers), b in medians.items():
        if kind != "attention_f32" or not shape.startswith(prefix):
            continue
        m = re.match(prefix + r"(\d+)$", shape)
        if not m:
            continue
        out.setdefault((impl, workers), []).append(
            (int(m.group(1)), b.get("flop", 0.0) / 1e9))
    for v in out.values():
        v.sort()
    return out


def plot(medians, order, limits, out_dir, model):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no matplotlib (apt-get install python3-matplotlib): no plots")
        return []
    written = []
    best = limits.best()

    # One color per implementation (its 1- and 2-worker lines share it:
    # solid and dashed); red and gray are OpenBLAS's and the reference's.
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:purple",
               "tab:brown", "tab:pink", "tab:cyan", "tab:olive", "navy",
               "gold", "teal", "magenta"]
    impls = []  # in the benchmark's order: the default backend first
    for k in order:
        if k[0] == "attention_f32" and k[2] not in impls + [
                "openblas_3step", "reference"]:
            impls.append(k[2])
    colors = {impl: palette[i % len(palette)] for i, impl in enumerate(impls)}
    colors["openblas_3step"] = "tab:red"
    colors["reference"] = "tab:gray"

    def style(impl, workers):
        marker = {"openblas_3step": "s", "reference": "x"}.get(
            impl, "^" if impl.startswith("xsimd") else "o")
        return dict(color=colors[impl], marker=marker,
                    linestyle="-" if workers == 1 else "--")

    def draw(prefix, xlabel, title, fname, log2, peaks):
        data = series(medians, prefix)
        if not data:
            return
        fig, ax = plt.subplots(figsize=(9, 5.5), dpi=110)
        rank = {impl: i for i, impl in enumerate(
            impls + ["openblas_3step", "reference"])}
        for impl, workers in sorted(data, key=lambda k: (rank[k[0]], k[1])):
            pts = data[(impl, workers)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts],
                    label="%s, %d worker%s" % (impl, workers,
                                               "s" if workers > 1 else ""),
                    **style(impl, workers))
        for target, threads, ls in peaks:
            p = limits.peak.get((target, threads))
            if p:
                ax.axhline(p, color="black" if target == best else "darkgray",
                           linestyle=ls, linewidth=1)
                ax.annotate("%s peak, %d thread%s: %.0f GFLOP/s" % (
                    TARGET_LABEL.get(target, target), threads,
                    "s" if threads > 1 else "", p),
                    xy=(0.01, p), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8)
        xs = sorted({p[0] for v in data.values() for p in v})
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.set_xticklabels([str(x) for x in xs])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("GFLOP/s (median)")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.set_title(title + "\n" + model, fontsize=10)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = os.path.join(out_dir, fname)
        fig.savefig(path)
        plt.close(fig)
        written.append(path)

    others = [(t, 1, "-.") for t in limits.targets
              if t != best and t in ("AVX2", "SSE4")]
    draw("sweep_kv", "kv_len (keys)",
         "qkv attention f32: kv_len sweep (q_len 128, 4 heads, d 64)",
         "kv_sweep.png", True,
         [(best, 1, "-"), (best, 2, ":")] + others)
    draw("sweep_d", "head_dim",
         "qkv attention f32: head_dim sweep (q_len = kv_len = 512, 4 heads)",
         "head_dim_sweep.png", False,
         [(best, 1, "-"), (best, 2, ":")] + others)
    return written


def main():
    report_path, out_dir, model, nproc, elapsed = sys.argv[1:6]
    (ctx, medians, cvs, errors, order, scaling, vs_plain,
     kv_error, bwd_paired, bwd_scaling) = load(report_path)
    limits = Limits(medians, ctx.get("openblas_corename", ""))
    lines = [
        "# qkv benchmark",
        "",
        "- machine: %s, %s cores (nproc); %s" % (model or "unknown CPU", nproc,
                                                 ctx.get("date", "")),
        "- qkv %s, default backend %s; backends: %s" % (
            ctx.get("qkv_version", "?"), ctx.get("qkv_backend", "?"),
            ctx.get("qkv_backends", "?")),
        engines_line(ctx.get("qkv_backends", "")),
        "- OpenBLAS: %s (core %s, OPENBLAS_CORETYPE=%s), 1 thread per worker"
        % (ctx.get("openblas_config", "?"), ctx.get("openblas_corename", "?"),
           ctx.get("openblas_coretype_env", ""))
        + ("; kernel set: %s" % ctx["openblas_pick"]
           if ctx.get("openblas_pick") else ""),
        "- f32, medians of the repetitions (cv: their spread), wall-clock "
        "time; the run took %ss" % elapsed,
        "",
    ]
    lines += limits.lines()
    lines += [
        "- GFLOP/s: 4*batch*heads*q_len*kv_len*d per call (half with causal); "
        "for additive scores 3*hidden+2*d per (query, key) pair",
        "- GB/s: q+k+v+out bytes per call; K+V GB/s (S1 decode and "
        "S1_gqa8_decode, 64 query heads over 8 kv heads, 4096 keys, d 128: "
        "their figure of merit): K and V bytes read per call",
        "- %% of peak: GFLOP/s / the multiply-add peak of the SIMD target in "
        "'peak used' with as many threads as workers (highway:X -> X, "
        "xsimd:avx512f -> AVX3, reference -> SCALAR, OpenBLAS -> %s); "
        "S1 decode shapes: K+V GB/s / the streaming read (four streams "
        "per thread, as attention reads K and V) with as many threads "
        "('read 1T', 'read 2T')" % (limits.blas_target() or "-"),
        "- vs OpenBLAS 3-step: its median time / this one, same shape and "
        "same workers; vs reference: the single-threaded reference backend's "
        "time / this one",
        "- max err: max |out - OpenBLAS out| / max |v|, checked once outside "
        "the timing",
        "- 2 copies (2-worker rows): what the machine gave two threads for "
        "the row's work just after it was timed: two copies of the row's "
        "1-worker call side by side on the pool's threads (own output and "
        "workspace), t1/t_a + t1/t_b, median of a few tries. 2.00x: two full "
        "cores; a 2-worker row cannot be expected to beat it. Below 2 where "
        "the copies compete for L3 or memory (a working set past L2, S1), "
        "or while the VM is not giving its vCPUs a core each; see the paired "
        "table",
        "",
    ]
    lines += scaling_lines(scaling)
    lines += merge_lines(medians, order, limits)
    for title, keep in SECTIONS:
        table = attention_rows(medians, cvs, errors, order, limits, keep)
        if table:
            lines += ["## " + title, ""] + markdown(table) + [""]
    lines += vs_plain_lines(vs_plain, limits.stream.get(1))
    lines += backward_lines(medians, cvs, errors, order, limits, bwd_paired,
                            bwd_scaling, model, nproc, ctx)
    lines += kv_error_lines(kv_error)
    text = "\n".join(lines)
    sys.stdout.write(text)
    md_path = os.path.join(out_dir, "report.md")
    with open(md_path, "w") as f:
        f.write(text)
    pictures = plot(medians, order, limits, out_dir, model)
    print("wrote %s and %s%s" % (report_path, md_path, "".join(
        " and " + p for p in pictures)))


if __name__ == "__main__":
    main()
