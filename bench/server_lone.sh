#!/bin/bash
# lily-server's lone stream: decode rate and first-token time with the device loop
# (LILY_SRV_DEVICE_LOOP=1, the default) and with the rounds (=0), on a GPU.
# usage: bench/server_lone.sh BIN_DIR MODEL_DIR     (BIN_DIR holds lily-server, lily-bench)
#   e.g. MODEL_DIR from `lily synth --out /tmp/m --preset 35b-a3b --layers 40` (19 GB, the full shape)
# Prints lily-bench's tg rates (the GPU alone), then per mode the request log's lines (three rounds of
# 256 greedy and 256 sampled tokens; then a slot swap sequence: the same prompt again parks the slot's
# conversation first), and whether each answer equals the rounds' (texts exact; logprobs within 1e-4).
set -u
. "$(dirname "$0")/server_lib.sh"
B=$1; M=$2
"$B/lily-bench" --model "$M" --tests tg256,tg256s --reps 3 -o md 2>&1 | grep -E "^\| |rror" | grep -v -- "---"
srv() { srv_start "$T/err" env LILY_SRV_DEVICE_LOOP=$1 "$B/lily-server" --model-path "$M" --slots 4 --ctx-len 4096 --log-requests 1; }
req() { srv_post /v1/completions "{\"prompt\":\"${3:-Once upon a time}\",\"max_tokens\":$1,$2,\"ignore_eos\":true}" |
  python3 -c 'import json,sys; c=json.load(sys.stdin)["choices"][0]; print(json.dumps([c["text"], c["finish_reason"], (c.get("logprobs") or {}).get("token_logprobs")]))'; }
G='"temperature":0'
S='"temperature":0.7,"top_p":0.8,"top_k":20,"seed":5,"presence_penalty":0.5,"logprobs":2'
for mode in 1 0; do
  srv $mode
  req 8 "$G" >/dev/null
  for r in 1 2 3; do req 256 "$G" >"$T/g$mode.$r"; req 256 "$S" >"$T/s$mode.$r"; done
  for p in "Once upon a time" "The quick brown fox" "Once upon a time" "Hello" "Hello"; do req 16 "$G" "$p" >/dev/null; done
  echo "## LILY_SRV_DEVICE_LOOP=$mode"
  grep "request done" "$T/err" | sed 's/lily-server: request done: //'
  srv_metrics "^lily_(device_loop|parked|unparked)"
  srv_stop
done
for f in g1.1 g1.3 s1.1 s1.3; do
  python3 - "$T/$f" "$T/${f/1./0.}" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
d = max([abs(x - y) for x, y in zip(a[2] or [], b[2] or [])] or [0])
print("%s: text %s, logprobs max diff %.1e" % (sys.argv[1].split("/")[-1], "same" if a[0] == b[0] else "DIFFERS", d))
PY
done
