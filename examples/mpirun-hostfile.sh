#!/bin/bash
# The same cluster benchmark with mpirun and a hostfile (no scheduler).
#   bash examples/mpirun-hostfile.sh hosts.txt 16
# hosts.txt, one node per line:  node01 slots=8   (Open MPI)  or  node01:8   (MPICH hydra)
# Every node needs the same Python env at the same path (pip install 'iobench[mpi]') and the
# shared paths below mounted at the same place; LOCAL is each node's own disk.
set -euo pipefail
HOSTS=${1:?hostfile}
N=${2:-8}
SHARED=${SHARED:-/mnt/shared/iobench}
LOCAL=${LOCAL:-/mnt/nvme/iobench}
OUT="$SHARED/results/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$OUT"

MPIRUN=(mpirun --hostfile "$HOSTS" -n "$N")
if mpirun --version 2>&1 | grep -q "Open MPI"; then
  # forward the environment; allow root only if you really run as root
  MPIRUN+=(-x PATH -x AWS_ACCESS_KEY_ID -x AWS_SECRET_ACCESS_KEY -x AWS_ENDPOINT_URL)
  [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
else
  MPIRUN+=(-genvlist PATH,AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY,AWS_ENDPOINT_URL)
fi

"${MPIRUN[@]}" iobench gen --format raw --modality tokens --num-samples 2000000 --seq-len 2048 \
    --shard-size 256MiB --out "$SHARED/ds" --json "$OUT/gen.json"
"${MPIRUN[@]}" iobench load "$SHARED/ds" --workers 4 --compute 100ms --steps 500 --json "$OUT/load.json"
"${MPIRUN[@]}" iobench probe file "$SHARED/probe" --layout n-n,n-1 --bs 1MiB --file-size 2GiB \
    --size $((N * 2))GiB --json "$OUT/probe-file.json"
"${MPIRUN[@]}" iobench ckpt --params 8e9 --scale 0.01 --dp "$N" --zero 3 --local "$LOCAL/ckpt" \
    --durable "$SHARED/ckpt" --json "$OUT/ckpt.json"
echo "results in $OUT (rank 0 wrote one file per command: world metrics + per_rank)"
