#!/bin/sh
# A bounded fuzz run of every pi2-fuzz target from the sanitizer build (docs/FUZZ.md): the seed corpus
# is written by the project's own .pi2 writer (tests/crafted_models.py) next to the committed
# regression inputs, the time is split 60/12/12/16 between pi2file, plan, chat and http, and any crash, hang or
# leak fails the run with its input kept under BUILD/fuzz/findings.
# Usage: native/fuzz/run-fuzz.sh [build-dir] [seconds] [seed] [python]
#   (defaults: build/asan, 120, 1, .venv/bin/python; the build must exist: make fuzz builds it)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build/asan}
seconds=${2:-120}
seed=${3:-1}
py=${4:-$root/.venv/bin/python}
case $build in /*) ;; *) build=$root/$build ;; esac
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fuzz=$build/pi2-fuzz
[ -x "$fuzz" ] || { echo "run-fuzz.sh: $fuzz is not built (make fuzz builds it)" >&2; exit 2; }
work=$build/fuzz
rm -rf "$work/corpus" && mkdir -p "$work/corpus" "$work/findings"
"$py" "$root/tests/crafted_models.py" seeds "$work/corpus"
for t in plan chat http; do cp "$root"/tests/fuzz/regressions/$t/* "$work/corpus/$t/" 2>/dev/null || true; done
status=0
for spec in pi2file:60 plan:12 chat:12 http:16; do
    t=${spec%%:*}
    s=$(( seconds * ${spec##*:} / 100 ))
    [ "$s" -ge 1 ] || s=1
    "$fuzz" "$t" --corpus "$work/corpus/$t" --seconds "$s" --seed "$seed" --crashes "$work/findings" \
        >"$work/$t.log" 2>&1 || status=1
    tail -1 "$work/$t.log"
    grep -q " 0 crashes, 0 hangs, 0 leaks" "$work/$t.log" || { status=1; grep -m 20 -E "ERROR|runtime error|pi2-fuzz:" "$work/$t.log" >&2 || true; }
done
[ "$status" -eq 0 ] || echo "run-fuzz.sh: findings in $work/findings (logs: $work/*.log)" >&2
exit $status
