/* Every fast matmul kernel against the reference row-buffer path, on fresh random
 * weights and inputs at the 35B-A3B shapes and odd ones, for every weight type and
 * token counts 1..300. Outputs are poisoned with NaN first and guarded past the end.
 *
 * Tolerance: fp32 sums in another order differ by a few ulps of the sum of the
 * magnitudes of the terms, so |fast - ref| <= 2e-5 * sum_i (|w_i| + |b_i|) |x_i|
 * (b_i the group bias of a quantized weight, which the fused kernels apply per group). */
#include <math.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "cpu/cpu.h"
#include "loader/synth.h"
#include "t.h"

static lily_rng rng;

typedef struct {
    lw_mat m;
    void *w, *s, *b;
} wmat;

static float nrm(void) { return lily_rng_normal(&rng); }

static uint16_t f2h(lw_type t, float f) { return t == LW_BF16 ? lily_f32_to_bf16(f) : lily_f32_to_f16(f); }

/* type LW_F32/BF16/F16, or LW_Q with bits/group/sb_type */
static wmat make(lw_type type, int rows, int cols, int bits, int group, lw_type sb) {
    wmat r = { 0 };
    r.m.type = type; r.m.rows = rows; r.m.cols = cols;
    size_t n = (size_t)rows * cols;
    float sc = 1.0f / sqrtf((float)cols);
    if (type == LW_F32) {
        float *w = malloc(n * 4);
        for (size_t i = 0; i < n; i++) w[i] = nrm() * sc;
        r.w = w;
    } else if (type == LW_BF16 || type == LW_F16) {
        uint16_t *w = malloc(n * 2);
        for (size_t i = 0; i < n; i++) w[i] = f2h(type, nrm() * sc);
        r.w = w;
    } else {
        r.m.bits = bits; r.m.group = group; r.m.sb_type = sb;
        size_t words = n * bits / 32, ng = n / group;
        uint32_t *q = malloc(words * 4);
        for (size_t i = 0; i < words; i++) q[i] = (uint32_t)lily_rng_u64(&rng);
        int levels = (1 << bits) - 1;
        size_t esz = sb == LW_F32 ? 4 : 2;
        r.s = malloc(ng * esz); r.b = malloc(ng * esz);
        for (size_t g = 0; g < ng; g++) {
            float s = sc * 4.0f / levels * (0.5f + (float)lily_rng_uniform(&rng));
            float b = -s * levels / 2 + 0.3f * s * nrm(); /* roughly centred, as min/max gives */
            if (sb == LW_F32) { ((float *)r.s)[g] = s; ((float *)r.b)[g] = b; }
            else { ((uint16_t *)r.s)[g] = f2h(sb, s); ((uint16_t *)r.b)[g] = f2h(sb, b); }
        }
        r.w = q;
    }
    r.m.w = r.w; r.m.scales = r.s; r.m.biases = r.b;
    return r;
}

static void drop(wmat *w) { free(w->w); free(w->s); free(w->b); }

static float *randx(int T, int cols) {
    float *x = malloc((size_t)T * cols * sizeof *x);
    for (size_t i = 0; i < (size_t)T * cols; i++) x[i] = nrm();
    return x;
}

enum { GUARD = 16 };
static float *poisoned(size_t n) {
    float *y = malloc((n + GUARD) * sizeof *y);
    for (size_t i = 0; i < n; i++) y[i] = NAN;
    for (int i = 0; i < GUARD; i++) y[n + i] = 12345.0f;
    return y;
}
static int guard_ok(const float *y, size_t n) {
    for (int i = 0; i < GUARD; i++) if (y[n + i] != 12345.0f) return 0;
    return 1;
}

