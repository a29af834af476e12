"""Reads bench/ab.sh's JSON (a_*.json, b_*.json) and prints, per benchmark,
the median time of A and of B over every repetition of every round and the
ratio B/A (below 1: B is faster), then the range of the ratios."""
import glob
import json
import os
import statistics
import sys


def times(pattern):
    out = {}
    for path in sorted(glob.glob(pattern)):
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                if b.get("run_type") != "iteration":
                    continue
                name = b["run_name"] if "run_name" in b else b["name"]
                out.setdefault(name, []).append(b["real_time"])
    return out


def main():
    d = sys.argv[1]
    a, b = times(os.path.join(d, "a_*.json")), times(os.path.join(d, "b_*.json"))
    ratios = []
    print(f"{'benchmark':70s} {'A median':>12s} {'B median':>12s} {'B/A':>7s}")
    for name in a:
        if name not in b:
            continue
        ma, mb = statistics.median(a[name]), statistics.median(b[name])
        ratios.append((mb / ma, name))
        print(f"{name:70s} {ma:12.4g} {mb:12.4g} {mb / ma:7.3f}")
    if ratios:
        rs = sorted(r for r, _ in ratios)
        print(f"\n{len(rs)} benchmarks: B/A median {statistics.median(rs):.3f}, "
              f"min {rs[0]:.3f} ({min(ratios)[1]}), max {rs[-1]:.3f} ({max(ratios)[1]})")


if __name__ == "__main__":
    main()
