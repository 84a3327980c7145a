#!/bin/bash
# One device call for A/B measuring (bench/RESULTS.md session 19: copied to .devrun/call.sh after
# tests/cuda/pack_device.sh): unpack the pack, run run_device.sh's stages $STAGES, then each setting of $AB
# ("VAR=1,VAR2=0 ...", a comma joining variables; BIN=NAME runs bin/NAME, another commit's lily-bench packed as
# EXTRA) over $ABT (default tg128,tg128@4096) at --reps 3, all settings in turn, twice; with TRACE (env settings,
# X=1 for none) the decode timeline of the TRACE=1 lily-bench packed as lily-bench-trace. Logs go to $OUT.
set -u
mkdir -p /tmp/d && tar -C /tmp/d -xJf .devrun/pack.tar.xz
R=$OUT; export LD_LIBRARY_PATH=/tmp/d/lib BIN=/tmp/d/bin FIX=.fixtures OUT=/tmp/st
mkdir -p $OUT
cat /tmp/d/bin/COMMIT
[ -n "${STAGES:-}" ] && bash tests/cuda/run_device.sh $STAGES 2>&1 | tee $R/stages.log | grep -vE "^\s+(largest|rel|prefill|contin|gener)"
for r in 1 2; do
  for v in ${AB:-}; do
    b=lily-bench; case $v in BIN=*) b=${v#BIN=}; v=X=1;; esac
    echo "## $v $b (round $r)"; env ${v//,/ } /tmp/d/bin/$b --tests ${ABT:-tg128,tg128@4096} --reps 3 -o md 2>&1 | grep -E "^\| " | grep -vE "^\| (model|---)" | cut -d'|' -f3-5
  done
done
if [ -n "${TRACE:-}" ]; then
  env ${TRACE//,/ } LILY_CU_TRACE_OUT=/tmp/trace.bin /tmp/d/bin/lily-bench-trace --tests tg128 --reps 1 -o md 2>&1 | tail -n 1 | cut -d'|' -f3-5
  python3 tests/cuda/trace_table.py /tmp/trace.bin src/cuda > $R/trace.md 2>&1
  sed -n '/^| kernel/,/^$/p' $R/trace.md | head -16
fi
cp $OUT/bench.md $OUT/model.log $R/ 2>/dev/null
true