/* cond[t][r] = sum_i (|w_i| + |b_i|) |x_i| in double */
static double *conditioning(const lw_mat *W, const float *X, int T) {
    double *c = calloc((size_t)T * W->rows, sizeof *c);
    float *row = malloc((size_t)W->cols * sizeof *row);
    for (int r = 0; r < W->rows; r++) {
        lw_row_f32(W, r, row);
        for (int i = 0; i < W->cols; i++) {
            double b = 0;
            if (W->type == LW_Q) {
                size_t gi = (size_t)r * (W->cols / W->group) + i / W->group;
                b = W->sb_type == LW_F32 ? ((const float *)W->biases)[gi]
                  : W->sb_type == LW_BF16 ? lily_bf16_to_f32(((const uint16_t *)W->biases)[gi])
                  : lily_f16_to_f32(((const uint16_t *)W->biases)[gi]);
            }
            double a = fabs(row[i]) + fabs(b);
            for (int t = 0; t < T; t++) c[(size_t)t * W->rows + r] += a * fabs(X[(size_t)t * W->cols + i]);
        }
    }
    free(row);
    return c;
}

static double worst_ratio; /* largest |fast - ref| / cond seen, reported at the end */

static const char *tname(const lw_mat *W) {
    static char b[64];
    if (W->type == LW_Q) snprintf(b, sizeof b, "q%d/g%d/%s", W->bits, W->group, W->sb_type == LW_BF16 ? "bf16" : W->sb_type == LW_F16 ? "f16" : "f32");
    else snprintf(b, sizeof b, "%s", W->type == LW_F32 ? "f32" : W->type == LW_BF16 ? "bf16" : "f16");
    return b;
}

/* One matrix, one T: every fast kind against the reference, and thread-count independence. */
static void run_case(lily_pool *pool, lily_pool *pool3, const lw_mat *W, int T) {
    size_t ny = (size_t)T * W->rows;
    float *X = randx(T, W->cols);
    float *ref = poisoned(ny);
    cpu_matmul_ref(pool, W, X, T, ref);
    double *cond = conditioning(W, X, T);
    cpu_mm_kind kinds[2] = { CPU_MM_C, CPU_MM_AVX2 };
    for (int k = 0; k < 2; k++) {
        if (kinds[k] == CPU_MM_AVX2 && !cpu_mm_avx2_available()) continue;
        const char *kn = kinds[k] == CPU_MM_C ? "c" : "avx2";
        float *y = poisoned(ny), *y1 = poisoned(ny), *y3 = poisoned(ny);
        cpu_mm_job j = { W, X, T, y };
        CHECK(cpu_matmul_kind(pool, &j, 1, kinds[k]) == 1, "%s declined %s %dx%d", kn, tname(W), W->rows, W->cols);
        size_t bad = 0, first = 0;
        double worst = 0;
        for (size_t i = 0; i < ny; i++) {
            double d = fabs((double)y[i] - ref[i]), lim = 2e-5 * cond[i] + 1e-30;
            if (!(d <= lim)) { if (!bad) first = i; bad++; }
            else if (cond[i] > 0 && d / cond[i] > worst) worst = d / cond[i];
        }
        if (worst > worst_ratio) worst_ratio = worst;
        CHECK(bad == 0, "%s %s %dx%d T=%d: %zu of %zu outside tolerance, first [%zu] %.9g vs ref %.9g (cond %.3g)", kn, tname(W),
              W->rows, W->cols, T, bad, ny, first, y[first], ref[first], cond[first]);
        CHECK(guard_ok(y, ny), "%s %s %dx%d T=%d wrote past the output", kn, tname(W), W->rows, W->cols, T);
        /* same bits from one thread and from three */
        j.Y = y1; cpu_matmul_kind(NULL, &j, 1, kinds[k]);
        if (T <= 7) { j.Y = y3; cpu_matmul_kind(pool3, &j, 1, kinds[k]); } else memcpy(y3, y1, ny * sizeof *y);
        CHECK(!memcmp(y, y1, ny * sizeof *y) && !memcmp(y, y3, ny * sizeof *y), "%s %s %dx%d T=%d depends on the thread count",
              kn, tname(W), W->rows, W->cols, T);
        free(y); free(y1); free(y3);
    }
    /* cpu_matmul itself follows cpu_mm_path: REF is the reference bit for bit */
    float *y = poisoned(ny);
    cpu_mm_path = CPU_MM_REF;
    cpu_matmul(pool, W, X, T, y);
    cpu_mm_path = CPU_MM_AUTO;
    CHECK(!memcmp(y, ref, ny * sizeof *y), "cpu_mm_path=REF is not the reference (%s)", tname(W));
    free(y); free(X); free(ref); free(cond);
}

