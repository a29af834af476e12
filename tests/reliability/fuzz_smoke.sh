#!/usr/bin/env bash
# The fuzzing smoke test: `fuzz_smoke.sh QKV_FUZZ ARTIFACT_DIR LIBFUZZER_ARGS...`.
# Runs the libFuzzer binary with the arguments given, its output to a log in
# ARTIFACT_DIR. Passes silently but for libFuzzer's final lines; on a failure
# prints first what failed (the harness's CHECK line or the sanitizer's
# report, and the input's file), then that input decoded (QKV_FUZZ_VERBOSE=1
# replay), then the log's last lines: a CI excerpt that shows only the start of
# a failing test's output still shows the cause.
set -u
fuzz=$1
dir=$2
shift 2
log=$dir/fuzz_smoke.log
rm -f "$dir"/crash-* "$dir"/timeout-* "$dir"/oom-* "$dir"/leak-*
"$fuzz" "$@" > "$log" 2>&1
rc=$?
if [ "$rc" -eq 0 ]; then
  tail -n 3 "$log"
  exit 0
fi
echo "qkv fuzz smoke: qkv_fuzz exited with $rc; the cause:"
grep -m 5 -E "CHECK FAILED|ERROR: (AddressSanitizer|UndefinedBehaviorSanitizer|libFuzzer)|runtime error|ALARM|Test unit written|SUMMARY" "$log"
for input in "$dir"/crash-* "$dir"/timeout-* "$dir"/oom-* "$dir"/leak-*; do
  [ -e "$input" ] || continue
  echo "== the input $input (hex, then decoded):"
  od -An -tx1 -v "$input" | head -n 20
  QKV_FUZZ_VERBOSE=1 timeout 120 "$fuzz" "$input" 2>&1 | grep -v "^INFO\|^Running\|^Executed" | head -n 40
done
echo "== the last lines of $log:"
tail -n 60 "$log"
exit "$rc"
