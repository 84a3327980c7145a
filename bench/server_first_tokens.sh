#!/bin/bash
# lily-server: the first tokens of N simultaneous arrivals (4, 8, 16 greedy 128-token requests, two reps):
# min, mean and max time to the first token from the request log, and the aggregate rate. Session 38 call 3
# ran it as .devrun/call3.sh with B=/tmp/d/bin and M=/tmp/m.
# usage: bench/server_first_tokens.sh BIN_DIR MODEL_DIR
set -u
. "$(dirname "$0")/server_lib.sh"
B=$1; M=$2
req() { srv_post /v1/completions "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":128,$2,\"ignore_eos\":true}" >/dev/null; }
srv_start "$T/err" "$B/lily-server" --model-path "$M" --slots 16 --ctx-len 1024 --log-requests 1
req warm '"temperature":0'
for N in 4 8 16; do
  for rep in 1 2; do
    : >"$T/err"
    t0=$(date +%s.%N)
    pids=""; for i in $(seq $N); do req "$i $rep" '"temperature":0' & pids="$pids $!"; done; wait $pids
    srv_rate "$N" $((N * 128)) "$t0" "$(date +%s.%N)" "greedy x 128 (rep $rep)"
    grep -ao "first token [0-9.]* ms, [0-9.]* tok/s" "$T/err" | awk '{t=$3; s+=t; if (t>m) m=t; if (mn==""||t<mn) mn=t; r=$5} END {printf "  first token: min %.1f mean %.1f max %.1f ms; a stream %.1f tok/s\n", mn, s/NR, m, r}'
  done
done
