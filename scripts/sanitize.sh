#!/usr/bin/env bash
# Builds gdnc's libraries, CLI and test binaries with ASan + UBSan (preset asan, into build-asan/;
# the prebuilt LLVM, NVRTC and OpenSSL stay uninstrumented) and runs the CPU doctest suites under
# them. The Python suite is left out: an uninstrumented interpreter cannot load an ASan library
# without LD_PRELOAD tricks. Kernels come from the release build's cache (same keys), so NVRTC
# compiles only what that build has not.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset asan >/dev/null
cmake --build --preset asan -j"$(nproc)"
export GDNC_CACHE_DIR="${GDNC_CACHE_DIR:-$PWD/build/kernel-cache}"
# Leaks inside NVRTC are NVIDIA's, not ours (tests/sanitizer/lsan.supp says which).
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-suppressions=$PWD/tests/sanitizer/lsan.supp:print_suppressions=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
start=$SECONDS
ctest --preset asan
echo "sanitizers (ASan + UBSan): CPU suites passed in $((SECONDS - start)) s"
