#!/usr/bin/env bash
# The CUDA backend on the CPU emulator (tests/cuda/emu, docs/cuda.md), so the kernels' logic
# is checked on every CI run without a GPU: builds $BUILD/emu (make emu), runs the
# emulator's self-test, `lily check --backend cuda` on the fixtures, the kernel test at
# small shapes, shows that deliberately broken kernels (cu2cpp.py --mutate) fail it, runs the
# unit tests that check the CUDA backend's sessions, and repeats the self-test, kernel test and one
# fixture under AddressSanitizer (make emu-asan), where test_sample_gen, test_park and test_batch_gen
# run (there only: ASan's run is the plain one's checks and more).
# Everything is built first; then the runs, each single-threaded on the emulator, go as a queue of
# jobs, as many at once as the machine has cores (LILY_EMU_JOBS; CI's two cores: this test was most
# of CI's time when it ran one item after the other), each job's report printed in queue order.
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
E=$BUILD/emu
A=$BUILD/emu-asan
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# each result is a line of $tmp/tally (appends of a few bytes: whole lines from concurrent jobs)
ok() { echo p >>"$tmp/tally"; echo "ok   $*"; }
bad() { echo f >>"$tmp/tally"; echo "FAIL $*"; }
summary() { echo "$(grep -c p "$tmp/tally") passed, $(grep -c f "$tmp/tally") failed"; [ "$(grep -c f "$tmp/tally")" = 0 ]; }
: >"$tmp/tally"
secs() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
queue=()
q() { queue+=("$*"); } # q FUNCTION ARGS...: a job for run_queue
run_queue() {
  local par=${LILY_EMU_JOBS:-$(nproc)} i=0 running=0 c
  for c in "${queue[@]}"; do
    ( J=$i; eval "$c" ) >"$tmp/job.$i" 2>&1 &
    i=$((i+1)); running=$((running+1))
    if [ "$running" -ge "$par" ]; then wait -n; running=$((running-1)); fi
  done
  wait
  for ((k = 0; k < i; k++)); do cat "$tmp/job.$k"; done
}

# ---- the builds: the emulated library and programs, its unit tests, the ASan build (make
# emu-asan), the mutants (below)
units="test_park test_beside test_batch test_batch_gen test_prefill_batch test_sample_gen"
t0=$(date +%s.%N)
if ! MAKEFLAGS= make -s -j2 BUILD="$BUILD" emu >"$tmp/build.log" 2>&1; then
  tail -n 40 "$tmp/build.log"; bad "make emu"; summary; exit 1
fi
ok "make emu ($(secs "$t0") s)"
t0=$(date +%s.%N)
ut=""; for n in $units; do ut="$ut $E/tests/$n"; done
if MAKEFLAGS= make -s -k -j2 EMU=1 BUILD="$E" $ut >"$tmp/units.build" 2>&1; then ok "emulated unit tests built ($(secs "$t0") s)"
else tail -n 20 "$tmp/units.build"; bad "build of the emulated unit tests"; fi
t0=$(date +%s.%N)
if MAKEFLAGS= make -s -j2 BUILD="$BUILD" emu-asan >"$tmp/asan.build" 2>&1; then asan_built=1; ok "make emu-asan ($(secs "$t0") s)"
else asan_built=0; tail -n 40 "$tmp/asan.build"; bad "make emu-asan"; fi

j_self() {
  "$E/emu-selftest" >"$tmp/self.log" 2>/dev/null; local rc=$? line
  line=$(tail -n 1 "$tmp/self.log")
  if [ $rc = 0 ] && echo "$line" | grep -qE '^[1-9][0-9]* passed, 0 failed'; then ok "emulator self-test: $line"
  else cat "$tmp/self.log"; bad "emulator self-test (rc=$rc)"; fi
}
q j_self

# bench/micro/chain.cu, the persistent kernel's measurement (a ring of bulk copies, grid flags),
# at rows / 64 on 3 blocks: every ring form must give the direct loads' results bit for bit
j_chain() {
  local t0 rc; t0=$(date +%s.%N)
  "$E/emu-chain" 2 64 3 >"$tmp/chain.log" 2>&1; rc=$?
  if [ $rc = 0 ] && grep -q '^chain: all checks passed' "$tmp/chain.log" && [ "$(grep -c 'equal to the direct' "$tmp/chain.log")" = 8 ]; then
    ok "emulated bench/micro/chain.cu: 6 ring runs, the launches and a second direct run equal to the direct run, first stage as the host's ($(secs "$t0") s)"
  else cat "$tmp/chain.log"; bad "emulated bench/micro/chain.cu (rc=$rc)"; fi
}
q j_chain

