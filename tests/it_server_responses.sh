#!/usr/bin/env bash
# The OpenAI Responses API (/v1/responses) on the real server over a tiny random-weight
# model, driven by curl and by the official openai client (tests/npm/responses_client.mjs):
# object and event shapes, greedy streamed == plain, usage equal to the chat route's exact
# prompt (/tokenize), instructions, previous_response_id reusing the cache, function tools
# (forced call, function_call_output round trip), text.format json_schema, stored responses
# (GET, input_items, DELETE, store:false), and every bad-input class in OpenAI's error shape.
cd "$(dirname "$0")/.." && . tests/lib.sh
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
KEY=k$RANDOM$RANDOM
serve "$T/m" --api-key "$KEY" --slots 2
U=http://127.0.0.1:$port/v1/responses
# post BODY [URL] -> body in $T/body, status echoed
post() { curl -s -o "$T/body" -w '%{http_code}' "${2:-$U}" -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' -d "$1"; }
py() { python3 -c "import json,sys; r=json.load(open('$T/body')); $1"; }
tokens() { # chat messages JSON [extra fields] -> the chat route's prompt length
  curl -s "http://127.0.0.1:$port/tokenize" -H "Authorization: Bearer $KEY" -d "{\"messages\":$1${2:-}}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])'; }
# greedy with thinking off unless a test says otherwise; random words make prompts differ per run
W=$(shuf -n 3 -e apple river stone cloud maple ember delta lunar | tr '\n' ' ')
base="\"model\":\"lily\",\"temperature\":0,\"reasoning\":{\"effort\":\"none\"}"
off=',"chat_template_kwargs":{"enable_thinking":false}'

# ---- plain and streamed text, usage ----------------------------------------------------------------
# a few of the word choices make this random-weight model write its end token within 12 tokens
# (8 of 336 orderings): draw again then, since these checks are about a cut-off answer
for _ in 1 2 3 4 5 6; do
  c=$(post "{$base,\"max_output_tokens\":12,\"input\":\"say $W\"}")
  [ "$c" = 200 ] && py 'import sys; sys.exit(0 if r["status"]=="incomplete" else 1)' && break
  W=$(shuf -n 3 -e apple river stone cloud maple ember delta lunar | tr '\n' ' ')
done
[ "$c" = 200 ] && py '
assert r["object"]=="response" and r["id"].startswith("resp_") and r["model"] and r["error"] is None
assert r["status"]=="incomplete" and r["incomplete_details"]=={"reason":"max_output_tokens"}, r["status"]
m=[o for o in r["output"] if o["type"]=="message"]; assert len(m)==1 and m[0]["id"].startswith("msg_") and m[0]["role"]=="assistant"
t=m[0]["content"][0]; assert t["type"]=="output_text" and t["annotations"]==[] and r["output_text"]==t["text"]
u=r["usage"]; assert u["output_tokens"]==12 and u["total_tokens"]==u["input_tokens"]+12 and u["output_tokens_details"]["reasoning_tokens"]==0
assert r["reasoning"]=={"effort":"none"} and r["store"] is True and r["tools"]==[] and r["tool_choice"]=="auto" and r["max_output_tokens"]==12
open("'$T/text1'","w").write(r["output_text"]); open("'$T/in1'","w").write(str(u["input_tokens"]))' \
  && ok "plain: response shape, incomplete at max_output_tokens, usage adds up" || bad "plain: $c $(cat "$T/body")"
n=$(tokens "[{\"role\":\"user\",\"content\":\"say $W\"}]" "$off")
[ "$n" = "$(cat "$T/in1")" ] && ok "input_tokens = the chat route's prompt ($n)" || bad "input_tokens $(cat "$T/in1") vs /tokenize $n"
post "{$base,\"max_output_tokens\":12,\"input\":\"say $W\"}" >/dev/null
[ "$(py 'print(r["output_text"], end="")')" = "$(cat "$T/text1")" ] && ok "greedy: same request, same text" || bad "greedy differs"
curl -sN "$U" -H "Authorization: Bearer $KEY" -d "{$base,\"max_output_tokens\":12,\"stream\":true,\"input\":\"say $W\"}" >"$T/sse"
python3 - "$T/sse" "$T/text1" <<'PY' && ok "stream: typed events in order, sequence numbers, text equals the plain answer" || bad "stream: $(head -c 800 "$T/sse")"
import json, sys
raw = open(sys.argv[1]).read(); want = open(sys.argv[2]).read()
evs = []
for blk in raw.split("\n\n"):
    if not blk.strip() or blk.startswith(":"): continue
    name, data = blk.split("\n", 1)
    assert name.startswith("event: ") and data.startswith("data: "), blk
    d = json.loads(data[6:]); assert d["type"] == name[7:], blk
    evs.append(d)
assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
names = [e["type"] for e in evs]
assert names[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"], names
assert names[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.incomplete"], names
assert evs[0]["response"]["status"] == "in_progress" and evs[0]["response"]["output"] == []
text = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
fin = evs[-1]["response"]
assert text == want and fin["output_text"] == want and fin["output"][0]["content"][0]["text"] == want, (text, want)
assert fin["usage"]["output_tokens"] == 12 and fin["status"] == "incomplete"
PY

# ---- instructions ---------------------------------------------------------------------------------
post "{$base,\"max_output_tokens\":2,\"instructions\":\"be terse $W\",\"input\":\"hi\"}" >/dev/null
a=$(py 'print(r["usage"]["input_tokens"])')
n=$(tokens '[{"role":"system","content":"be terse '"$W"'"},{"role":"user","content":"hi"}]' "$off")
n0=$(tokens '[{"role":"user","content":"hi"}]' "$off")
[ "$a" = "$n" ] && [ "$a" -gt "$n0" ] && py 'assert r["instructions"].startswith("be terse")' \
  && ok "instructions: the system message ($n0 -> $a tokens), echoed" || bad "instructions $a vs $n (no system $n0)"

# ---- multi-turn with previous_response_id: the prefix comes from the cache -----------------------
post "{$base,\"max_output_tokens\":6,\"instructions\":\"You are a careful assistant.\",\"input\":\"Tell me about $W and the history of printing.\"}" >/dev/null
id1=$(py 'print(r["id"])'); py 'open("'$T/t1'","w").write(r["output_text"])'; i1=$(py 'print(r["usage"]["input_tokens"])')
c=$(post "{$base,\"max_output_tokens\":6,\"instructions\":\"You are a careful assistant.\",\"previous_response_id\":\"$id1\",\"input\":\"And after that?\"}")
[ "$c" = 200 ] && py '
u=r["usage"]; assert r["previous_response_id"]=="'$id1'"
assert u["input_tokens_details"]["cached_tokens"] > 0 and u["input_tokens"] > '$i1', u' \
  && ok "previous_response_id: turn 2 reuses the cache ($(py 'print(r["usage"]["input_tokens_details"]["cached_tokens"])') of $(py 'print(r["usage"]["input_tokens"])') cached)" \
  || bad "turn 2: $c $(cat "$T/body")"
python3 -c '
import json,sys
print(json.dumps([{"role":"system","content":"You are a careful assistant."},{"role":"user","content":sys.argv[1]},
 {"role":"assistant","content":open(sys.argv[2]).read()},{"role":"user","content":"And after that?"}]))' "Tell me about $W and the history of printing." "$T/t1" >"$T/msgs"
n=$(tokens "$(cat "$T/msgs")" "$off")
[ "$n" = "$(py 'print(r["usage"]["input_tokens"])')" ] && ok "turn 2 renders exactly the whole conversation ($n tokens)" || bad "turn 2 prompt $(py 'print(r["usage"]["input_tokens"])') vs $n"

# ---- function tools (calls are decoded under the tools' grammar, so even this random model
# writes well-formed calls; parallel_tool_calls false: exactly one) -----------------------------------
tools='[{"type":"function","name":"get_weather","description":"weather","parameters":{"type":"object","properties":{"city":{"enum":["Paris","Oslo"]}},"required":["city"],"additionalProperties":false},"strict":true}]'
q="\"input\":\"weather in Paris $W?\""
post "{$base,\"max_output_tokens\":8,\"tools\":$tools,$q}" >/dev/null; n_auto=$(py 'print(r["usage"]["input_tokens"])')
forced="$base,\"max_output_tokens\":200,\"parallel_tool_calls\":false,\"tools\":$tools,\"tool_choice\":{\"type\":\"function\",\"name\":\"get_weather\"},$q"
c=$(post "{$forced}")
[ "$c" = 200 ] && py '
assert r["status"]=="completed" and len(r["output"])==1, r["output"]
fc=r["output"][0]; assert fc["type"]=="function_call" and fc["status"]=="completed" and fc["name"]=="get_weather"
assert fc["id"].startswith("fc_") and fc["call_id"].startswith("call_") and json.loads(fc["arguments"]) in ({"city":"Paris"},{"city":"Oslo"}), fc
assert r["tool_choice"]=={"type":"function","name":"get_weather"} and r["tools"][0]["name"]=="get_weather" and r["parallel_tool_calls"] is False
assert r["usage"]["input_tokens"] > '$n_auto' and r["output_text"]==""
json.dump(fc, open("'$T/fc'","w"))' && ok "tool_choice function: one function_call item, arguments valid JSON for the schema" || bad "forced: $c $(cat "$T/body")"
idF=$(py 'print(r["id"])')
curl -sN "$U" -H "Authorization: Bearer $KEY" -d "{$forced,\"stream\":true}" >"$T/sse"
python3 - "$T/sse" "$T/fc" <<'PY' && ok "tool_choice function streamed: item added, arguments delta/done, the same call" || bad "forced stream: $(head -c 600 "$T/sse")"
import json, sys
evs = [json.loads(l[6:]) for l in open(sys.argv[1]).read().splitlines() if l.startswith("data: ")]
want = json.load(open(sys.argv[2])); names = [e["type"] for e in evs]
assert names == ["response.created", "response.in_progress", "response.output_item.added", "response.function_call_arguments.delta",
                 "response.function_call_arguments.done", "response.output_item.done", "response.completed"], names
assert "".join(e["delta"] for e in evs if e["type"].endswith("arguments.delta")) == want["arguments"] == evs[4]["arguments"]
fin = evs[-1]["response"]["output"][0]
assert fin["name"] == want["name"] and fin["arguments"] == want["arguments"] and fin["id"] == evs[2]["item"]["id"] == evs[3]["item_id"]
PY
c=$(post "{$base,\"max_output_tokens\":4,\"tools\":$tools,\"previous_response_id\":\"$idF\",\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"$(python3 -c "import json; print(json.load(open('$T/fc'))['call_id'])")\",\"output\":\"sunny\"}]}")
[ "$c" = 200 ] && py 'assert r["usage"]["input_tokens_details"]["cached_tokens"] > 0' \
  && ok "function_call_output for that call_id via previous_response_id: answered, prefix cached" || bad "tool turn 2: $c $(cat "$T/body")"
rt() { echo "\"tools\":$tools,\"input\":[{\"role\":\"user\",\"content\":\"weather in Paris?\"},{\"type\":\"function_call\",\"call_id\":\"call_7\",\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"},{\"type\":\"function_call_output\",\"call_id\":\"call_7\",\"output\":\"$1\"}]"; }
c=$(post "{$base,\"max_output_tokens\":4,$(rt sun)}"); n_short=$(py 'print(r["usage"]["input_tokens"])')
post "{$base,\"max_output_tokens\":4,$(rt "sun and $W with clouds later")}" >/dev/null; n_long=$(py 'print(r["usage"]["input_tokens"])')
want=$(tokens "[{\"role\":\"user\",\"content\":\"weather in Paris?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_7\",\"content\":\"sun\"}]" ",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"enum\":[\"Paris\",\"Oslo\"]}},\"required\":[\"city\"],\"additionalProperties\":false},\"strict\":true}}]$off")
[ "$c" = 200 ] && [ "$n_short" = "$want" ] && [ "$n_long" -gt "$n_short" ] \
  && ok "function_call + function_call_output round trip rendered as the chat route does ($n_short tokens)" || bad "round trip $c $n_short vs $want, $n_long"
post "{$base,\"max_output_tokens\":4,\"tools\":$tools,\"tool_choice\":\"none\",$q}" >/dev/null
[ "$(py 'print(r["usage"]["input_tokens"])')" -lt "$n_auto" ] && ok "tool_choice none: tools not offered" || bad "none $(cat "$T/body")"
c=$(post "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"strict\":true,\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^x\"}}}}],\"tool_choice\":\"required\"}")
[ "$c" = 400 ] && py 'assert r["error"]["param"]=="tools" and "pattern" in r["error"]["message"]' \
  && ok "strict tool with an unenforceable schema: 400, param tools" || bad "strict tool $c $(cat "$T/body")"

# ---- text.format json_schema ------------------------------------------------------------------------
sch='{"type":"object","properties":{"color":{"enum":["red","green","blue"]},"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["color","n","ok"],"additionalProperties":false}'
c=$(post "{\"temperature\":0.8,\"seed\":7,\"reasoning\":{\"effort\":\"minimal\"},\"max_output_tokens\":200,\"input\":\"Answer:\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"c\",\"schema\":$sch,\"strict\":true}}}")
[ "$c" = 200 ] && py '
v=json.loads(r["output_text"]); assert r["status"]=="completed", r["status"]
assert set(v)=={"color","n","ok"} and v["color"] in ("red","green","blue") and type(v["n"]) is int and type(v["ok"]) is bool, v
assert r["text"]["format"]["type"]=="json_schema"' && ok "text.format json_schema: $(py 'print(json.dumps(json.loads(r["output_text"])))')" || bad "json_schema $c $(cat "$T/body")"
c=$(post "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"c\",\"schema\":{\"type\":\"object\",\"patternProperties\":{}}}}}")
[ "$c" = 400 ] && py 'e=r["error"]; assert e["param"]=="text.format" and "patternProperties" in e["message"]' \
  && ok "unsupported schema keyword: 400, param text.format, names it" || bad "schema keyword $c $(cat "$T/body")"

# ---- reasoning on: a reasoning item, counted ------------------------------------------------------------
post "{\"temperature\":0,\"reasoning\":{\"effort\":\"low\"},\"max_output_tokens\":5,\"input\":\"hi $W\"}" >/dev/null
py 'o=r["output"][0]; assert o["type"]=="reasoning" and o["id"].startswith("rs_") and o["content"][0]["type"]=="reasoning_text" and o["content"][0]["text"]
assert 0 < r["usage"]["output_tokens_details"]["reasoning_tokens"] <= 5' && ok "reasoning effort low: reasoning item, reasoning_tokens counted" || bad "reasoning: $(cat "$T/body")"

# ---- stored responses ----------------------------------------------------------------------------------
get() { curl -s -o "$T/body" -w '%{http_code}' "$U/$1" -H "Authorization: Bearer $KEY" "${@:2}"; }
c=$(get "$id1")
[ "$c" = 200 ] && py 'assert r["id"]=="'$id1'" and r["object"]=="response" and r["output_text"]==open("'$T/t1'").read()' \
  && ok "GET /v1/responses/{id}: the stored response" || bad "GET $c $(cat "$T/body")"
c=$(get "$id1/input_items")
[ "$c" = 200 ] && py 'assert r["object"]=="list" and r["data"][0]["role"]=="user"' && ok "GET input_items" || bad "input_items $c $(cat "$T/body")"
c=$(get "$id1" -X DELETE)
[ "$c" = 200 ] && py 'assert r=={"id":"'$id1'","object":"response","deleted":True}' && ok "DELETE" || bad "DELETE $c $(cat "$T/body")"
c=$(get "$id1")
[ "$c" = 404 ] && py 'assert r["error"]["message"]' && ok "GET after DELETE: 404" || bad "GET deleted $c"
c=$(post "{$base,\"previous_response_id\":\"$id1\",\"input\":\"more\"}")
[ "$c" = 400 ] && py 'e=r["error"]; assert e["param"]=="previous_response_id" and e["code"]=="previous_response_not_found"' \
  && ok "previous_response_id of a deleted response: 400 previous_response_not_found" || bad "deleted previous $c $(cat "$T/body")"
post "{$base,\"max_output_tokens\":2,\"store\":false,\"input\":\"x\"}" >/dev/null
c=$(get "$(py 'print(r["id"])')")
[ "$c" = 404 ] && ok "store false: not kept" || bad "store false $c"

# ---- errors: OpenAI's shape, the right status and param -------------------------------------------------
err() { # status param body
  local c
  c=$(post "$3")
  if [ "$c" = "$1" ] && py "e=r['error']; assert e['message'] and e['type'] and (e['param'] or '')=='$2'"; then ok "error $1 param '$2': ${3:0:60}"
  else bad "error want $1 '$2' got $c: $(cat "$T/body")"; fi
}
err 400 input '{"input":[{"role":"user","content":[{"type":"input_image","image_url":"http://x/y.png"}]}]}'
grep -q input_image "$T/body" && ok "input_image refusal names it" || bad "image message $(cat "$T/body")"
err 400 tools '{"input":"x","tools":[{"type":"web_search"}]}'
grep -q web_search "$T/body" && ok "web_search refusal names it" || bad "web_search message $(cat "$T/body")"
err 400 '' '{"input":'
err 400 input '{"model":"lily"}'
err 400 input '{"input":[{"type":"item_reference","id":"msg_1"}]}'
err 400 input '{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"[1]"}]}'
err 400 max_output_tokens '{"input":"x","max_output_tokens":0}'
err 400 tool_choice '{"input":"x","tool_choice":{"type":"file_search"}}'
err 400 tool_choice '{"input":"x","tool_choice":"required"}'
err 400 text.format '{"input":"x","text":{"format":{"type":"xml"}}}'
err 400 reasoning.effort '{"input":"x","reasoning":{"effort":"max"}}'
err 400 temperature '{"input":"x","temperature":5}'
err 400 store '{"input":"x","store":"no"}'
err 400 previous_response_id '{"input":"x","previous_response_id":"resp_unknown"}'
c=$(curl -s -o "$T/body" -w '%{http_code}' "$U" -d '{"input":"x"}')
[ "$c" = 401 ] && ok "no key: 401" || bad "auth $c"
c=$(curl -s -o "$T/body" -w '%{http_code}' "$U" -H "Authorization: Bearer $KEY")
[ "$c" = 405 ] && ok "GET /v1/responses: 405" || bad "GET list $c"
c=$(curl -s -o "$T/body" -w '%{http_code}' -X PUT "$U/resp_x" -H "Authorization: Bearer $KEY")
[ "$c" = 405 ] && ok "PUT /v1/responses/{id}: 405" || bad "PUT $c"

# ---- a long conversation (tools: more than one prefill chunk): turn 2 resumes from the cache
# and answers exactly what the same conversation sent whole to a fresh server answers -------------
post "{$base,\"max_output_tokens\":6,\"tools\":$tools,\"input\":\"Plan a trip to $W.\"}" >/dev/null; idA=$(py 'print(r["id"])')
post "{$base,\"max_output_tokens\":6,\"tools\":$tools,\"previous_response_id\":\"$idA\",\"input\":\"And then?\"}" >/dev/null
idB=$(py 'print(r["id"])'); py 'open("'$T/tB'","w").write(r["output_text"])'; cB=$(py 'print(r["usage"]["input_tokens_details"]["cached_tokens"])')
get "$idB/input_items" >/dev/null; py 'json.dump(r["data"][::-1], open("'$T/items'","w"))'
serve "$T/m" --api-key "$KEY" --slots 2
U=http://127.0.0.1:$port/v1/responses
post "{$base,\"max_output_tokens\":6,\"tools\":$tools,\"input\":$(cat "$T/items")}" >/dev/null
[ "$cB" -gt 512 ] && py 'assert r["usage"]["input_tokens_details"]["cached_tokens"]==0 and r["output_text"]==open("'$T/tB'").read()' \
  && ok "long conversation: turn 2 reused $cB tokens and answers as the whole conversation on a fresh server" \
  || bad "long conversation: cached $cB, fresh answer $(cat "$T/body") vs $(cat "$T/tB")"

# ---- the official openai client ------------------------------------------------------------------------
if [ -d tests/npm/node_modules/openai ]; then
  node tests/npm/responses_client.mjs "http://127.0.0.1:$port/v1" "$KEY" >"$T/node.out" 2>&1
  cat "$T/node.out"
  line=$(grep -E '^client: [0-9]+ passed, [0-9]+ failed' "$T/node.out")
  if [ -n "$line" ]; then
    pass=$((pass + $(echo "$line" | sed -E 's/client: ([0-9]+) passed.*/\1/')))
    fail=$((fail + $(echo "$line" | sed -E 's/.* ([0-9]+) failed/\1/')))
  else bad "responses client script crashed"; fi
else
  bad "tests/npm/node_modules/openai missing: run (cd tests/npm && npm install)"
fi
it_done
