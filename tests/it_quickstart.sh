#!/usr/bin/env bash
# The README's first command, scripts/quickstart.sh, as a new user runs it: it must build,
# write the demo model, serve it and show each answer (plain, streamed, schema-constrained).
cd "$(dirname "$0")/.." && . tests/lib.sh
[ "$B" = "$PWD/build" ] || { echo "quickstart builds into build/; skipped for BUILD=$B"; it_done; exit; }
timeout 600 bash scripts/quickstart.sh >"$T/out" 2>&1; rc=$?
[ $rc = 0 ] && ok "quickstart exits 0" || bad "quickstart rc=$rc: $(tail -20 "$T/out")"
grep -q '"object":"chat.completion"' "$T/out" && ok "a chat completion" || bad "no chat completion"
grep -q '^data: \[DONE\]' "$T/out" && ok "a streamed answer" || bad "no stream"
grep -q '^parsed, re-printed compactly: {"city": ' "$T/out" && ok "the schema-constrained answer parses" || bad "structured output: $(grep -A2 structured "$T/out")"
grep -q '^lily_generation_tokens_total [1-9]' "$T/out" && ok "metrics" || bad "metrics"
it_done
