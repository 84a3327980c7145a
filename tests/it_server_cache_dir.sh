#!/usr/bin/env bash
# --cache-dir on the real server: a conversation survives SIGTERM and a restart. Its next
# turn is restored from the saved file (cached tokens cover the first prompt up to where the
# template re-renders its end, as many as without a restart; the unparked counter moves)
# and answers exactly as a server that never stopped (greedy). At startup a damaged file
# is reported and skipped, a file of another format version is deleted, and neither stops
# the server; the next shutdown leaves only current conversations in DIR.
# Saving and loading keep to --cache-mb, the most recently used first.
cd "$(dirname "$0")/.." && . tests/lib.sh
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
C="$T/cache"
chat() { curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -d "{\"messages\":$1,\"max_tokens\":8,\"temperature\":0,\"chat_template_kwargs\":{\"enable_thinking\":false}}"; }
field() { python3 -c "import json,sys; r=json.load(sys.stdin); print($1)"; }
metric() { curl -s "http://127.0.0.1:$port/metrics" | awk -v k="$1" '$1==k {print $2}'; }
stop() { kill -TERM $sp; wait $sp 2>/dev/null; sp=; }
A='[{"role":"system","content":"You are a careful assistant who answers in full sentences about the history of printing presses and movable type in Europe and Asia."},{"role":"user","content":"Tell me about Gutenberg and the spread of printing across the cities of the Rhine."}]'
follow() { # A's next turn, given A's first answer
  python3 -c 'import json,sys; a=json.loads(sys.argv[1]); a.append({"role":"assistant","content":sys.argv[2]}); a.append({"role":"user","content":"And after that?"}); print(json.dumps(a))' "$A" "$1"
}

serve "$T/m" --slots 1 --cache-mb 64 --cache-dir "$C"
r=$(chat "$A")
a1=$(echo "$r" | field 'r["choices"][0]["message"]["content"]')
p1=$(echo "$r" | field 'r["usage"]["prompt_tokens"]')
stop
files=$(ls "$C" | grep -c '\.lpark$')
grep -q "saved 1 conversations" "$T/err" && [ "$files" = 1 ] && ok "SIGTERM saved the slot's conversation ($(ls "$C"))" \
  || bad "save at shutdown: $files files; $(cat "$T/err")"
[ -z "$(ls "$C" | grep tmp)" ] && ok "no temporary file left" || bad "left: $(ls "$C")"

