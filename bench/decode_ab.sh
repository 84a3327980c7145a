#!/bin/bash
# A/B of a decode setting on one warm GPU machine: lily-bench's tg128 and tg128@4096 (model made in GPU
# memory) with VAR=0 and VAR=1 in turn, ROUNDS rounds (default 2), each row the median of 3 reps.
# usage: bench/decode_ab.sh BIN_DIR VAR [ROUNDS]     e.g. bench/decode_ab.sh /tmp/d/bin LILY_CU_PREFETCH
# (sessions 40-41 measured LILY_CU_GDN_OUT, since removed, with it: bench/RESULTS.md)
set -u
B=$1; V=$2; R=${3:-2}
for r in $(seq "$R"); do
  for v in 0 1; do
    row=$(env "$V=$v" "$B/lily-bench" --tests tg128,tg128@4096 --reps 3 -o md 2>&1 | grep -E '\| tg' | awk -F'|' '{printf "%s %s;", $3, $4}')
    echo "$V=$v round $r: $row"
  done
done
