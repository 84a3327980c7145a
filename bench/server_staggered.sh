#!/bin/bash
# lily-server: concurrent sampled requests that end at different steps (N of 16, 32, ..., 128 tokens at
# N = 8 and 16; every end leaves the batched device loop), for one or more server binaries in alternated
# rounds, with the aggregate rate (wall clock with prompts, prefill and HTTP) and the device-loop counters.
# usage: bench/server_staggered.sh MODEL_DIR ROUNDS SERVER...   (MODEL_DIR from `lily synth --out /tmp/m
#   --preset 35b-a3b --layers 40`; SERVER: lily-server binaries, say this commit's and a baseline's)
set -u
. "$(dirname "$0")/server_lib.sh"
M=$1; R=$2; shift 2
req() { srv_post /v1/completions "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":$2,\"temperature\":0.7,\"top_k\":20,\"top_p\":0.8,\"ignore_eos\":true}" >/dev/null; }
for r in $(seq "$R"); do
  for S in "$@"; do
    srv_start "$T/err" "$S" --model-path "$M" --slots 16 --ctx-len 1024
    req warm 16
    for N in 8 16; do
      t0=$(date +%s.%N)
      pids=""; tot=0
      for i in $(seq $N); do mt=$((16 * i * 8 / N)); tot=$((tot + mt)); req "$i $r" $mt & pids="$pids $!"; done; wait $pids
      srv_rate "$N" "$tot" "$t0" "$(date +%s.%N)" "round $r $(basename "$S")"
    done
    echo "  $(srv_metrics '^lily_device_loop' | tr '\n' ' ')"
    srv_stop
  done
done
