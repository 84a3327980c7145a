#!/bin/bash
# One device call: unpack what tests/cuda/pack_device.sh packed, run run_device.sh's stages (and, with
# NCU=1, Nsight Compute over a few decode tokens) inside a deadline, and leave every log in $OUT/logs.tgz
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
  if [ "$s" = ncu ]; then
    # one kernel's time and DRAM bytes each, over 3 decode tokens (the random model's fills excluded)
    timeout $(left) ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,launch__grid_size \
      -k 'regex:^(?!k_fill)' --csv --page raw $BIN/lily-bench --tests ${NCU_TEST:-tg3} --reps 1 --warmup 0 \
      >$L/ncu.csv 2>$L/ncu.err; echo "== ncu rc $?: $(wc -l <$L/ncu.csv) rows" | tee -a $L/summary.txt
  else
    timeout $(left) bash tests/cuda/run_device.sh $s 2>&1 | tee -a $L/summary.txt
  fi
done
tar -C $L -czf $OUT_DIR/logs.tgz . 2>/dev/null; cp $L/summary.txt $OUT_DIR/
