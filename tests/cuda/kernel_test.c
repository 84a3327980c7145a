/* CUDA kernel test: every kernel against the CPU reference on fresh random inputs, at
 * the real Qwen3.6-35B-A3B shapes and at odd sizes, with outputs poisoned (NaN) before
 * each run so an unwritten element fails the comparison. Needs a GPU; built with CUDA=1.
 *
 *   cuda-kernel-test [--seed N] [--small]       kernel-by-kernel checks (--small: every kernel and
 *                                               code path at small sizes, for the CPU emulator),
 *                                               then decode batches on random-weight models (not
 *                                               with --small: --small --batch runs only those)
 *   cuda-kernel-test --sampling [--small]       only the GPU sampler against the CPU sampler
 *   cuda-kernel-test --model DIR [--prompt 1000] [--steps 32]
 *                                               whole model: CPU and CUDA logits after a random
 *                                               prompt, and the greedy tokens of the next steps
 * Last line: "N passed, N failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cpu/cpu.h"
#include "cuda/cuda_test.h"
#include "cuda/cuda_backend.h"
#include "loader/synth.h"
#include "lily.h"
#include "util/util.h"

static int n_pass, n_fail;
static lily_rng rng;

/* LILY_KT_FAILFAST=1: end at the first failing check, as the summary line says (the emulator's
 * mutants, tests/it_cuda_emu.sh, only need one) */
static void report(const char *what, double err, double tol) {
    int ok = err <= tol; /* NaN fails */
    printf("%-58s rel err %.3e (tol %.0e)  %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (ok) n_pass++; else n_fail++;
    const char *ff = getenv("LILY_KT_FAILFAST");
    if (!ok && ff && *ff && *ff != '0') {
        printf("%d passed, %d failed\n", n_pass, n_fail);
        fflush(stdout);
        exit(1);
    }
}

/* ||a - ref|| / max(||ref||, sqrt(flo)) (flo 0: plain relative error) */
/* LILY_KT_ONLY=a,b,...: only those sections of the kernel checks (mm rows group experts gnorm attn tc
 * conv gdn norm router batch argmax sampling); the emulator's mutant runs start at their kernel's */
static int kt_sec(const char *name) {
    const char *o = getenv("LILY_KT_ONLY");
    if (!o || !*o) return 1;
    const size_t n = strlen(name);
    for (const char *p = o; (p = strstr(p, name)) != NULL; p += n)
        if ((p == o || p[-1] == ',') && (p[n] == ',' || p[n] == 0)) return 1;
    return 0;
}
static double rel_den(const float *a, const float *ref, size_t n, double flo) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
    }
    if (!isfinite(num)) return INFINITY;
    if (den < flo) den = flo;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}
static double rel(const float *a, const float *ref, size_t n) { return rel_den(a, ref, n, 0); }

/* A floor for rel_den's denominator: the size a sum of random-signed products has, each output r's
 * sum_k (W_rk x_k)^2 summed. A matrix of few rows can draw outputs that all nearly cancel; then the
 * outputs' own norm says nothing of the kernel's rounding, which scales with the products' size. */
static double products_sq(const lw_mat *W, const float *X, int T) {
    double flo = 0;
    float *row = malloc((size_t)W->cols * sizeof *row);
    for (int r = 0; r < W->rows; r++) {
        lw_row_f32(W, r, row);
        for (int t = 0; t < T; t++) {
            const float *x = X + (size_t)t * W->cols;
            for (int k = 0; k < W->cols; k++) flo += (double)row[k] * x[k] * row[k] * x[k];
        }
    }
    free(row);
    return flo;
}

static float *rnd(size_t n, float sd) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++) p[i] = lily_rng_normal(&rng) * sd;
    return p;
}

/* the type of the quantized matrices' scales and biases (MLX: bf16) */
static lw_type mk_sbt = LW_BF16;
static float mk_amp = 1.0f; /* the quantized matrices' scale factor (k_gemm_tc's exponent, dmat.sexp) */
static void put_sb(void *p, size_t i, float v) {
    if (mk_sbt == LW_F32) ((float *)p)[i] = v;
    else if (mk_sbt == LW_F16) ((uint16_t *)p)[i] = lily_f32_to_f16(v);
    else ((uint16_t *)p)[i] = lily_f32_to_bf16(v);
}

