#include "cpu/cpu.h"
#include <math.h>
#include <stdlib.h>

/* The reference matmul, kept forever as the oracle the fast kernels (matmul.c) are
 * tested against: rows are split into blocks; each block dequantizes one weight row at a
 * time into a buffer and dots it with all T inputs. */
typedef struct {
    const lw_mat *W;
    const float *X;
    int T;
    float *Y;
    int rows_per;
} mm_ctx;

static void mm_block(void *p, int blk) {
    mm_ctx *c = p;
    const lw_mat *W = c->W;
    int r0 = blk * c->rows_per, r1 = r0 + c->rows_per;
    if (r1 > W->rows) r1 = W->rows;
    int n = W->cols;
    float stackbuf[4096];
    float *row = n <= 4096 ? stackbuf : malloc((size_t)n * sizeof *row);
    LILY_ASSERT(row);
    for (int r = r0; r < r1; r++) {
        lw_row_f32(W, r, row);
        for (int t = 0; t < c->T; t++) {
            const float *x = c->X + (size_t)t * n;
            float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int i = 0;
            for (; i + 4 <= n; i += 4) {
                s0 += row[i] * x[i]; s1 += row[i + 1] * x[i + 1];
                s2 += row[i + 2] * x[i + 2]; s3 += row[i + 3] * x[i + 3];
            }
            for (; i < n; i++) s0 += row[i] * x[i];
            c->Y[(size_t)t * W->rows + r] = (s0 + s1) + (s2 + s3);
        }
    }
    if (row != stackbuf) free(row);
}

void cpu_matmul_ref(lily_pool *pool, const lw_mat *W, const float *X, int T, float *Y) {
    int nth = lily_pool_size(pool);
    int rows_per = (W->rows + nth * 8 - 1) / (nth * 8);
    if (rows_per < 4) rows_per = 4;
    mm_ctx c = { W, X, T, Y, rows_per };
    lily_pool_run(pool, (W->rows + rows_per - 1) / rows_per, mm_block, &c);
}

void cpu_rmsnorm(const float *x, const float *w, int n, double eps, float *y) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = 0; i < n; i++) y[i] = x[i] * r * w[i];
}

void cpu_gdn_recurrent(int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk,
                       const float *v, int ldv, const float *g, const float *beta, float *S,
                       float *o, int ldo) {
    float *d = malloc((size_t)dv * sizeof *d);
    LILY_ASSERT(d);
    for (int t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * ldq, *kt = k + (size_t)t * ldk, *vt = v + (size_t)t * ldv;
        float decay = expf(g[t]);
        for (int i = 0; i < dk * dv; i++) S[i] *= decay;
        for (int j = 0; j < dv; j++) d[j] = 0;
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) d[j] += S[i * dv + j] * kt[i];
        for (int j = 0; j < dv; j++) d[j] = (vt[j] - d[j]) * beta[t];
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) S[i * dv + j] += kt[i] * d[j];
        float *ot = o + (size_t)t * ldo;
        for (int j = 0; j < dv; j++) ot[j] = 0;
        for (int i = 0; i < dk; i++)
            for (int j = 0; j < dv; j++) ot[j] += S[i * dv + j] * qt[i];
    }
    free(d);
}

/* Chunked form (model-spec 2.4): within a chunk of C rows, with G the running sum of g,
 * D[i][j] = exp(G_i - G_j) (j <= i), the unit-lower system (I + strict(Kb K^T . D)) X = B
 * gives U (B = V*beta) and W (B = K*beta*exp(G)); then Vn = U - W S,
 * O = (Q*exp(G)) S + (Q K^T . D) Vn and S' = exp(G_C) S + (K*exp(G_C - G))^T Vn. */
void cpu_gdn_chunked(int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk,
                     const float *v, int ldv, const float *g, const float *beta, float *S,
                     float *o, int ldo) {
    enum { CH = 64 };
    float *G = malloc(CH * sizeof *G), *A = malloc(CH * CH * sizeof *A);
    float *U = malloc((size_t)CH * dv * sizeof *U), *Wk = malloc((size_t)CH * dk * sizeof *Wk);
    LILY_ASSERT(G && A && U && Wk);
    for (int t0 = 0; t0 < T; t0 += CH) {
        int C = T - t0 < CH ? T - t0 : CH;
        const float *Q = q + (size_t)t0 * ldq, *K = k + (size_t)t0 * ldk, *Vv = v + (size_t)t0 * ldv;
        const float *bt = beta + t0;
        float acc = 0;
        for (int i = 0; i < C; i++) { acc += g[t0 + i]; G[i] = acc; }
        /* A = strict_lower((K beta) K^T . D) */
        for (int i = 0; i < C; i++)
            for (int j = 0; j < i; j++) {
                float s = 0;
                for (int e = 0; e < dk; e++) s += K[(size_t)i * ldk + e] * K[(size_t)j * ldk + e];
                A[i * CH + j] = s * bt[i] * expf(G[i] - G[j]);
            }
        /* forward substitution for U and Wk */
        for (int i = 0; i < C; i++) {
            for (int e = 0; e < dv; e++) U[(size_t)i * dv + e] = Vv[(size_t)i * ldv + e] * bt[i];
            float eg = expf(G[i]);
            for (int e = 0; e < dk; e++) Wk[(size_t)i * dk + e] = K[(size_t)i * ldk + e] * bt[i] * eg;
            for (int j = 0; j < i; j++) {
                float a = A[i * CH + j];
                for (int e = 0; e < dv; e++) U[(size_t)i * dv + e] -= a * U[(size_t)j * dv + e];
                for (int e = 0; e < dk; e++) Wk[(size_t)i * dk + e] -= a * Wk[(size_t)j * dk + e];
            }
        }
        /* Vn = U - Wk S (into U) */
        for (int i = 0; i < C; i++)
            for (int e = 0; e < dk; e++) {
                float w = Wk[(size_t)i * dk + e];
                for (int j = 0; j < dv; j++) U[(size_t)i * dv + j] -= w * S[(size_t)e * dv + j];
            }
        /* O = (Q exp(G)) S + (Q K^T . D) Vn */
        for (int i = 0; i < C; i++) {
            float *ot = o + (size_t)(t0 + i) * ldo;
            float eg = expf(G[i]);
            for (int j = 0; j < dv; j++) ot[j] = 0;
            for (int e = 0; e < dk; e++) {
                float qe = Q[(size_t)i * ldq + e] * eg;
                for (int j = 0; j < dv; j++) ot[j] += qe * S[(size_t)e * dv + j];
            }
            for (int m = 0; m <= i; m++) {
                float s = 0;
                for (int e = 0; e < dk; e++) s += Q[(size_t)i * ldq + e] * K[(size_t)m * ldk + e];
                s *= expf(G[i] - G[m]);
                for (int j = 0; j < dv; j++) ot[j] += s * U[(size_t)m * dv + j];
            }
        }
        /* S = exp(G_C) S + (K exp(G_C - G))^T Vn */
        float gl = G[C - 1], el = expf(gl);
        for (int e = 0; e < dk * dv; e++) S[e] *= el;
        for (int m = 0; m < C; m++) {
            float f = expf(gl - G[m]);
            for (int e = 0; e < dk; e++) {
                float ke = K[(size_t)m * ldk + e] * f;
                for (int j = 0; j < dv; j++) S[(size_t)e * dv + j] += ke * U[(size_t)m * dv + j];
            }
        }
    }
    free(G); free(A); free(U); free(Wk);
}
