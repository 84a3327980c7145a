#!/usr/bin/env bash
# CPU benchmark: a 35B-A3B-shaped random model cut to a few layers (full hidden, experts
# and vocab, MLX 4-bit), timed by bench/cpu_bench.c straight through cpu_forward.
# usage: bench/cpu_bench.sh [MODEL_DIR] [cpu_bench options...]   (run from the repo root after make)
# env: LAYERS (4), KINDS ("ref auto"), PROMPT (128), GEN (16), REPS (3)
set -euo pipefail
B=${BUILD:-build}
M=${1:-/tmp/lily-cpubench-35b-l${LAYERS:-4}}
[ $# -gt 0 ] && shift
cc -O2 -std=gnu11 -Wall -Wextra -Werror -Iinclude -Isrc -pthread bench/cpu_bench.c "$B/liblily.a" -o "$B/cpu_bench" \
   -ljansson -lmicrohttpd -lcurl -lcrypto -lpcre2-8 -lutf8proc -lm -pthread
if [ ! -f "$M/config.json" ]; then
  echo "synth: $M (35b-a3b preset, ${LAYERS:-4} layers)" >&2
  /usr/bin/time -f "synth %e s wall, %U s user" "$B/lily" synth --out "$M" --preset 35b-a3b --layers "${LAYERS:-4}"
fi
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')  date: $(date -u +%FT%TZ)"
for k in ${KINDS:-ref auto}; do
  "$B/cpu_bench" "$M" --prompt "${PROMPT:-128}" --gen "${GEN:-16}" --reps "${REPS:-3}" --kind "$k" "$@"
done