# lily check replays each fixture's reference (prefill, continuation, greedy generation)
j_check() {
  local d t0 rc log="$tmp/check.$J.log"
  for d in ../shared/fixtures/tiny tests/fixtures/tinyq tests/fixtures/pe tests/fixtures/pe-mlx4; do
    if [ ! -f "$d/reference.safetensors" ]; then bad "fixture $d missing"; continue; fi
    t0=$(date +%s.%N)
    "$E/lily" check --backend cuda --model "$d" --reference "$d/reference.safetensors" >"$log" 2>&1; rc=$?
    if [ $rc = 0 ] && grep -q "cuda backend" "$log" && grep -q '^PASS' "$log"; then
      ok "emulated lily check --backend cuda $d ($(secs "$t0") s): $(grep -oE 'rel err [0-9.e+-]+' "$log" | tr '\n' ' ')"
    else cat "$log"; bad "emulated lily check --backend cuda $d (rc=$rc)"; fi
  done
}
q j_check

# the other paths the forward pass keeps (docs/cuda.md): the TF32/SIMT tiles instead of the FP16
# GEMM (LILY_CU_GEMM=0), decode's unfused residual norm and top-k (LILY_CU_FUSE=0), the staged
# recurrent delta rule instead of the chunked one (LILY_CU_GDN_CHUNK=0) and the SIMT router tiles
# (LILY_CU_ROUTER_TC=0)
j_check_alt() {
  local d t0 rc log="$tmp/check.$J.log"
  for d in ../shared/fixtures/tiny tests/fixtures/tinyq; do
    t0=$(date +%s.%N)
    LILY_CU_GEMM=0 LILY_CU_GDN_CHUNK=0 LILY_CU_FUSE=0 LILY_CU_ROUTER_TC=0 "$E/lily" check --backend cuda --model "$d" --reference "$d/reference.safetensors" >"$log" 2>&1; rc=$?
    if [ $rc = 0 ] && grep -q '^PASS' "$log"; then
      ok "emulated lily check --backend cuda $d, LILY_CU_GEMM=0 LILY_CU_GDN_CHUNK=0 LILY_CU_FUSE=0 LILY_CU_ROUTER_TC=0 ($(secs "$t0") s)"
    else cat "$log"; bad "emulated lily check --backend cuda $d with the fallback tiles and the staged delta rule (rc=$rc)"; fi
  done
  # the fused decode MoE with the shared expert in its own launches (LILY_CU_SHSLOT=0), as before it
  # rode in the routed experts' launches, and the top-k by the router group's last block
  # (LILY_CU_TOPK_APART=0) instead of its own launch
  d=tests/fixtures/tinyq; t0=$(date +%s.%N)
  LILY_CU_SHSLOT=0 LILY_CU_TOPK_APART=0 "$E/lily" check --backend cuda --model "$d" --reference "$d/reference.safetensors" >"$log" 2>&1; rc=$?
  if [ $rc = 0 ] && grep -q '^PASS' "$log"; then ok "emulated lily check --backend cuda $d, LILY_CU_SHSLOT=0 LILY_CU_TOPK_APART=0 ($(secs "$t0") s)"
  else cat "$log"; bad "emulated lily check --backend cuda $d with the shared expert's own launches and the fused top-k (rc=$rc)"; fi
}
q j_check_alt

# emu_unit NAME MARKER [DETAIL]: tests/NAME.c built for the emulator and run on its CUDA backend;
# the last line must say it passed and the output must name MARKER (the backend really used);
# DETAIL, a grep -o pattern, adds a line of its output to the report
emu_unit() {
  local n=$1 marker=$2 detail=${3:-} log="$tmp/$1.log" t0 rc line
  if [ ! -x "$E/tests/$n" ]; then bad "build of the emulated $n"; return; fi
  t0=$(date +%s.%N)
  LILY_TEST_BACKEND=cuda "$E/tests/$n" >"$log" 2>&1; rc=$?
  line=$(tail -n 1 "$log")
  if [ $rc = 0 ] && echo "$line" | grep -qE '^[1-9][0-9]* passed, 0 failed' && grep -q "$marker" "$log"; then
    ok "emulated $n on the CUDA backend ($(secs "$t0") s): $line${detail:+; $(grep -o "$detail" "$log")}"
  else grep -v '^ok' "$log" | tail -20; bad "emulated $n on the CUDA backend (rc=$rc)"; fi
}