/* A random matrix of the given storage: type LW_Q with bits 4/8 (mk_sbt scales, group g). */
static lw_mat mk_mat(lw_type t, int bits, int group, int rows, int cols, void **hold) {
    lw_mat m;
    memset(&m, 0, sizeof m);
    m.type = t; m.rows = rows; m.cols = cols;
    size_t n = (size_t)rows * cols;
    if (t == LW_Q) {
        m.bits = bits; m.group = group; m.sb_type = mk_sbt;
        size_t words = n * bits / 32, ng = n / group, sz = mk_sbt == LW_F32 ? 4 : 2;
        uint32_t *w = malloc(words * 4);
        void *s = malloc(ng * sz), *b = malloc(ng * sz);
        for (size_t i = 0; i < words; i++) w[i] = (uint32_t)lily_rng_u64(&rng);
        float amp = mk_amp / sqrtf((float)cols);
        for (size_t i = 0; i < ng; i++) {
            put_sb(s, i, amp * (0.5f + (float)lily_rng_uniform(&rng)) / ((1 << bits) - 1) * 2);
            put_sb(b, i, -amp * (0.5f + (float)lily_rng_uniform(&rng)));
        }
        m.w = w; m.scales = s; m.biases = b;
        hold[0] = w; hold[1] = s; hold[2] = b;
    } else {
        size_t es = t == LW_F32 ? 4 : 2;
        void *p = malloc(n * es);
        for (size_t i = 0; i < n; i++) {
            float v = lily_rng_normal(&rng) / sqrtf((float)cols);
            if (t == LW_F32) ((float *)p)[i] = v;
            else if (t == LW_BF16) ((uint16_t *)p)[i] = lily_f32_to_bf16(v);
            else ((uint16_t *)p)[i] = lily_f32_to_f16(v);
        }
        m.w = p;
        hold[0] = p; hold[1] = hold[2] = NULL;
    }
    return m;
}

static const char *tname(lw_type t, int bits) {
    return t == LW_Q ? (bits == 4 ? "q4" : "q8") : t == LW_BF16 ? "bf16" : t == LW_F16 ? "f16" : "f32";
}

/* A producer's packed GEMM input (lct_packed) for rows x cols: written where want (T > 8, cols %
 * 128 == 0, the _p forms' conditions) and then bit for bit k_xp_pack's packing of its fp32
 * output (the GEMM reads either); pk_new gives the buffers, pk_done checks and frees them. */
static lct_packed pk_new(size_t n) {
    lct_packed pk = { malloc(n * 2), malloc(n * 2), -1 };
    return pk;
}
static void pk_done(const char *what, lct_packed *pk, size_t n, int want) {
    size_t bad = 0;
    for (size_t i = 0; want && pk->packed == 1 && i < n; i++) bad += pk->xp[i] != pk->xp_ref[i];
    const int ok = pk->packed == want && bad == 0;
    printf("%-58s packed input %s, %zu halves differ  %s\n", what, pk->packed == 1 ? "written" : "not written", bad, ok ? "ok" : "FAIL");
    if (ok) n_pass++; else n_fail++;
    free(pk->xp); free(pk->xp_ref);
}

#include "kt_matmul.h"
#include "kt_moe.h"
#include "kt_attn.h"
#include "kt_gdn.h"
#include "kt_sample.h"
#include "kt_model.h"