/* Several jobs in one region (the MoE use): same bits as one at a time; a declined
 * matrix (2-bit) inside the batch goes to the reference. */
static void many_case(lily_pool *pool) {
    enum { N = 7 };
    wmat w[N];
    int T[N] = { 1, 3, 2, 5, 1, 0, 9 };
    w[0] = make(LW_Q, 512, 2048, 4, 64, LW_BF16);
    w[1] = make(LW_Q, 512, 2048, 4, 64, LW_BF16);
    w[2] = make(LW_Q, 2048, 512, 4, 64, LW_BF16);
    w[3] = make(LW_BF16, 96, 200, 0, 0, 0);
    w[4] = make(LW_Q, 256, 2048, 8, 64, LW_BF16);
    w[5] = make(LW_F32, 64, 64, 0, 0, 0);
    w[6] = make(LW_Q, 40, 128, 2, 64, LW_BF16); /* 2-bit: no fast kernel */
    T[1] = T[0]; /* job 1 shares its input with job 0, as gate and up do */
    cpu_mm_job jobs[N];
    float *X[N], *Ya[N], *Yb[N], *Yr[N];
    for (int i = 0; i < N; i++) {
        size_t ny = (size_t)T[i] * w[i].m.rows;
        X[i] = randx(T[i] ? T[i] : 1, w[i].m.cols);
        Ya[i] = poisoned(ny); Yb[i] = poisoned(ny); Yr[i] = poisoned(ny);
        jobs[i] = (cpu_mm_job){ &w[i].m, X[i], T[i], Ya[i] };
    }
    jobs[1].X = X[0];
    cpu_matmul_many(pool, jobs, N);
    for (int i = 0; i < N; i++) cpu_matmul(pool, jobs[i].W, jobs[i].X, jobs[i].T, Yb[i]);
    for (int i = 0; i < N; i++) cpu_matmul_ref(pool, jobs[i].W, jobs[i].X, jobs[i].T, Yr[i]);
    for (int i = 0; i < N; i++) {
        size_t ny = (size_t)jobs[i].T * w[i].m.rows;
        CHECK(!memcmp(Ya[i], Yb[i], ny * sizeof(float)) && guard_ok(Ya[i], ny), "many: job %d differs from its own call", i);
        double e = 0, r = 0;
        for (size_t k = 0; k < ny; k++) { e += ((double)Ya[i][k] - Yr[i][k]) * ((double)Ya[i][k] - Yr[i][k]); r += (double)Yr[i][k] * Yr[i][k]; }
        CHECK(ny == 0 || sqrt(e / r) < 1e-5, "many: job %d rel err %.3g vs reference", i, sqrt(e / r));
    }
    CHECK(!memcmp(Ya[6], Yr[6], (size_t)T[6] * 40 * sizeof(float)), "declined 2-bit job is not the reference path");
    cpu_mm_job j6 = jobs[6];
    CHECK(cpu_matmul_kind(pool, &j6, 1, CPU_MM_C) == 0, "portable kernel claims 2-bit");
    for (int i = 0; i < N; i++) { drop(&w[i]); free(X[i]); free(Ya[i]); free(Yb[i]); free(Yr[i]); }
}

/* ---- Gated DeltaNet: the fast rules against the reference ones ---- */
static double relerr(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
    return num == num ? sqrt(num / (den + 1e-30)) : INFINITY;
}

