#!/usr/bin/env bash
# Aggregate decode throughput of lily-server under N concurrent streams.
# usage: bench/server_concurrency.sh SERVER_BIN MODEL_DIR N [server options, e.g. --backend cuda]
#        (32 greedy tokens per stream; on the GPU every round of the N streams is one batched pass)
# env: SAMP, sampling fields for the requests instead of greedy, e.g.
#      SAMP='"temperature":0.7,"top_k":20,"top_p":0.8' (Qwen's default)
B=$1; M=$2; N=$3; shift 3
$B --model-path $M --port 0 --slots 8 --ctx-len 512 "$@" 2>${TMPDIR:-/tmp}/lily-conc.err &
sp=$!
for _ in $(seq 600); do port=$(grep -o 'http://127.0.0.1:[0-9]*' ${TMPDIR:-/tmp}/lily-conc.err | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.2; done
# curl without LD_LIBRARY_PATH: on the GPU machine that points at the libraries carried for lily
# (tests/cuda/pack_device.sh), which the system's curl must not load
req() { env -u LD_LIBRARY_PATH curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":32,${SAMP:-\"temperature\":0},\"ignore_eos\":true}" >/dev/null; }
req warm
t0=$(date +%s.%N)
pids=""; for i in $(seq $N); do req $i & pids="$pids $!"; done; wait $pids
t1=$(date +%s.%N)
awk -v n="$N" -v a="$t0" -v b="$t1" 'BEGIN { printf "N=%d streams x 32 tokens: %.3f s, %.1f tok/s aggregate\n", n, b - a, n * 32 / (b - a) }'
kill $sp; wait $sp 2>/dev/null
