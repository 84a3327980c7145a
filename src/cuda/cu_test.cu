/* The kernel test's entry points (see cuda_test.h): host in, device kernel, host out. */
#include "cuda/cu_model.h"
#include "cuda/cu_dev.h"
#include "cuda/cu_sample.h"
extern "C" {
#include "cuda/cuda_test.h"
}
#include <stdlib.h>

typedef struct { void *p[16]; int n; } dlist;
static void *dput(dlist *d, const void *h, size_t n, lily_status *st, lily_code *rc) {
    void *p = NULL;
    if (*rc) return NULL;
    cudaError_t e = cudaMalloc(&p, n ? n : 4);
    if (e == cudaSuccess && h) e = cudaMemcpy(p, h, n, cudaMemcpyHostToDevice);
    else if (e == cudaSuccess) e = cudaMemset(p, 0xff, n ? n : 4); /* NaN poison for floats */
    if (e != cudaSuccess) { *rc = cu_fail(st, e, "test buffer", __FILE__, __LINE__); return NULL; }
    d->p[d->n++] = p;
    return p;
}
static void dfree(dlist *d) { for (int i = 0; i < d->n; i++) cudaFree(d->p[i]); }
static lily_code finish(lily_status *st, lily_code rc) {
    if (rc) return rc;
    cudaError_t e = cudaDeviceSynchronize();
    if (e == cudaSuccess) e = cudaGetLastError();
    return e == cudaSuccess ? LILY_OK : cu_fail(st, e, "kernel", __FILE__, __LINE__);
}
static lily_code dget(void *h, const void *d, size_t n, lily_status *st) {
    cudaError_t e = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? LILY_OK : cu_fail(st, e, "copy back", __FILE__, __LINE__);
}

/* Y [n][rows] in slot order from the device's sorted rows dys and slot -> sorted map pos */
static lily_code slot_order(float *Y, const float *dys, const int *pos, int n, int rows, lily_status *st) {
    int *hp = (int *)malloc((size_t)n * 4);
    float *hs = (float *)malloc((size_t)n * rows * 4);
    lily_code rc = hp && hs ? dget(hp, pos, (size_t)n * 4, st) : lily_err(st, LILY_ENOMEM, "out of memory");
    if (!rc) rc = dget(hs, dys, (size_t)n * rows * 4, st);
    for (int i = 0; !rc && i < n; i++) memcpy(Y + (size_t)i * rows, hs + (size_t)hp[i] * rows, (size_t)rows * 4);
    free(hp); free(hs);
    return rc;
}

/* sel [n] uploaded and sorted by expert on the GPU (cu_moe_sort), with the bt-token tile map
 * (cu_moe_tiles; merged: both from cu_moe_sort_tiles, as the model does), in buffers of L; all
 * NULL where *rc is set */
static dsort sorted_tiles(dlist *L, const int *sel, int n, int E, int bt, int mt, int merged, lily_status *st, lily_code *rc) {
    int *ds = (int *)dput(L, sel, (size_t)n * 4, st, rc);
    int *cnt = (int *)dput(L, NULL, (size_t)E * 4, st, rc), *off = (int *)dput(L, NULL, (size_t)E * 4, st, rc);
    int *src = (int *)dput(L, NULL, (size_t)n * 4, st, rc), *pos = (int *)dput(L, NULL, (size_t)n * 4, st, rc);
    int *tiles = (int *)dput(L, NULL, (size_t)mt * 4, st, rc);
    dsort so = { NULL, NULL, NULL, NULL, NULL };
    if (*rc) return so;
    if (merged) cu_moe_sort_tiles(0, ds, n, E, cnt, off, src, pos, bt, tiles, mt);
    else {
        cu_moe_sort(0, ds, n, E, cnt, off, src, pos);
        cu_moe_tiles(0, cnt, E, bt, tiles, mt);
    }
    so.count = cnt; so.off = off; so.src = src; so.pos = pos; so.tiles = tiles;
    return so;
}

/* cu_wg_mma64 over two k steps: A [64][32], B [64][32] fp16 bits (row-major), D [64][64]; one
 * warpgroup, B staged in the layout cu_wg_mma64 reads (a k step's 2 KB, its k-halves 1 KB apart,
 * token groups 128 bytes apart). */
__global__ void k_wg_test(const uint16_t *__restrict__ A, const uint16_t *__restrict__ B, float *__restrict__ D) {
    __shared__ __align__(128) uint16_t Bs[2 * 64 * 16];
    const int tid = threadIdx.x, w = tid >> 5, g = (tid & 31) >> 2, q = tid & 3, r0 = 16 * w + g;
    for (int i = tid; i < 64 * 32; i += 128) {
        const int n = i / 32, k = i % 32;
        Bs[(k / 16) * 1024 + (((k % 16) / 8) * 8 + n / 8) * 64 + (n % 8) * 8 + k % 8] = B[i];
    }
    cu_wg_smem_fence();
    __syncthreads();
    auto pk = [&](int r, int c) { return (uint32_t)A[r * 32 + c] | (uint32_t)A[r * 32 + c + 1] << 16; };
    uint32_t a[2][4];
    for (int s = 0; s < 2; s++) {
        a[s][0] = pk(r0, 16 * s + 2 * q); a[s][1] = pk(r0 + 8, 16 * s + 2 * q);
        a[s][2] = pk(r0, 16 * s + 2 * q + 8); a[s][3] = pk(r0 + 8, 16 * s + 2 * q + 8);
    }
    float d[32];
    cu_wg_fence();
    cu_wg_mma64(d, a[0][0], a[0][1], a[0][2], a[0][3], Bs, 8 * 128, 128, 0);
    cu_wg_mma64(d, a[1][0], a[1][1], a[1][2], a[1][3], Bs + 1024, 8 * 128, 128, 1);
    cu_wg_commit();
    cu_wg_wait<0>();
    for (int j = 0; j < 8; j++)
        for (int c = 0; c < 4; c++) D[(r0 + 8 * (c >> 1)) * 64 + 8 * j + 2 * q + (c & 1)] = d[4 * j + c];
}

lily_code lct_wgmma(const uint16_t *A, const uint16_t *B, float *D, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    uint16_t *dA = (uint16_t *)dput(&L, A, 64 * 32 * 2, st, &rc), *dB = (uint16_t *)dput(&L, B, 64 * 32 * 2, st, &rc);
    float *dD = (float *)dput(&L, NULL, 64 * 64 * 4, st, &rc);
    if (!rc) cu_go(k_wg_test, 1, 128, 0, 0)(dA, dB, dD);
    rc = finish(st, rc);
    if (!rc) rc = dget(D, dD, 64 * 64 * 4, st);
    dfree(&L);
    return rc;
}

