#!/usr/bin/env bash
# Device check for `iobench gds` (see benchmarks/gds_device_check.py).  On the device machine:
#   bash benchmarks/gds_device_check.sh            # results in $OUT (default reports/gds-device-check)
# Wheels for KvikIO (kvikio-cu12, libkvikio-cu12 and their small deps) and for iobench's
# dependencies are installed from $GDS_WHEELS (default shared/wheels) when that directory
# exists; torch and cupy are expected to be installed already.  iobench itself is imported
# from this tree through a symlink shim (no pip install, nothing written into the tree).
# Everything is bounded by $GDS_TIMEOUT seconds (default 290).
set -u
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
OUT="${OUT:-reports/gds-device-check}"
WHEELS="${GDS_WHEELS:-shared/wheels}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
{
  echo "## nvidia-smi"; nvidia-smi 2>&1 | head -20
  echo "## python"; "$PY" -c 'import sys; print(sys.version)'
  for m in torch cupy kvikio; do "$PY" -c "import $m; print('$m', $m.__version__)" 2>&1 | tail -1; done
} > "$OUT/environment.txt" 2>&1
if [ -d "$WHEELS" ]; then
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" kvikio-cu12 numpy fsspec PyYAML psutil hdrhistogram \
      xxhash crc32c zstandard rich pytest pytest-timeout >> "$OUT/install.txt" 2>&1 || \
    echo "install from $WHEELS failed (see above); missing paths will report unavailable" >> "$OUT/install.txt"
fi
if ! "$PY" -c 'import iobench.gds' 2>/dev/null; then
  SHIMDIR="$(mktemp -d)"
  trap 'rm -rf "$SHIMDIR"' EXIT
  SHIM="$SHIMDIR/site"
  mkdir -p "$SHIM/iobench"
  for f in "$ROOT"/iobench/*; do ln -s "$f" "$SHIM/iobench/$(basename "$f")"; done
  ln -s "$ROOT/gds" "$SHIM/iobench/gds"
  ln -s "$ROOT/formats" "$SHIM/iobench/formats"
  ln -s "$ROOT/checkpointing" "$SHIM/iobench/checkpointing"
  export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
timeout -k 10 "${GDS_TIMEOUT:-290}" "$PY" benchmarks/gds_device_check.py --out "$OUT" "$@"
rc=$?
echo "exit code $rc" >> "$OUT/environment.txt"
exit $rc
