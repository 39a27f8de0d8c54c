#!/bin/sh
# Cross-builds the native code for arm64 and runs its unit tests under qemu-aarch64 on three CPUs:
# qemu's default "max" (NEON, dotprod, i8mm: every kernel level is compared with the scalar one),
# Cortex-A76 (dotprod, no i8mm) and Cortex-A53 (ARMv8.0 NEON only). Each run also checks that dispatch
# picked that CPU's best level, so a binary falls back on older cores instead of dying with SIGILL.
# Usage: native/tests/run-arm64.sh [build-dir]   (default build/arm64)
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build/arm64}
case $build in /*) ;; *) build=$root/$build ;; esac
for tool in aarch64-linux-gnu-gcc qemu-aarch64 cmake ninja; do
    command -v "$tool" >/dev/null 2>&1 || { echo "run-arm64.sh: $tool not found (apt-get install gcc-aarch64-linux-gnu qemu-user ninja-build cmake)" >&2; exit 2; }
done
cmake -S "$root/native" -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$root/native/cmake-aarch64-linux-gnu.cmake"
cmake --build "$build" -j "${PI2_JOBS:-2}"
log=$build/run-arm64.log
# run_on CPU EXPECTED_LEVEL: all tests pass and dispatch picked the level that CPU should get
run_on() {
    echo "== arm64 tests, qemu cpu $1 (expect kernel level $2)"
    if [ "$1" = max ]; then unset QEMU_CPU; else QEMU_CPU=$1; export QEMU_CPU; fi
    ctest --test-dir "$build" --output-on-failure -V >"$log" 2>&1 || { cat "$log"; exit 1; }
    grep -E "tests passed|passed, " "$log" | sed 's/^[0-9]*: //'
    grep -q "kernel levels: best $2" "$log" || { echo "run-arm64.sh: expected best level $2 on $1" >&2; exit 1; }
}
run_on max i8mm
run_on cortex-a76 dotprod
run_on cortex-a53 neon
