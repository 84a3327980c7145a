#!/bin/bash
# lily-server: concurrent sampled requests that end at different steps (N of 16, 32, ..., 128 tokens at
# N = 8 and 16; every end leaves the batched device loop), for one or more server binaries in alternated
# rounds, with the aggregate rate (wall clock with prompts, prefill and HTTP) and the device-loop counters.
# usage: bench/server_staggered.sh MODEL_DIR ROUNDS SERVER...   (MODEL_DIR from `lily synth --out /tmp/m
#   --preset 35b-a3b --layers 40`; SERVER: lily-server binaries, say this commit's and a baseline's)
set -u
M=$1; R=$2; shift 2
T=$(mktemp -d)
sp=
trap 'kill $sp 2>/dev/null; rm -rf "$T"' EXIT
req() { env -u LD_LIBRARY_PATH curl -s "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
  -d "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":$2,\"temperature\":0.7,\"top_k\":20,\"top_p\":0.8,\"ignore_eos\":true}" >/dev/null; }
for r in $(seq "$R"); do
  for S in "$@"; do
    "$S" --model-path "$M" --port 0 --slots 16 --ctx-len 1024 --backend cuda 2>"$T/err" &
    sp=$!
    port=
    for _ in $(seq 900); do kill -0 $sp 2>/dev/null || break; port=$(grep -ao 'http://127.0.0.1:[0-9]*' "$T/err" | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.2; done
    [ -n "$port" ] || { echo "$S: server did not start: $(tail -3 "$T/err")"; exit 1; }
    req warm 16
    for N in 8 16; do
      t0=$(date +%s.%N)
      pids=""; tot=0
      for i in $(seq $N); do mt=$((16 * i * 8 / N)); tot=$((tot + mt)); req "$i $r" $mt & pids="$pids $!"; done; wait $pids
      t1=$(date +%s.%N)
      awk -v s="$(basename "$S")" -v n="$N" -v a="$t0" -v b="$t1" -v t=$tot -v r=$r \
        'BEGIN { printf "round %d %s N=%d (%d tokens): %.3f s, %.1f tok/s\n", r, s, n, t, b - a, t / (b - a) }'
    done
    echo "  $(env -u LD_LIBRARY_PATH curl -s "http://127.0.0.1:$port/metrics" | grep -E "^lily_device_loop" | tr '\n' ' ')"
    kill $sp; wait $sp 2>/dev/null; sp=
  done
done
