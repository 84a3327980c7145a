#!/usr/bin/env bash
# Runs every test: the unit/fixture test programs, the integration scripts, bounded
# fuzz runs, and the CUDA compile check. Each piece prints "N passed, N failed" as its
# last line; this sums them and fails when anything failed or a piece crashed.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
FUZZ_SECONDS=${FUZZ_SECONDS:-15}
pass=0; fail=0; broken=""
tally() { # name, exit code, output file
  local line p f
  line=$(grep -E '^([A-Za-z_-]+: )?[0-9]+ passed, [0-9]+ failed' "$3" | tail -n 1)
  if [ -z "$line" ]; then fail=$((fail+1)); broken="$broken $1(no-summary,rc=$2)"; return; fi
  p=$(echo "$line" | sed -E 's/^([A-Za-z_-]+: )?([0-9]+) passed.*/\2/')
  f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  pass=$((pass+p)); fail=$((fail+f))
  if [ "$2" != 0 ] && [ "$f" = 0 ]; then fail=$((fail+1)); broken="$broken $1(rc=$2)"; fi
  [ "$f" != 0 ] && broken="$broken $1"
}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# every piece's whole output stays in $BUILD/test-logs (the console shows each one's tail)
logs=$BUILD/test-logs; rm -rf "$logs"; mkdir -p "$logs"
t_all=$SECONDS
took() { echo "-- $1: $(( SECONDS - $2 )) s"; cp "$tmp/$1.out" "$logs/$1.log" 2>/dev/null; } # each piece's time, for keeping CI short
for t in "$BUILD"/tests/test_*; do
  [ -x "$t" ] || continue
  n=$(basename "$t"); echo "== $n"; t0=$SECONDS
  "$t" >"$tmp/$n.out" 2>&1; rc=$?
  [ $rc = 0 ] || { echo "-- failed checks:"; grep -E '^(FAIL|not ok)' "$tmp/$n.out" | head -n 30; echo "-- last lines:"; }
  tail -n 40 "$tmp/$n.out"; tally "$n" $rc "$tmp/$n.out"; took "$n" $t0
done
for s in tests/it_*.sh; do
  [ -f "$s" ] || continue
  n=$(basename "$s" .sh); echo "== $n"; t0=$SECONDS
  BUILD=$BUILD bash "$s" >"$tmp/$n.out" 2>&1; rc=$?
  # a failure's own lines first: the tail alone may not reach them
  [ $rc = 0 ] || { echo "-- failed checks:"; grep -E '^(FAIL|not ok)' "$tmp/$n.out" | head -n 30; echo "-- last lines:"; }
  tail -n 40 "$tmp/$n.out"; tally "$n" $rc "$tmp/$n.out"; took "$n" $t0
done
for fz in "$BUILD"/fuzz/fuzz_*; do
  [ -x "$fz" ] || continue
  n=$(basename "$fz"); echo "== $n (${FUZZ_SECONDS}s)"
  corpus="$tmp/corpus-$n"; mkdir -p "$corpus"
  [ -d "fuzz/corpus/${n#fuzz_}" ] && cp -r "fuzz/corpus/${n#fuzz_}/." "$corpus/"
  "$fz" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 -max_len=65536 "$corpus" >"$tmp/$n.out" 2>&1; rc=$?
  if [ $rc = 0 ]; then echo "1 passed, 0 failed" >>"$tmp/$n.out"; else echo "0 passed, 1 failed" >>"$tmp/$n.out"; tail -n 30 "$tmp/$n.out"; fi
  tail -n 1 "$tmp/$n.out"; tally "$n" $rc "$tmp/$n.out"
done
echo "== cuda-compile-check"
if MAKEFLAGS= make -s BUILD="$BUILD" cuda-compile-check >"$tmp/cuda.out" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); broken="$broken cuda-compile-check"; fi
tail -n 20 "$tmp/cuda.out"
# The GPU build on a machine without a GPU: --backend cuda is refused with a reason,
# auto runs on the CPU and still matches the reference.
if [ -x "$BUILD/cuda/lily" ] && ! nvidia-smi -L >/dev/null 2>&1; then
  fx=../shared/fixtures/tiny
  out=$("$BUILD/cuda/lily" check --backend cuda --model $fx --reference $fx/reference.safetensors 2>&1); rc=$?
  if [ $rc = 1 ] && echo "$out" | grep -q "CUDA backend unavailable"; then pass=$((pass+1)); echo "ok   CUDA build without a GPU: $out"
  else fail=$((fail+1)); broken="$broken cuda-no-gpu"; echo "FAIL CUDA build without a GPU (rc=$rc): $out"; fi
  if "$BUILD/cuda/lily" check --model $fx --reference $fx/reference.safetensors >/dev/null 2>&1; then pass=$((pass+1)); echo "ok   CUDA build, auto backend: CPU fallback passes"
  else fail=$((fail+1)); broken="$broken cuda-auto-fallback"; echo "FAIL CUDA build, auto backend"; fi
fi
[ -n "$broken" ] && echo "failing:$broken"
echo "total: $pass passed, $fail failed ($(( SECONDS - t_all )) s)"
[ "$fail" = 0 ]
