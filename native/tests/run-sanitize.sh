#!/bin/sh
# The engine under AddressSanitizer + UndefinedBehaviorSanitizer (and LeakSanitizer at every exit):
# builds native/ with PI2_SANITIZE=ON, runs the native unit tests, then the engine end to end: sparse
# generates under a memory budget on a small synthetic model (every policy's read path, the pipeline
# with lookahead), a neuron read failing mid-decode (PI2_IO_FAULT), the crafted files that must be
# refused with one line, and `serve` against hostile clients (tests/test_serve.py). Any sanitizer
# report fails the run. docs/FUZZ.md.
# Usage: native/tests/run-sanitize.sh [build-dir] [python]   (default build/asan, .venv/bin/python)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build/asan}
py=${2:-$root/.venv/bin/python}
case $build in /*) ;; *) build=$root/$build ;; esac
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
start=$(date +%s)
cmake -S "$root/native" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPI2_SANITIZE=ON >/dev/null
cmake --build "$build" -j "${PI2_JOBS:-2}"
echo "== native unit tests under ASan+UBSan"
ctest --test-dir "$build" --output-on-failure
engine=$build/pi2-engine
work=$build/sanitize
rm -rf "$work" && mkdir -p "$work"

# one error line, a plain non-zero exit (no signal, no sanitizer report)
expect_one_line() {
    what=$1; shift
    rc=0; "$@" >"$work/out" 2>"$work/err" || rc=$?
    lines=$(wc -l <"$work/err")
    if [ "$rc" -eq 0 ] || [ "$rc" -gt 2 ] || [ "$lines" -ne 1 ] || ! grep -q "^pi2-engine: error: " "$work/err"; then
        echo "run-sanitize.sh: $what: expected one error line and exit 1 or 2, got exit $rc:" >&2
        cat "$work/err" >&2; exit 1
    fi
    echo "$what: $(cat "$work/err")"
}

echo "== a small synthetic sparse model (2 layers of 8192 neurons), sparse generate under a budget"
model=$work/model/model.pi2
"$py" -m pi2cli models synth --like turbosparse-mistral-7b --layers 2 --hidden 128 --ffn 8192 \
    --calib-seqs 1 --eval-seqs 1 --out "$work/model" >/dev/null
# The budget: about the smallest of these that holds the fixed region (larger under ASan: shadow memory),
# so the neuron cache holds part of the FFN and decode reads from storage. The probe runs the same
# prompt and length as the runs below: the engine sizes the context (KV cache, attention scratch)
# to the run, so a shorter probe would find a budget the real runs do not fit in.
prompt="The capital of France is"
ngen=24
# One step above the smallest that passes: the fixed region's resident part is measured (RSS), so
# a budget right at the edge passes or fails by a fraction of a MiB, and leaves no neuron cache.
budget=""
found=""
for b in 34M 36M 40M 48M 64M 96M 128M 160M; do
    if [ -n "$found" ]; then budget=$b; break; fi
    if "$engine" generate -m "$model" -p "$prompt" -n "$ngen" --ignore-eos --policy powerinfer2 --lookahead \
        --memory-budget "$b" >/dev/null 2>"$work/err"; then
        found=$b; continue
    fi
    grep -q "is too small" "$work/err" || { cat "$work/err" >&2; exit 1; }
done
[ -n "$budget" ] || { echo "run-sanitize.sh: no budget up to 128M holds the fixed region with a step to spare" >&2; exit 1; }
for args in "--policy powerinfer2 --lookahead" "--policy powerinfer2 --io pread --check-predictor" \
            "--policy cache --io buffered" "--policy llmflash" "--policy bundle --batch 3"; do
    # shellcheck disable=SC2086
    "$engine" generate -m "$model" -p "$prompt" -n "$ngen" --ignore-eos --memory-budget "$budget" \
        $args --events "$work/events.jsonl" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
    echo "generate $args --memory-budget $budget: $(tail -1 "$work/err")"
done
expect_one_line "neuron read failing mid-decode (PI2_IO_FAULT=eio:2000)" \
    env PI2_IO_FAULT=eio:2000 "$engine" generate -m "$model" -p "$prompt" -n "$ngen" --ignore-eos \
    --policy powerinfer2 --memory-budget "$budget"

echo "== crafted files: one error line each"
"$py" "$root/tests/crafted_models.py" crafted "$work/crafted"
for f in "$work"/crafted/*.pi2; do
    expect_one_line "info $(basename "$f")" "$engine" info -m "$f"
    expect_one_line "generate $(basename "$f")" "$engine" generate -m "$f" -p hi -n 2 --policy powerinfer2
done
for f in "$root"/tests/fuzz/regressions/pi2file/*.pi2.gz; do
    gzip -dc "$f" >"$work/regression.pi2"
    expect_one_line "info $(basename "$f")" "$engine" info -m "$work/regression.pi2"
done
echo "== output files that are not regular files, and a full disk: one error line each"
ln -sf "$work/err" "$work/link"
mkfifo "$work/fifo"
for out in "$work/link" "$work/fifo" /dev/full; do
    expect_one_line "eval --logits-out $out" "$engine" eval -m "$model" --tokens 1,2 --logits-out "$out"
    expect_one_line "generate --events $out" "$engine" generate -m "$model" -p hi -n 2 --events "$out"
done
# ulimit -f (a few blocks): later writes fail with EFBIG as on a full disk (SIGXFSZ ignored, so the
# write returns the error)
expect_one_line "eval --logits-out on a full disk" sh -c 'trap "" XFSZ; ulimit -f 4; exec "$@"' sh \
    "$engine" eval -m "$model" --tokens 1,2,3,4 --all --logits-out "$work/logits.bin"
expect_one_line "chat --events on a full disk" \
    sh -c 'trap "" XFSZ; ulimit -f 2; echo "{\"prompt\": \"hi\", \"n_predict\": 64}" | "$@"' sh \
    "$engine" chat -m "$model" --events "$work/big-events.jsonl"
[ ! -e "$work/logits.bin" ] && [ -z "$(find "$work" -maxdepth 1 -name '.logits.bin.*')" ] || {
    echo "run-sanitize.sh: a failed --logits-out left a file behind" >&2; exit 1; }
echo "== serve: hostile clients, a disconnect mid-stream, a full queue, /metrics, SIGTERM (exit 0, no leak)"
PI2_BUILD_DIR=$build "$py" -m pytest -q -x -p no:cacheprovider "$root/tests/test_serve.py" \
    -k "hostile or slow_loris or disconnect or queue or api_key"
PI2_BUILD_DIR=$build "$py" -m pytest -q -x -p no:cacheprovider "$root/tests/test_serve_metrics.py"
echo "run-sanitize.sh: passed in $(( $(date +%s) - start )) s"
