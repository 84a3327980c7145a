#!/usr/bin/env bash
# The Anthropic Messages API (/v1/messages, /v1/messages/count_tokens) on the real server
# over a tiny random-weight model, driven by curl and by the official @anthropic-ai/sdk:
# message and event shapes, usage adding up, stop_sequences, system blocks, a tool round
# trip and a forced tool, thinking on/off, greedy determinism (streamed == plain), auth by
# x-api-key or Bearer, and every bad-input class answered in Anthropic's error shape.
cd "$(dirname "$0")/.."
. tests/lib.sh
KEY=k$RANDOM$RANDOM
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
serve "$T/m" --api-key "$KEY"
[ -n "${port:-}" ] || { it_done; exit 1; }
U=http://127.0.0.1:$port/v1/messages
# post BODY [PATH] -> body in $T/body, status echoed
post() { curl -s -o "$T/body" -w '%{http_code}' "$U${2:-}" -H "x-api-key: $KEY" -H 'Content-Type: application/json' -d "$1"; }
py() { python3 -c "import json,sys; r=json.load(open('$T/body')); $1"; }
# greedy, thinking off unless a test says otherwise; the word list makes prompts differ per run
W=$(shuf -n 3 -e apple river stone cloud maple ember delta lunar | tr '\n' ' ')
base="\"model\":\"lily\",\"temperature\":0,\"thinking\":{\"type\":\"disabled\"}"
user="[{\"role\":\"user\",\"content\":\"say $W\"}]"

# ---- plain and streamed text, usage, determinism ---------------------------------------------
# a few of the word choices make this random-weight model write its end token within 12 tokens:
# draw again then, since these checks are about an answer cut at max_tokens
for _ in 1 2 3 4 5 6; do
  c=$(post "{$base,\"max_tokens\":12,\"messages\":$user}")
  [ "$c" = 200 ] && py 'import sys; sys.exit(0 if r["stop_reason"]=="max_tokens" else 1)' && break
  W=$(shuf -n 3 -e apple river stone cloud maple ember delta lunar | tr '\n' ' ')
  user="[{\"role\":\"user\",\"content\":\"say $W\"}]"
done
[ "$c" = 200 ] && py '
assert r["type"]=="message" and r["role"]=="assistant" and r["id"].startswith("msg_")
assert r["content"] and all(b["type"]=="text" for b in r["content"])
u=r["usage"]; assert u["output_tokens"]==12 and r["stop_reason"]=="max_tokens" and r["stop_sequence"] is None
open("'$T/text1'","w").write("".join(b["text"] for b in r["content"]))' && ok "plain: message shape, max_tokens stop" || bad "plain: $c $(cat "$T/body")"
py 'u=r["usage"]; print(u["input_tokens"]+u["cache_read_input_tokens"])' >"$T/in1"
post "{\"model\":\"lily\",\"thinking\":{\"type\":\"disabled\"},\"messages\":$user}" /count_tokens >/dev/null
[ "$(py 'print(r["input_tokens"])')" = "$(cat "$T/in1")" ] && ok "usage: input + cache read = count_tokens ($(cat "$T/in1"))" \
  || bad "usage $(cat "$T/in1") vs count $(cat "$T/body")"
post "{$base,\"max_tokens\":12,\"messages\":$user}" >/dev/null
[ "$(py 'print("".join(b["text"] for b in r["content"]), end="")')" = "$(cat "$T/text1")" ] && ok "greedy: same request, same text" || bad "greedy differs"
curl -sN "$U" -H "x-api-key: $KEY" -d "{$base,\"max_tokens\":12,\"stream\":true,\"messages\":$user}" >"$T/sse"
python3 - "$T/sse" "$T/text1" <<'PY' && ok "stream: event sequence well formed, text equals the plain answer" || bad "stream: $(head -c 600 "$T/sse")"
import json, sys
raw = open(sys.argv[1]).read(); want = open(sys.argv[2]).read()
evs = []
for blk in raw.split("\n\n"):
    if not blk.strip() or blk.startswith(":"): continue
    name, data = blk.split("\n", 1)
    assert name.startswith("event: ") and data.startswith("data: "), blk
    d = json.loads(data[6:]); assert d["type"] == name[7:], blk
    evs.append(d)
