#!/bin/bash
# What runs on the GPU machine (CI has no GPU; `make test` only compiles the CUDA code).
# Run from the repository root:  bash tests/cuda/run_device.sh [stage...]
#   stages: build fixtures check kernels model bench batch variants ncu chain batchtc base   (default: build check kernels model bench batch)
#   batchtc: the decode batches' forms (bench/RESULTS.md sessions 29 and 31): cuda-kernel-test --batch and the cuda
#          test_batch / test_beside with k_mvdpt at every row count (LILY_CU_MVDPT=1; by default from 6 rows), then
#          lily-bench tg32x{1,2,4,6,8,12,16}@1024 as is, with LILY_CU_MVDPT=1, =0, with the top-k launch
#          (LILY_CU_BATCH_ROUTE=0), with the DeltaNet step in two launches (LILY_CU_GDN_SPLIT_ROWS=0), and with the
#          GEMMs past 8 rows (LILY_CU_BATCH_MV=8), in turn, twice; then --profile of x8 and x16
#   base:  lily-bench tg128,tg128@4096 as is and as bin/lily-bench-base (an earlier commit's, packed as EXTRA), in
#          turn, twice: the default path against that commit on the same GPU
#   chain: bench/micro/chain.cu, a synthetic 35B-A3B token as one persistent kernel (direct loads, rings of bulk
#          copies, launches in a graph; docs/cuda.md "Persistent decode"), at full size and at one row a block
#   batch: decode batches (lcuda_forward_batch): lily-bench tg32xB@1024 for B = 1, 2, 4, 8, 16 and
#          lily-server's aggregate decode rate under 1, 4 and 8 concurrent streams (bench/server_concurrency.sh);
#          tg32x{2,4,8}@1024 again with LILY_MVQB_RW=4 and LILY_MVQB=0 (the 2-8-row matrix-vector kernel's variants)
#   variants: check and pp512/pp2048 with LILY_CU_GEMM=0, LILY_CU_GEMM_TC=0 (the wmma GEMM), LILY_CU_ATTN_TC=0
#             (SIMT prefill attention), LILY_CU_ATTN_SPLIT=0, LILY_CU_GDN_CHUNK=0, LILY_CU_GDN_CHUNK=1 with LILY_CU_GDN_TC=0,
#             LILY_CU_RTR=0 (the router on the tiles) alone and with LILY_CU_ROUTER_TC=0 or LILY_CU_SPLITK=0, LILY_CU_MOE_XP=0 and
#             LILY_CU_DENSE_XP=0 (fp32 GEMM inputs), LILY_CU_SIMT8=0 (k_mm_simt router), LILY_CU_SIDE=0
#             (one stream); tg128 and tg128s
#             with LILY_CU_PDL=0, LILY_CU_FUSE=0, LILY_CU_SHSLOT=0, LILY_CU_MVTC=0, LILY_CU_MVTC_MIN=0, and as they are
#   BIN   folder with lily, lily-bench, cuda-kernel-test (default build/, made by the build stage)
#   FIX   folder with the fixtures tiny, tiny-mlx4 (default ../shared/fixtures); tests/fixtures is read too
#   OUT   where logs go (default /tmp/lily-device)
#   BENCH lily-bench tests (default pp512,pp2048,pp8192,tg128,tg128@4096,tg128@32768)
set -u
OUT=${OUT:-/tmp/lily-device}; FXOUT=${FXOUT:-/tmp/lily-fx}; BIN=${BIN:-build}; FIX=${FIX:-../shared/fixtures}
mkdir -p "$OUT"
stages=${*:-build check kernels model bench batch}
fail=0
for stage in $stages; do
  echo "== $stage ($(date -u +%H:%M:%S))"
  case $stage in
  base)
    [ -x "$BIN/lily-bench-base" ] || { echo "base: no bin/lily-bench-base packed"; fail=1; continue; }
    for r in 1 2; do
      for b in lily-bench lily-bench-base; do
        echo "$b (round $r): $("$BIN/$b" --tests tg128,tg128@4096 --reps 3 -o md 2>&1 | grep -E '^\| ' |
          grep -vE '^\| (model|---)' | cut -d'|' -f3-4 | tr '\n' ' ')"
      done
    done ;;
  batchtc)
    LILY_CU_MVDPT=1 "$BIN/cuda-kernel-test" --batch >"$OUT/kernels_tc.log" 2>&1 || fail=1
    echo "cuda-kernel-test --batch (LILY_CU_MVDPT=1): $(grep -E "FAIL|error" "$OUT/kernels_tc.log" | head -20)$(tail -1 "$OUT/kernels_tc.log")"
    for t in test_batch test_beside; do
      [ -x "$BIN/tests/$t" ] || continue
      LILY_CU_MVDPT=1 LILY_TEST_BACKEND=cuda "$BIN/tests/$t" >"$OUT/$t.log" 2>&1 &&
        echo "$t (cuda, LILY_CU_MVDPT=1): $(tail -1 "$OUT/$t.log")" ||
        { echo "$t (cuda, LILY_CU_MVDPT=1): FAIL"; grep -v '^ok' "$OUT/$t.log" | tail; fail=1; }
    done
    for r in 1 2; do
      for v in X=1 LILY_CU_MVDPT=1 LILY_CU_MVDPT=0 LILY_CU_BATCH_ROUTE=0 LILY_CU_GDN_SPLIT_ROWS=0 LILY_CU_BATCH_MV=8; do
        echo "$v (round $r): $(env $v "$BIN/lily-bench" --tests tg32x1@1024,tg32x2@1024,tg32x4@1024,tg32x6@1024,tg32x8@1024,tg32x12@1024,tg32x16@1024 \
          --reps 3 -o md 2>&1 | grep -E '^\| ' | grep -vE '^\| (model|---)' | cut -d'|' -f3-4 | tr '\n' ' ')"
      done
    done
    "$BIN/lily-bench" --tests tg32x8@1024,tg32x16@1024 --reps 1 --profile 2>&1 | tail -60 ;;
  chain)
    nvcc -O3 -arch=sm_90a -Isrc -o "$OUT/chain" bench/micro/chain.cu >"$OUT/chain_build.log" 2>&1 ||
      { tail -20 "$OUT/chain_build.log"; fail=1; continue; }
    for a in "6 1" "6 100000"; do
      "$OUT/chain" $a >"$OUT/chain.log" 2>&1 || fail=1
      echo "chain $a:"; cat "$OUT/chain.log"
    done ;;
  build)
    make -j16 CUDA=1 CUDA_ARCH=sm_90a BUILD=build >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
    BIN=build ;;
  fixtures) # regenerates the extra fixtures with transformers (needs torch): tinyq (MLX 4-bit, reference on the
            # stored bf16(1+w) norms) and pe (one-tensor-per-expert layout, other sizes)
    python3 tests/cuda/make_fixture_q.py "$FXOUT/tinyq" --seed 1 --hidden 128 --layers 8 --heads 4 --kv-heads 2 \
      --lin-k-heads 2 --lin-v-heads 4 --experts 16 --topk 4 --moe-inter 64 --vocab 512 --prefill 100 --cont 37 --gen 24 \
      --shard 3MB --mlx4 >"$OUT/fx_tinyq.log" 2>&1 || { tail -20 "$OUT/fx_tinyq.log"; fail=1; }
    python3 tests/cuda/make_fixture_q.py "$FXOUT/pe" --layout per-expert --hidden 256 --layers 4 --heads 8 --kv-heads 1 \
      --lin-k-heads 4 --lin-v-heads 8 --experts 8 --topk 2 --moe-inter 64 --vocab 384 --seed 7 --mlx4 \
      >"$OUT/fx_pe.log" 2>&1 || { tail -20 "$OUT/fx_pe.log"; fail=1; }
    for f in tinyq-mlx4 pe pe-mlx4; do (cd "$FXOUT" && tar czf "$OUT/fx_$f.tar.gz" $f && ls -la "$OUT/fx_$f.tar.gz"); done ;;
  check)
    for d in "$FIX/tiny" "$FIX/tiny-mlx4" tests/fixtures/tinyq tests/fixtures/pe tests/fixtures/pe-mlx4 \
             "$FXOUT/tinyq-mlx4" "$FXOUT/pe" "$FXOUT/pe-mlx4"; do
      [ -f "$d/reference.safetensors" ] || continue
      for be in cpu cuda; do
        if "$BIN/lily" check --backend $be --model "$d" --reference "$d/reference.safetensors" >"$OUT/check.log" 2>&1; then
          echo "check $be $d: PASS"; grep -E "rel err" "$OUT/check.log" | sed 's/^/    /'
        else echo "check $be $d: FAIL"; cat "$OUT/check.log"; fail=1; fi
      done
    done ;;
  kernels)
    # the unit tests open ../shared/fixtures/tiny, which does not travel to the GPU machine: $FIX does
    [ -d ../shared/fixtures ] || { mkdir -p ../shared && ln -s "$(cd "$FIX" && pwd)" ../shared/fixtures; }
    for a in "" --batch --sampling; do
      "$BIN/cuda-kernel-test" $a >"$OUT/kernels$a.log" 2>&1 || fail=1
      echo "cuda-kernel-test $a: $(grep -E "FAIL|error" "$OUT/kernels$a.log" | head -20)$(tail -1 "$OUT/kernels$a.log")"
    done
    # the same tokens alone and beside other sessions, parking to the host and back, the batched decode
    # loop and the side-by-side prefills against their one-at-a-time twins
    for t in test_beside test_park test_batch test_sample_gen test_batch_gen test_prefill_batch; do
      [ -x "$BIN/tests/$t" ] || continue
      LILY_TEST_BACKEND=cuda "$BIN/tests/$t" >"$OUT/$t.log" 2>&1 && echo "$t (cuda): $(tail -1 "$OUT/$t.log")" ||
        { echo "$t (cuda): FAIL"; grep -v '^ok' "$OUT/$t.log" | tail; fail=1; }
    done ;;
  model) # CPU and CUDA on a random model of the real widths (4 layers): 1000-token prompt, 32 greedy steps
    "$BIN/lily" synth --out /tmp/lily-m4 --layout mlx4 --preset 35b-a3b --layers 4 >"$OUT/synth.log" 2>&1 || { tail "$OUT/synth.log"; fail=1; }
    "$BIN/cuda-kernel-test" --model /tmp/lily-m4 --prompt 1000 --steps 32 >"$OUT/model.log" 2>&1 || fail=1
    cat "$OUT/model.log" ;;
  variants) # the paths kept for measuring: the older tiles (LILY_CU_GEMM=0), the chunked delta rule
            # (LILY_CU_GDN_CHUNK=0: the staged recurrence; LILY_CU_GDN_CHUNK=1,LILY_CU_GDN_TC=0: the tiled SIMT
            # chunks; a comma joins variables), the decode graph without programmatic launch (LILY_CU_PDL=0),
            # decode's matrix-vector products without the tensor-core kernel or with it on every launch
    for v in LILY_CU_GEMM=0 LILY_CU_GEMM_TC=0 LILY_CU_ATTN_TC=0 LILY_CU_ATTN_SPLIT=0 LILY_CU_GDN_CHUNK=0 LILY_CU_GDN_CHUNK=1,LILY_CU_GDN_TC=0 LILY_CU_RTR=0 LILY_CU_RTR=0,LILY_CU_ROUTER_TC=0 LILY_CU_RTR=0,LILY_CU_SPLITK=0 LILY_CU_MOE_XP=0 \
             LILY_CU_DENSE_XP=0 LILY_CU_SIMT8=0 LILY_CU_SIDE=0 LILY_CU_PDL_STREAM=1 LILY_CU_GT_SPLIT=0 LILY_CU_GT_NJ=0; do
      for d in tests/fixtures/tinyq tests/fixtures/pe-mlx4; do
        env ${v//,/ } "$BIN/lily" check --backend cuda --model "$d" --reference "$d/reference.safetensors" >"$OUT/var_check.log" 2>&1 &&
          echo "$v check $d: PASS" || { echo "$v check $d: FAIL"; cat "$OUT/var_check.log"; fail=1; }
      done
      echo "## $v"; env ${v//,/ } "$BIN/lily-bench" --tests pp512,pp2048 --reps ${REPS:-3} -o md 2>&1 | tee -a "$OUT/variants.md"
    done
    for v in LILY_CU_FOLD=0 LILY_CU_PDL=0 LILY_CU_PREFETCH=0 LILY_CU_FUSE=0 LILY_CU_SHSLOT=0 LILY_CU_TOPK_APART=0 LILY_CU_MVTC=0 LILY_CU_MVTC_MIN=0 X=default; do
      echo "## $v"; env $v "$BIN/lily-bench" --tests tg128,tg128s --reps ${REPS:-3} -o md 2>&1 | tee -a "$OUT/variants.md"
    done ;;
  batch) # decode batches: one pass for B sessions vs B single-token passes (not yet measured anywhere)
    "$BIN/lily-bench" --tests tg32x1@1024,tg32x2@1024,tg32x4@1024,tg32x8@1024,tg32x16@1024 --reps ${REPS:-5} -o md 2>&1 | tee "$OUT/batch.md"
    # the 2-8-row matrix-vector kernel (k_mvqb) against one row a lane group and against the older k_mv
    for v in "LILY_MVQB_RW=4" "LILY_MVQB=0"; do
      echo "## $v" | tee -a "$OUT/batch.md"
      env $v "$BIN/lily-bench" --tests tg32x2@1024,tg32x4@1024,tg32x8@1024 --reps ${REPS:-5} -o md 2>&1 | tee -a "$OUT/batch.md"
    done
    [ -d /tmp/lily-m4 ] || "$BIN/lily" synth --out /tmp/lily-m4 --layout mlx4 --preset 35b-a3b --layers 4 >"$OUT/synth.log" 2>&1
    for n in 1 4 8; do bash bench/server_concurrency.sh "$BIN/lily-server" /tmp/lily-m4 $n 2>&1 | tee -a "$OUT/batch.md"; done ;;
  ncu) # Nsight Compute: every kernel of 3 greedy decode tokens (time, DRAM bytes), one token's table with
       # each kernel's byte floor (ncu.md), the lm_head's speed-of-light, memory and issue sections, and
       # k_mvq4's SASS (k_mvq4.sass)
    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum -k 'regex:^(?!k_fill)' --csv --page raw \
      "$BIN/lily-bench" --tests tg3 --reps 1 --warmup 0 >"$OUT/ncu.csv" 2>"$OUT/ncu.err" || { tail "$OUT/ncu.err"; fail=1; }
    python3 tests/cuda/ncu_table.py "$OUT/ncu.csv" | tee "$OUT/ncu.md" || fail=1
    # the lm_head: the last matrix-vector launch of a one-token run (k_mvtc, or k_mvq4 with LILY_CU_MVTC=0)
    kn=k_mvtc; grep -q 'k_mvtc<' "$OUT/ncu.csv" || kn=k_mvq4
    n=$(grep -c "$kn<" "$OUT/ncu.csv"); n=$(( n / 3 - 1 ))
    ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section SchedulerStats \
      --section WarpStateStats -k regex:$kn --launch-skip $(( n > 0 ? n : 0 )) --launch-count 1 \
      "$BIN/lily-bench" --tests tg1 --reps 1 --warmup 0 2>&1 | grep -vE '^==PROF==|^\s*$' | tee "$OUT/ncu_lm_head.txt" | \
      grep -E "$kn|Duration|Throughput|Issued|Eligible"
    # the decode kernels' machine code (cuobjdump is on the GPU machine, not on the dev machine): every
    # k_mvq4 instantiation, and its instruction count, for the instructions-per-chunk budget
    cuobjdump -sass "$BIN/lily-bench" 2>/dev/null | awk '/Function : .*k_mv(q4|tc)/ {on = 1; print; next} /Function : / {on = 0} on' \
      >"$OUT/k_mvq4.sass"
    awk '/Function : / {if (f) print f ": " n " instructions"; f = $3; n = 0; next} /^[ \t]*\/\*[0-9a-f]+\*\// {n++}
         END {if (f) print f ": " n " instructions"}' "$OUT/k_mvq4.sass" ;;
  bench)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
    "$BIN/lily-bench" --tests "${BENCH:-pp512,pp2048,pp8192,tg128,tg128@4096,tg128@32768}" --reps ${REPS:-5} -o md ${PROFILE:+--profile} 2>&1 | tee "$OUT/bench.md" ;;
  esac
done
echo "device run: $([ $fail = 0 ] && echo ok || echo FAILURES)"
exit $fail
