#!/usr/bin/env bash
# lily chat on a random-weight model: turns answer, a follow-up turn reuses the
# conversation's cache, /reset starts over (the same first answer again, greedy), the
# whole session is deterministic, and bad options fail clearly.
cd "$(dirname "$0")/.." && . tests/lib.sh
"$B/lily" synth --out "$T/m" --preset tiny --vocab 2048 >/dev/null 2>&1
run() { printf 'Hello there, how are you today?\nAnd what about tomorrow?\n/reset\nHello there, how are you today?\n' |
  "$B/lily" chat --model "$T/m" -n 10 --temp 0 --system "Be brief." >"$T/out$1" 2>"$T/err$1"; }
run 1; rc=$?
[ $rc = 0 ] && [ "$(grep -c '^\[prompt' "$T/err1")" = 3 ] && ok "three turns answered" || bad "rc $rc: $(cat "$T/err1")"
c2=$(sed -n 2p "$T/err1" | sed 's/.*(\([0-9]*\) cached).*/\1/')
p1=$(sed -n 1p "$T/err1" | sed 's/\[prompt \([0-9]*\) tokens.*/\1/')
[ "$c2" -gt 10 ] && ok "the follow-up turn reuses the conversation's cache ($c2 of turn 1's $p1 tokens)" || bad "follow-up cached $c2"
grep -q '^\[new conversation\]' "$T/out1" && ok "/reset announced" || bad "no reset line"
a1=$(awk '/^\[new conversation\]/{exit} {print}' "$T/out1" | head -2)
a3=$(awk 'f{print} /^\[new conversation\]/{f=1}' "$T/out1" | head -2)
[ -n "$a1" ] && [ "$a1" = "$a3" ] && ok "after /reset the same first turn answers the same (greedy)" || bad "reset answers differ: '$a1' vs '$a3'"
run 2
cmp -s "$T/out1" "$T/out2" && ok "deterministic across runs" || bad "runs differ"
"$B/lily" chat >/dev/null 2>"$T/e"; [ $? = 2 ] && grep -q usage "$T/e" && ok "no --model: usage, exit 2" || bad "no model"
echo hi | "$B/lily" chat --model "$T/nope" >/dev/null 2>"$T/e"; [ $? = 1 ] && grep -q "lily chat" "$T/e" && ok "missing model: clear error" || bad "missing model: $(cat "$T/e")"
it_done