/* q, k, v interleaved in rows of ld floats as forward lays them out (ld > dk, dv) */
static void gdn_case(int T, int dk, int dv) {
    int ld = 2 * dk + dv + 5;
    float *qkv = malloc((size_t)T * ld * sizeof *qkv), *g = malloc((size_t)T * 4), *b = malloc((size_t)T * 4);
    float *q = qkv, *k = qkv + dk, *v = qkv + 2 * dk;
    for (int t = 0; t < T; t++) {
        double sq = 0, sk = 0;
        for (int i = 0; i < dk; i++) { q[t * ld + i] = nrm(); k[t * ld + i] = nrm(); sq += q[t * ld + i] * q[t * ld + i]; sk += k[t * ld + i] * k[t * ld + i]; }
        for (int i = 0; i < dk; i++) { q[t * ld + i] /= (float)sqrt(sq) * sqrtf((float)dk); k[t * ld + i] /= (float)sqrt(sk); }
        for (int i = 0; i < dv; i++) v[t * ld + i] = nrm();
        g[t] = -(float)lily_rng_uniform(&rng) * 2.0f;
        b[t] = (float)lily_rng_uniform(&rng);
    }
    size_t ns = (size_t)dk * dv, no = (size_t)T * dv;
    float *S0 = malloc(ns * 4), *S[3], *o[3];
    for (size_t i = 0; i < ns; i++) S0[i] = 0.1f * nrm();
    cpu_mm_kind kinds[3] = { CPU_MM_REF, CPU_MM_C, CPU_MM_AVX2 };
    for (int chunked = 0; chunked < 2; chunked++) {
        for (int kk = 0; kk < 3; kk++) {
            S[kk] = malloc(ns * 4); memcpy(S[kk], S0, ns * 4);
            o[kk] = poisoned(no);
            if (chunked) cpu_gdn_chunked_fast(T, dk, dv, q, ld, k, ld, v, ld, g, b, S[kk], o[kk], dv, kinds[kk]);
            else cpu_gdn_recurrent_fast(T, dk, dv, q, ld, k, ld, v, ld, g, b, S[kk], o[kk], dv, kinds[kk]);
        }
        float *Sr = malloc(ns * 4), *orf = poisoned(no); /* CPU_MM_REF is the reference itself */
        memcpy(Sr, S0, ns * 4);
        if (chunked) cpu_gdn_chunked(T, dk, dv, q, ld, k, ld, v, ld, g, b, Sr, orf, dv);
        else cpu_gdn_recurrent(T, dk, dv, q, ld, k, ld, v, ld, g, b, Sr, orf, dv);
        CHECK(!memcmp(orf, o[0], no * 4) && !memcmp(Sr, S[0], ns * 4), "gdn %s REF kind is not the reference", chunked ? "chunked" : "recurrent");
        for (int kk = 1; kk < 3; kk++) {
            double eo = relerr(o[kk], orf, no), es = relerr(S[kk], Sr, ns);
            CHECK(eo < 1e-5 && es < 1e-5 && guard_ok(o[kk], no), "gdn %s kind %d T=%d dk=%d dv=%d: output rel err %.3g, state %.3g",
                  chunked ? "chunked" : "recurrent", kk, T, dk, dv, eo, es);
        }
        for (int kk = 0; kk < 3; kk++) { free(S[kk]); free(o[kk]); }
        free(Sr); free(orf);
    }
    free(qkv); free(g); free(b); free(S0);
}

/* ---- attention rows: fast against the reference ---- */
static void attn_case(int n, int hd, int nkv, float sharp) {
    int ld = nkv * hd;
    float *q = randx(1, hd), *k = randx(n, ld), *v = randx(n, ld), *sc = malloc((size_t)n * sizeof *sc);
    for (int i = 0; i < hd; i++) q[i] *= sharp; /* sharper or flatter softmax */
    float *ref = poisoned((size_t)hd);
    cpu_attn_row(n, hd, q, k + hd, v + hd, ld, sc, ref); /* the second KV head */
    cpu_mm_kind kinds[3] = { CPU_MM_REF, CPU_MM_C, CPU_MM_AVX2 };
    for (int kk = 0; kk < 3; kk++) {
        float *o = poisoned((size_t)hd);
        cpu_attn_row_fast(n, hd, q, k + hd, v + hd, ld, sc, o, kinds[kk]);
        double e = relerr(o, ref, (size_t)hd);
        if (kk == 0) CHECK(!memcmp(o, ref, (size_t)hd * 4), "attention REF kind is not the reference");
        else CHECK(e < 1e-5 && guard_ok(o, (size_t)hd), "attention kind %d n=%d hd=%d sharp %.1f: rel err %.3g", kk, n, hd, sharp, e);
        free(o);
    }
    free(q); free(k); free(v); free(sc); free(ref);
}

