#!/usr/bin/env bash
# Aggregate decode throughput of lily-server under N concurrent streams.
# usage: bench/server_concurrency.sh SERVER_BIN MODEL_DIR N [server options, e.g. --backend cuda]
#        (32 greedy tokens per stream; on the GPU every round of the N streams is one batched pass)
B=$1; M=$2; N=$3; shift 3
$B --model-path $M --port 0 --slots 8 --ctx-len 512 "$@" 2>${TMPDIR:-/tmp}/lily-conc.err &
sp=$!
for _ in $(seq 600); do port=$(grep -o 'http://127.0.0.1:[0-9]*' ${TMPDIR:-/tmp}/lily-conc.err | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.2; done
req() { curl -s http://127.0.0.1:$port/v1/completions -H 'Content-Type: application/json' -d "{\"prompt\":\"Once upon a time $1\",\"max_tokens\":32,\"temperature\":0,\"ignore_eos\":true}" >/dev/null; }
req warm
t0=$(date +%s.%N)
pids=""; for i in $(seq $N); do req $i & pids="$pids $!"; done; wait $pids
t1=$(date +%s.%N)
echo "N=$N streams x 32 tokens: $(echo "$t1 - $t0" | bc) s, $(echo "$N * 32 / ($t1 - $t0)" | bc -l | cut -c1-6) tok/s aggregate"
kill $sp; wait $sp 2>/dev/null
