/* Decode's router by linearity: the load-time layout of the router for the out-projection's
 * shares (cu_rlin in cu_common.h; the kernels are k_mvdp's CL -2 and -3 forms, cu_mvdp.cu).
 *
 * Why: the router group's launch (the router, the shared expert's gate, the residual add and the
 * norm) sits on every layer's path between the out-projection and the experts' gate|up. Leaving it
 * out, the gate|up staging the norm and routing on stale logits (a timing-only diagnostic), measured
 * +4.1% tg128 on an H100 (bench/RESULTS.md session 32); its logits can come from the out-projection
 * instead, since W_r t with t = (x + o) ln2 / rms is linear in o's rows but for the one scalar
 * 1 / rms, which the gate|up launch finds anyway while staging t.
 *
 * Measured (session 32, H100): exact (kernel test, the 35B-width model's 32 greedy tokens) but tg128
 * 501 against 537 (-6.5%; -5% with the L2 prefetch fork off): off (LILY_CU_RLIN=1 turns it on) until
 * the out-projection's added cost is found (its timeline was not taken).
 *
 * The layout: a warp of the out-projection owns four consecutive rows r .. r + 3 of o, so it needs
 * columns r .. r + 3 of every router row: word [r / 4][e] holds row e's four 8-bit codes there (the
 * stored order within a row, little-endian), and [H / 64][ldr] holds each group's (scale, bias) as
 * floats. The shared expert's gate is row E. Rows past ne are zero. 0.53 MB a 35B-A3B layer. */
#include "cuda/cu_common.h"
#include "cuda/cu_dev.h"

static int rlin_fits(const dmat *m, int rows, int H) {
    return m->type == LW_Q && m->bits == 8 && m->group == 64 && m->rows == rows && m->cols == H && H % 64 == 0 &&
           (m->sbt == LW_BF16 || m->sbt == LW_F16 || m->sbt == LW_F32);
}

size_t cu_rlin_words(const dmat *router, const dmat *shg, int H) {
    const int E = router->rows;
    if (E < 1 || E > 256 || !rlin_fits(router, E, H) || (shg && !rlin_fits(shg, 1, H))) return 0;
    const size_t ldr = (size_t)cu_rlin_ldr(E, shg != NULL);
    return ldr * (H / 4) + 2 * ldr * (H / 64);
}

/* one thread a word of q (four codes), then one a (group, row) of sb */
__global__ void k_rlin_make(dmat r, dmat sg, int has_sg, int H, int ldr, uint32_t *q, float2 *sb) {
    const size_t nq = (size_t)(H / 4) * ldr, ns = (size_t)(H / 64) * ldr;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nq + ns; i += (size_t)gridDim.x * blockDim.x) {
        const bool isq = i < nq;
        const size_t j = isq ? i : i - nq;
        const int e = (int)(j % ldr), c = (int)(j / ldr); /* c: a column quad, or a group */
        const bool sh = e == r.rows && has_sg;
        if (e >= r.rows && !sh) {
            if (isq) q[j] = 0u;
            else sb[j] = make_float2(0.f, 0.f);
            continue;
        }
        const dmat &m = sh ? sg : r;
        const int row = sh ? 0 : e;
        if (isq) q[j] = ((const uint32_t *)m.w)[((size_t)row * H + 4 * (size_t)c) / 4];
        else {
            const size_t gi = (size_t)row * (H / 64) + c;
            sb[j] = make_float2(ld_sb((const char *)m.s, m.sbt, gi), ld_sb((const char *)m.b, m.sbt, gi));
        }
    }
}

void cu_rlin_make(cudaStream_t s, const dmat *router, const dmat *shg, int H, uint32_t *out) {
    const int ldr = cu_rlin_ldr(router->rows, shg != NULL);
    cu_go(k_rlin_make, 256, 256, 0, s)(*router, shg ? *shg : *router, shg != NULL, H, ldr, out,
                                       (float2 *)(out + (size_t)ldr * (H / 4)));
}

int cu_rlin_ast(void) {
    static int a = INT_MIN;
    cu_env_int(&a, "LILY_CU_RLIN_AST", 1);
    return a < 1 ? 1 : a > RLIN_AST_MAX ? RLIN_AST_MAX : a;
}