lily_code lct_moe_sort(const int *sel, int n, int E, int bt, int merged, int *count, int *off, int *src, int *pos, int *tiles,
                       int mt, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    int *ds = (int *)dput(&L, sel, (size_t)n * 4, st, &rc);
    int *dc = (int *)dput(&L, NULL, (size_t)E * 4, st, &rc), *dof = (int *)dput(&L, NULL, (size_t)E * 4, st, &rc);
    int *dsrc = (int *)dput(&L, NULL, (size_t)n * 4, st, &rc), *dpos = (int *)dput(&L, NULL, (size_t)n * 4, st, &rc);
    int *dt = (int *)dput(&L, NULL, (size_t)mt * 4, st, &rc);
    if (!rc && merged) cu_moe_sort_tiles(0, ds, n, E, dc, dof, dsrc, dpos, bt, dt, mt);
    else if (!rc) cu_moe_sort(0, ds, n, E, dc, dof, dsrc, dpos);
    rc = finish(st, rc);
    if (!rc) rc = dget(count, dc, (size_t)E * 4, st);
    if (!rc) rc = dget(off, dof, (size_t)E * 4, st);
    if (!rc) rc = dget(src, dsrc, (size_t)n * 4, st);
    if (!rc) rc = dget(pos, dpos, (size_t)n * 4, st);
    if (!rc && merged) rc = dget(tiles, dt, (size_t)mt * 4, st);
    dfree(&L);
    return rc;
}

static int attn_amin = 0;
void lct_attn_amin(int amin) { attn_amin = amin; }

