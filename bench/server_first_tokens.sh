#!/bin/bash
# lily-server: the first tokens of N simultaneous arrivals (4, 8, 16 greedy 128-token requests, two reps):
# min, mean and max time to the first token from the request log, and the aggregate rate. Session 38 call 3
# ran it as .devrun/call3.sh with B=/tmp/d/bin and M=/tmp/m.
# usage: bench/server_first_tokens.sh BIN_DIR MODEL_DIR
set -u
B=$1; M=$2
T=$(mktemp -d)
trap 'kill $sp 2>/dev/null; rm -rf "$T"' EXIT
sp=
req() { env -u LD_LIBRARY_PATH curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":128,$2,\"ignore_eos\":true}" >/dev/null; }
: > $T/err
"$B/lily-server" --model-path "$M" --port 0 --slots 16 --ctx-len 1024 --backend cuda --log-requests 1 2>$T/err &
sp=$!
port=
for _ in $(seq 900); do kill -0 $sp 2>/dev/null || break; port=$(grep -ao 'http://127.0.0.1:[0-9]*' $T/err | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.2; done
[ -n "$port" ] || { echo "no server"; tail -5 $T/err; exit 1; }
req warm '"temperature":0'
for N in 4 8 16; do
  for rep in 1 2; do
    : > $T/err
    t0=$(date +%s.%N)
    pids=""; for i in $(seq $N); do req "$i $rep" '"temperature":0' & pids="$pids $!"; done; wait $pids
    t1=$(date +%s.%N)
    awk -v n="$N" -v a="$t0" -v b="$t1" -v r=$rep 'BEGIN { printf "greedy N=%d x 128 (rep %d): %.3f s, %.1f tok/s aggregate\n", n, r, b - a, n * 128 / (b - a) }'
    grep -ao "first token [0-9.]* ms, [0-9.]* tok/s" $T/err | awk '{t=$3; s+=t; if (t>m) m=t; if (mn==""||t<mn) mn=t; r=$5} END {printf "  first token: min %.1f mean %.1f max %.1f ms; a stream %.1f tok/s\n", mn, s/NR, m, r}'
  done
done
kill $sp; wait $sp 2>/dev/null