# kernel_test DESC [VAR=value ...] -- ARGS: one run of the emulated cuda-kernel-test ($tmp/kt.$J.log)
kernel_test() {
  local desc=$1 envs=() t0 rc line log="$tmp/kt.$J.log"; shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  t0=$(date +%s.%N)
  env "${envs[@]}" "$E/cuda-kernel-test" "$@" >"$log" 2>&1; rc=$?
  line=$(tail -n 1 "$log")
  if [ $rc = 0 ] && echo "$line" | grep -qE '^[1-9][0-9]* passed, 0 failed'; then ok "emulated cuda-kernel-test $desc ($(secs "$t0") s): $line"
  else grep -v ' ok$' "$log"; bad "emulated cuda-kernel-test $desc (rc=$rc)"; fi
}

# asan_unit TEST: one unit test on the ASan build's CUDA backend: out-of-bounds accesses of device
# buffers and static shared arrays inside kernels are reported (the self-test shows both are caught)
asan_unit() {
  local t0 rc line log="$tmp/asan-$1.log"
  if [ "$asan_built" != 1 ]; then return; fi
  t0=$(date +%s.%N)
  ASAN_OPTIONS=detect_leaks=0 LILY_TEST_BACKEND=cuda "$A/tests/$1" >"$log" 2>&1; rc=$?
  line=$(tail -n 1 "$log")
  if [ $rc = 0 ] && echo "$line" | grep -qE '^[1-9][0-9]* passed, 0 failed' && ! grep -q AddressSanitizer "$log"; then
    ok "ASan $1 on the CUDA backend ($(secs "$t0") s): $line"
  else grep -v '^ok' "$log" | tail -n 30; bad "ASan $1 on the CUDA backend (rc=$rc)"; fi
}
# (the longest jobs first: ASan's. test_sample_gen, test_park and test_batch_gen run there only, the
# same checks as the plain build's with the sanitizer's besides.) The decode loop's graphs against
# buffers reallocated under them (a stale sampler graph wrote and read the freed logits, which only
# ASan sees here); parking's GPU tier (one device allocation walked by offsets, host copies of it, its
# budget); the batched decode loop (its rows' tables, rings and forked graph); parked conversations
# on the CUDA backend (state to the host and back, bit-exact); lily_session_generate with every
# sampling option (device sampling in the graph loop: reproducible per seed, equal to host sampling
# and to the CPU backend); the batched loop's rows (greedy, every sampling option, temperature
# alone, greedy with logprobs) in pieces, equal to the host's rounds bit for bit
q asan_unit test_sample_gen
q asan_unit test_batch_gen
q asan_unit test_park
j_asan_kernels() {
  [ "$asan_built" = 1 ] || return
  local t0 rc line d; t0=$(date +%s.%N)
  ASAN_OPTIONS=detect_leaks=0 "$A/emu-selftest" >"$tmp/aself.log" 2>/dev/null; rc=$?
  line=$(tail -n 1 "$tmp/aself.log")
  if [ $rc = 0 ] && echo "$line" | grep -qE '^[1-9][0-9]* passed, 0 failed'; then ok "ASan emulator self-test: $line"
  else cat "$tmp/aself.log"; bad "ASan emulator self-test (rc=$rc)"; fi
  t0=$(date +%s.%N)
  # (the matrix-vector blocks capped at 2, so they walk tiles: a load past a matrix shows)
  ASAN_OPTIONS=detect_leaks=0 LILY_CU_MVQ_BLOCKS=2 "$A/cuda-kernel-test" --small --seed "$seed" >"$tmp/akt.log" 2>&1; rc=$?
  line=$(tail -n 1 "$tmp/akt.log")
  if [ $rc = 0 ] && echo "$line" | grep -qE '^[1-9][0-9]* passed, 0 failed' && ! grep -q AddressSanitizer "$tmp/akt.log"; then
    ok "ASan cuda-kernel-test --small --seed $seed ($(secs "$t0") s): $line"
  else grep -v ' ok$' "$tmp/akt.log" | tail -n 40; bad "ASan cuda-kernel-test --small --seed $seed (rc=$rc)"; fi
  d=tests/fixtures/tinyq
  t0=$(date +%s.%N)
  ASAN_OPTIONS=detect_leaks=0 "$A/lily" check --backend cuda --model "$d" --reference "$d/reference.safetensors" >"$tmp/acheck.log" 2>&1; rc=$?
  if [ $rc = 0 ] && grep -q '^PASS' "$tmp/acheck.log"; then ok "ASan lily check --backend cuda $d ($(secs "$t0") s)"
  else tail -n 40 "$tmp/acheck.log"; bad "ASan lily check --backend cuda $d (rc=$rc)"; fi
}
q j_asan_kernels