names = [e["type"] for e in evs]
assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"], names
text = "".join(e["delta"]["text"] for e in evs if e["type"] == "content_block_delta" and e["delta"]["type"] == "text_delta")
assert text == want, (text, want)
md = evs[-2]; assert md["delta"]["stop_reason"] == "max_tokens" and md["usage"]["output_tokens"] == 12
PY

# ---- stop_sequences: a piece of the greedy answer ends it just before ---------------------------
stop=$(python3 -c "t=open('$T/text1').read(); n=len(t); print(t[n//3:n//3+3] if n>=6 else t[-2:])")
c=$(post "{$base,\"max_tokens\":12,\"messages\":$user,\"stop_sequences\":[$(python3 -c "import json;print(json.dumps('$stop'))" 2>/dev/null || echo '"zz"')]}")
STOP="$stop" TEXT="$T/text1" python3 -c "
import json,os
r=json.load(open('$T/body')); s=os.environ['STOP']; t=open(os.environ['TEXT']).read()
got=''.join(b['text'] for b in r['content'])
assert r['stop_reason']=='stop_sequence' and r['stop_sequence']==s and got==t[:t.find(s)], (r, s, t)" \
  && ok "stop_sequences: stop_reason stop_sequence, text cut before '$stop'" || bad "stop $c '$stop': $(cat "$T/body")"

# ---- system blocks, tool round trip and forced tool: seen in the prompt size -------------------
cnt() { post "$1" /count_tokens >/dev/null; py 'print(r.get("input_tokens", -1))'; }
m1="\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
s_str=$(cnt "{\"system\":\"be terse $W\",$m1}"); s_blk=$(cnt "{\"system\":[{\"type\":\"text\",\"text\":\"be terse \"},{\"type\":\"text\",\"text\":\"$W\"}],$m1}")
s_none=$(cnt "{$m1}")
[ "$s_str" = "$s_blk" ] && [ "$s_str" -gt "$s_none" ] && ok "system as blocks = system as string ($s_blk > $s_none tokens)" || bad "system $s_str $s_blk $s_none"
tools='[{"name":"get_weather","description":"weather","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}]'
rt() { echo "\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_7\",\"name\":\"get_weather\",\"input\":{\"city\":\"Paris\"}}]},{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_7\",\"content\":\"$1\"}]}]"; }
n_short=$(cnt "{$(rt sun)}"); n_long=$(cnt "{$(rt "sun and $W and more clouds")}")
n_q=$(cnt "{\"tools\":$tools,\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}]}")
[ "$n_long" -gt "$n_short" ] && [ "$n_short" -gt "$n_q" ] && ok "tool round trip: tool_use and tool_result are rendered ($n_q < $n_short < $n_long)" \
  || bad "round trip counts $n_q $n_short $n_long"
c=$(post "{$base,\"max_tokens\":6,$(rt sun)}")
[ "$c" = 200 ] && ok "tool round trip answered" || bad "round trip $c $(cat "$T/body")"
forced="{$base,\"max_tokens\":8,\"tools\":$tools,\"tool_choice\":{\"type\":\"tool\",\"name\":\"get_weather\"},\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}]}"
n_f=$(cnt "$forced")
c=$(post "$forced")
[ "$c" = 200 ] && [ "$n_f" -gt "$n_q" ] && py '
c=r["content"]
assert any(b["type"]=="tool_use" and b["name"]=="get_weather" and b["id"].startswith("toolu_") and isinstance(b["input"],dict) for b in c) \
  and r["stop_reason"]=="tool_use" or any(b["type"]=="text" and "<function=get_weather>" in b["text"] for b in c)' \
  && ok "tool_choice tool: the turn begins with the call ($n_q -> $n_f tokens)" || bad "forced $c $n_f: $(cat "$T/body")"

