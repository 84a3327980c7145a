#!/usr/bin/env bash
# POST /tokenize and /detokenize on the real server: ids equal the CLI tokenizer's, pieces
# and detokenize give the text back, a chat request counts exactly the prompt tokens the
# chat route reports, bad input is 400 and the routes honour --api-key.
cd "$(dirname "$0")/.." && . tests/lib.sh
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
serve "$T/m" --api-key k3y
post() { curl -s -H 'Authorization: Bearer k3y' -H 'Content-Type: application/json' "http://127.0.0.1:$port$1" -d "$2"; }
py() { python3 -c "import json,sys; r=json.load(sys.stdin); print($1)"; }
txt='Hello world, <|im_end|> and ünïcödé!'
want=$(printf '%s' "$txt" | "$B/lily" tokenize --special --tokenizer "$T/m" | tr -s ' \n' ' ' | sed 's/ $//')
r=$(post /tokenize "{\"prompt\":\"$txt\",\"with_pieces\":true}")
got=$(echo "$r" | py '" ".join(map(str, r["tokens"]))')
[ -n "$want" ] && [ "$got" = "$want" ] && ok "/tokenize ids equal lily tokenize --special ($(echo "$r" | py 'r["count"]') tokens)" || bad "tokenize: '$got' vs '$want' ($r)"
a='Plain ASCII text, <|im_start|> too.'
[ "$(post /tokenize "{\"prompt\":\"$a\",\"with_pieces\":true}" | py '"".join(r["pieces"])')" = "$a" ] && ok "pieces join to the text" || bad "pieces"
plain=$(post /tokenize "{\"content\":\"$txt\",\"add_special_tokens\":false}" | py 'len(r["tokens"])')
[ "$plain" -gt "$(echo "$r" | py 'r["count"]')" ] && ok "add_special_tokens false: <|im_end|> stays text ($plain tokens)" || bad "plain count $plain"
d=$(post /detokenize "{\"tokens\":[$(echo "$r" | py '",".join(map(str, r["tokens"]))')]}" | py 'r["prompt"]')
[ "$d" = "$txt" ] && ok "/detokenize gives the text back" || bad "detokenize: '$d'"
msgs='[{"role":"system","content":"Be brief."},{"role":"user","content":"Count me."}]'
n_tok=$(post /tokenize "{\"messages\":$msgs}" | py 'r["count"]')
n_chat=$(post /v1/chat/completions "{\"messages\":$msgs,\"max_tokens\":1}" | py 'r["usage"]["prompt_tokens"]')
[ "$n_tok" = "$n_chat" ] && ok "messages: the chat route's prompt ($n_tok tokens)" || bad "messages: $n_tok vs chat $n_chat"
code() { curl -s -o "$T/b" -w '%{http_code}' -H 'Authorization: Bearer k3y' "http://127.0.0.1:$port$1" -d "$2"; }
[ "$(code /detokenize '{"tokens":[1,99999999]}')" = 400 ] && ok "detokenize: id past the vocabulary is 400" || bad "detokenize range: $(cat "$T/b")"
[ "$(code /tokenize '{"nothing":1}')" = 400 ] && ok "tokenize without prompt or messages is 400" || bad "tokenize empty: $(cat "$T/b")"
[ "$(code /tokenize '{bad json')" = 400 ] && ok "bad JSON is 400" || bad "bad json: $(cat "$T/b")"
[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/tokenize" -d '{"prompt":"x"}')" = 401 ] && ok "no key: 401" || bad "auth"
[ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer k3y' "http://127.0.0.1:$port/tokenize")" = 405 ] && ok "GET: 405" || bad "GET"
it_done
