#!/usr/bin/env bash
# The whole pipeline on a fresh machine, in seconds: build lily, write a small
# random-weight checkpoint of the real Qwen3.5/3.6-MoE architecture with a synthetic
# tokenizer (build/demo-model), start lily-server on it, and send real requests with curl.
# The weights are random, so the answers are gibberish: this shows the plumbing, not a
# model. To serve a real checkpoint instead:  MODEL=/path/to/Qwen3.6-35B-A3B scripts/quickstart.sh
# Add --keep to leave the server running afterwards (Ctrl-C stops it).
set -euo pipefail
cd "$(dirname "$0")/.."
keep=0; [ "${1:-}" = "--keep" ] && keep=1
jobs=$(nproc 2>/dev/null || echo 2)
bash scripts/setup.sh | grep -v "^setup: ok" || true
echo "== building (make -j$jobs)"
make -s -j"$jobs" build/lily build/lily-server
model=${MODEL:-build/demo-model}
if [ -z "${MODEL:-}" ] && [ ! -f "$model/tokenizer.json" ]; then
  echo "== writing a random-weight demo model to $model"
  build/lily synth --out "$model" --preset tiny --seed 1
fi
log=$(mktemp)
echo "== starting lily-server on $model"
build/lily-server --model-path "$model" --port "${PORT:-0}" --ctx-len "${CTX_LEN:-4096}" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 600); do grep -q "serving" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
cat "$log"
port=$(grep -o 'http://[0-9.]*:[0-9]*' "$log" | sed 's/.*://')
[ -n "$port" ] || { echo "lily-server did not start"; exit 1; }
url="http://127.0.0.1:$port"
echo
echo "== curl $url/v1/chat/completions"
curl -sS "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello! Who are you?"}],"max_tokens":24,"temperature":0}'
echo; echo
echo "== the same, streamed (server-sent events)"
curl -sS -N "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello! Who are you?"}],"max_tokens":4,"temperature":0,"stream":true}'
echo
echo "== structured output: a JSON schema enforced while decoding (even random weights answer valid JSON)"
curl -sS "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"A city and its population?"}],"max_tokens":300,"temperature":0,
       "chat_template_kwargs":{"enable_thinking":false},
       "response_format":{"type":"json_schema","json_schema":{"name":"city","schema":{"type":"object",
         "properties":{"city":{"type":"string","maxLength":12},"population":{"type":"integer"}},
         "required":["city","population"],"additionalProperties":false}}}}' |
  python3 -c 'import json,sys
c = json.load(sys.stdin)["choices"][0]; t = c["message"]["content"]
print("parsed, re-printed compactly:", json.dumps(json.loads(t)) if c["finish_reason"] == "stop" else t)' || true
echo
echo "== $url/metrics (excerpt)"
curl -sS "$url/metrics" | grep -E '^lily_(requests_total|generation_tokens_total|time_to_first_token_seconds_count)' || true
if [ $keep = 1 ]; then
  echo; echo "lily-server keeps running on $url (Ctrl-C to stop)"
  wait $pid
fi
