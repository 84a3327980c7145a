#!/usr/bin/env bash
# response_format (JSON mode and JSON schemas) on the real server: the openai client and
# ajv check every finished answer (tests/npm/format_client.mjs), on a synthetic byte-level
# vocabulary and on the real Qwen3 tokenizer's 151,669 tokens; curl checks the completions
# route and that streaming carries the same constrained text.
cd "$(dirname "$0")/.." && . tests/lib.sh
start() { serve "$@" --slots 4; }
client() { # rounds, label
  if [ ! -d tests/npm/node_modules/ajv ]; then bad "tests/npm/node_modules/ajv missing: run (cd tests/npm && npm install)"; return; fi
  node tests/npm/format_client.mjs "http://127.0.0.1:$port/v1" "$1" >"$T/node.out" 2>&1
  rc=$?
  grep '^FAIL' "$T/node.out" | head -20
  tail -1 "$T/node.out"
  [ $rc = 0 ] && ok "$2: openai client + ajv" || bad "$2: openai client + ajv"
}

"$B/lily" synth --out "$T/tiny" --preset tiny --vocab 2048 >/dev/null 2>&1
start "$T/tiny"
client 4 "synthetic vocabulary"

# completions route: a schema with only bounded choices always finishes and validates
U=http://127.0.0.1:$port/v1/completions
sch='{"type":"object","properties":{"color":{"enum":["red","green","blue"]},"n":{"type":"integer"},"ok":{"type":"boolean"}},"required":["color","n","ok"],"additionalProperties":false}'
body="{\"prompt\":\"Answer: \",\"max_tokens\":200,\"temperature\":0.8,\"seed\":7,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"c\",\"schema\":$sch}}}"
r=$(curl -s "$U" -H 'Content-Type: application/json' -d "$body")
echo "$r" | python3 -c '
import json,sys
r=json.load(sys.stdin); c=r["choices"][0]
v=json.loads(c["text"])
assert c["finish_reason"]=="stop", c
assert set(v)=={"color","n","ok"} and v["color"] in ("red","green","blue") and type(v["n"]) is int and type(v["ok"]) is bool, v
' 2>"$T/py" && ok "completions: constrained answer $(echo "$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')" \
  || bad "completions: $r $(cat "$T/py")"
s=$(curl -sN "$U" -H 'Content-Type: application/json' -d "${body%\}},\"stream\":true}")
st=$(echo "$s" | sed -n 's/^data: //p' | grep -v '^\[DONE\]' | python3 -c '
import json,sys
print("".join(json.loads(l)["choices"][0]["text"] for l in sys.stdin if json.loads(l)["choices"]), end="")')
[ "$st" = "$(echo "$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"], end="")')" ] \
  && ok "completions: the stream carries the same text" || bad "completions stream: '$st'"
c=$(curl -s -o "$T/b" -w '%{http_code}' "$U" -H 'Content-Type: application/json' -d '{"prompt":"x","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","patternProperties":{}}}}}')
[ "$c" = 400 ] && grep -q patternProperties "$T/b" && ok "unsupported keyword: 400 naming it" || bad "unsupported keyword: $c $(cat "$T/b")"

# logit_bias: +100 on one token makes greedy repeat it; -100 on the greedy choice moves it
zid=$(printf 'Z' | "$B/lily" tokenize --tokenizer "$T/tiny" | tr -dc '0-9 ' | awk '{print $1}')
r=$(curl -s "$U" -H 'Content-Type: application/json' -d "{\"prompt\":\"Hello\",\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true,\"logit_bias\":{\"$zid\":100}}")
[ "$(echo "$r" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')" = ZZZZ ] \
  && ok "logit_bias +100 on 'Z' ($zid): ZZZZ" || bad "logit_bias +100: $r"
first() { python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["logprobs"]["tokens"][0], end="")'; }
done_neg=0
for pr in Hello The A Once x 1 Why; do # a prompt whose greedy token is one id that round-trips as text
  g=$(curl -s "$U" -H 'Content-Type: application/json' -d "{\"prompt\":\"$pr\",\"max_tokens\":1,\"temperature\":0,\"logprobs\":1}")
  gt=$(echo "$g" | first)
  ids=$(printf '%s' "$gt" | "$B/lily" tokenize --special --tokenizer "$T/tiny" 2>/dev/null | tr -dc '0-9 ')
  [ -n "$gt" ] && [ "$(echo $ids | wc -w)" = 1 ] || continue
  r=$(curl -s "$U" -H 'Content-Type: application/json' -d "{\"prompt\":\"$pr\",\"max_tokens\":1,\"temperature\":0,\"logprobs\":1,\"logit_bias\":{\"$(echo $ids)\":-100}}")
  [ "$(echo "$r" | first)" != "$gt" ] && ok "logit_bias -100 on the greedy token '$gt' ($ids) changes the choice" || bad "logit_bias -100: $g / $r"
  done_neg=1; break
done
[ $done_neg = 1 ] || bad "logit_bias -100: no prompt with a single round-tripping greedy token"
c=$(curl -s -o "$T/b" -w '%{http_code}' "$U" -H 'Content-Type: application/json' -d '{"prompt":"x","logit_bias":{"99999999":1}}')
[ "$c" = 400 ] && grep -q logit_bias "$T/b" && ok "logit_bias past the vocabulary: 400" || bad "logit_bias past the vocabulary: $c $(cat "$T/b")"

# the real Qwen3 vocabulary: masks over 151,669 real tokens
Q=../shared/data/qwen-tokenizer/qwen3/tokenizer.json
if [ -f "$Q" ]; then
  "$B/lily" synth --out "$T/q3" --preset tiny --vocab 151669 >/dev/null 2>&1
  start "$T/q3" --tokenizer "$Q"
  client 2 "Qwen3 vocabulary"
else
  bad "missing $Q (the shared tokenizer data)"
fi
it_done