# the same tokens alone and beside other sessions' work (tests/test_beside.c)
q emu_unit test_beside "'cuda backend'"
# decode batches (tests/test_batch.c): sessions at different positions, one past a snapshot
# rollback, one token each in one pass on the emulated GPU, equal to each session fed alone
# and to the CPU's batch; then each continues alone (feeds, the decode loop, a rollback, parking)
q emu_unit test_batch "'cuda backend'" "'largest rel err.*'"
# arrivals prefilled side by side (tests/test_prefill_batch.c): each job as prefilled alone, bit for bit
q emu_unit test_prefill_batch "'cuda backend'"

# every kernel against the CPU reference on fresh random inputs (the seed is printed)
seed=$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')
q kernel_test "'--small --seed $seed'" -- --small --seed "$seed"
# the same in a random order of blocks, warps and lanes: results must not depend on it; and the
# matrix-vector kernel's blocks capped at 2 a row of slots, so each walks many tiles of rows; and
# k_mvdp's experts fetching their first codes before the staging (LILY_CU_MVDP_EPF=1, off by default);
# and k_attn_dtc's prefetches, of its first two steps' keys before the wait (LILY_CU_ATTN_PF=2; 1 by
# default) and two steps ahead in its loop (LILY_CU_ATTN_PFL=2, off by default; the --batch run below
# too): the emulator faults a bulk prefetch outside device memory
q kernel_test "'--small, LILY_EMU_ORDER=random LILY_EMU_SEED=$seed LILY_CU_MVQ_BLOCKS=2 LILY_CU_MVDP_EPF=1 LILY_CU_FOLD_EPF=1 LILY_CU_ATTN_PF=2 LILY_CU_ATTN_PFL=2'" \
  LILY_EMU_ORDER=random LILY_EMU_SEED="$seed" LILY_CU_MVQ_BLOCKS=2 LILY_CU_MVDP_EPF=1 LILY_CU_FOLD_EPF=1 LILY_CU_ATTN_PF=2 LILY_CU_ATTN_PFL=2 \
  -- --small --seed "$seed"
# the float decode kernel (k_mvq4) where the tensor-core one (k_mvtc) takes 4-bit matrices by default;
# k_mvdp's routing warp before the staging rather than beside it (LILY_CU_ROUTE_OVL=0); greedy's
# two-read first pass (LILY_CU_ARGMAX1=0)
q kernel_test "'--small, LILY_CU_MVTC=0 LILY_CU_ROUTE_OVL=0 LILY_CU_ARGMAX1=0'" LILY_CU_MVTC=0 LILY_CU_ROUTE_OVL=0 LILY_CU_ARGMAX1=0 \
  -- --small --seed "$seed"