# beside it: a copy with one byte changed, and a copy claiming another format version
f=$(ls "$C"/*.lpark)
python3 - "$f" "$C/damaged.lpark" "$C/oldversion.lpark" <<'PY'
import random, sys
b = bytearray(open(sys.argv[1], 'rb').read())
d = bytearray(b); i = random.randrange(100, len(d)); d[i] ^= 1 + random.randrange(255)
open(sys.argv[2], 'wb').write(d)
v = bytearray(b); v[8] = 99
open(sys.argv[3], 'wb').write(v)
PY
serve "$T/m" --slots 1 --cache-mb 64 --cache-dir "$C"
grep -q "skipped a conversation: .*damaged.lpark" "$T/err" && ok "a damaged file is reported and skipped" || bad "damaged: $(cat "$T/err")"
grep -q "oldversion.lpark.*deleted it" "$T/err" && [ ! -e "$C/oldversion.lpark" ] && ok "a file of another version is deleted" \
  || bad "other version: $(ls "$C"); $(cat "$T/err")"
grep -q "restored 1 conversations" "$T/err" && ok "the saved conversation is restored" || bad "restore: $(cat "$T/err")"
r=$(chat "$(follow "$a1")")
x=$(echo "$r" | field 'r["choices"][0]["message"]["content"]')
cached=$(echo "$r" | field 'r["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$cached" -ge $((p1 - 12)) ] && [ "$(metric lily_unparked_total)" = 1 ] \
  && ok "after the restart the next turn resumes: $cached cached tokens of the first prompt's $p1" \
  || bad "next turn after restart: cached $cached (first prompt $p1), unparked $(metric lily_unparked_total): $r"
stop
[ "$(ls "$C")" = "$(ls "$C" | grep -v damaged)" ] && [ "$(ls "$C" | grep -c '\.lpark$')" = 1 ] \
  && ok "the next shutdown leaves only the current conversation" || bad "left in DIR: $(ls "$C")"

# the budget: 8 MB holds one of A (~6 MB here) and B (~5 MB); the most recently used is kept
Bm='[{"role":"user","content":"Something else entirely: list three prime numbers."}]'
serve "$T/m" --slots 1 --cache-mb 8 --cache-dir "$T/c2"
chat "$A" >/dev/null
chat "$Bm" >/dev/null # A is parked, B holds the slot until shutdown
stop
kept=$(ls "$T/c2")
grep -q "saved 1 conversations" "$T/err" && [ "$(echo "$kept" | wc -l)" = 1 ] && [ "$kept" != "$(basename "$f")" ] \
  && ok "within --cache-mb the most recent conversation is saved, the older one dropped" || bad "budget: kept '$kept' (A is $(basename "$f")); $(cat "$T/err")"
serve "$T/m" --slots 1 --cache-mb 4 --cache-dir "$T/c2"
grep -q "restored 0 conversations .*1 more did not fit" "$T/err" && ok "loading keeps to --cache-mb too" || bad "load budget: $(cat "$T/err")"

# a crash: with --cache-sync-ms the folder catches up once the server is idle, so SIGKILL loses nothing
serve "$T/m" --slots 1 --cache-mb 64 --cache-dir "$T/c3" --cache-sync-ms 200
r3=$(chat "$A")
a3=$(echo "$r3" | field 'r["choices"][0]["message"]["content"]')
for _ in $(seq 100); do grep -q "synced 1 conversations" "$T/err" && break; sleep 0.1; done
kill -KILL $sp; wait $sp 2>/dev/null; sp=
[ "$(ls "$T/c3" | grep -c '\.lpark$')" = 1 ] && [ -z "$(ls "$T/c3" | grep tmp)" ] \
  && ok "idle for --cache-sync-ms: the slot's conversation is in the folder before a SIGKILL" \
  || bad "sync before the kill: $(ls "$T/c3"); $(cat "$T/err")"
serve "$T/m" --slots 1 --cache-mb 64 --cache-dir "$T/c3" --cache-sync-ms 200
r=$(chat "$(follow "$a3")")
c3=$(echo "$r" | field 'r["usage"]["prompt_tokens_details"]["cached_tokens"]')
grep -q "restored 1 conversations" "$T/err" && [ "$c3" -ge $((p1 - 12)) ] && [ "$(metric lily_unparked_total)" = 1 ] \
  && ok "after SIGKILL and a restart the next turn resumes: $c3 cached tokens" \
  || bad "after the kill: cached $c3 (first prompt $p1), unparked $(metric lily_unparked_total); $(cat "$T/err")"
# the first turn's file gives way to the second's at the next sync (names follow the tokens)
for _ in $(seq 100); do [ "$(grep -c "synced 1 conversations" "$T/err")" -ge 1 ] && break; sleep 0.1; done
n3=$(ls "$T/c3" | grep -c '\.lpark$')
stop
[ "$n3" = 1 ] && ok "each sync leaves only the current conversation" || bad "after the second sync: $(ls "$T/c3")"

serve "$T/m" --slots 1 --cache-mb 64 # a server that never stops
a1b=$(chat "$A" | field 'r["choices"][0]["message"]["content"]')
r=$(chat "$(follow "$a1b")")
y=$(echo "$r" | field 'r["choices"][0]["message"]["content"]')
ycached=$(echo "$r" | field 'r["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$cached" = "$ycached" ] && ok "as many cached tokens as on a server that never stopped ($ycached)" \
  || bad "cached $cached after the restart, $ycached without one"
[ "$a1" = "$a1b" ] && [ "$x" = "$y" ] && ok "the restored conversation answers exactly as on a server that never stopped" \
  || bad "answers differ ($(tail -3 "$T/err")): '$a1' / '$x' vs '$a1b' / '$y'"
it_done