int main(int argc, char **argv) {
    /* the tensor-core matrix-vector kernel (k_mvtc) takes only launches of 16M weights or more by
     * default: here it takes every launch it can, unless the caller says otherwise */
    setenv("LILY_CU_MVTC_MIN", "0", 0);
    uint64_t seed = (uint64_t)time(NULL);
    const char *model = NULL;
    int P = 1000, steps = 32, small = 0, batch = 0, sampling = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--small")) small = 1;
        if (!strcmp(argv[i], "--batch")) batch = 1;
        if (!strcmp(argv[i], "--sampling")) sampling = 1;
    }
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--seed")) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--model")) model = argv[++i];
        else if (!strcmp(argv[i], "--prompt")) P = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[++i]);
    }
    printf("seed %llu\n", (unsigned long long)seed);
    if (getenv("LILY_KT_ONLY") && *getenv("LILY_KT_ONLY")) printf("sections %s only (LILY_KT_ONLY)\n", getenv("LILY_KT_ONLY"));
    lily_rng_seed(&rng, seed);
    if (model) {
        if (test_model(model, P, steps)) n_fail++;
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail != 0;
    }
    if (batch || sampling) { /* whole (tiny) models / the sampler alone: apart from the kernels */
        if (batch) batch_tests(small);
        if (sampling) test_sampling(small ? 1 : 2);
        printf("%d passed, %d failed\n", n_pass, n_fail);
        return n_fail != 0;
    }
    lily_pool *pool = lily_pool_new(0);
    if (kt_sec("mm")) {
        if (small) { /* the same kernels and code paths at sizes the CPU emulator runs in seconds */
            test_matmul(pool, LW_Q, 4, 64, 160, 2048, 1);
            test_matmul(pool, LW_Q, 4, 64, 96, 1024, 3);
            test_matmul(pool, LW_Q, 4, 64, 128, 256, 77);
            test_matmul(pool, LW_Q, 8, 64, 64, 512, 1);
            test_matmul(pool, LW_Q, 8, 64, 64, 256, 130);
            test_matmul(pool, LW_BF16, 0, 0, 96, 512, 5);
            test_matmul(pool, LW_BF16, 0, 0, 70, 128, 200);
        } else { /* real 35B-A3B shapes (H 2048): DeltaNet qkv, out, attention q, router, lm_head slice */
            test_matmul(pool, LW_Q, 4, 64, 12288, 2048, 1);
            test_matmul(pool, LW_Q, 4, 64, 2048, 4096, 3);
            test_matmul(pool, LW_Q, 4, 64, 8192, 2048, 77);
            test_matmul(pool, LW_Q, 8, 64, 256, 2048, 1);
            test_matmul(pool, LW_Q, 8, 64, 256, 2048, 130);
            test_matmul(pool, LW_Q, 8, 64, 256, 2048, 512); /* the router at pp512: split tiles */
            test_matmul(pool, LW_BF16, 0, 0, 4096, 2048, 5);
            test_matmul(pool, LW_BF16, 0, 0, 1000, 2048, 200);
        }
        /* odd sizes */
        test_matmul(pool, LW_Q, 4, 64, 100, 512, 1);
        test_matmul(pool, LW_Q, 4, 64, 33, 1024, 1);
        test_matmul(pool, LW_Q, 4, 64, 45, 1536, 1); /* 48 chunks over 32 lanes: half the lanes' second chunk is past the row */
        test_matmul(pool, LW_Q, 4, 128, 50, 1024, 1); /* groups of 128: two of the tensor-core kernel's units a scale */
        test_matvec_range(pool, 70, 2048);
        test_matmul(pool, LW_Q, 4, 64, 17, 192, 1);   /* three units, so lanes past the columns; a second tile of one row */
        test_matmul(pool, LW_Q, 4, 64, 2, 2048, 1);   /* both outputs can cancel to near 0: products_sq's floor */
        /* scales and biases stored as f16 and f32 (the decode kernel's run-time typed path) */
        mk_sbt = LW_F16;
        test_matmul(pool, LW_Q, 4, 64, 70, 2048, 1);
        test_matmul(pool, LW_Q, 4, 64, 19, 12288, 1); /* another kernel past 48 KB of staged input: its own opt-in */
        test_matmul(pool, LW_Q, 8, 64, 33, 512, 1);
        mk_sbt = LW_F32;
        test_matmul(pool, LW_Q, 4, 64, 70, 2048, 1);
        test_matmul(pool, LW_Q, 4, 32, 19, 512, 3);
        test_matmul(pool, LW_Q, 4, 128, 40, 384, 20); /* k_gemm_tc: one f32 scale a 128-column step */
        mk_sbt = LW_BF16;
        test_matmul(pool, LW_Q, 4, 32, 130, 256, 70); /* k_gemm_tc: four bf16 scales a step, partial row and token tiles */
        test_matmul(pool, LW_Q, 4, 32, 37, 96, 1);
        test_matmul(pool, LW_Q, 4, 32, 37, 96, 9);
        test_matmul(pool, LW_Q, 8, 32, 65, 160, 67);
        test_matmul(pool, LW_BF16, 0, 0, 33, 100, 7);
        test_matmul(pool, LW_BF16, 0, 0, 70, 100, 40); /* split tiles of 64 and 36 columns */
        test_matmul(pool, LW_F16, 0, 0, 70, 36, 65);
        test_matmul(pool, LW_F32, 0, 0, 129, 13, 3);
        test_matmul(pool, LW_F32, 0, 0, 1, 1000, 70);
        /* the FP16 GEMM's tiles at prefill sizes: full, partial row and token tiles, group 32 */
        test_matmul(pool, LW_Q, 4, 64, small ? 192 : 8192, small ? 256 : 2048, small ? 140 : 512);
        test_matmul(pool, LW_Q, 4, 32, 100, 128, 130);
        test_matmul(pool, LW_Q, 4, 64, 65, 192, 1);
        test_matmul(pool, LW_Q, 4, 64, 4, 128, 100); /* DeltaNet b and a (nv rows) at prefill: one partial row block */
        /* k_gemm_tc's dequantization exponent at tiny scales (weights ~1e-4: fp16 subnormals), at
         * large ones (scales ~10), and past them (scales ~375: the wmma kernel takes the matrix) */
        const float amps[3] = { 1e-3f, 800.f, 3e4f };
        for (int i = 0; i < 3; i++) {
            mk_amp = amps[i];
            test_matmul(pool, LW_Q, 4, 64, 130, 256, 70);
        }
        mk_amp = 1.0f;
        test_matmul(pool, LW_Q, 8, 64, 1, 2048, 77);  /* the shared expert's gate at prefill */
        test_matmul(pool, LW_BF16, 0, 0, 3, 100, 20);
        /* decode batches: 2-8 rows through the fast quantized kernel (via cu_matmul's matrix-vector
         * variant above, and grouped here), at the real widths' columns, odd row counts */
        test_matmul(pool, LW_Q, 4, 64, 37, 2048, 2);
        test_matmul(pool, LW_Q, 4, 64, 67, 512, 5);
        test_matmul(pool, LW_Q, 8, 64, 33, 2048, 8);
    }
    if (kt_sec("rows")) {
        for (int T = 2; T <= 8; T++) {
            int rows[4] = { 37 + 2 * T, 5, 101, 64 + T };
            test_matvec_rows(pool, T % 3 == 0 ? 8 : 4, 1 + T % 4, rows, T % 2 ? 2048 : 512, T, T % 2 == 0);
        }
        { /* several passes: 4096 columns take 4 rows a pass, 12288 two (then one through k_mvq) */
            int rows[2] = { 19, 40 };
            test_matvec_rows(pool, 4, 2, rows, 4096, 8, 0);
            test_matvec_rows(pool, 4, 1, rows, 12288, 3, 1);
            test_matvec_rows(pool, 0, 2, rows, 1024, 6, 0);
            /* the 35B-A3B's batch shapes: DeltaNet's in-projection (k_mvdpb's 8 rows a pass, R 2), the
             * out-projection, the router group's 8-bit router with the shared expert's gate */
            const int inp[4] = { 8192, 4096, 32, 32 }, rtr[2] = { 256, 1 }, outp[1] = { 2048 };
            test_matvec_rows(pool, 4, 4, inp, 2048, 8, 0);
            test_matvec_rows(pool, 4, 1, outp, 4096, 5, 0);
            test_matvec_rows(pool, 8, 2, rtr, 2048, 3, 0);
            /* a batch past 8 rows (mv_pass): k_mvdpb's passes of 8 rows, the last of one; k_mvdpt's
             * two n tiles (16 rows a pass), partly filled */
            test_matvec_rows(pool, 4, 2, inp + 1, 2048, 17, 1);
            test_matvec_rows(pool, 4, 2, rows, 1024, 12, 0);
            test_matvec_rows(pool, 8, 1, rows + 1, 512, 16, 0);
            /* a batch's DeltaNet out-projection with the gated norm staged (k_mvdpt): the real width, one n
             * tile and two, a NaN in one row's head */
            test_matvec_rows_gated(pool, small ? 67 : 2048, 4096, 8, 0);
            test_matvec_rows_gated(pool, 45, small ? 512 : 4096, 13, 0);
            test_matvec_rows_gated(pool, 33, 1024, 3, 1);
            /* a batch's in-projections after its folded combine (the norm staged): DeltaNet's at 2 rows
             * (k_mvdpb) and 8 (k_mvdpt), attention's at 5; 4,096 columns (two passes of 4 rows, the
             * norm's weights loaded a word at a time), 12 rows (k_mvdpt's 512 threads), odd rows */
            test_matvec_rows_norm(pool, 4, inp, 2048, 2);
            test_matvec_rows_norm(pool, 4, inp, 2048, 8);
            const int ainp[3] = { small ? 300 : 8192, 512, 512 };
            test_matvec_rows_norm(pool, 3, ainp, 2048, 5);
            test_matvec_rows_norm(pool, 2, rows, 4096, 5);
            test_matvec_rows_norm(pool, 1, rows + 1, 1024, 12);
            test_matvec_rows_norm(pool, 2, rows, 512, 3);
        }
    }
    if (kt_sec("group")) {
        { /* decode's grouped launches (k_mvdp and the kernels it stands beside): DeltaNet's in-projection,
           * the experts' gate|up and down with the shared expert riding along, an out-projection, odd
           * widths (one group a row, three, 24 over 16 lanes), groups of 128, f16 and f32 scales */
            const int inp[4] = { 8192, 4096, 32, 32 }, inps[4] = { 300, 129, 4, 4 }, gu[2] = { 512, 512 }, dn[1] = { 2048 };
            const int o1[1] = { 37 }, o3[3] = { 45, 8, 1 }, o2[2] = { 70, 33 }, o1b[1] = { 200 };
            test_matvec_group(pool, 4, small ? inps : inp, small ? 512 : 2048, 64, 1, 1, 1, 0, 0, 0);
            test_matvec_group(pool, 2, gu, small ? 512 : 2048, 64, small ? 12 : 64, 8, 8, 1, 0, 0);
            { /* the gate|up launch routing itself (decode's folded top-k), 256 experts as the real model */
                const int gr[2] = { 64, 64 };
                test_matvec_group_b(pool, 4, 2, gr, small ? 512 : 2048, 64, small ? 40 : 256, 8, 8, 1, 0, 0, 0, 1);
                test_matvec_group_b(pool, 4, 2, gr, 256, 64, 9, 3, 3, 0, 0, 0, 0, 1);
                /* a decode batch's (or a short pass's): each token routing itself, then the shared
                 * expert one slot a token (xslot = T K), and its down after (slots T K + j) */
                test_matvec_group_b(pool, 4, 2, gr, small ? 512 : 2048, 64, small ? 40 : 256, 3 * 8, 8, 3, 0, 0, 0, 1);
                test_matvec_group_b(pool, 4, 2, gr, 256, 64, 9, 2 * 3, 3, 2, 0, 0, 0, 1);
                test_matvec_group_b(pool, 4, 2, gr, 256, 64, 9, 4 * 3, 3, 0, 0, 0, 0, 1); /* no shared expert */
                test_matvec_group(pool, 1, small ? o1b : dn, 512, 64, small ? 12 : 64, 3 * 8, 1, 3, 1, 0);
            }
            test_matvec_group(pool, 1, small ? o1 : dn, 512, 64, small ? 12 : 64, 8, 1, 1, 1, 0);
            test_matvec_group(pool, 1, small ? o1 : dn, small ? 1024 : 4096, 64, 1, 1, 1, 0, 0, 0);
            test_matvec_group(pool, 1, o1, 64, 64, 3, 5, 1, 1, 1, 0);
            test_matvec_group(pool, 3, o3, 192, 64, 2, 3, 3, 0, 0, 0);
            test_matvec_group(pool, 2, o2, 1536, 64, 1, 1, 1, 1, 0, 0);
            test_matvec_group(pool, 2, o2, 1024, 128, 4, 3, 1, 0, 1, 0);
            test_matvec_group(pool, 1, o1, 2048, 64, 1, 1, 1, 0, 0, 1);
            /* rows of 64 and 192 groups: the two-group form too (dp G2) */
            test_matvec_group(pool, 2, o2, 4096, 64, 1, 1, 1, 0, 0, 0);
            test_matvec_group(pool, 1, o1, 12288, 64, 2, 2, 1, 1, 1, 0);
            test_matvec_group(pool, 2, o2, 512, 64, 3, 4, 4, 1, 0, 2);
            mk_sbt = LW_F16;
            test_matvec_group(pool, 2, o2, 1024, 64, 3, 4, 2, 1, 0, 0);
            mk_sbt = LW_F32;
            test_matvec_group(pool, 1, o1, 2048, 128, 1, 1, 1, 0, 1, 0);
            mk_sbt = LW_BF16;
            /* 8-bit codes: the router group (the router and the shared expert's gate, one row) with the
             * fused residual and norm, at the real width and odd ones; the slots' form */
            const int rt[2] = { 256, 1 }, rto[2] = { 17, 3 };
            test_matvec_group_b(pool, 8, 2, rt, small ? 512 : 2048, 64, 1, 1, 1, 0, 0, 0, 1, 0);
            test_matvec_group_b(pool, 8, 2, rto, 192, 64, 1, 1, 1, 0, 0, 0, 1, 0);
            /* a decode batch's (a short pass's) router group: the residual and norm a slot a row */
            test_matvec_group_b(pool, 8, 2, rt, small ? 512 : 2048, 64, 1, 3, 1, 0, 0, 0, 1, 0);
            test_matvec_group_b(pool, 8, 2, rto, 192, 64, 1, 8, 1, 0, 0, 0, 1, 0);
            test_matvec_group_b(pool, 4, 2, o2, 1536, 64, 1, 2, 1, 0, 0, 0, 1, 0); /* 4-bit codes */
            test_matvec_group_b(pool, 8, 2, rto, 64, 64, 1, 1, 1, 0, 0, 0, 0, 0);
            test_matvec_group_b(pool, 8, 2, o2, 1024, 128, 3, 4, 2, 1, 1, 0, 0, 0);
            test_matvec_group_b(pool, 8, 1, o1, 512, 64, 1, 1, 1, 0, 0, 1, 1, 0);
            test_matvec_group_b(pool, 4, 2, o2, 1536, 64, 1, 1, 1, 0, 0, 0, 1, 0); /* 4-bit with the norm */
            test_matvec_group_b(pool, 4, 4, inps, 512, 64, 1, 1, 1, 0, 0, 0, 2, 0); /* the norm alone: a folded combine's next in-projection */
            test_matvec_group_b(pool, 4, small ? 3 : 4, small ? o3 : inp, small ? 192 : 2048, 64, 1, 1, 1, 0, 0, 0, 2, 0);
            test_matvec_group_b(pool, 4, 1, o1, 1024, 128, 1, 1, 1, 0, 0, 1, 2, 0);
            /* the gated norm staged (the DeltaNet out-projection after k_gdn_dec_split): the real width,
             * odd ones, a NaN */
            test_matvec_group_b(pool, 4, 1, small ? o1 : dn, small ? 1024 : 4096, 64, 1, 1, 1, 0, 0, 0, 3, 0);
            test_matvec_group_b(pool, 4, 1, o1, 384, 128, 1, 1, 1, 0, 0, 0, 3, 0);
            test_matvec_group_b(pool, 4, 1, o1, 256, 64, 1, 1, 1, 0, 0, 1, 3, 0);
            test_matvec_group_b(pool, 4, 1, o1, 640, 64, 1, 1, 1, 0, 0, 0, 3, 0);
            test_matvec_group_b(pool, 4, 1, o1, 6144, 64, 1, 1, 1, 0, 0, 0, 3, 0); /* 768 words: a third pass of the staging */
        }
    }
    if (kt_sec("experts")) {
        /* experts: the real shapes (gate/up 512x2048, down 2048x512, 256 experts, top 8) and odd ones */
        if (small) {
            test_experts(pool, 4, 16, 64, 1024, 1, 4);
            test_experts(pool, 4, 16, 256, 64, 3, 4);
            test_experts(pool, 4, 16, 64, 256, 130, 4);
        } else {
            test_experts(pool, 4, 256, 512, 2048, 1, 8);
            test_experts(pool, 4, 256, 2048, 512, 3, 8);
            test_experts(pool, 4, 256, 512, 2048, 300, 8);
        }
        test_experts(pool, 4, 7, 96, 192, 70, 3);
        test_experts(pool, 8, 5, 33, 64, 1, 2);
        test_experts(pool, 8, 5, 33, 128, 40, 2); /* 8-bit through the grouped FP16 GEMM */
        test_experts(pool, 4, 9, 70, 512, 2, 3);
        if (small) {
            test_experts(pool, 4, 64, 128, 128, 128, 8); /* 16 tokens an expert: 32-token tiles, half empty */
            test_experts(pool, 4, 16, 64, 128, 128, 8);  /* 64 an expert: 32-token tiles */
            test_experts(pool, 4, 8, 128, 128, 130, 8);  /* 130 an expert: 64-token tiles */
        } else {
            test_experts(pool, 4, 256, 2048, 512, 512, 8);  /* 16 tokens an expert: 32-token tiles, half empty */
            test_experts(pool, 4, 256, 512, 2048, 2048, 8); /* 64 an expert: 32-token tiles */
            test_experts(pool, 4, 32, 512, 2048, 512, 8);   /* 128 an expert: 64-token tiles */
        }
        test_wgmma();
        test_moe_sort(512 * 8, 256, 32, 0);  /* pp512's slots: one batch of loads a thread */
        test_moe_sort(2048 * 8, 256, 32, 1); /* a 2,048-token chunk: two batches */
        test_moe_sort(8193, 7, 64, 0);       /* one slot past a batch */
        test_moe_sort(5, 300, 16, 1);
        test_experts(pool, 4, 7, 96, 192, 70, 3);       /* 30 an expert: 32-token tiles */
        test_experts(pool, 4, 7, 256, 384, 70, 3);      /* the same through the packed-input FFN, 3 tiles wide */
    }
    if (kt_sec("gnorm")) {
        test_gated_norm(small ? 37 : 512, 32, 128); /* a warp a head */
        test_gated_norm(9, 3, 24);                  /* a block a head */
    }
    if (kt_sec("attn")) {
        test_attention_s(1, 16, 2, 256, 40, 64);  /* decode: 64 splits, most empty; then more keys than splits */
        test_attention_s(1, 16, 2, 256, small ? 300 : 3000, 64);
        test_attention_s(1, 4, 1, 64, 100, 64);    /* the generic split kernel (k_attn), 64 x its warps partials */
        test_attention_s(1, 16, 2, 256, 300, 4);   /* 4 splits: every warp of a tensor-core block with keys (k_attn_merge) */
        test_attention_dec(16, 2, 256, 64, 40, 64);   /* the 35B-A3B heads, the new key in a middle split */
        test_attention_dec(16, 2, 256, 64, small ? 300 : 3000, 64);
        test_attention_dec(8, 2, 256, 128, 0, 64);    /* the first token: one key, two rotated lanes' columns */
        test_attention_dec(16, 2, 128, 64, 77, 64);   /* head dim 128 */
        /* decode's adaptive splits (128, of which as many as give 32 keys each, at least 64): short,
         * between, past them all */
        lct_attn_amin(32);
        test_attention_s(1, 16, 2, 256, 40, 128);
        test_attention_s(1, 16, 2, 256, small ? 2559 : 3039, 128); /* (n a multiple of 32: the next key adds a split) */
        test_attention_s(1, 16, 2, 256, small ? 5000 : 9000, 128);
        test_attention_dec(16, 2, 256, 64, 40, 128);
        test_attention_dec(16, 2, 256, 64, small ? 2559 : 3039, 128);
        test_attention_dec(16, 2, 256, 64, small ? 5000 : 9000, 128);
        lct_attn_amin(0);
        test_attention(9, 4, 2, 64, 3);  /* the SIMT kernels: other head shapes */
        test_attention(11, 6, 1, 32, 0);
    }
    if (kt_sec("tc")) {
        if (!(getenv("LILY_CU_GEMM_TC") && !strcmp(getenv("LILY_CU_GEMM_TC"), "0"))) { /* k_gemm_tc's alone */
            test_swiglu_dense(pool, small ? 96 : 512, small ? 256 : 2048, small ? 70 : 512);
            test_swiglu_dense(pool, 40, 128, 9); /* one partial row block, one partial token tile */
            /* attention at the 35B-A3B heads: a whole prompt, a chunk after a cached prefix (keys past
             * a 64-key stage, a partial token tile) */
            test_attention(small ? 20 : 512, 16, 2, 256, 0);
            test_attention(small ? 13 : 37, 16, 2, 256, small ? 70 : 300);
            /* from 128 tokens the keys in four splits, merged after (an empty last split here) */
            test_attention(small ? 130 : 200, 16, 2, 256, small ? 40 : 700);
            { /* DeltaNet's in-projections qkv|z|b|a at their widths, and odd row counts */
                const int big[4] = { 8192, 4096, 32, 32 }, odd[4] = { 200, 37, 128, 5 };
                test_gemm_group(pool, 4, small ? odd : big, small ? 256 : 2048, small ? 70 : 512);
                test_gemm_group(pool, 3, odd, 128, 17);
                /* an out-projection (one matrix: cu_gemm_tc_xp packed), 64-token tiles */
                const int out[1] = { small ? 130 : 2048 };
                test_gemm_group(pool, 1, out, small ? 384 : 4096, small ? 200 : 512);
                /* the same split in two halves of its columns (an odd step count in the small form) */
                test_gemm_split(pool, out[0], small ? 384 : 4096, small ? 200 : 512);
                test_gemm_split(pool, 40, 256, 9);
            }
        }
    }
    if (kt_sec("conv")) {
        /* the conv: the 35B-A3B widths (16 q/k heads of 128, 32 v heads), a partial token group, fewer
         * tokens than taps (the state shifts), and dk 64 (the norm in its own launch) */
        test_conv(small ? 20 : 512, small ? 1024 : 8192, 4, small ? 2 : 16, 128, 32);
        test_conv(13, 768, 4, 2, 128, 5);
        test_conv(2, 512, 4, 1, 128, 3); /* fewer tokens than taps, with gates: the state from both */
        test_conv(9, 320, 4, 1, 64, 0);
    }
    if (kt_sec("gdn")) {
        test_gdn(1, small ? 2 : 16, small ? 4 : 32, 128, 128);
        test_gdn_dec(3, small ? 2 : 16, small ? 4 : 32, 4); /* the 35B-A3B heads, its conv of 4 taps */
        test_gdn_dec(2, 3, 3, 3);
        test_gdn_dec(2, 1, 4, 1);
        test_gdn(small ? 20 : 100, small ? 2 : 16, small ? 4 : 32, 128, small ? 64 : 128);
        test_gdn(37, 2, 4, 128, 128);
        test_gdn(9, 1, 3, 40, 24);
        test_gdn(small ? 128 : 512, small ? 2 : 16, small ? 4 : 32, 128, 128); /* full chunks (eight: the 35B-A3B heads) */
        test_gdn(130, 2, 4, 128, 128);   /* a partial last chunk */
        if (!small) test_gdn(1000, 16, 32, 128, 128); /* a whole 1,000-token prompt at the real heads */
    }
    if (kt_sec("norm")) {
        test_rmsnorm(2048, 5);
        test_rmsnorm(2048, 37); /* prefill rows: the packed input too */
        test_rmsnorm(200, 12);  /* columns the packed form does not take */
        test_moe_combine(1, 8, 2048, 1, 1, 1); /* decode, the residual add fused (mvq_fuse) */
        test_moe_combine(1, 8, 2048, 0, 1, 1);
        test_moe_combine(1, 4, 100, 1, 0, 1);
        test_moe_combine(1, 8, 2048, 1, 1, 0);  /* the last layer: no norm */
        test_moe_combine(3, 8, 2048, 1, 1, 1);
        test_moe_combine(40, 8, 2048, 0, 1, 1);  /* prefill rows: four columns a thread (k_moe_combine4) */
        test_moe_combine(37, 8, 2048, 1, 0, 1);
        test_moe_combine(20, 3, 100, 0, 1, 0);
        test_mvdp_comb(pool, small ? 12 : 32, 2048, 512, 64, 8, 1, 1, 1); /* the 35B-A3B decode MoE tail */
        test_mvdp_comb(pool, 9, small ? 300 : 2048, 512, 64, 8, 1, 0, 1);
        test_mvdp_comb(pool, 6, 100, 64, 64, 4, 0, 1, 1);                /* one group a row: a lane a row */
        test_mvdp_comb(pool, 5, 37, 1024, 128, 3, 1, 1, 1);              /* 16 lanes a row, odd rows, 2 units a group */
        test_mvdp_comb(pool, 20, 70, 128, 64, 15, 1, 0, 1);              /* 16 slots, the most a block takes */
        test_mvdp_comb(pool, 7, 45, 2560, 64, 2, 1, 1, 1);               /* 32 lanes a row, more groups than lanes */
        /* a decode batch's (or short pass's) rows, grid y the token: the 35B-A3B tail at 2 and 8 rows,
         * odd shapes at 3 and 5, no shared expert */
        test_mvdp_comb(pool, small ? 12 : 32, small ? 300 : 2048, 512, 64, 8, 1, 1, 2);
        test_mvdp_comb(pool, small ? 12 : 32, 2048, 512, 64, 8, 1, 0, 8);
        test_mvdp_comb(pool, 5, 37, 1024, 128, 3, 1, 1, 3);
        test_mvdp_comb(pool, 6, 100, 64, 64, 4, 0, 1, 5);
        test_rmsnorm(129, 3);
    }
    if (kt_sec("router")) {
        test_router(1, 256, 8, 0);
        test_router(small ? 40 : 333, 256, 8, 0);
        test_router(5, 17, 3, 0);
        test_router(7, 256, 8, 5);   /* ties */
        test_router(3, 512, 10, 0);  /* the registers' second size */
        test_router(3, 600, 8, 7);   /* shared memory, ties */
        test_router(2, 64, 33, 0);   /* K past a warp: shared memory */
        /* the router at prefill: cu_matmul_exact's tiles, then cu_router_tc's code copy (slices of whole groups:
         * 16 at 512 tokens, 4 at 70), declined shapes and types, forced slice counts, 4-bit codes, bf16 and
         * fp16 values (s = 1, b = 0), fp32 (declined) */
        test_router_exact(pool, small ? 70 : 512, 256, small ? 256 : 2048, 8, -1, 0, LW_Q, 8);
        test_router_exact(pool, small ? 70 : 512, 256, small ? 256 : 2048, 8, 0, small ? 4 : 16, LW_Q, 8);
        test_router_exact(pool, 5, 40, 128, 3, 0, 0, LW_Q, 8);                  /* matrix-vector, no split */
        test_router_exact(pool, small ? 37 : 129, 600, 256, 8, 0, 0, LW_Q, 8);  /* split tiles, shared-memory top-k */
        test_router_exact(pool, 129, 128, 512, 8, 1, 1, LW_Q, 8);               /* one slice: Y direct */
        test_router_exact(pool, 129, 128, 512, 8, 3, 2, LW_Q, 8);               /* 8 groups: 3 slices -> 2 */
        test_router_exact(pool, 37, 64, 192, 4, 0, 3, LW_Q, 8);                 /* 3 groups: 16 -> 3 one-group slices */
        test_router_exact(pool, 9, 192, 320, 6, 5, 5, LW_Q, 8);                 /* 9 tokens (T > 8), 5 one-group slices */
        test_router_exact(pool, 100, 64, 384, 8, 0, 0, LW_Q, 4);                /* 4-bit codes */
        test_router_exact(pool, 100, 128, 256, 8, 2, 2, LW_BF16, 16);           /* bf16 values, groups of 64 with s = 1 */
        test_router_exact(pool, 70, 64, 320, 4, 0, 0, LW_F16, 16);              /* fp16 values */
        test_router_exact(pool, 70, 64, 256, 8, 0, 0, LW_F32, 32);              /* fp32: declined, the tiles */
    }
    if (kt_sec("batch")) {
        if (!small) batch_tests(0);
    }
    if (kt_sec("argmax")) {
        test_argmax(248320);
        test_argmax(1);
        test_argmax(1000);
    }
    if (kt_sec("sampling")) {
        test_sampling(small ? 0 : 2);
    }
    lily_pool_free(pool);
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