# the wmma GEMM (cu_gemm.cu) where k_gemm_tc takes the 4-bit matrices by default, and the SIMT
# attention where k_attn_tc takes the 35B-A3B heads
q kernel_test "'--small, LILY_CU_GEMM_TC=0 LILY_CU_ATTN_TC=0'" LILY_CU_GEMM_TC=0 LILY_CU_ATTN_TC=0 -- --small --seed "$seed"
# decode batches (lcuda_forward_batch) on random-weight models, each session against a twin fed
# alone; in a random order of blocks, warps and lanes (the rows are a grid dimension). By default
# the DeltaNet step runs split over the rows (k_gdn_dec_split) and each token routes itself in the
# experts' gate|up launch: the split step required to have run
j_kt_batch() {
  kernel_test "--small --batch, LILY_EMU_ORDER=random LILY_EMU_SEED=$seed LILY_CU_ATTN_PFL=2" LILY_EMU_STATS=kernels LILY_EMU_ORDER=random \
    LILY_EMU_SEED="$seed" LILY_CU_ATTN_PFL=2 -- --small --batch --seed "$seed"
  grep -q '^lily emu: kernel k_gdn_dec_split<' "$tmp/kt.$J.log" || bad "emulated cuda-kernel-test --batch ran no k_gdn_dec_split"
}
q j_kt_batch
# the same with the dense products on the int8 tensor cores at every row count (k_mvdpt,
# LILY_CU_MVDPT=1; by default from 6 rows), three blocks a launch, and every batch's combine folded
# into its down (LILY_CU_BATCH_COMB=8; by default 2 rows); k_mvdpt required to have run
j_kt_batch_dpt() {
  kernel_test "--small --batch, LILY_CU_MVDPT=1 LILY_CU_MVQ_BLOCKS=3 LILY_CU_BATCH_COMB=8, blocks in a random order" \
    LILY_EMU_STATS=kernels LILY_CU_MVDPT=1 LILY_CU_MVQ_BLOCKS=3 LILY_CU_BATCH_COMB=8 LILY_EMU_ORDER=random \
    LILY_EMU_SEED="$seed" -- --small --batch --seed "$seed"
  grep -q '^lily emu: kernel k_mvdpt<' "$tmp/kt.$J.log" || bad "emulated cuda-kernel-test --batch with LILY_CU_MVDPT=1 ran no k_mvdpt"
}
q j_kt_batch_dpt
# and the older forms kept for measuring and as the fallbacks: k_mvdpb at every row count, the
# top-k launch, the DeltaNet step in two launches (k_gdn_prep1 then the recurrence)
q kernel_test "'--small --batch, LILY_CU_MVDPT=0 LILY_CU_BATCH_ROUTE=0 LILY_CU_GDN_SPLIT_ROWS=0'" \
  LILY_CU_MVDPT=0 LILY_CU_BATCH_ROUTE=0 LILY_CU_GDN_SPLIT_ROWS=0 LILY_EMU_ORDER=random \
  LILY_EMU_SEED="$seed" -- --small --batch --seed "$seed"
# the GPU sampler (cu_sample.cu) against the CPU sampler for the same uniform draw: every
# option at small vocabularies and the real 248,320, and the draw statistics (chi-square)
q kernel_test "'--sampling --small --seed $seed'" -- --sampling --small --seed "$seed"

# whole model (a random tiny one): CPU and CUDA logits after a prompt long enough for the
# tensor-core tiles, greedy steps on both, and the GPU decode loop (CUDA graph replay) giving
# the same tokens. The prefill runs the fp32 tiles with fp32 inputs (LILY_CU_GEMM=0,
# LILY_EMU_TF32=fp32): in a tiny random model a 10-bit mantissa can flip an expert choice or a
# near-tied greedy token (TF32, seen: logits rel err 0.23 at one seed; the FP16 GEMM, seed
# 201660224: the 7th of 12 tokens), which is a precision effect, not what this checks. The kernel
# test bounds those GEMMs' error per matmul, and lily check above runs them end to end.
j_model_tiny() {
  local t0 rc line; t0=$(date +%s.%N)
  if "$E/lily" synth --out "$tmp/model" --layout mlx4 --preset tiny --seed "$seed" >"$tmp/synth.$J.log" 2>&1; then
    LILY_CU_GEMM=0 LILY_EMU_TF32=fp32 "$E/cuda-kernel-test" --model "$tmp/model" --prompt 140 --steps 12 --seed "$seed" >"$tmp/model.$J.log" 2>&1; rc=$?
    line=$(tail -n 1 "$tmp/model.$J.log")
    if [ $rc = 0 ] && echo "$line" | grep -qE '^4 passed, 0 failed'; then ok "emulated cuda-kernel-test --model (tiny, 140-token prompt, 12 steps, $(secs "$t0") s): $line"
    else cat "$tmp/model.$J.log"; bad "emulated cuda-kernel-test --model (rc=$rc)"; fi
  else cat "$tmp/synth.$J.log"; bad "lily synth --preset tiny"; fi
}
q j_model_tiny

