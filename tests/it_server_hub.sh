#!/usr/bin/env bash
# lily-server --model-path ORG/NAME: the model comes from a (fake, local) Hugging Face hub,
# is pulled into $LILY_HOME, converted to 4-bit once when it is the bf16 release, and served.
set -u
cd "$(dirname "$0")/.."
B=${BUILD:-build}; case $B in /*) ;; *) B=$PWD/$B ;; esac
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
T=$(mktemp -d /tmp/lily-it-srvhub-XXXXXX)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; rm -rf "$T"; }
trap cleanup EXIT

serve_and_ask() { # repo-id, label
  "$B/lily-server" --model-path "$1" --port 0 --threads 2 >"$T/srv.out" 2>"$T/srv.err" &
  local sp=$! port=""
  pids="$pids $sp"
  for _ in $(seq 300); do
    port=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/srv.err" | head -n 1 | sed 's/.*://')
    [ -n "$port" ] && break
    kill -0 $sp 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$port" ]; then bad "$2: server did not start: $(tail -n 3 "$T/srv.err")"; return; fi
  ok "$2: server started from the hub"
  out=$(curl -s "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' \
        -d '{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0}')
  echo "$out" | grep -q '"completion_tokens":' && ok "$2: answered a chat request" || bad "$2: no answer: $out"
  kill $sp; wait $sp 2>/dev/null
}

for layout in mlx4 hf; do
  "$B/lily" synth --out "$T/repo-$layout" --preset tiny --layout $layout --vocab 1024 >/dev/null 2>&1 || bad "synth $layout"
  python3 tests/fake_hub.py "$T/repo-$layout" org/demo-$layout "$T/ports-$layout" 2>"$T/hub-$layout.log" &
  pids="$pids $!"
  for _ in $(seq 50); do [ -s "$T/ports-$layout" ] && break; sleep 0.1; done
  read -r HP CP < "$T/ports-$layout"
  export HF_ENDPOINT=http://127.0.0.1:$HP LILY_HOME=$T/home
  serve_and_ask org/demo-$layout "$layout"
done
[ -f "$T/home/models/org--demo-mlx4/config.json" ] && ok "4-bit repo pulled into the cache" || bad "4-bit repo not in the cache"
ls "$T/home/models" | grep -q 'org--demo-hf-mlx4' && ok "bf16 release converted once beside it" || bad "no converted folder: $(ls "$T/home/models")"
grep -q '"quantization"' "$T/home/models/org--demo-hf-mlx4/config.json" 2>/dev/null && ok "converted config is 4-bit" || bad "converted config lacks quantization"
# a repo that does not exist: a clear error, exit 1
"$B/lily-server" --model-path org/nosuch --port 0 >/dev/null 2>"$T/err"; rc=$?
[ $rc = 1 ] && grep -qi "nosuch\|404\|not found" "$T/err" && ok "missing repo: $(tail -n 1 "$T/err")" || bad "missing repo rc=$rc: $(cat "$T/err")"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
