# Sourced (not run) by the scripts that run on the GPU machine, from the repository root: unpacks
# the binaries scripts/pack_device.sh carries into $bin and points the loader and gdnc at them and
# at this tree's templates. Returns 2 when the carried archive does not unpack.
bin=.scratch_device/bin
if [ -f .scratch_device/bin.tar.xz ]; then
  rm -rf "$bin" && mkdir -p "$bin" && tar xJf .scratch_device/bin.tar.xz -C "$bin" || return 2
fi
chmod +x "$bin"/* 2>/dev/null || true
export GDNC_SOURCE_DIR="$PWD" GDNC_CACHE_DIR="${GDNC_CACHE_DIR:-/tmp/gdnc-cache}"
export LD_LIBRARY_PATH="$PWD/$bin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
