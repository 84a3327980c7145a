#!/usr/bin/env bash
# tool_choice on the real server: "required" and a named function make the assistant turn
# begin with the call (the prompt grows by that prefix and the answer holds the call);
# bad tool_choice values are refused with 400 naming the field.
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}; case $B in /*) ;; *) B=$PWD/$B ;; esac
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
T=$(mktemp -d /tmp/lily-it-tools-XXXXXX)
trap 'kill $sp 2>/dev/null; rm -rf "$T"' EXIT
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
"$B/lily-server" --model-path "$T/m" --port 0 --threads 2 2>"$T/err" &
sp=$!
for _ in $(seq 200); do port=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/err" | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.1; done
U=http://127.0.0.1:$port/v1/chat/completions
tools='[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]'
req() { curl -s "$U" -H 'Content-Type: application/json' -d "{\"messages\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"}],\"tools\":$tools,\"max_tokens\":6,\"temperature\":0$1}"; }
ptok() { python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens"])'; }
auto=$(req "" | ptok)
named=$(req ',"tool_choice":{"type":"function","function":{"name":"get_weather"}}')
n_named=$(echo "$named" | ptok)
[ "$n_named" -gt "$auto" ] && ok "named: the prompt ends with the forced call ($auto -> $n_named tokens)" || bad "named prompt $n_named vs auto $auto"
echo "$named" | python3 -c '
import json,sys
m=json.load(sys.stdin)["choices"][0]["message"]
calls=m.get("tool_calls") or []
text=m.get("content") or ""
sys.exit(0 if any(c["function"]["name"]=="get_weather" for c in calls) or "<function=get_weather>" in text else 1)' \
  && ok "named: the answer holds the get_weather call" || bad "named: no call in $named"
[ -z "$(echo "$named" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"].get("reasoning_content") or "")')" ] \
  && ok "named: no reasoning before the forced call" || bad "named: reasoning leaked"
stream=$(curl -sN "$U" -H 'Content-Type: application/json' -d "{\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}],\"tools\":$tools,\"max_tokens\":6,\"temperature\":0,\"stream\":true,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}}")
echo "$stream" | grep -q 'data: \[DONE\]' && ! echo "$stream" | grep -q '"reasoning_content":"[^"]' && ok "named, streamed: completes, no reasoning" || bad "stream: $stream"
n_req=$(req ',"tool_choice":"required"' | ptok)
[ "$n_req" -gt "$auto" ] && [ "$n_req" -lt "$n_named" ] && ok "required: forced <tool_call> prefix ($n_req tokens)" || bad "required prompt $n_req (auto $auto, named $n_named)"
code() { curl -s -o "$T/body" -w '%{http_code}' "$U" -H 'Content-Type: application/json' -d "$1"; }
c=$(code "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":$tools,\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"nope\"}}}")
[ "$c" = 400 ] && grep -q tool_choice "$T/body" && ok "unknown function: 400" || bad "unknown function: $c $(cat "$T/body")"
c=$(code '{"messages":[{"role":"user","content":"x"}],"tool_choice":"required"}')
[ "$c" = 400 ] && grep -q tool_choice "$T/body" && ok "required without tools: 400" || bad "required without tools: $c $(cat "$T/body")"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
