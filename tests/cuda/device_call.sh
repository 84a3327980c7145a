#!/bin/bash
# One device call: unpack what tests/cuda/pack_device.sh packed, run run_device.sh's stages (ncu among
# them: Nsight Compute over a few decode tokens) inside a deadline, and leave every log in $OUT/logs.tgz
# plus a summary in $OUT/summary.txt, so that a call stopped at its limit still returns what it measured.
#   bash tests/cuda/device_call.sh SECONDS stage...
set -u
DEADLINE=$(( $(date +%s) + ${1:-540} )); shift
OUT_DIR=${OUT:?}; D=/tmp/d; L=/tmp/lily-device; mkdir -p $D $L
[ -x $D/bin/lily ] || tar -C $D -xJf .devrun/pack.tar.xz || exit 1
export LD_LIBRARY_PATH=$D/lib BIN=$D/bin FIX=.fixtures OUT=$L
echo "commit $(head -1 $D/bin/COMMIT); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)" | tee $L/summary.txt
left() { echo $(( DEADLINE - $(date +%s) )); }
for s in "$@"; do
  [ "$(left)" -gt 20 ] || { echo "== $s skipped: deadline" | tee -a $L/summary.txt; continue; }
  timeout $(left) bash tests/cuda/run_device.sh $s 2>&1 | tee -a $L/summary.txt
done
tar -C $L -czf $OUT_DIR/logs.tgz . 2>/dev/null; cp $L/summary.txt $OUT_DIR/
