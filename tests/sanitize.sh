#!/usr/bin/env bash
# make sanitize: the unit tests and the server's integration tests on binaries built with
# AddressSanitizer + UBSan (BUILD names that build). A sanitizer report anywhere, even in a
# server whose test still passed, fails the run: reports go to files and are counted.
set -u
cd "$(dirname "$0")/.."
B=${BUILD:?BUILD names the sanitizer build}; case $B in /*) ;; *) B=$PWD/$B ;; esac
logs=$(mktemp -d /tmp/lily-sanitize-XXXXXX)
export ASAN_OPTIONS=log_path=$logs/asan:detect_leaks=1 UBSAN_OPTIONS=log_path=$logs/ubsan:print_stacktrace=1
pass=0; fail=0; failing=
for t in "$B"/tests/test_*; do
  case $t in *.d|*.o) continue ;; esac
  n=$(basename "$t")
  if "$t" >"$logs/$n.out" 2>&1; then pass=$((pass+1)); echo "ok   $n: $(tail -n 1 "$logs/$n.out")"
  else fail=$((fail+1)); failing="$failing $n"; tail -n 20 "$logs/$n.out"; echo "FAIL $n"; fi
done
# servers are stopped with a signal, so leaks are not checked there
export ASAN_OPTIONS=log_path=$logs/asan:detect_leaks=0
for s in it_server it_server_tools it_server_anthropic it_server_responses it_server_park it_server_cache_dir it_server_tokenize it_chat it_convert it_pull; do
  if BUILD=$B bash tests/$s.sh >"$logs/$s.out" 2>&1; then pass=$((pass+1)); echo "ok   $s: $(tail -n 1 "$logs/$s.out")"
  else fail=$((fail+1)); failing="$failing $s"; grep -v '^ok' "$logs/$s.out" | tail -n 20; echo "FAIL $s"; fi
done
# it_server's memory-limit case runs the server under ulimit -v, where ASan cannot map its
# shadow memory; that one start-up refusal is expected and not a finding
reports=$(grep -L 'ReserveShadowMemoryRange failed' "$logs"/asan.* "$logs"/ubsan.* 2>/dev/null)
for r in $reports; do fail=$((fail+1)); failing="$failing $(basename "$r")"; echo "FAIL sanitizer report $r:"; head -n 30 "$r"; done
[ -z "$reports" ] && { pass=$((pass+1)); echo "ok   no sanitizer reports"; }
[ $fail = 0 ] && rm -rf "$logs"
[ -n "$failing" ] && echo "failing:$failing (logs in $logs)"
echo "$pass passed, $fail failed"
[ $fail = 0 ]
