#!/bin/bash
# lily-server's concurrent streams on a GPU: the batched device loop (LILY_SRV_BATCH_LOOP=1, the default)
# against the rounds (=0), beside lily-bench's batches in rounds and in the loop. What session 38's two
# device calls ran (.devrun/call1.sh and call2.sh), in one script.
# usage: bench/server_batch_loop.sh BIN_DIR MODEL_DIR     (BIN_DIR holds lily-server, lily-bench)
#   e.g. MODEL_DIR from `lily synth --out /tmp/m --preset 35b-a3b --layers 40` (19 GB, the full shape)
# Prints lily-bench's rows, then per mode: the first request's log line (the warm-up is on with the loop
# and off with the rounds: LILY_SRV_WARMUP), N concurrent 128-token requests (greedy at 2, 4, 8, 16;
# sampled at 4, 8; two reps each, wall clock with prompts and HTTP) and the last two requests' log
# lines (a stream's decode rate), then 8 and 16 requests of 16..128 tokens (ends at different steps,
# each one restarting the loop), and the device-loop counters.
set -u
. "$(dirname "$0")/server_lib.sh"
B=$1; M=$2
"$B/lily-bench" --model "$M" --tests tg128,tg128x2@64,tg128x2l@64,tg128x4@64,tg128x4l@64,tg128x8@64,tg128x8l@64,tg128x8ls@64,tg128x16@64,tg128x16l@64 \
  --reps 3 -o md 2>&1 | grep -E "^\| |rror" | grep -v -- "---"
req() { srv_post /v1/completions "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":${3:-128},$2,\"ignore_eos\":true}" >/dev/null; }
log() { grep -a 'request done' "$T/err" | sed 's/lily-server: request done: //'; }
G='"temperature":0'
S='"temperature":0.7,"top_k":20,"top_p":0.8'
for loop in 0 1; do
  echo "=== LILY_SRV_BATCH_LOOP=$loop LILY_SRV_WARMUP=$loop"
  srv_start "$T/err" env LILY_SRV_WARMUP=$loop LILY_SRV_BATCH_LOOP=$loop "$B/lily-server" --model-path "$M" --slots 16 --ctx-len 1024 \
    --log-requests 1
  req warm "$G"; echo "first request: $(log | head -1)"
  req warm2 "$G"; echo "second: $(log | sed -n 2p)"
  for samp in "$G" "$S"; do
    for N in 2 4 8 16; do
      [ "$samp" = "$S" ] && { [ $N = 2 ] || [ $N = 16 ]; } && continue
      for rep in 1 2; do
        t0=$(date +%s.%N)
        pids=""; for i in $(seq $N); do req "$i $rep" "$samp" & pids="$pids $!"; done; wait $pids
        t1=$(date +%s.%N)
        awk -v n="$N" -v a="$t0" -v b="$t1" -v s="$samp" -v r=$rep 'BEGIN { printf "%s N=%d x 128 (rep %d): %.3f s, %.1f tok/s aggregate\n", s, n, r, b - a, n * 128 / (b - a) }'
      done
      log | tail -2
    done
  done
  for N in 8 16; do
    for rep in 1 2; do
      t0=$(date +%s.%N)
      pids=""; tot=0
      for i in $(seq $N); do mt=$((16 * i * 8 / N)); tot=$((tot + mt)); req "$i $rep" "$S" $mt & pids="$pids $!"; done; wait $pids
      t1=$(date +%s.%N)
      awk -v n="$N" -v a="$t0" -v b="$t1" -v t=$tot -v r=$rep 'BEGIN { printf "staggered N=%d (16..128 tokens, %d in all) rep %d: %.3f s, %.1f tok/s aggregate\n", n, t, r, b - a, t / (b - a) }'
    done
  done
  srv_metrics "^lily_device_loop"
  srv_stop
done
