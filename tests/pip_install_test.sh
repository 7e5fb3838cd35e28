#!/usr/bin/env bash
# `pip install ./python` into a fresh virtual environment, then the installed package (imported
# from outside the source tree) validates a spec through libgdn. Usage: pip_install_test.sh SRC WORK LIBGDN
set -euo pipefail
src="$1" work="$2" lib="$3"
rm -rf "$work" && mkdir -p "$work"
python3 -m venv "$work/venv"
# From a copy: setuptools writes build/ and *.egg-info next to the sources it builds.
cp -r "$src/python" "$work/package"
"$work/venv/bin/python" -m pip install -q "$work/package"
cd "$work"
GDNC_LIBRARY="$lib" "$work/venv/bin/python" - "$work" <<'PY'
import sys
import gdnc
assert gdnc.__file__.startswith(sys.argv[1] + "/venv/"), f"imported {gdnc.__file__}, not the installed package"
spec = gdnc.validate_spec({"name": "installed", "heads": {"qk": 2, "v": 6}})
assert spec["heads"] == {"qk": 2, "v": 6} and spec["chunk"] == 64, spec
try:
    gdnc.validate_spec({"name": "installed", "heads": {"qk": 2, "v": 5}})
    raise SystemExit("an invalid spec was accepted")
except gdnc.SpecError as e:
    assert str(e).startswith("/heads/v"), e
print("pip install ./python: the installed gdnc", gdnc.__file__, "validates specs through", gdnc.library()._name)
PY
