#!/usr/bin/env bash
# Installs the Debian packages gdnc builds against. Idempotent: installs only what is missing.
set -euo pipefail
# clang-14 and libclang-rt-14-dev (libFuzzer, ASan, UBSan; only recommended by clang-14) build the
# fuzz targets that scripts/fuzz.sh runs in CI.
packages=(cmake g++ ninja-build libfmt-dev nlohmann-json3-dev doctest-dev libcli11-dev libssl-dev
          llvm-14-dev zlib1g-dev libzstd-dev libtinfo-dev libxml2-dev libedit-dev libffi-dev
          clang-14 libclang-rt-14-dev clang-format-14)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: all Debian packages present"
fi
if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "setup: the CUDA toolkit (13.0) is expected at /usr/local/cuda; it is not a Debian package here" >&2
  exit 1
fi