# ---- thinking on / off ----------------------------------------------------------------------------
on="{\"model\":\"lily\",\"temperature\":0,\"max_tokens\":5,\"thinking\":{\"type\":\"enabled\",\"budget_tokens\":1024},\"messages\":$user}"
post "$on" >/dev/null
py 'c=r["content"]; assert c[0]["type"]=="thinking" and c[0]["thinking"] and "signature" in c[0]' && ok "thinking enabled: a thinking block" || bad "thinking on: $(cat "$T/body")"
post "{$base,\"max_tokens\":5,\"messages\":$user}" >/dev/null
py 'assert all(b["type"]!="thinking" for b in r["content"])' && ok "thinking disabled: no thinking block" || bad "thinking off: $(cat "$T/body")"

# ---- errors: Anthropic's shape and status --------------------------------------------------------
err() { # status type body [path] [curl args...]
  local want=$1 type=$2 body=$3 path=${4:-}; shift 4 2>/dev/null || shift $#
  local c
  c=$(curl -s -o "$T/body" -w '%{http_code}' "$U$path" -H "x-api-key: $KEY" "$@" -d "$body")
  if [ "$c" = "$want" ] && py "assert r['type']=='error' and r['error']['type']=='$type' and r['error']['message']"; then ok "error $want $type: ${body:0:50}"
  else bad "error want $want $type got $c: $(cat "$T/body")"; fi
}
err 400 invalid_request_error "{\"messages\":$user}"
err 400 invalid_request_error "{\"max_tokens\":5,\"messages\":[{\"role\":\"system\",\"content\":\"x\"}]}"
err 400 invalid_request_error '{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}'
grep -q image "$T/body" && ok "image refusal names images" || bad "image message: $(cat "$T/body")"
err 400 invalid_request_error '{"max_tokens":5,"messages":'
err 400 invalid_request_error '{"max_tokens":5,"messages":[{"role":"user","content":"x"}],"tool_choice":{"type":"tool"}}'
err 400 invalid_request_error '{"messages":' /count_tokens
c=$(curl -s -o "$T/body" -w '%{http_code}' "$U" -H "x-api-key: wrong" -d "{$base,\"max_tokens\":2,\"messages\":$user}")
[ "$c" = 401 ] && py 'assert r["error"]["type"]=="authentication_error"' && ok "wrong x-api-key: 401 authentication_error" || bad "auth $c $(cat "$T/body")"
c=$(curl -s -o "$T/body" -w '%{http_code}' "$U" -H "Authorization: Bearer $KEY" -d "{$base,\"max_tokens\":2,\"messages\":$user}")
[ "$c" = 200 ] && ok "Authorization: Bearer also accepted" || bad "bearer $c"
c=$(curl -s -o "$T/body" -w '%{http_code}' "$U" -H "x-api-key: $KEY")
[ "$c" = 405 ] && py 'assert r["type"]=="error"' && ok "GET /v1/messages: 405 in Anthropic's shape" || bad "GET $c $(cat "$T/body")"

# ---- the official Anthropic SDK ------------------------------------------------------------------
if [ -d tests/npm/node_modules/@anthropic-ai/sdk ]; then
  node tests/npm/anthropic_client.mjs "http://127.0.0.1:$port" "$KEY" >"$T/node.out" 2>&1
  cat "$T/node.out"
  line=$(grep -E '^client: [0-9]+ passed, [0-9]+ failed' "$T/node.out")
  if [ -n "$line" ]; then
    pass=$((pass + $(echo "$line" | sed -E 's/client: ([0-9]+) passed.*/\1/')))
    fail=$((fail + $(echo "$line" | sed -E 's/.* ([0-9]+) failed/\1/')))
  else bad "anthropic client script crashed"; fi
else
  bad "tests/npm/node_modules/@anthropic-ai/sdk missing: run (cd tests/npm && npm install)"
fi
it_done
[ $fail = 0 ]
