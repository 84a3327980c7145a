#!/usr/bin/env bash
# Aggregate decode throughput of lily-server under N concurrent streams.
# usage: bench/server_concurrency.sh SERVER_BIN MODEL_DIR N [server options]
#        (32 greedy tokens per stream; on the GPU every round of the N streams is one batched pass;
#        the backend is SRV_BACKEND's, default cuda: bench/server_lib.sh)
# env: SAMP, sampling fields for the requests instead of greedy, e.g.
#      SAMP='"temperature":0.7,"top_k":20,"top_p":0.8' (Qwen's default)
set -u
. "$(dirname "$0")/server_lib.sh"
B=$1; M=$2; N=$3; shift 3
srv_start "$T/err" "$B" --model-path "$M" --slots 8 --ctx-len 512 "$@"
req() { srv_post /v1/completions "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":32,${SAMP:-\"temperature\":0},\"ignore_eos\":true}" >/dev/null; }
req warm
t0=$(date +%s.%N)
pids=""; for i in $(seq $N); do req $i & pids="$pids $!"; done; wait $pids
srv_rate "$N" $((N * 32)) "$t0" "$(date +%s.%N)" "streams x 32 tokens:"