lily_code lct_matmul(const lw_mat *W, int E, const float *X, int T, int variant, const int *sel, int K,
                     float *Y, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat d;
    lily_code rc = cu_upload_mats(m, W, (variant == 3 || variant == 4 || variant == 6) ? E : 1, &d, st);
    dlist L = { {0}, 0 };
    int grouped = variant == 3 || variant == 4 || variant == 6;
    int rows = W->rows, cols = W->cols, ny = grouped ? T * K : T;
    float *dx = (float *)dput(&L, X, (size_t)T * cols * 4, st, &rc);
    float *dy = (float *)dput(&L, NULL, (size_t)ny * rows * 4, st, &rc);
    const int sorted = variant == 4 || variant == 6;
    int *ds = variant == 3 ? (int *)dput(&L, sel, (size_t)T * K * 4, st, &rc) : NULL;
    float *dys = sorted ? (float *)dput(&L, NULL, (size_t)ny * rows * 4, st, &rc) : NULL;
    int bt = cu_moe_tile_rows(T * K, E), mt = cu_moe_max_tiles(T * K, E, bt);
    dsort so = { NULL, NULL, NULL, NULL, NULL };
    if (sorted) so = sorted_tiles(&L, sel, T * K, E, bt, mt, 0, st, &rc);
    if (!rc && (variant == 5 || variant == 6) && !cu_gemm_q4_ok(&d, dx, cols))
        rc = lily_err(st, LILY_EUNSUPPORTED, "the FP16 GEMM does not take this matrix");
    if (!rc) {
        if (variant <= 2 || variant == 7) cu_matmul_variant(0, variant, &d, dx, cols, T, dy, rows);
        else if (variant == 8 || variant == 9) {
            size_t nscr = (size_t)8 * T * rows;
            float *scr = (float *)dput(&L, NULL, nscr * 4, st, &rc);
            cu_matmul_exact_tc(variant == 8);
            if (!rc) cu_matmul_exact(0, &d, dx, cols, T, dy, rows, scr, nscr);
            cu_matmul_exact_tc(-1);
        }
        else if (variant == 5) cu_gemm_q4(0, &d, dx, cols, T, dy, rows);
        else if (variant == 3) cu_matmul_slots(0, &d, ds, dx, K, cols, T * K, dy, rows);
        else if (variant == 6) cu_gemm_q4_grouped(0, &d, &so, bt, mt, K, dx, cols, dys, rows);
        else { /* the per-expert tiles read no tile map */
            so.tiles = NULL;
            cu_matmul_grouped(0, &d, E, &so, K, dx, cols, T, dys, rows);
        }
    }
    rc = finish(st, rc);
    if (!rc && sorted) rc = slot_order(Y, dys, so.pos, T * K, rows, st);
    else if (!rc) rc = dget(Y, dy, (size_t)ny * rows * 4, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

lily_code lct_experts_swiglu(const lw_mat *G, const lw_mat *U, int E, const float *X, int T, const int *sel, int K, int packed,
                             float *Y, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat dg, du;
    lily_code rc = cu_upload_mats(m, G, sel ? E : 1, &dg, st);
    if (!rc) rc = cu_upload_mats(m, U, sel ? E : 1, &du, st);
    dlist L = { {0}, 0 };
    if (!sel) { /* dense: T rows, one gate/up pair */
        float *dx = (float *)dput(&L, X, (size_t)T * G->cols * 4, st, &rc);
        float *dy = (float *)dput(&L, NULL, (size_t)T * G->rows * 4, st, &rc);
        uint16_t *xp = packed ? (uint16_t *)dput(&L, NULL, (size_t)T * G->cols * 2, st, &rc) : NULL;
        if (!rc && !cu_gemm_swiglu(0, &dg, &du, dx, G->cols, T, dy, G->rows, xp, 0))
            rc = lily_err(st, LILY_EUNSUPPORTED, "the fused gate/up kernel does not take these matrices");
        rc = finish(st, rc);
        if (!rc) rc = dget(Y, dy, (size_t)T * G->rows * 4, st);
        dfree(&L);
        lcuda_model_free(m);
        return rc;
    }
    const int rows = G->rows, cols = G->cols, n = T * K;
    int bt = cu_moe_tile_rows(n, E), mt = cu_moe_max_tiles(n, E, bt);
    float *dx = (float *)dput(&L, X, (size_t)T * cols * 4, st, &rc);
    float *dy = (float *)dput(&L, NULL, (size_t)n * rows * 4, st, &rc);
    const dsort so = sorted_tiles(&L, sel, n, E, bt, mt, 0, st, &rc);
    if (!rc && !cu_gemm_swiglu_grouped(0, &dg, &du, &so, bt, mt, K, dx, cols, dy, rows))
        rc = lily_err(st, LILY_EUNSUPPORTED, "the fused gate/up kernel does not take these matrices");
    rc = finish(st, rc);
    if (!rc) rc = slot_order(Y, dy, so.pos, n, rows, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

lily_code lct_experts_ffn(const lw_mat *G, const lw_mat *U, const lw_mat *D, int E, const float *X, int T, const int *sel, int K,
                          int bt, float *Y, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat dg, du, dd;
    lily_code rc = cu_upload_mats(m, G, E, &dg, st);
    if (!rc) rc = cu_upload_mats(m, U, E, &du, st);
    if (!rc) rc = cu_upload_mats(m, D, E, &dd, st);
    dlist L = { {0}, 0 };
    const int I = G->rows, H = G->cols, n = T * K, mt = cu_moe_max_tiles(n, E, bt);
    float *dx = (float *)dput(&L, X, (size_t)T * H * 4, st, &rc);
    float *dy = (float *)dput(&L, NULL, (size_t)n * D->rows * 4, st, &rc);
    uint16_t *xpx = (uint16_t *)dput(&L, NULL, (size_t)T * H * 2, st, &rc), *xph = (uint16_t *)dput(&L, NULL, (size_t)n * I * 2, st, &rc);
    const dsort so = sorted_tiles(&L, sel, n, E, bt, mt, 1, st, &rc);
    /* bt 32 (the 35B-A3B's tile at 512 tokens): X packed beforehand, as the norm before the MoE
     * leaves it in the model (xp_in); the other tiles pack it in the call */
    const int xp_in = bt == 32;
    if (!rc && xp_in) cu_xp_pack(0, dx, H, T, H, xpx);
    if (!rc) {
        if (cu_moe_gate_up_xp(0, &dg, &du, &dd, &so, bt, mt, K, dx, H, T, xpx, xph, xp_in))
            cu_moe_down_xp(0, &dd, &so, bt, mt, xph, dy, D->rows);
        else rc = lily_err(st, LILY_EUNSUPPORTED, "the packed-input experts' kernels do not take these matrices");
    }
    rc = finish(st, rc);
    if (!rc) rc = slot_order(Y, dy, so.pos, n, D->rows, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

lily_code lct_conv(const float *mixed, float *state, const float *w, int cd, int K, int T, int nk, int dk, float *u,
                   const lct_gates *gt, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *dm = (float *)dput(&L, mixed, (size_t)T * cd * 4, st, &rc), *ds = (float *)dput(&L, state, (size_t)cd * (K - 1) * 4, st, &rc);
    float *dw = (float *)dput(&L, w, (size_t)cd * K * 4, st, &rc), *du = (float *)dput(&L, NULL, (size_t)T * cd * 4, st, &rc);
    cu_gates G;
    memset(&G, 0, sizeof G);
    if (gt) {
        const size_t tn = (size_t)T * gt->nv * 4, n = (size_t)gt->nv * 4;
        G.bb = (float *)dput(&L, gt->bb, tn, st, &rc); G.aa = (float *)dput(&L, gt->aa, tn, st, &rc);
        G.A_log = (float *)dput(&L, gt->A_log, n, st, &rc); G.dt_bias = (float *)dput(&L, gt->dt_bias, n, st, &rc);
        G.g = (float *)dput(&L, NULL, tn, st, &rc); G.beta = (float *)dput(&L, NULL, tn, st, &rc);
        G.nv = gt->nv;
    }
    if (!rc && !cu_conv(0, dm, ds, dw, cd, K, T, du, nk, dk, gt ? &G : NULL)) cu_l2norm_heads(0, du, T, cd, nk, dk);
    rc = finish(st, rc);
    if (!rc) rc = dget(u, du, (size_t)T * cd * 4, st);
    if (!rc) rc = dget(state, ds, (size_t)cd * (K - 1) * 4, st);
    if (!rc && gt) rc = dget(gt->g, G.g, (size_t)T * gt->nv * 4, st);
    if (!rc && gt) rc = dget(gt->beta, G.beta, (size_t)T * gt->nv * 4, st);
    dfree(&L);
    return rc;
}

int lct_has_wgmma(void) { return cu_gemm_wg_available(); }

lily_code lct_gemm_group(const lw_mat *W, int n, const float *X, int T, int packed, float *const *Y, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat d[4];
    const dmat *dp[4];
    float *dy[4];
    dlist L = { {0}, 0 };
    lily_code rc = n >= 1 && n <= 4 ? LILY_OK : lily_err(st, LILY_EINVAL, "1 to 4 matrices");
    for (int i = 0; i < n && !rc; i++) {
        rc = cu_upload_mats(m, &W[i], 1, &d[i], st);
        dp[i] = &d[i];
        dy[i] = (float *)dput(&L, NULL, (size_t)T * W[i].rows * 4, st, &rc);
    }
    float *dx = (float *)dput(&L, X, (size_t)T * W[0].cols * 4, st, &rc);
    uint16_t *xp = packed ? (uint16_t *)dput(&L, NULL, (size_t)T * W[0].cols * 2, st, &rc) : NULL;
    const int wg0 = cu_gemm_wg_launches();
    cu_gemm_wg_test(packed >= 2 ? packed - 1 : 0);
    if (!rc && !(n == 1 && packed ? cu_gemm_tc_xp(0, dp[0], dx, W[0].cols, T, dy[0], W[0].rows, xp)
                                  : cu_gemm_tc_group(0, n, dp, dx, W[0].cols, T, dy, xp, 0)))
        rc = lily_err(st, LILY_EUNSUPPORTED, "the grouped tensor-core GEMM does not take these matrices");
    cu_gemm_wg_test(-1);
    if (!rc && packed >= 2 && cu_gemm_wg_launches() == wg0) rc = lily_err(st, LILY_EUNSUPPORTED, "no launch took wgmma");
    rc = finish(st, rc);
    for (int i = 0; i < n && !rc; i++) rc = dget(Y[i], dy[i], (size_t)T * W[i].rows * 4, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

lily_code lct_gemm_split(const lw_mat *W, const float *X, int T, int wg, float *Y, int *parts, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat d;
    dlist L = { {0}, 0 };
    lily_code rc = cu_upload_mats(m, W, 1, &d, st);
    const size_t ny = (size_t)T * W->rows;
    float *dy = (float *)dput(&L, NULL, ny * 4, st, &rc), *dy2 = (float *)dput(&L, NULL, ny * 4, st, &rc);
    float *dx = (float *)dput(&L, X, (size_t)T * W->cols * 4, st, &rc);
    uint16_t *xp = (uint16_t *)dput(&L, NULL, (size_t)T * W->cols * 2, st, &rc);
    *parts = 0;
    if (!rc) {
        cudaMemset(dy2, 0xff, ny * 4); /* NaN: a second part claimed but not written shows */
        const int wg0 = cu_gemm_wg_launches();
        cu_gemm_wg_test(wg);
        *parts = cu_gemm_tc_xp2(0, &d, dx, W->cols, T, dy, dy2, W->rows, xp, 0);
        cu_gemm_wg_test(-1);
        if (!*parts) rc = lily_err(st, LILY_EUNSUPPORTED, "the tensor-core GEMM does not take this matrix");
        else if (wg && cu_gemm_wg_launches() == wg0) rc = lily_err(st, LILY_EUNSUPPORTED, "no launch took wgmma");
    }
    rc = finish(st, rc);
    if (!rc) rc = dget(Y, dy, ny * 4, st);
    if (!rc && *parts == 2) {
        float *y2 = (float *)malloc(ny * 4);
        rc = y2 ? dget(y2, dy2, ny * 4, st) : lily_err(st, LILY_ENOMEM, "out of memory");
        for (size_t i = 0; !rc && i < ny; i++) Y[i] += y2[i];
        free(y2);
    }
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

/* The test's fp32 cache rows as the device holds them (fp16, cu_kv_f2h): put, and got back as fp32 */
static uint16_t *dput_kv(dlist *d, const float *x, size_t n, lily_status *st, lily_code *rc) {
    if (*rc) return NULL;
    uint16_t *h = (uint16_t *)malloc(n * sizeof(uint16_t) + 1);
    if (!h) { *rc = lily_err(st, LILY_ENOMEM, "out of memory"); return NULL; }
    for (size_t i = 0; i < n; i++) h[i] = cu_kv_f2h(x[i]);
    uint16_t *p = (uint16_t *)dput(d, h, n * sizeof(uint16_t), st, rc);
    free(h);
    return p;
}
static lily_code dget_kv(float *x, const uint16_t *d, size_t n, lily_status *st) {
    uint16_t *h = (uint16_t *)malloc(n * sizeof(uint16_t) + 1);
    if (!h) return lily_err(st, LILY_ENOMEM, "out of memory");
    lily_code rc = dget(h, d, n * sizeof(uint16_t), st);
    for (size_t i = 0; !rc && i < n; i++) x[i] = cu_kv_h2f(h[i]);
    free(h);
    return rc;
}
void lct_attn_form(int u, int hs) { cu_attn_form_test(u, hs); }
void lct_attn_dtc(int on, int dmin) { cu_attn_dtc_test(on, dmin); }
void lct_kv_round(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = cu_kv_h2f(cu_kv_f2h(x[i]));
}

static lily_code attention_run(const float *q, const float *qg, const float *kc, const float *vc, int T, int nh, int nkv, int hd,
                               int pos0, int ctx, int splits, int h16, float *o, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *dq = (float *)dput(&L, q, (size_t)T * nh * hd * 4, st, &rc);
    float *dqg = (float *)dput(&L, qg, (size_t)T * nh * 2 * hd * 4, st, &rc);
    uint16_t *dk = dput_kv(&L, kc, (size_t)ctx * nkv * hd, st, &rc), *dv = dput_kv(&L, vc, (size_t)ctx * nkv * hd, st, &rc);
    int *dp = (int *)dput(&L, &pos0, 4, st, &rc);
    float *part = (float *)dput(&L, NULL, cu_attention_part_floats(T, nh, hd, splits) * 4, st, &rc);
    float *dout = (float *)dput(&L, NULL, (size_t)T * nh * hd * 4, st, &rc);
    /* h16: the fp16 keys' scratch exactly as large as they need (an overrun shows in the emulator) */
    const size_t hb = h16 ? cu_attn_h16_bytes(pos0 + T, nkv) : 0;
    void *dh = h16 ? dput(&L, NULL, hb, st, &rc) : NULL;
    cu_attn_h16_test(h16);
    if (!rc && h16) cu_attention_h16(0, dq, dqg, dk, dv, T, nh, nkv, hd, dp, pos0, dh, hb, part, dout);
    else if (!rc) cu_attention(0, dq, dqg, dk, dv, T, nh, nkv, hd, dp, splits, part, dout, attn_amin, T == 1 && cu_attn_tc_at(pos0 + 1));
    rc = finish(st, rc);
    cu_attn_h16_test(-1);
    if (!rc) rc = dget(o, dout, (size_t)T * nh * hd * 4, st);
    dfree(&L);
    return rc;
}
lily_code lct_attention(const float *q, const float *qg, const float *kc, const float *vc, int T, int nh, int nkv, int hd,
                        int pos0, int ctx, int h16, float *o, lily_status *st) {
    return attention_run(q, qg, kc, vc, T, nh, nkv, hd, pos0, ctx, 1, h16, o, st);
}
lily_code lct_attention_split(const float *q, const float *qg, const float *kc, const float *vc, int nh, int nkv, int hd,
                              int pos0, int ctx, int splits, float *o, lily_status *st) {
    return attention_run(q, qg, kc, vc, 1, nh, nkv, hd, pos0, ctx, splits, 0, o, st);
}

lily_code lct_attention_dec(const float *qg, const float *k, const float *v, const float *qn, const float *kn, const float *inv_freq,
                            int nh, int nkv, int hd, int rot, float eps, int pos0, int ctx, int splits, float *kc, float *vc, float *o,
                            lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *dqg = (float *)dput(&L, qg, (size_t)nh * 2 * hd * 4, st, &rc);
    float *dk = (float *)dput(&L, k, (size_t)nkv * hd * 4, st, &rc), *dv = (float *)dput(&L, v, (size_t)nkv * hd * 4, st, &rc);
    float *dqn = (float *)dput(&L, qn, (size_t)hd * 4, st, &rc), *dkn = (float *)dput(&L, kn, (size_t)hd * 4, st, &rc);
    float *dif = (float *)dput(&L, inv_freq, (size_t)(rot / 2) * 4, st, &rc);
    uint16_t *dkc = dput_kv(&L, kc, (size_t)ctx * nkv * hd, st, &rc), *dvc = dput_kv(&L, vc, (size_t)ctx * nkv * hd, st, &rc);
    int *dp = (int *)dput(&L, &pos0, 4, st, &rc);
    float *part = (float *)dput(&L, NULL, cu_attention_part_floats(1, nh, hd, splits) * 4, st, &rc);
    float *dout = (float *)dput(&L, NULL, (size_t)nh * hd * 4, st, &rc);
    if (!rc && !cu_attention_dec(0, dqg, dk, dv, dqn, dkn, nh, nkv, hd, rot, dif, eps, dp, dkc, dvc, splits, part, dout, attn_amin,
                                 cu_attn_tc_at(pos0 + 1)))
        rc = lily_err(st, LILY_EUNSUPPORTED, "cu_attention_dec declined");
    rc = finish(st, rc);
    if (!rc) rc = dget(o, dout, (size_t)nh * hd * 4, st);
    if (!rc) rc = dget_kv(kc, dkc, (size_t)ctx * nkv * hd, st);
    if (!rc) rc = dget_kv(vc, dvc, (size_t)ctx * nkv * hd, st);
    dfree(&L);
    return rc;
}

/* lct_packed: device buffers for the producer's packed output and k_xp_pack's of y [T][n] */
static uint16_t *pk_alloc(dlist *L, const lct_packed *pk, int T, int n, uint16_t **ref, lily_status *st, lily_code *rc) {
    if (!pk) return *ref = NULL;
    *ref = (uint16_t *)dput(L, NULL, (size_t)T * n * 2, st, rc);
    return (uint16_t *)dput(L, NULL, (size_t)T * n * 2, st, rc);
}
static lily_code pk_get(lct_packed *pk, const uint16_t *dxp, uint16_t *dref, const float *dy, int T, int n, lily_status *st) {
    if (!pk || n % 128) return LILY_OK; /* (no packed form of such rows: the producer must say so) */
    cu_xp_pack(0, dy, n, T, n, dref);
    lily_code rc = finish(st, LILY_OK);
    if (!rc) rc = dget(pk->xp, dxp, (size_t)T * n * 2, st);
    if (!rc) rc = dget(pk->xp_ref, dref, (size_t)T * n * 2, st);
    return rc;
}

lily_code lct_gated_norm(float *o, const float *z, const float *gw, int T, int nv, int dv, float eps, lct_packed *pk,
                         lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *d_o = (float *)dput(&L, o, (size_t)T * nv * dv * 4, st, &rc);
    float *d_z = (float *)dput(&L, z, (size_t)T * nv * dv * 4, st, &rc);
    float *d_w = (float *)dput(&L, gw, (size_t)dv * 4, st, &rc);
    uint16_t *dref, *dxp = pk_alloc(&L, pk, T, nv * dv, &dref, st, &rc);
    if (!rc && pk) pk->packed = cu_gated_norm_p(0, d_o, d_z, d_w, T, nv, dv, eps, dxp);
    else if (!rc) cu_gated_norm(0, d_o, d_z, d_w, T, nv, dv, eps);
    rc = finish(st, rc);
    if (!rc) rc = dget(o, d_o, (size_t)T * nv * dv * 4, st);
    if (!rc) rc = pk_get(pk, dxp, dref, d_o, T, nv * dv, st);
    dfree(&L);
    return rc;
}

/* The rows kernels' test launch: n (1 to MVQ_MAX) matrices uploaded into m (dp[i] = &d[i], ld[i] their
 * rows) and their T output rows each (dy[i]) in L; the inputs are the caller's, put in L after them */
typedef struct {
    lcuda_model *m;
    dmat d[MVQ_MAX];
    const dmat *dp[MVQ_MAX];
    float *dy[MVQ_MAX]; /* [T][ld[i]] */
    int ld[MVQ_MAX];
    dlist L;
} rows_job;

static lily_code rows_begin(rows_job *j, const lw_mat *W, int n, int T, lily_status *st) {
    memset(j, 0, sizeof *j);
    j->m = (lcuda_model *)calloc(1, sizeof *j->m);
    lily_code rc = !j->m                    ? lily_err(st, LILY_ENOMEM, "out of host memory")
                   : n >= 1 && n <= MVQ_MAX ? LILY_OK
                                            : lily_err(st, LILY_EINVAL, "1 to %d matrices", MVQ_MAX);
    for (int i = 0; i < n && !rc; i++) {
        rc = cu_upload_mats(j->m, &W[i], 1, &j->d[i], st);
        if (!rc && !cu_mvq_ok(&j->d[i])) rc = lily_err(st, LILY_EUNSUPPORTED, "the matrix-vector kernel does not take this matrix");
        j->dp[i] = &j->d[i];
        j->ld[i] = W[i].rows;
    }
    for (int i = 0; i < n && !rc; i++) j->dy[i] = (float *)dput(&j->L, NULL, (size_t)T * W[i].rows * 4, st, &rc);
    return rc;
}
/* the launch's end (rc: its status so far) and its outputs into Y; rows_free after any other copies */
static lily_code rows_outputs(rows_job *j, lily_code rc, const lw_mat *W, int n, int T, float *const *Y, lily_status *st) {
    rc = finish(st, rc);
    for (int i = 0; i < n && !rc; i++) rc = dget(Y[i], j->dy[i], (size_t)T * W[i].rows * 4, st);
    return rc;
}
static void rows_free(rows_job *j) {
    dfree(&j->L);
    if (j->m) lcuda_model_free(j->m);
}

lily_code lct_matvec_rows(const lw_mat *W, int n, const float *X, const float *X2, int T, float *const *Y, int kern,
                          lily_status *st) {
    rows_job j;
    lily_code rc = rows_begin(&j, W, n, T, st);
    const int cols = W[0].cols;
    float *dx = (float *)dput(&j.L, X, (size_t)T * cols * 4, st, &rc);
    float *dx2 = X2 ? (float *)dput(&j.L, X2, (size_t)T * cols * 4, st, &rc) : NULL;
    if (!rc && kern == 4) {
        if (!cu_mvdpt(0, n, j.dp, dx, dx2, cols, T, j.dy, j.ld)) rc = lily_err(st, LILY_EUNSUPPORTED, "k_mvdpt declined the launch");
    } else if (!rc && kern >= 2) {
        cu_mvdpb_test_off(kern == 3 ? -1 : -2);
        if (!cu_mvdpb(0, n, j.dp, dx, dx2, cols, T, j.dy, j.ld)) rc = lily_err(st, LILY_EUNSUPPORTED, "k_mvdpb declined the launch");
        cu_mvdpb_test_off(0);
    } else if (!rc) {
        cu_mvdpb_test_off(kern == 1);
        cu_matvec_rows(0, n, j.dp, dx, dx2, cols, T, j.dy, j.ld);
        cu_mvdpb_test_off(0);
    }
    rc = rows_outputs(&j, rc, W, n, T, Y, st);
    rows_free(&j);
    return rc;
}

lily_code lct_matvec_rows_norm(const lw_mat *W, int n, const float *X, const float *nw, float eps, int T, float *const *Y,
                               float *tout, int kern, lily_status *st) {
    rows_job j;
    lily_code rc = rows_begin(&j, W, n, T, st);
    const int cols = W[0].cols;
    float *dx = (float *)dput(&j.L, X, (size_t)T * cols * 4, st, &rc), *dn = (float *)dput(&j.L, nw, (size_t)cols * 4, st, &rc);
    float *dt = (float *)dput(&j.L, NULL, (size_t)T * cols * 4, st, &rc);
    if (!rc && kern == 5) {
        for (int t = 0; t < T; t++) {
            mvq_fuse fu;
            memset(&fu, 0, sizeof fu);
            fu.nw = dn; fu.eps = eps; fu.tout = dt + (size_t)t * cols;
            float *yt[MVQ_MAX];
            for (int i = 0; i < n; i++) yt[i] = j.dy[i] + (size_t)t * j.ld[i];
            cu_matvec_group(0, n, j.dp, dx + (size_t)t * cols, NULL, cols, yt, NULL, NULL, 1, 1, &fu);
        }
    } else if (!rc && kern == 4) {
        if (!cu_mvdpt_norm(0, n, j.dp, dx, cols, T, j.dy, j.ld, dn, eps, dt)) rc = lily_err(st, LILY_EUNSUPPORTED, "k_mvdpt declined the launch");
    } else if (!rc) {
        cu_mvdpb_test_off(kern == 2 ? -2 : 0);
        if (!cu_mvdpb_norm(0, n, j.dp, dx, cols, T, j.dy, j.ld, dn, eps, dt)) rc = lily_err(st, LILY_EUNSUPPORTED, "cu_mvdpb_norm declined the launch");
        cu_mvdpb_test_off(0);
    }
    rc = rows_outputs(&j, rc, W, n, T, Y, st);
    if (!rc) rc = dget(tout, dt, (size_t)T * cols * 4, st);
    rows_free(&j);
    return rc;
}

lily_code lct_matvec_group(const lw_mat *W, int n, int E, const lw_mat *XM, int nsh, const int *sel, int nslots, int xdiv, int xrow,
                           const float *X, const float *X2, int nx, const lct_mvnorm *nm, int dp, const lct_mvroute *rt,
                           float *const *Y, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat d[MVQ_MAX], dx[MVQ_MAX];
    const dmat *dpp[MVQ_MAX];
    float *dy[MVQ_MAX];
    int ld[MVQ_MAX];
    const int ns = nslots + (XM ? nsh : 0), cols = W[0].cols, rT = rt && rt->T > 1 ? rt->T : 1;
    lily_code rc = n >= 1 && n <= MVQ_MAX ? LILY_OK : lily_err(st, LILY_EINVAL, "1 to %d matrices", MVQ_MAX);
    for (int i = 0; i < n && !rc; i++) {
        rc = cu_upload_mats(m, &W[(size_t)i * E], E, &d[i], st);
        if (!rc && XM) rc = cu_upload_mats(m, &XM[i], 1, &dx[i], st);
        if (!rc && !cu_mvq_ok(&d[i])) rc = lily_err(st, LILY_EUNSUPPORTED, "the matrix-vector kernel does not take this matrix");
        dpp[i] = &d[i];
        ld[i] = W[(size_t)i * E].rows;
    }
    dlist L = { {0}, 0 };
    float *ddx = (float *)dput(&L, X, (size_t)nx * cols * 4, st, &rc);
    float *ddx2 = X2 ? (float *)dput(&L, X2, (size_t)nx * cols * 4, st, &rc) : NULL;
    int *ds = sel ? (int *)dput(&L, sel, (size_t)nslots * 4, st, &rc) : NULL;
    float *dlg = rt ? (float *)dput(&L, rt->lg, (size_t)rT * rt->E * 4, st, &rc) : NULL;
    float *dwt = rt ? (float *)dput(&L, NULL, (size_t)rT * rt->K * 4, st, &rc) : NULL;
    if (rt && ds) { /* the launch must route itself: the given experts poisoned */
        cudaMemset(ds, 0xff, (size_t)nslots * 4);
        cudaMemset(dwt, 0xff, (size_t)rT * rt->K * 4);
    }
    float *dadd = nm && nm->add ? (float *)dput(&L, nm->add, (size_t)nx * cols * 4, st, &rc) : NULL;
    float *dnw = nm && nm->nw ? (float *)dput(&L, nm->nw, (size_t)cols * 4, st, &rc) : NULL;
    float *dtout = nm && nm->nw ? (float *)dput(&L, NULL, (size_t)nx * cols * 4, st, &rc) : NULL;
    float *dgz = nm && nm->gz ? (float *)dput(&L, nm->gz, (size_t)cols * 4, st, &rc) : NULL;
    float *dgw = nm && nm->gz ? (float *)dput(&L, nm->gw, 128 * 4, st, &rc) : NULL;
    if (!rc && dgz && (n != 1 || E != 1 || XM || sel || rt || dp < 0))
        rc = lily_err(st, LILY_EINVAL, "the gated norm takes one dense matrix, through k_mvdp");
    for (int i = 0; i < n; i++) dy[i] = (float *)dput(&L, NULL, (size_t)ns * ld[i] * 4, st, &rc);
    mvq_fuse fu;
    memset(&fu, 0, sizeof fu);
    if (nm) { fu.add = dadd; fu.nw = dnw; fu.eps = nm->eps; fu.tout = dtout; }
    if (XM) {
        fu.xslot = nslots;
        fu.xrow = xrow;
        for (int i = 0; i < n; i++) fu.xm[i] = dx[i];
    }
    if (rt) { fu.rlog = dlg; fu.E = rt->E; fu.K = rt->K; fu.rsel = ds; fu.rwt = dwt; }
    if (!rc) {
        cu_mvdp_test_r(dp);
        if (dgz) {
            if (!cu_matvec_gated(0, dpp[0], ddx, dgz, dgw, nm->eps, dy[0])) rc = lily_err(st, LILY_EUNSUPPORTED, "cu_matvec_gated declined");
        } else cu_matvec_group(0, n, dpp, ddx, ddx2, cols, dy, ld, ds, xdiv, ns, XM || nm || rt ? &fu : NULL);
        cu_mvdp_test_r(0);
    }
    rc = finish(st, rc);
    for (int i = 0; i < n && !rc; i++) rc = dget(Y[i], dy[i], (size_t)ns * ld[i] * 4, st);
    if (!rc && nm && nm->nw) rc = dget(nm->tout, dtout, (size_t)nx * cols * 4, st);
    if (!rc && rt) rc = dget(rt->sel, ds, (size_t)rT * rt->K * 4, st);
    if (!rc && rt) rc = dget(rt->wt, dwt, (size_t)rT * rt->K * 4, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

/* The delta rule through the recurrent kernel (mode 0), the chunked kernels (1, of variant
 * cu_gdn_chunk_variant) or the staged prefill kernel (2). */
static lily_code gdn_run(int mode, int variant, int T, int nk, int nv, int dk, int dv, const float *u, const float *g,
                         const float *beta, float *S, float *o, lily_status *st) {
    int cd = 2 * nk * dk + nv * dv;
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *du = (float *)dput(&L, u, (size_t)T * cd * 4, st, &rc), *dg = (float *)dput(&L, g, (size_t)T * nv * 4, st, &rc);
    float *db = (float *)dput(&L, beta, (size_t)T * nv * 4, st, &rc), *dS = (float *)dput(&L, S, (size_t)nv * dk * dv * 4, st, &rc);
    float *dout = (float *)dput(&L, NULL, (size_t)T * nv * dv * 4, st, &rc);
    float *scr = mode == 1 ? (float *)dput(&L, NULL, cu_gdn_chunk_scratch_floats(T, nv, dk, dv) * 4, st, &rc) : NULL;
    if (!rc && mode == 0) cu_gdn_rec(0, T, nk, nv, dk, dv, du, cd, dg, db, dS, dout);
    if (!rc && mode == 1) {
        cu_gdn_chunk_variant(variant);
        if (!cu_gdn_chunked(0, T, nk, nv, dk, dv, du, cd, dg, db, dS, dout, scr))
            rc = lily_err(st, LILY_EUNSUPPORTED, "the chunked delta rule does not take this shape");
        cu_gdn_chunk_variant(0);
    }
    if (!rc && mode == 2 && !cu_gdn_staged(0, T, nk, nv, dk, dv, du, cd, dg, db, dS, dout))
        rc = lily_err(st, LILY_EUNSUPPORTED, "the staged delta rule does not take this shape");
    rc = finish(st, rc);
    if (!rc) rc = dget(o, dout, (size_t)T * nv * dv * 4, st);
    if (!rc) rc = dget(S, dS, (size_t)nv * dk * dv * 4, st);
    dfree(&L);
    return rc;
}

lily_code lct_gdn(int T, int nk, int nv, int dk, int dv, const float *u, const float *g, const float *beta,
                  float *S, float *o, lily_status *st) {
    return gdn_run(0, 0, T, nk, nv, dk, dv, u, g, beta, S, o, st);
}

lily_code lct_gdn_chunked(int variant, int T, int nk, int nv, int dk, int dv, const float *u, const float *g,
                          const float *beta, float *S, float *o, lily_status *st) {
    return gdn_run(1, variant, T, nk, nv, dk, dv, u, g, beta, S, o, st);
}

lily_code lct_gdn_staged(int T, int nk, int nv, int dk, int dv, const float *u, const float *g, const float *beta,
                         float *S, float *o, lily_status *st) {
    return gdn_run(2, 0, T, nk, nv, dk, dv, u, g, beta, S, o, st);
}

lily_code lct_rmsnorm(const float *x, const float *add, const float *w, int n, int T, float eps, float *y,
                      float *x_out, lct_packed *pk, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *dx = (float *)dput(&L, x, (size_t)T * n * 4, st, &rc), *da = add ? (float *)dput(&L, add, (size_t)T * n * 4, st, &rc) : NULL;
    float *dw = (float *)dput(&L, w, (size_t)n * 4, st, &rc), *dy = (float *)dput(&L, NULL, (size_t)T * n * 4, st, &rc);
    uint16_t *dref, *dxp = pk_alloc(&L, pk, T, n, &dref, st, &rc);
    if (!rc && pk) pk->packed = cu_rmsnorm2p(0, dx, da, NULL, dw, n, T, eps, dy, dxp);
    else if (!rc) cu_rmsnorm(0, dx, da, dw, n, T, eps, dy);
    rc = finish(st, rc);
    if (!rc) rc = dget(y, dy, (size_t)T * n * 4, st);
    if (!rc && x_out) rc = dget(x_out, dx, (size_t)T * n * 4, st);
    if (!rc) rc = pk_get(pk, dxp, dref, dy, T, n, st);
    dfree(&L);
    return rc;
}

lily_code lct_moe_combine(float *x, const float *add, const float *D, const float *wt, int T, int K, int H, const float *SD,
                          const float *sr, const float *nw, float eps, float *tout, int reps, lct_packed *pk, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    const size_t th = (size_t)T * H * 4;
    float *dx = (float *)dput(&L, x, th, st, &rc), *da = add ? (float *)dput(&L, add, th, st, &rc) : NULL;
    float *dD = (float *)dput(&L, D, th * K, st, &rc), *dw = (float *)dput(&L, wt, (size_t)T * K * 4, st, &rc);
    float *dS = SD ? (float *)dput(&L, SD, th, st, &rc) : NULL, *dr = SD ? (float *)dput(&L, sr, (size_t)T * 4, st, &rc) : NULL;
    float *dn = nw ? (float *)dput(&L, nw, (size_t)H * 4, st, &rc) : NULL, *dt = (float *)dput(&L, NULL, th, st, &rc);
    uint16_t *dref, *dxp = pk_alloc(&L, pk, T, H, &dref, st, &rc);
    for (int i = 0; !rc && i < reps; i++)
        if (pk) pk->packed = cu_moe_combine_p(0, dx, da, dD, NULL, dw, T, K, H, dS, dr, dn, eps, dt, dxp);
        else cu_moe_combine(0, dx, da, dD, NULL, dw, T, K, H, dS, dr, dn, eps, dt);
    rc = finish(st, rc);
    if (!rc) rc = dget(x, dx, th, st);
    if (!rc && nw) rc = dget(tout, dt, th, st);
    if (!rc && nw) rc = pk_get(pk, dxp, dref, dt, T, H, st);
    dfree(&L);
    return rc;
}

lily_code lct_mvdp_comb(const lw_mat *D, int E, const lw_mat *SD, const int *sel, const float *wt, int K, int T, const float *hg,
                        const float *hu, const float *sr, float *x, const float *add, int reps, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat dd, ds;
    lily_code rc = cu_upload_mats(m, D, E, &dd, st);
    if (!rc && SD) rc = cu_upload_mats(m, SD, 1, &ds, st);
    dlist L = { {0}, 0 };
    const int H = D->rows, I = D->cols, nh = T * K + (SD ? T : 0);
    int *dsel = (int *)dput(&L, sel, (size_t)T * K * 4, st, &rc);
    float *dwt = (float *)dput(&L, wt, (size_t)T * K * 4, st, &rc), *dhg = (float *)dput(&L, hg, (size_t)nh * I * 4, st, &rc);
    float *dhu = (float *)dput(&L, hu, (size_t)nh * I * 4, st, &rc), *dsr = (float *)dput(&L, sr, (size_t)T * 4, st, &rc);
    float *dx = (float *)dput(&L, x, (size_t)T * H * 4, st, &rc);
    float *da = add ? (float *)dput(&L, add, (size_t)T * H * 4, st, &rc) : NULL;
    for (int i = 0; !rc && i < reps; i++)
        if (!cu_mvdp_comb(0, &dd, SD ? &ds : NULL, dsel, dwt, K, T, dhg, dhu, dsr, dx, da))
            rc = lily_err(st, LILY_EUNSUPPORTED, "cu_mvdp_comb declined");
    rc = finish(st, rc);
    if (!rc) rc = dget(x, dx, (size_t)T * H * 4, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

lily_code lct_router(const float *logits, int T, int E, int K, int *sel, float *wt, lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *dl = (float *)dput(&L, logits, (size_t)T * E * 4, st, &rc);
    int *ds = (int *)dput(&L, NULL, (size_t)T * K * 4, st, &rc);
    float *dw = (float *)dput(&L, NULL, (size_t)T * K * 4, st, &rc);
    if (!rc) cu_router_topk(0, dl, T, E, K, ds, dw);
    rc = finish(st, rc);
    if (!rc) rc = dget(sel, ds, (size_t)T * K * 4, st);
    if (!rc) rc = dget(wt, dw, (size_t)T * K * 4, st);
    dfree(&L);
    return rc;
}

lily_code lct_router_exact(const lw_mat *W, const float *X, int T, int K, int splits, float *logits, int *sel, float *wt,
                           int *used, lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat d;
    lily_code rc = cu_upload_mats(m, W, 1, &d, st);
    dlist L = { {0}, 0 };
    const int E = W->rows, cols = W->cols;
    const size_t nscr = (size_t)16 * T * E;
    float *dx = (float *)dput(&L, X, (size_t)T * cols * 4, st, &rc), *dl = (float *)dput(&L, NULL, (size_t)T * E * 4, st, &rc);
    float *scr = (float *)dput(&L, NULL, nscr * 4, st, &rc), *dw = (float *)dput(&L, NULL, (size_t)T * K * 4, st, &rc);
    int *ds = (int *)dput(&L, NULL, (size_t)T * K * 4, st, &rc);
    const size_t nf = splits >= 0 ? cu_router_frag_floats(W->type, W->bits, W->group, E, cols) : 0;
    float *rf = nf ? (float *)dput(&L, NULL, nf * 4, st, &rc) : NULL;
    *used = 0;
    if (!rc && rf) cu_router_frag(0, &d, rf);
    if (!rc && rf) {
        /* the launch cu_router_exact_topk makes, run alone first to learn its S (same output) */
        cu_router_tc_splits(splits);
        *used = cu_router_tc(0, &d, rf, dx, cols, T, dl, E, scr, nscr);
    }
    if (!rc) cu_router_exact_topk(0, &d, rf, dx, cols, T, dl, scr, nscr, K, ds, dw);
    cu_router_tc_splits(0);
    rc = finish(st, rc);
    if (!rc) rc = dget(logits, dl, (size_t)T * E * 4, st);
    if (!rc) rc = dget(sel, ds, (size_t)T * K * 4, st);
    if (!rc) rc = dget(wt, dw, (size_t)T * K * 4, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}

lily_code lct_argmax(const float *x, int V, int out[2], lily_status *st) {
    dlist L = { {0}, 0 };
    lily_code rc = LILY_OK;
    float *dx = (float *)dput(&L, x, (size_t)V * 4, st, &rc);
    int *dout = (int *)dput(&L, NULL, 8, st, &rc);
    float *dp = (float *)dput(&L, NULL, 3 * CU_ARGMAX_PARTS1 * 4, st, &rc);
    if (!rc) cu_argmax(0, dx, V, dout, dp);
    rc = finish(st, rc);
    if (!rc) rc = dget(out, dout, 8, st);
    dfree(&L);
    return rc;
}

lily_code lct_sample(const float *logits, int V, const lily_sampling *p, const int32_t *counts,
                     const uint8_t *prompt_mask, uint64_t rng[2], int steps, lily_token *out, int *err,
                     lily_status *st) {
    cu_sampler *c = NULL;
    lily_code rc = cu_sampler_new(V, &c, st);
    if (rc) return rc;
    dlist L = { {0}, 0 };
    float *dx = (float *)dput(&L, logits, (size_t)V * 4, st, &rc);
    int *tok = (int *)dput(&L, NULL, 8, st, &rc), *step = (int *)dput(&L, NULL, 4, st, &rc);
    lcuda_sample_state ss = { counts, prompt_mask, { rng[0], rng[1] } };
    if (!rc) rc = cu_sampler_setup(c, 0, p, &ss, st);
    for (int i = 0; !rc && i < steps; i++) {
        cu_set_int(0, step, i);
        cu_sampler_enqueue(c, 0, dx, tok, step);
        rc = finish(st, rc);
        if (!rc) err[i] = cu_sampler_read(c, i, &out[i]);
    }
    if (!rc) rc = cu_sampler_rng(c, rng, st);
    dfree(&L);
    cu_sampler_free(c);
    return rc;
}

lily_code lct_gdn_dec(int fused, int steps, int nk, int nv, int K, const float *mixed, float *state, const float *cw, const float *bb,
                      const float *aa, const float *A_log, const float *dt_bias, float *S, const float *z, const float *gw, float eps,
                      float *o, lily_status *st) {
    const int dk = 128, dv = 128, cd = 2 * nk * dk + nv * dv, vd = nv * dv;
    dlist L = { {0}, 0 };
    lily_code rc = fused && !cu_gdn_dec_ok(nk, nv, dk, dv, K) ? lily_err(st, LILY_EINVAL, "cu_gdn_dec does not take the shape") : LILY_OK;
    float *dm = (float *)dput(&L, mixed, (size_t)steps * cd * 4, st, &rc), *ds = (float *)dput(&L, state, (size_t)cd * (K - 1) * 4, st, &rc);
    float *dw = (float *)dput(&L, cw, (size_t)cd * K * 4, st, &rc), *db = (float *)dput(&L, bb, (size_t)steps * nv * 4, st, &rc);
    float *da = (float *)dput(&L, aa, (size_t)steps * nv * 4, st, &rc), *dal = (float *)dput(&L, A_log, (size_t)nv * 4, st, &rc);
    float *ddt = (float *)dput(&L, dt_bias, (size_t)nv * 4, st, &rc), *dS = (float *)dput(&L, S, (size_t)nv * dk * dv * 4, st, &rc);
    float *dz = (float *)dput(&L, z, (size_t)steps * vd * 4, st, &rc), *dgw = (float *)dput(&L, gw, (size_t)dv * 4, st, &rc);
    float *dout = (float *)dput(&L, NULL, (size_t)steps * vd * 4, st, &rc), *du = (float *)dput(&L, NULL, (size_t)cd * 4, st, &rc);
    float *dg = (float *)dput(&L, NULL, (size_t)nv * 4, st, &rc), *dbeta = (float *)dput(&L, NULL, (size_t)nv * 4, st, &rc);
    unsigned *dc = (unsigned *)dput(&L, NULL, GDN_DEC_CNT * 4, st, &rc);
    if (!rc && cudaMemset(dc, 0, GDN_DEC_CNT * 4) != cudaSuccess) rc = lily_err(st, LILY_EDEVICE, "cudaMemset");
    for (int t = 0; t < steps && !rc; t++) { /* one launch a token, as decode runs them */
        const float *m = dm + (size_t)t * cd, *b = db + (size_t)t * nv, *a = da + (size_t)t * nv, *zt = dz + (size_t)t * vd;
        float *ot = dout + (size_t)t * vd;
        if (fused == 2) {
            if (!cu_gdn_dec_split(0, nk, nv, dk, dv, K, m, ds, dw, b, a, dal, ddt, dS, ot, dc))
                rc = lily_err(st, LILY_EINVAL, "cu_gdn_dec_split declined");
            else cu_gated_norm(0, ot, zt, dgw, 1, nv, dv, eps);
        } else if (fused) cu_gdn_dec(0, nk, nv, dk, dv, K, m, ds, dw, b, a, dal, ddt, dS, ot, zt, dgw, eps, dc);
        else {
            cu_gdn_prep1(0, m, ds, dw, K, nk, dk, nv * dv, b, a, dal, ddt, nv, du, dg, dbeta);
            if (!cu_gdn_rec_norm(0, 1, nk, nv, dk, dv, du, cd, dg, dbeta, dS, ot, zt, dgw, eps)) rc = lily_err(st, LILY_EINVAL, "no fused norm");
        }
    }
    rc = finish(st, rc);
    unsigned hc[GDN_DEC_CNT];
    if (!rc) rc = dget(o, dout, (size_t)steps * vd * 4, st);
    if (!rc) rc = dget(state, ds, (size_t)cd * (K - 1) * 4, st);
    if (!rc) rc = dget(S, dS, (size_t)nv * dk * dv * 4, st);
    if (!rc) rc = dget(hc, dc, sizeof hc, st);
    for (int i = 0; i < GDN_DEC_CNT && !rc; i++)
        if (hc[i]) rc = lily_err(st, LILY_EINVAL, "cu_gdn_dec left its counter %d at %u", i, hc[i]);
    dfree(&L);
    return rc;
}

lily_code lct_matvec_rows_gated(const lw_mat *W, const float *O, const float *Z, const float *gw, float eps, int T, float *Y,
                                lily_status *st) {
    lcuda_model *m = (lcuda_model *)calloc(1, sizeof *m);
    dmat d;
    lily_code rc = cu_upload_mats(m, W, 1, &d, st);
    if (!rc && !cu_mvq_ok(&d)) rc = lily_err(st, LILY_EUNSUPPORTED, "the matrix-vector kernel does not take this matrix");
    dlist L = { {0}, 0 };
    const int cols = W->cols;
    float *dox = (float *)dput(&L, O, (size_t)T * cols * 4, st, &rc);
    float *dz = (float *)dput(&L, Z, (size_t)T * cols * 4, st, &rc);
    float *dgw = (float *)dput(&L, gw, 128 * 4, st, &rc);
    float *dy = (float *)dput(&L, NULL, (size_t)T * W->rows * 4, st, &rc);
    if (!rc && !cu_mvdpt_gated(0, &d, dox, dz, dgw, eps, T, dy)) rc = lily_err(st, LILY_EUNSUPPORTED, "cu_mvdpt_gated declined");
    rc = finish(st, rc);
    if (!rc) rc = dget(Y, dy, (size_t)T * W->rows * 4, st);
    dfree(&L);
    lcuda_model_free(m);
    return rc;
}