/* ---- the whole forward: fast vs reference paths, and the same bits for any thread count ---- */
static void forward_case(int mlx4) {
    char dir[] = "/tmp/lily-test-cpufast-XXXXXX";
    if (!mkdtemp(dir)) { CHECK(0, "mkdtemp"); return; }
    synth_opts o;
    memset(&o, 0, sizeof o);
    lily_status st = { 0 };
    synth_preset("tiny", &o.cfg, &st);
    o.mlx4 = mlx4; o.seed = lily_rng_u64(&rng) >> 1;
    lily_weights w;
    CHECK(synth_write(dir, &o, &st) == LILY_OK && lw_load(dir, &w, &st) == LILY_OK, "synth/load: %s", st.msg);
    if (st.code) return;
    const lily_config *c = &w.cfg;
    enum { T = 37, D = 3 }; /* a prefill chunk, then decode steps */
    int32_t ids[T + D];
    for (int i = 0; i < T + D; i++) ids[i] = (int32_t)(lily_rng_u64(&rng) % (uint64_t)c->vocab);
    lily_pool *p1 = lily_pool_new(1), *p2 = lily_pool_new(2), *p3 = lily_pool_new(3);
    lily_pool *pools[3] = { p1, p2, p3 };
    size_t V = (size_t)c->vocab, nl = (size_t)(T + D) * V;
    float *lg[4];
    cpu_mm_kind path[4] = { CPU_MM_REF, CPU_MM_AUTO, CPU_MM_AUTO, CPU_MM_AUTO };
    for (int r = 0; r < 4; r++) {
        cpu_cache k;
        cpu_cache_new(c, T + D, &k, &st);
        lg[r] = poisoned(nl);
        cpu_mm_path = path[r];
        cpu_forward(&w, &k, pools[r ? r - 1 : 1], ids, T, 0, lg[r], 1, NULL);
        for (int d = 0; d < D; d++) cpu_forward(&w, &k, pools[r ? r - 1 : 1], ids + T + d, 1, T + d, lg[r] + (size_t)(T + d) * V, 0, NULL);
        cpu_mm_path = CPU_MM_AUTO;
        cpu_cache_free(&k);
    }
    double e = relerr(lg[1], lg[0], nl);
    CHECK(e < 1e-5, "%s forward: fast vs reference logits rel err %.3g", mlx4 ? "mlx4" : "hf", e);
    CHECK(!memcmp(lg[1], lg[2], nl * 4) && !memcmp(lg[1], lg[3], nl * 4), "%s forward depends on the thread count", mlx4 ? "mlx4" : "hf");
    for (int r = 0; r < 4; r++) free(lg[r]);
    lily_pool_free(p1); lily_pool_free(p2); lily_pool_free(p3);
    lw_free(&w);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    CHECK(system(cmd) == 0, "cleanup");
}

