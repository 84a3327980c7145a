# tests/lib.sh, shared by the tests/it_*.sh scripts: source it after `cd` to the repository root.
# Gives B (the build folder, absolute), ok/bad counters, T (a temporary folder removed at
# exit unless KEEP is set), serve (a lily-server on a free port: $port, $sp) and it_done.
set -u
B=${BUILD:-build}; case $B in /*) ;; *) B=$PWD/$B ;; esac
pass=0; fail=0
ok() { pass=$((pass+1)); echo "ok   $*"; }
bad() { fail=$((fail+1)); echo "FAIL $*"; }
T=$(mktemp -d "/tmp/lily-$(basename "$0" .sh)-XXXXXX")
sp=
trap 'kill $sp 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$T"' EXIT
# serve MODEL [lily-server options...]: (re)starts the server; its stderr goes to $T/err
serve() {
  [ -n "$sp" ] && { kill $sp 2>/dev/null; wait $sp 2>/dev/null; }
  : >"$T/err" # emptied here: the child's own truncation may come after the first look for the port
  "$B/lily-server" --model-path "$@" --port 0 --threads 2 2>"$T/err" &
  sp=$!
  port=
  for _ in $(seq 300); do port=$(grep -o 'http://127.0.0.1:[0-9]*' "$T/err" | sed 's/.*://'); [ -n "$port" ] && break; sleep 0.1; done
  [ -n "$port" ] || bad "server did not start: $(cat "$T/err")"
}
it_done() { echo "$pass passed, $fail failed"; [ $fail = 0 ]; }
