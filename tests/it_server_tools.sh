#!/usr/bin/env bash
# tool_choice on the real server: "required" and a named function make the assistant turn
# begin with the call (the prompt grows by that prefix and the answer holds the call);
# bad tool_choice values are refused with 400 naming the field.
cd "$(dirname "$0")/.."
. tests/lib.sh
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
serve "$T/m"
[ -n "${port:-}" ] || { it_done; exit 1; }
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

# Tool calls decoded under the tools' grammar: whatever the (random) model writes, a forced
# call parses and its arguments match the schema; <tool_call> written by the model itself
# (here pushed by logit_bias) starts the same constraint.
tools2='[{"type":"function","function":{"name":"set_alarm","parameters":{"type":"object","properties":{"hour":{"type":"integer"},"label":{"type":"string","maxLength":6},"days":{"type":"array","items":{"enum":["mon","tue"]},"maxItems":2}},"required":["hour","label"]}}},{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"enum":["Paris","Oslo"]}},"required":["city"]}}}]'
check_calls() { # response json on stdin, allowed names, label
  python3 -c '
import json,sys
r=json.load(sys.stdin); names=sys.argv[1].split(","); c=r["choices"][0]; calls=c["message"].get("tool_calls") or []
assert c["finish_reason"]=="tool_calls" and calls, ("no tool call", c)
for tc in calls:
    f=tc["function"]; a=json.loads(f["arguments"]); assert f["name"] in names, f
    if f["name"]=="set_alarm":
        assert type(a["hour"]) is int and type(a["label"]) is str and len(a["label"])<=6, a
        assert set(a)<= {"hour","label","days"} and all(d in ("mon","tue") for d in a.get("days",[])), a
    else:
        assert a=={"city":"Paris"} or a=={"city":"Oslo"}, a
print(len(calls))' "$1" 2>"$T/py.err"
}
treq() { curl -s "$U" -H 'Content-Type: application/json' -d "{\"messages\":[{\"role\":\"user\",\"content\":\"wake me\"}],\"tools\":$tools2,\"max_tokens\":300,\"temperature\":0.9,\"seed\":$1$2}"; }
good=0
for seed in 1 2 3; do n=$(treq $seed ',"tool_choice":{"type":"function","function":{"name":"set_alarm"}}' | check_calls set_alarm) && good=$((good+1)); done
[ $good = 3 ] && ok "named, constrained: 3 of 3 sampled calls parse and match the schema" || bad "named constrained: $good of 3 ($(cat "$T/py.err" | tail -1))"
good=0
for seed in 4 5 6; do n=$(treq $seed ',"tool_choice":"required"' | check_calls set_alarm,get_weather) && good=$((good+1)); done
[ $good = 3 ] && ok "required, constrained: 3 of 3 calls to one of the tools, valid" || bad "required constrained: $good of 3 ($(cat "$T/py.err" | tail -1))"
tc_id=$(printf '<tool_call>' | "$B/lily" tokenize --special --tokenizer "$T/m" | tr -dc '0-9')
r=$(treq 7 ",\"logit_bias\":{\"$tc_id\":100},\"chat_template_kwargs\":{\"enable_thinking\":false}")
n=$(echo "$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["finish_reason"])')
calls=$(echo "$r" | python3 -c '
import json,sys
m=json.load(sys.stdin)["choices"][0]["message"]; ok=0
for tc in m.get("tool_calls") or []:
    json.loads(tc["function"]["arguments"]); ok+=1
print(ok)')
[ "${calls:-0}" -ge 1 ] && ok "auto: the model's own <tool_call> ($tc_id) starts the constraint ($calls valid calls, finish $n)" || bad "auto: $r"
strict='[{"type":"function","function":{"name":"f","strict":true,"parameters":{"type":"object","properties":{"a":{"type":"string","pattern":"^x"}}}}}]'
c=$(code "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":$strict,\"tool_choice\":\"required\"}")
[ "$c" = 400 ] && grep -q pattern "$T/body" && ok "strict tool with an unenforceable schema: 400 naming it" || bad "strict: $c $(cat "$T/body")"
c=$(code "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":${strict/\"strict\":true,/},\"tool_choice\":\"required\",\"max_tokens\":3}")
[ "$c" = 200 ] && ok "the same tool without strict: served unconstrained" || bad "non-strict: $c $(cat "$T/body")"

# The Qwen3 template writes calls as JSON objects: the forced opening and the grammar follow it
serve "$T/m" --template qwen3
U=http://127.0.0.1:$port/v1/chat/completions
good=0
for seed in 1 2 3; do n=$(treq $seed ',"tool_choice":{"type":"function","function":{"name":"set_alarm"}}' | check_calls set_alarm) && good=$((good+1)); done
[ $good = 3 ] && ok "qwen3 template, named: 3 of 3 JSON-form calls parse and match the schema" || bad "qwen3 named: $good of 3 ($(tail -1 "$T/py.err"))"
good=0
for seed in 4 5; do n=$(treq $seed ',"tool_choice":"required"' | check_calls set_alarm,get_weather) && good=$((good+1)); done
[ $good = 2 ] && ok "qwen3 template, required: 2 of 2 valid calls" || bad "qwen3 required: $good of 2 ($(tail -1 "$T/py.err"))"
c=$(code "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\\\\\\\"b\"}}],\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"a\\\\\\\"b\"}}}")
[ "$c" = 400 ] && grep -q tool_choice "$T/body" && ok "a function name with a quote cannot be forced: 400" || bad "quote name: $c $(cat "$T/body")"
it_done
[ $fail = 0 ]