int main(void) {
    uint64_t seed = t_seed("test_cpu_fast");
    printf("avx2 %s\n", cpu_mm_avx2_available() ? "yes" : "no (portable kernel only)");
    lily_rng_seed(&rng, seed);
    lily_pool *pool = lily_pool_new(2), *pool3 = lily_pool_new(3);
    double t0 = lily_now();
    static const int Ts[] = { 1, 2, 7, 64, 300 };
    /* the 35B-A3B shapes: expert gate/up [512][2048], expert down [2048][512], qkv [8192][2048] */
    struct { int rows, cols, maxT; } shapes[] = { { 512, 2048, 300 }, { 2048, 512, 300 }, { 8192, 2048, 7 } };
    for (int s = 0; s < 3; s++) {
        wmat ws[6] = { make(LW_F32, shapes[s].rows, shapes[s].cols, 0, 0, 0), make(LW_BF16, shapes[s].rows, shapes[s].cols, 0, 0, 0),
                       make(LW_F16, shapes[s].rows, shapes[s].cols, 0, 0, 0), make(LW_Q, shapes[s].rows, shapes[s].cols, 4, 64, LW_BF16),
                       make(LW_Q, shapes[s].rows, shapes[s].cols, 8, 64, LW_BF16), make(LW_Q, shapes[s].rows, shapes[s].cols, 4, 128, LW_F16) };
        for (int i = 0; i < 6; i++) {
            for (size_t k = 0; k < sizeof Ts / sizeof *Ts; k++) {
                if (Ts[k] > shapes[s].maxT) continue;
                if (Ts[k] == 300 && i != 1 && i != 3) continue; /* T=300: the real types (bf16, q4), for time */
                run_case(pool, pool3, &ws[i].m, Ts[k]);
            }
            drop(&ws[i]);
        }
        printf("shape %dx%d done at %.1f s\n", shapes[s].rows, shapes[s].cols, lily_now() - t0);
    }
    /* odd sizes: rows not a multiple of the tiles, columns with a tail, other group layouts */
    struct { lw_type t; int rows, cols, bits, group; lw_type sb; } odd[] = {
        { LW_F32, 37, 100, 0, 0, 0 }, { LW_BF16, 61, 1001, 0, 0, 0 }, { LW_F16, 5, 13, 0, 0, 0 }, { LW_F32, 3, 40000, 0, 0, 0 },
        { LW_Q, 45, 192, 4, 64, LW_BF16 }, { LW_Q, 33, 96, 8, 32, LW_F32 }, { LW_Q, 7, 256, 4, 128, LW_F32 },
        { LW_Q, 1, 64, 4, 64, LW_BF16 }, { LW_Q, 9, 40960, 4, 64, LW_BF16 }, { LW_Q, 66, 4096, 8, 128, LW_F16 },
    };
    for (size_t o = 0; o < sizeof odd / sizeof *odd; o++) {
        wmat w = make(odd[o].t, odd[o].rows, odd[o].cols, odd[o].bits, odd[o].group, odd[o].sb);
        for (size_t k = 0; k < sizeof Ts / sizeof *Ts; k++) run_case(pool, pool3, &w.m, Ts[k]);
        drop(&w);
    }
    printf("odd shapes done at %.1f s\n", lily_now() - t0);
    /* lm_head [248320][2048] 4-bit at decode */
    wmat lm = make(LW_Q, 248320, 2048, 4, 64, LW_BF16);
    run_case(pool, pool3, &lm.m, 1);
    drop(&lm);
    many_case(pool);
    static const int gT[] = { 1, 2, 7, 63, 64, 65, 200 };
    for (size_t i = 0; i < sizeof gT / sizeof *gT; i++) gdn_case(gT[i], 128, 128);
    gdn_case(77, 16, 24);
    static const int aN[] = { 1, 2, 7, 300, 2000 };
    for (size_t i = 0; i < sizeof aN / sizeof *aN; i++) { attn_case(aN[i], 256, 2, 1.0f); attn_case(aN[i], 256, 2, 4.0f); }
    attn_case(33, 20, 3, 1.0f);
    attn_case(5, 3, 2, 0.5f);
    forward_case(1);
    forward_case(0);
    gdn_case(129, 7, 3);
    printf("largest |fast - ref| / sum|w||x|: %.3g (tolerance 2e-5), %.1f s\n", worst_ratio, lily_now() - t0);
    lily_pool_free(pool);
    lily_pool_free(pool3);
    return T_DONE();
}
