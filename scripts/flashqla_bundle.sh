#!/usr/bin/env bash
# Builds .peers/flashqla.tar.xz: FlashQLA 0.1.3 and the environment it needs (tilelang 0.1.15,
# apache-tvm-ffi 0.1.12 -- a newer one fails at import --, torch-c-dlpack-ext 0.1.5, z3-solver
# 4.15.4.0 whose libz3 libtvm links), for Python 3.12 on x86-64 Linux, the GPU machine's Python.
# torch and the CUDA toolkit are already there. Nothing of this is committed (.peers/ is ignored).
# On the GPU machine, scripts/gpu_run.sh unpacks it into a folder put on PYTHONPATH for the
# FlashQLA process only.
set -euo pipefail
cd "$(dirname "$0")/.."
wheels=.peers/wheels site=.peers/flashqla-site out=.peers/flashqla.tar.xz
pins=(flash-qla==0.1.3 tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0)
platform=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
mkdir -p "$wheels"
python3 -m pip download -q --no-deps "${platform[@]}" -d "$wheels" "${pins[@]}"
n=$(ls "$wheels"/*.whl | wc -l)
[ "$n" -eq ${#pins[@]} ] || { echo "flashqla_bundle: expected ${#pins[@]} wheels in $wheels, found $n (one version of each)" >&2; exit 1; }
rm -rf "$site"
python3 -m pip install -q --no-deps --no-compile "${platform[@]}" --target "$site" "$wheels"/*.whl
# Not needed to run FlashQLA's kernels and too large to carry: AMD's composable_kernel sources
# (absent from some tilelang wheels) and the z3 command-line program (libz3 stays).
rm -rf "$site/tilelang/3rdparty/composable_kernel" "$site/bin/z3"
tar -C "$site" -cf - . | xz -6 -T0 > "$out"
du -h "$out"
