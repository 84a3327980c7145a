#!/usr/bin/env bash
# Parked conversations on the real server: with one slot, conversation A is parked when B
# takes the slot, and A's next turn is restored from the parked copy (cached tokens, the
# unparked counter) and answers exactly what it answers when A never left the slot; with
# --cache-mb 0 the same sequence recomputes A's prefix.
cd "$(dirname "$0")/.." && . tests/lib.sh
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
start() { serve "$T/m" --slots 1 "$@"; }
chat() { curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"messages\":$1,\"max_tokens\":8,\"temperature\":0,\"chat_template_kwargs\":{\"enable_thinking\":false}}"; }
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print($1)"; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1==k {print $2}'; }
A='[{"role":"system","content":"You are a careful assistant who answers in full sentences about the history of printing presses and movable type in Europe and Asia."},{"role":"user","content":"Tell me about Gutenberg and the spread of printing across the cities of the Rhine."}]'
Bm='[{"role":"user","content":"Something else entirely: list three prime numbers."}]'
follow() { # A's next turn, given A's first answer
  python3 -c 'import json,sys; a=json.loads(sys.argv[1]); a.append({"role":"assistant","content":sys.argv[2]}); a.append({"role":"user","content":"And after that?"}); print(json.dumps(a))' "$A" "$1"
}

start --cache-mb 64
a1=$(chat "$A" | field 'r["choices"][0]["message"]["content"]')
chat "$Bm" >/dev/null
[ "$(metric lily_parked_total)" = 1 ] && ok "B took the only slot: A was parked" || bad "parked_total $(metric lily_parked_total)"
r=$(chat "$(follow "$a1")")
x=$(echo "$r" | field 'r["choices"][0]["message"]["content"]')
cached=$(echo "$r" | field 'r["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$cached" -gt 20 ] && [ "$(metric lily_unparked_total)" = 1 ] && ok "A's next turn restored from the parked copy ($cached cached tokens)" \
  || bad "A's next turn: cached $cached, unparked $(metric lily_unparked_total): $r"
[ "$(metric lily_parked_conversations)" -ge 1 ] && [ "$(metric lily_parked_bytes)" -gt 0 ] && ok "gauges: $(metric lily_parked_conversations) parked, $(metric lily_parked_bytes) bytes" \
  || bad "gauges"

start --cache-mb 64 # A never leaves its slot
a1b=$(chat "$A" | field 'r["choices"][0]["message"]["content"]')
y=$(chat "$(follow "$a1b")" | field 'r["choices"][0]["message"]["content"]')
[ "$a1" = "$a1b" ] && [ "$x" = "$y" ] && ok "the restored conversation answers exactly as one that stayed" || bad "answers differ: '$x' vs '$y'"

start --cache-mb 0
chat "$A" >/dev/null
chat "$Bm" >/dev/null
r=$(chat "$(follow "$a1")")
cached=$(echo "$r" | field 'r["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$cached" = 0 ] && [ "$(metric lily_parked_total)" = 0 ] && ok "--cache-mb 0: nothing parked, the prefix is recomputed" || bad "cache off: cached $cached"

# budget: a budget too small for any conversation keeps nothing
start --cache-mb 1
chat "$A" >/dev/null
chat "$Bm" >/dev/null
[ "$(metric lily_parked_conversations)" = 0 ] && ok "a conversation larger than the budget is not kept" || bad "budget 1 MB: $(metric lily_parked_conversations) kept"
it_done