# the same with the tensor-core prefill attention's shape (16 query heads, 2 KV heads) and its
# fp16-key form on (off by default until measured on the H200): the prompt's 140 keys converted
# once, four key splits merged
j_model_h16() {
  local t0 rc line; t0=$(date +%s.%N)
  if "$E/lily" synth --out "$tmp/model16" --layout mlx4 --preset tiny --hidden 256 --heads 16 --kv-heads 2 --seed "$seed" >"$tmp/synth.$J.log" 2>&1; then
    LILY_EMU_STATS=kernels LILY_CU_ATTN_H16=1 LILY_CU_GEMM=0 LILY_EMU_TF32=fp32 "$E/cuda-kernel-test" --model "$tmp/model16" --prompt 140 --steps 4 --seed "$seed" >"$tmp/model.$J.log" 2>&1; rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$tmp/model.$J.log" | tail -n 1)
    if [ $rc = 0 ] && echo "$line" | grep -qE '^4 passed, 0 failed' && grep -q '^lily emu: kernel k_kv_h16: ' "$tmp/model.$J.log"; then ok "emulated cuda-kernel-test --model (hidden 256, 16 heads: the fp16 keys fit the scratch; LILY_CU_ATTN_H16=1, $(secs "$t0") s): $line"
    else cat "$tmp/model.$J.log"; bad "emulated cuda-kernel-test --model, 16 heads, LILY_CU_ATTN_H16=1 (rc=$rc)"; fi
  else cat "$tmp/synth.$J.log"; bad "lily synth --preset tiny --heads 16"; fi
}
q j_model_h16

# the real widths (hidden 2,048, 16 key and 32 value heads of 128, experts of 512; 16 experts, vocab
# 512, 4 layers) on the default decode path: the integer matrix-vector kernels at the 35B-A3B's
# columns, the gate|up launch routing itself and the combine folded into the down (k_mvdp_comb);
# with a 6-token prompt, that prompt's one pass on the decode batches' kernels too (T <= 8: k_mvdpt,
# the router group taking the residual and norm a slot a row, LILY_CU_BATCH_FUSE, and the shared
# expert riding in the experts' launches one slot a token, LILY_CU_BATCH_SHSLOT)
j_model_2k() { # PROMPT KERNEL [VAR=value]: the prompt's tokens, a kernel the run must have launched, a setting
  local t0 rc line m="$tmp/m2k.$1"; t0=$(date +%s.%N)
  if "$E/lily" synth --out "$m" --layout mlx4 --preset 35b-a3b --layers 4 --experts 16 --vocab 512 --seed "$seed" >"$tmp/synth.$J.log" 2>&1; then
    env ${3:-X=1} LILY_EMU_STATS=kernels LILY_CU_GEMM=0 LILY_EMU_TF32=fp32 "$E/cuda-kernel-test" --model "$m" --prompt "$1" --steps 4 --seed "$seed" >"$tmp/model.$J.log" 2>&1; rc=$?
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$tmp/model.$J.log" | tail -n 1)
    if [ $rc = 0 ] && echo "$line" | grep -qE '^4 passed, 0 failed' && grep -q "^lily emu: kernel $2<" "$tmp/model.$J.log"; then
      ok "emulated cuda-kernel-test --model (hidden 2048, experts of 512, a $1-token prompt${3:+, $3}, $(secs "$t0") s): $line"
    else cat "$tmp/model.$J.log"; bad "emulated cuda-kernel-test --model, hidden 2048, $1-token prompt (rc=$rc)"; fi
  else cat "$tmp/synth.$J.log"; bad "lily synth --preset 35b-a3b --layers 4"; fi
}
# (k_mvdp at R = 4, 2 rows a lane group being the default since session 44: both forms through a model,
# the 6-token job below at the default)
q j_model_2k 20 k_mvdp_comb LILY_CU_MVDP_R=4
# (the 6-token pass with its combine folded into the down, a token a grid row, and the next
# in-projections staging the norm on k_mvdpt: by default only 2-row passes fold)
q j_model_2k 6 k_mvdpt LILY_CU_BATCH_COMB=8

# the emulation can fail: each mutant (an off-by-one, a missing block barrier, a short warp
# reduction, a missing __syncwarp, the router's tie within a lane going to the higher id, a
# misplaced tensor-core tile, a decode batch whose rows all take the first row's position, a
# batched matrix-vector product reading input row 0 for every row, the tensor-core matrix-vector
# kernel's input in the wrong mma column, a prefill GEMM step computed before its copies land, attention seeing one key past its own, the chunked delta rule's
# state update reading its chunk before the copies land, an expert tile of 17-24 tokens computed as
# one of up to 16, the decode MoE tail folded into the down summing a row before every slot's warp wrote it or staging
# every slot's gate outputs from the first slot, decode attention's folded q/k prep rotating a pair's
# second half the wrong way or reading the new key before it is written, the MoE sort's scatter
# reusing its first batch of slots, the integer matrix-vector kernel writing a lane group's rows to
# its first row, its staging mixing the odd columns' bytes into the even ones', its 8-bit codes meeting
# the wrong columns' input or its two-group form reusing the first group's codes, decode attention's merge taking half the partials' maximum or
# joining all warps' partials but the last's, the integer kernel routing itself giving every slot the first expert, decode's fused DeltaNet
# step letting a key head's first block write the conv state the others still read, greedy's one-read
# first pass giving ties to the higher index,
# the wgmma GEMM's B operand with two lanes' words swapped, the fp16 keys' pairs holding one key twice, a GEMM block's
# scales held for all its steps giving every odd step the step before's, the split DeltaNet step's first block
# writing the shared conv state or every quarter writing the first quarter's columns, the staged gated norm
# summing half a head, the router's copy computing on a stage not yet waited for, with two fragment values
# swapped or its inputs' group sums over half the columns, k_mvdp's staging putting a thread's second
# preloaded word in its first word's place, decode's routing warp taking the wrong lane's id, a dense
# launch's pre-wait group taking its scales for its biases, the batches' integer kernel staging every row
# into the first row's place or computing a warp's later tiles with its first tile's rows, a batch's tokens'
# shared-expert slots all reading the first one's input row, its router group adding the first row's
# mixer output to every row) must fail the
# kernel test, or, where it writes past a buffer (the sort's scatter does at some seeds: CI saw
# glibc abort on the heap it had overwritten), be stopped there by the emulator's red zones
mutants="argmax1-tie gdn-dec-first attn-merge-w-warp mvdp-route-slot wg-transpose attn-h16-pair mvdp-row-sel mvdp-stage-odd mvdp-q8-order mvdp-g2-stale attn-merge-max rmsnorm-off-by-one block-sum-no-sync warp-sum-half router-no-syncwarp route-regs-tie tf32-tile-b rows-pos-first mvqb-row0 mvdpb-row0 mvdpb-tile-stale mvtc-column gemm-tc-early attn-tc-causal gdn-tc-early gemm-tc-nj dpc-no-sync dpc-slot-stage qk-fold-rope qk-fold-no-sync sort-one-batch gemm-sbup-step gdn-split-first gdn-split-col gated-half-head attn-adapt-merge rtr-stage-wait rtr-frag-order rtr-xs-half mvdp-stage-pre2 route-rdx-id mvdp-raw-bias mvdp-gw-pre qk-fold-kw dpt-kstep-b dpt-stale-batch dpt-red-warps dpt-meta-row gsr-row-cnt gsr-row-s mvdp-broute-slot dpt-gated-gw dtc-p-lo dtc-mask dtc-join-warp xslot-row0 mvq-add-row0 dpc-rows-sel0 rows-norm-r0"
# -O1 without debug info, built by one make (-j2: the two cores; -k: a failed build is reported
# below) before the runs, each a job of the queue ending at its first failing check
# (LILY_KT_FAILFAST)
t0=$(date +%s.%N)
targets=""; for m in $mutants; do targets="$targets $E/mutant/$m/cuda-kernel-test"; done
# (an earlier build's binary must not stand in for one whose source no longer takes the mutant's pattern)
rm -f $targets
MAKEFLAGS= make -s -k -j2 EMU=1 BUILD="$E" EMU_CXXFLAGS=-O1 $targets >"$tmp/mb.log" 2>&1
echo "(mutants built in $(secs "$t0") s)"
# the kernel test's section that exercises each mutant's kernel (LILY_KT_ONLY; a mutant that section
# does not catch runs the whole test again before it counts as not caught)
mutant_sec() {
  case $1 in
    argmax1-tie) echo argmax ;;
    gdn-*) echo gdn ;;
    attn-merge-*|attn-adapt-merge|qk-fold-*|dtc-*) echo attn ;;
    attn-h16-pair|attn-tc-causal) echo tc ;;
    wg-transpose|gemm-tc-nj|sort-one-batch) echo experts ;;
    mvdp-route-slot|mvdp-q8-order|mvdp-g2-stale|block-sum-no-sync|mvtc-column|gated-half-head|route-rdx-id|mvdp-gw-pre|xslot-row0|mvq-add-row0) echo group ;;
    mvdpb-tile-stale|dpt-gated-gw|rows-norm-r0) echo rows ;;
    rmsnorm-off-by-one|dpc-*) echo norm ;;
    router-no-syncwarp|route-regs-tie|rtr-*) echo router ;;
    *) echo mm ;;
  esac
}
run_mutant() { # NAME: its result line in $tmp/mres.NAME
  local m=$1 args=--small menv=X=1 rc nf log="$tmp/m.$1.log" sec
  if [ ! -x "$E/mutant/$m/cuda-kernel-test" ]; then echo "FAIL build of mutant $m" >"$tmp/mres.$m"; return; fi
  [ $m = rows-pos-first ] && args="--small --batch"
  # (the batch's split DeltaNet step's blocks in a random order, as the GPU may run them: in grid order a
  # shared counter still ends each row last)
  case $m in gsr-*) args="--small --batch"; menv="LILY_EMU_ORDER=random LILY_EMU_SEED=$seed";; mvdp-broute-*) args="--small --batch";; esac
  # (k_attn_merge meets many partials only where decode's wide merge is off)
  [ $m = attn-merge-max ] && menv=LILY_CU_MERGE_W=0
  sec=$(mutant_sec "$m")
  env $menv LILY_KT_ONLY="$sec" LILY_KT_FAILFAST=1 "$E/mutant/$m/cuda-kernel-test" $args --seed "$seed" >"$log" 2>&1; rc=$?
  nf=$(tail -n 1 "$log" | sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p')
  if ! { [ $rc != 0 ] && { [ -n "$nf" ] && [ "$nf" -gt 0 ] || grep -q 'lily emu: kernel .* was written outside it' "$log"; }; }; then
    echo "(mutant $m not caught in section $sec: the whole test)" >>"$tmp/mnote"
    env $menv LILY_KT_FAILFAST=1 "$E/mutant/$m/cuda-kernel-test" $args --seed "$seed" >"$log" 2>&1; rc=$?
    nf=$(tail -n 1 "$log" | sed -nE 's/^[0-9]+ passed, ([0-9]+) failed$/\1/p')
  fi
  if [ $rc != 0 ] && [ -n "$nf" ] && [ "$nf" -gt 0 ]; then
    echo "ok   mutant $m caught: $(grep -m1 ' FAIL$' "$log" | sed -E 's/ +rel err.*//') fails" >"$tmp/mres.$m"
  elif [ $rc != 0 ] && grep -q 'lily emu: kernel .* was written outside it' "$log"; then
    echo "ok   mutant $m caught: the emulator saw it write outside a buffer ($(grep -o 'kernel [a-z0-9_]*' "$log" | head -n 1))" >"$tmp/mres.$m"
  else { tail -n 5 "$log"; echo "FAIL mutant $m not caught (rc=$rc)"; } >"$tmp/mres.$m"; fi
}
j_mutant() {
  run_mutant "$1"
  if head -n 1 "$tmp/mres.$1" | grep -q '^FAIL build'; then grep -A3 -B3 "mutant/$1/" "$tmp/mb.log" | tail -n 20; fi
  local r; r=$(tail -n 1 "$tmp/mres.$1")
  case "$r" in ok*) ok "${r#ok   }" ;; *) head -n -1 "$tmp/mres.$1"; bad "${r#FAIL }" ;; esac
}
for m in $mutants; do q j_mutant "$m"; done

t0=$(date +%s.%N)
run_queue
echo "(${#queue[@]} jobs, ${LILY_EMU_JOBS:-$(nproc)} at a time: $(secs "$t0") s)"
[ -s "$tmp/mnote" ] && cat "$tmp/mnote"
summary
