/* The CUDA backend's forward pass: a chunk of tokens as a sequence of kernel launches on the
 * session's stream (decode's graph captures the same for one token), the per-stage profile, the
 * logits rows and lcuda_forward. */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include <stdio.h>
#include <stdlib.h>
#include <limits.h>
#include <math.h>

/* ---- the forward pass ---- */
/* Optional per-stage timing (lcuda_profile): an event after each stage. */
#define PROF_MAX 8192
static struct {
    int on, n;
    cudaEvent_t ev[PROF_MAX];
    const char *lab[PROF_MAX];
} prof;
void cu_prof_mark(lcuda_session *s, const char *lab) {
    if (!prof.on || prof.n >= PROF_MAX) return;
    if (!prof.ev[prof.n]) cudaEventCreate(&prof.ev[prof.n]);
    prof.lab[prof.n] = lab;
    cudaEventRecord(prof.ev[prof.n++], s->st);
}
#define PM cu_prof_mark

/* Decode's weights into L2 ahead of their launches, on the second stream (cu_l2_prefetch): a
 * decode step's launches are latency chains that leave the DRAM mostly idle (a token reads 1.8 GB
 * in 2.6 ms, 16% of the H200's bandwidth), so a launch whose weights already sit in L2 waits less
 * on each load. Forks: a layer's out-projection and router group when its mixer starts; the
 * chosen experts' down and the next layer's in-projection once the top-k is known (the experts'
 * gate|up run meanwhile). Joined before the lm_head. Decode only (T <= 8): prefill's GEMMs keep
 * the DRAM busy themselves. */
/* LILY_CU_PF_PARTS, a mask of the forks: 1 the layer-start fork (out-projection, router group), 2 the
 * chosen experts' down, 4 the next layer's in-projection. 1 alone by default: on the H200 (session 21)
 * tg128 557.0 with it, 554.9 with none, 538.4 with all three, 521 with the downs alone, 504 with the
 * next in-projection alone; the prefetch launches' blocks take SM slots from the launches they serve,
 * which are bound by how many SMs stream their codes (bench/RESULTS.md). */
static int pf_parts(void) {
    static int v = INT_MIN;
    return cu_env_int(&v, "LILY_CU_PF_PARTS", 1) & 7;
}
static int pf_on(const lcuda_session *s, int T) { return T <= 8 && s->st2 && s->evp && cu_prefetch_enabled() && pf_parts(); }
/* the second stream waits for what the first has enqueued so far */
static void pf_wait(lcuda_session *s) {
    /* (a failed record or wait is the caller's cudaGetLastError, as a failed launch) */
    cudaEventRecord(s->evp, s->st);
    cudaStreamWaitEvent(s->st2, s->evp, 0);
}
static void pf_fork(lcuda_session *s, int n, const dmat *const *W, const int *sel, int slots) {
    pf_wait(s);
    cu_l2_prefetch(s->st2, n, W, sel, slots);
}
static void pf_join(lcuda_session *s) {
    cudaEventRecord(s->evp, s->st2);
    cudaStreamWaitEvent(s->st, s->evp, 0);
}
/* The layer-start fork: what the layer reads after its in-projection, the out-projection and the
 * router group (not a DeltaNet layer's state S: its prefetch finished after the delta rule it was
 * for, decode 2.5% slower, bench/RESULTS.md session 21), forked before the in-projection (late 0)
 * or, with LILY_CU_PF_LATE=1 (measured slower, session 25), after it (late 1, from the mixer), so
 * its DRAM traffic does not meet the in-projection's staging. */
static void pf_layer(lcuda_session *s, const cu_layer *L, int T, int late) {
    static int v = -1;
    if (!pf_on(s, T) || !(pf_parts() & 1) || cu_env_flag(&v, "LILY_CU_PF_LATE", 0) != late) return;
    const dmat *W[6] = { L->full ? &L->o : &L->out, &L->router, &L->sh_gate, &L->sh_up, &L->sh_router, &L->sh_down };
    pf_fork(s, s->m->cfg.shared_inter ? 6 : 2, W, NULL, 0);
}
/* the mixer's input projections (what the layer reads first) */
static int pf_mixer_in(const cu_layer *L, const dmat **W) {
    if (L->full) { W[0] = &L->q; W[1] = &L->k; W[2] = &L->v; return 3; }
    W[0] = &L->qkv; W[1] = &L->z; W[2] = &L->b; W[3] = &L->a;
    return 4;
}

/* Whether xpx holds X packed for the GEMM about to read X (the producer's _p form wrote it: no
 * k_xp_pack launch). A GEMM that packs its own input into xpx ends that (xp_used). Prefill's three
 * a layer that go this way: the norms' t (in-projection, experts, shared expert) and the gated
 * norm's o (out-projection). */
static int xp_ready(const lcuda_session *s, const float *X) { return X && s->xp_src == X; }
/* where a producer writes its packed output: xpx, or NULL with LILY_CU_XP_OUT=0 (the GEMMs pack
 * their inputs themselves, for measuring) */
static uint16_t *xp_out(const lcuda_session *s) {
    static int on = -1;
    return cu_env_flag(&on, "LILY_CU_XP_OUT", 1) ? s->xpx : NULL;
}
static void xp_used(lcuda_session *s, int ready) { if (!ready) s->xp_src = NULL; }

/* One prefill projection, Y [T][W->rows] = X W^T: through the packed-input tensor-core GEMM where
 * it takes the matrix, else cu_matmul. */
/* Whether a pass of T rows takes the matrix-vector kernels (fp32 or the exact integer form, as one
 * token's step) rather than the tensor-core GEMMs (fp16 inputs): decode (T <= 8) and decode batches of
 * up to LILY_CU_BATCH_MV rows (default 16), so that a session's tokens do not depend on how many others
 * share its batch (bench/RESULTS.md session 27). Larger batches take the GEMMs, which read each
 * weight once for all rows. */
static int mv_pass(const lcuda_session *s, int T) {
    static int mx = INT_MIN;
    return T <= 8 || (s->rows && T <= cu_env_int(&mx, "LILY_CU_BATCH_MV", 16));
}
static int mv_rows_ok(const lcuda_session *s, int T) { return T == 1 || (mv_pass(s, T) && cu_mvqb_enabled()); }

/* T rows of W X into Y through cu_matvec_rows where mv_pass wants it past cu_matmul's 8 rows */
static int proj_mv(lcuda_session *s, const dmat *W, const float *X, int ldx, int T, float *Y) {
    if (T <= 8 || !mv_rows_ok(s, T) || !cu_mvq_ok(W)) return 0;
    const int ld = W->rows;
    cu_matvec_rows(s->st, 1, &W, X, NULL, ldx, T, &Y, &ld);
    return 1;
}
static void proj(lcuda_session *s, const dmat *W, const float *X, int ldx, int T, float *Y) {
    if (proj_mv(s, W, X, ldx, T, Y)) return;
    const int in = xp_ready(s, X);
    if (!cu_gemm_tc_xp2(s->st, W, X, ldx, T, Y, NULL, W->rows, s->xpx, in)) cu_matmul(s->st, W, X, ldx, T, Y, W->rows);
    xp_used(s, in);
}
/* A mixer's out-projection into s->y, which the residual add reads with s->y2: the launch may
 * split its columns in two (cu_gemm_tc_xp2), the second part into s->D (the experts' down
 * outputs, free until this layer's experts run). */
static void proj_out(lcuda_session *s, const dmat *W, const float *X, int ldx, int T) {
    s->y2 = NULL;
    if (proj_mv(s, W, X, ldx, T, s->y)) return;
    const int in = xp_ready(s, X);
    const int parts = cu_gemm_tc_xp2(s->st, W, X, ldx, T, s->y, s->D, W->rows, s->xpx, in);
    xp_used(s, in);
    if (!parts) cu_matmul(s->st, W, X, ldx, T, s->y, W->rows);
    s->y2 = parts == 2 ? s->D : NULL;
}

static void proj_group(lcuda_session *s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y) {
    int ok = mv_rows_ok(s, T) && n <= MVQ_MAX, ld[MVQ_MAX];
    for (int i = 0; i < n && ok; i++) {
        ok = cu_mvq_ok(W[i]) && W[i]->cols == W[0]->cols;
        ld[i] = W[i]->rows;
    }
    if (ok) { cu_matvec_rows(s->st, n, W, X, NULL, ldx, T, Y, ld); return; }
    const int in = xp_ready(s, X);
    const int done = !mv_pass(s, T) && cu_gemm_tc_group(s->st, n, W, X, ldx, T, Y, s->xpx, in); /* prefill: one launch for the group */
    xp_used(s, in);
    if (done) return;
    for (int i = 0; i < n; i++) cu_matmul(s->st, W[i], X, ldx, T, Y[i], W[i]->rows);
}

/* one row's products W x with the norm a folded combine left (s->fold_nw) staged by the launch */
static void fold_matvec(lcuda_session *s, int n, const dmat *const *W, float *const *Y) {
    LILY_ASSERT(s->fold_nw && n <= MVQ_MAX);
    mvq_fuse fu;
    memset(&fu, 0, sizeof fu);
    fu.nw = s->fold_nw; fu.eps = (float)s->m->cfg.eps; fu.tout = s->t;
    cu_matvec_group(s->st, n, W, s->x, NULL, s->m->cfg.hidden, Y, NULL, NULL, 1, 1, &fu);
    s->fold_nw = NULL;
}
/* A mixer's input projections of t. After a folded combine (s->fold_nw, decode) x holds the
 * layer's input before its norm: the launch normalizes it while staging (mvq_fuse.nw; every
 * matrix-vector kernel but k_mvtc, which declines, does) and writes t, as the combine did. */
/* T rows (a batch's combine folded into its down, cu_mvdp_comb with T rows): the norm in the rows
 * kernels' staging (cu_mvdpb_norm), else its own launch before the products */
static void fold_rows(lcuda_session *s, int n, const dmat *const *W, int T, float *const *Y) {
    const int H = s->m->cfg.hidden;
    const float eps = (float)s->m->cfg.eps;
    int ld[MVQ_MAX];
    LILY_ASSERT(n <= MVQ_MAX);
    for (int i = 0; i < n; i++) ld[i] = W[i]->rows;
    if (!cu_mvdpb_norm(s->st, n, W, s->x, H, T, Y, ld, s->fold_nw, eps, s->t)) {
        cu_rmsnorm(s->st, s->x, NULL, s->fold_nw, H, T, eps, s->t);
        proj_group(s, n, W, s->t, H, T, Y);
    }
    s->fold_nw = NULL;
}
static void proj_in(lcuda_session *s, int n, const dmat *const *W, int T, float *const *Y) {
    if (!s->fold_nw) {
        proj_group(s, n, W, s->t, s->m->cfg.hidden, T, Y);
        return;
    }
    if (T > 1) fold_rows(s, n, W, T, Y);
    else fold_matvec(s, n, W, Y);
}
/* Whether L's input projections (L NULL: the lm_head) can take the norm that a folded combine
 * leaves to them: the one-row matrix-vector kernels (proj_group's condition for one row) */
static int fold_in_ok(const lcuda_session *s, const cu_layer *L) {
    const dmat *W[4] = { &s->m->lm_head };
    const int n = L ? pf_mixer_in(L, W) : 1;
    for (int i = 0; i < n; i++)
        if (!cu_mvq_ok(W[i]) || W[i]->cols != s->m->cfg.hidden) return 0;
    return 1;
}

/* One token's out-projection of o before its gated norm (cu_gdn_dec_split): the norm
 * in the out-projection's staging, or a launch of its own */
static void gdn_out_gated(lcuda_session *s, const cu_layer *L) {
    const lily_config *c = &s->m->cfg;
    static int fold = -1; /* LILY_CU_GATED_FOLD=0: the norm's own launch, for measuring */
    if (cu_env_flag(&fold, "LILY_CU_GATED_FOLD", 1) && cu_matvec_gated(s->st, &L->out, s->o, s->zb, L->gnorm, (float)c->eps, s->y))
        s->y2 = NULL;
    else {
        cu_gated_norm(s->st, s->o, s->zb, L->gnorm, 1, c->lin_nv, c->lin_dv, (float)c->eps);
        proj_out(s, &L->out, s->o, cfg_val_dim(c), 1);
    }
    PM(s, "gated norm + gdn out-proj");
}

static void mixer_gdn(lcuda_session *s, const cu_layer *L, int li, int T) {
    const lily_config *c = &s->m->cfg;
    cudaStream_t q = s->st;
    int cd = cfg_conv_dim(c), vd = cfg_val_dim(c), nv = c->lin_nv;
    const dmat *W[4] = { &L->qkv, &L->z, &L->b, &L->a };
    float *Y[4] = { s->mixed, s->zb, s->bb, s->aa };
    proj_in(s, 4, W, T, Y);
    pf_layer(s, L, T, 1);
    s->xp_src = NULL; /* (o is written below) */
    PM(s, "gdn in-proj qkv|z|b|a");
    if (s->rows) { /* decode batch: each row one step on its own session's conv and S */
        cu_rows R = *s->rows;
        R.conv_off = (long long)li * s->conv_n;
        R.S_off = (long long)li * s->S_n;
        /* the one-token step's split form over the rows (conv in the launch), the gated norm after it */
        if (cu_gdn_dec_split_rows(q, &R, T, c->lin_nk, nv, c->lin_dk, c->lin_dv, c->conv_k, s->mixed, L->conv_w, s->bb, s->aa,
                                  L->A_log, L->dt_bias, s->o, s->fcount + 2)) {
            PM(s, "gdn conv+norm+gates + delta rule");
            /* the gated norm in the out-projection's staging where k_mvdpt runs the batch's products */
            if (T <= 16 && cu_mvdpt_on(T) && cu_mvq_ok(&L->out) && cu_mvdpt_gated(q, &L->out, s->o, s->zb, L->gnorm, (float)c->eps, T, s->y))
                s->y2 = NULL;
            else {
                cu_gated_norm(q, s->o, s->zb, L->gnorm, T, nv, c->lin_dv, (float)c->eps);
                proj_out(s, &L->out, s->o, vd, T);
            }
            PM(s, "gated norm + gdn out-proj");
            return;
        }
        cu_gdn_prep1_rows(q, &R, T, s->mixed, L->conv_w, c->conv_k, c->lin_nk, c->lin_dk, vd, s->bb, s->aa, L->A_log, L->dt_bias,
                          nv, s->u, s->g, s->beta);
        PM(s, "gdn conv+norm+gates");
        if (!cu_gdn_rec_rows(q, &R, T, c->lin_nk, nv, c->lin_dk, c->lin_dv, s->u, cd, s->g, s->beta, s->o, s->zb, L->gnorm, (float)c->eps))
            cu_gated_norm(q, s->o, s->zb, L->gnorm, T, nv, c->lin_dv, (float)c->eps);
        PM(s, "gdn delta rule + gated norm");
        proj_out(s, &L->out, s->o, vd, T);
        PM(s, "gdn out-proj");
        return;
    }
    float *conv = s->conv + (size_t)li * s->conv_n, *S = s->S + (size_t)li * s->S_n;
    if (T == 1 && cu_gdn_dec_split(q, c->lin_nk, nv, c->lin_dk, c->lin_dv, c->conv_k, s->mixed, conv, L->conv_w, s->bb, s->aa,
                                   L->A_log, L->dt_bias, S, s->o, s->fcount + 2)) {
        /* o before its gated norm: the out-projection's staging applies it, or a launch of its own */
        PM(s, "gdn conv+norm+gates + delta rule");
        gdn_out_gated(s, L);
        return;
    }
    if (T == 1 && cu_gdn_dec(q, c->lin_nk, nv, c->lin_dk, c->lin_dv, c->conv_k, s->mixed, conv, L->conv_w, s->bb, s->aa, L->A_log,
                             L->dt_bias, S, s->o, s->zb, L->gnorm, (float)c->eps, s->fcount + 2)) {
        PM(s, "gdn conv+norm+gates + delta rule + gated norm");
        proj_out(s, &L->out, s->o, vd, T);
        PM(s, "gdn out-proj");
        return;
    }
    if (T == 1) cu_gdn_prep1(q, s->mixed, conv, L->conv_w, c->conv_k, c->lin_nk, c->lin_dk, vd, s->bb, s->aa, L->A_log, L->dt_bias, nv, s->u, s->g, s->beta);
    else {
        const cu_gates G = { s->bb, s->aa, L->A_log, L->dt_bias, nv, s->g, s->beta };
        const int normed = cu_conv(q, s->mixed, conv, L->conv_w, cd, c->conv_k, T, s->u, c->lin_nk, c->lin_dk, &G);
        cu_gdn_prep(q, s->u, T, cd, c->lin_nk, c->lin_dk, NULL, NULL, NULL, NULL, nv, s->g, s->beta, normed);
    }
    PM(s, "gdn conv+norm+gates");
    if ((T >= 64 && cu_gdn_chunk_enabled() &&
         cu_gdn_chunked(q, T, c->lin_nk, nv, c->lin_dk, c->lin_dv, s->u, cd, s->g, s->beta, S, s->o, s->gdn_scr)) ||
        (T > 1 && cu_gdn_staged(q, T, c->lin_nk, nv, c->lin_dk, c->lin_dv, s->u, cd, s->g, s->beta, S, s->o))) {
        if (cu_gated_norm_p(q, s->o, s->zb, L->gnorm, T, nv, c->lin_dv, (float)c->eps, xp_out(s))) s->xp_src = s->o;
    } else if (!cu_gdn_rec_norm(q, T, c->lin_nk, nv, c->lin_dk, c->lin_dv, s->u, cd, s->g, s->beta, S, s->o, s->zb, L->gnorm, (float)c->eps)) {
        cu_gdn_rec(q, T, c->lin_nk, nv, c->lin_dk, c->lin_dv, s->u, cd, s->g, s->beta, S, s->o);
        cu_gated_norm(q, s->o, s->zb, L->gnorm, T, nv, c->lin_dv, (float)c->eps);
    }
    PM(s, "gdn delta rule + gated norm");
    proj_out(s, &L->out, s->o, vd, T);
    PM(s, "gdn out-proj");
}

static void mixer_attn(lcuda_session *s, const cu_layer *L, int fi, int T) {
    const lily_config *c = &s->m->cfg;
    cudaStream_t q = s->st;
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    const dmat *W[3] = { &L->q, &L->k, &L->v };
    float *Y[3] = { s->qg, s->kb, s->vb };
    proj_in(s, 3, W, T, Y);
    pf_layer(s, L, T, 1);
    s->xp_src = NULL;
    PM(s, "attn in-proj q|k|v");
    if (s->rows) { /* decode batch: each row at its own position in its own session's cache */
        cu_rows R = *s->rows;
        R.kv_off = (long long)fi * s->kv_n;
        cu_qk_prep_rows(q, &R, T, s->qg, s->q, s->kb, s->vb, L->q_norm, L->k_norm, nh, nkv, hd, c->rot_dim, s->m->inv_freq, (float)c->eps);
        PM(s, "attn q/k norm + rope + cache");
        cu_attention_rows(q, &R, T, s->q, s->qg, nh, nkv, hd, cu_decode_splits(s, T), s->part, s->ao, s->attn_tc);
        PM(s, "attn core");
        proj_out(s, &L->o, s->ao, nh * hd, T);
        PM(s, "attn out-proj");
        return;
    }
    uint16_t *kc = s->kc + (size_t)fi * s->kv_n, *vc = s->vc + (size_t)fi * s->kv_n;
    if (T == 1 && cu_qk_fold_enabled() && cu_attention_dec(q, s->qg, s->kb, s->vb, L->q_norm, L->k_norm, nh, nkv, hd, c->rot_dim, s->m->inv_freq,
                                   (float)c->eps, s->d_pos, kc, vc, DECODE_SPLITS, s->part, s->ao, cu_dec_kmin(), s->attn_tc)) {
        PM(s, "attn q/k norm + rope + cache + core");
        proj_out(s, &L->o, s->ao, nh * hd, T);
        PM(s, "attn out-proj");
        return;
    }
    cu_qk_prep(q, s->qg, s->q, s->kb, s->vb, L->q_norm, L->k_norm, T, nh, nkv, hd, c->rot_dim, s->m->inv_freq,
               (float)c->eps, s->d_pos, kc, vc);
    PM(s, "attn q/k norm + rope + cache");
    /* s->D (the experts' down outputs) is free until this layer's out-projection: the fp16 keys' scratch */
    if (T > 1 && s->hpos >= 0)
        cu_attention_h16(q, s->q, s->qg, kc, vc, T, nh, nkv, hd, s->d_pos, s->hpos, s->D, moe_d_floats(s->m) * sizeof(float),
                         s->part, s->ao);
    else cu_attention(q, s->q, s->qg, kc, vc, T, nh, nkv, hd, s->d_pos, T == 1 ? DECODE_SPLITS : 1, s->part, s->ao, cu_dec_kmin(),
                      T == 1 && s->attn_tc);
    PM(s, "attn core");
    proj_out(s, &L->o, s->ao, nh * hd, T);
    PM(s, "attn out-proj");
}

/* MoE; leaves x += moe(t) and, with nw, t = rmsnorm(x) * nw for the next layer. */
/* Decode's MoE in two launches fewer: the router group's launch also adds the mixer's output
 * to the residual and normalizes (mvq_fuse.add), and picks the top-k (mvq_fuse.sel). It needs
 * the group's four matrices on the matrix-vector kernel and the E logits to fit its staged input.
 * A pass of 2-8 rows (a decode batch, a short prefill) takes the residual and norm the same way,
 * a slot a row (LILY_CU_BATCH_FUSE=0: its own launch, for measuring), where its out-projection
 * wrote y whole (no second part in y2). */
static int moe_fused(const lcuda_session *s, const cu_layer *L, int T) {
    const lily_config *c = &s->m->cfg;
    static int bf = -1;
    if (T > 1 && (T > 8 || s->y2 || !mv_pass(s, T) || !cu_env_flag(&bf, "LILY_CU_BATCH_FUSE", 1))) return 0;
    if (!cu_fuse_enabled() || c->n_experts > c->hidden) return 0;
    const dmat *W[4] = { &L->router, &L->sh_gate, &L->sh_up, &L->sh_router };
    for (int i = 0; i < (c->shared_inter ? 4 : 1); i++)
        if (!cu_mvq_ok(W[i]) || W[i]->cols != c->hidden) return 0;
    return 1;
}

/* With moe_fused, the shared expert also rides in the routed experts' two launches as slot K
 * (its gate|up rows beside theirs, its down after), one launch a layer fewer and a router
 * group of 257 rows instead of 1,281 (LILY_CU_SHSLOT=0: its own launches, for measuring).
 * It needs the shared expert's shapes to equal an expert's. */
static int moe_shared_slot(const lcuda_session *s, const cu_layer *L) {
    static int on = -1;
    const lily_config *c = &s->m->cfg;
    return cu_env_flag(&on, "LILY_CU_SHSLOT", 1) && c->shared_inter == c->moe_inter && cu_mvq_ok(&L->sh_down) &&
           cu_mvq_ok(&L->gate) && cu_mvq_ok(&L->up) && cu_mvq_ok(&L->down) && /* the experts' launches it rides in */
           L->sh_gate.rows == L->gate.rows && L->sh_up.rows == L->up.rows && L->sh_down.rows == L->down.rows &&
           L->sh_down.cols == L->down.cols && L->sh_gate.cols == L->gate.cols;
}

/* The shared expert at prefill (T > 8) on the session's second stream, beside the router, the
 * top-k, the sort and the routed experts on the first: gate+up+SwiGLU, its exact gate, down, into
 * sg, sr and SD, with its own packing scratch (xps). Nothing there reads what the routed side
 * writes, and the combine waits for it (evj); the next layer's forks after that combine. Worth
 * ~37 us a layer at 512 tokens that the routed experts' launches hide (RESULTS.md). */
static void moe_shared_side(lcuda_session *s, const cu_layer *L, int T) {
    const lily_config *c = &s->m->cfg;
    const int H = c->hidden, SI = c->shared_inter;
    cudaStream_t q2 = s->st2;
    /* t's packed form where the norm left it in xpx: read there (nothing on the first stream
     * writes xpx before the combine, which waits for this side) */
    const int in = xp_ready(s, s->t);
    if (!cu_gemm_swiglu(q2, &L->sh_gate, &L->sh_up, s->t, H, T, s->sg, SI, in ? s->xpx : s->xps, in)) {
        cu_matmul(q2, &L->sh_gate, s->t, H, T, s->sg, SI);
        cu_matmul(q2, &L->sh_up, s->t, H, T, s->su, SI);
        cu_swiglu(q2, s->sg, s->su, s->sg, (long long)T * SI);
    }
    cu_matmul_exact(q2, &L->sh_router, s->t, H, T, s->sr, 1, NULL, 0);
    if (!cu_gemm_tc_xp2(q2, &L->sh_down, s->sg, SI, T, s->SD, NULL, H, s->xps, 0)) cu_matmul(q2, &L->sh_down, s->sg, SI, T, s->SD, H);
}

/* add: the mixer's output when moe_fused (the residual add and norm not done yet), else NULL.
 * next: the next layer (its in-projection is prefetched in decode), or NULL. */
static void moe(lcuda_session *s, const cu_layer *L, const cu_layer *next, int T, const float *nw, const float *add) {
    const lily_config *c = &s->m->cfg;
    cudaStream_t q = s->st;
    int H = c->hidden, E = c->n_experts, K = c->top_k, I = c->moe_inter, SI = c->shared_inter;
    /* the experts on the matrix-vector kernels by slot (decode and its batches) */
    const int mvx = cu_mvq_ok(&L->gate) && cu_mvq_ok(&L->up) && cu_mvq_ok(&L->down);
    /* the router group: matrices reading the layer's normed input */
    const dmat *RW[4] = { &L->router, &L->sh_gate, &L->sh_up, &L->sh_router };
    float *RY[4] = { s->rl, s->sg, s->su, s->sr };
    /* with the shared expert riding in the experts' launches: the router and its gate alone */
    const dmat *RW2[2] = { &L->router, &L->sh_router };
    float *RY2[2] = { s->rl, s->sr };
    const int shx = add && T == 1 && SI && moe_shared_slot(s, L);
    /* A batch's (or a short pass's) shared expert rides in the experts' two launches too, one slot
     * a token after the T K routed ones (mvq_fuse.xslot = T K): the router group shrinks to the
     * router and the shared gate (257 rows instead of 1,281) and its own down launch goes
     * (LILY_CU_BATCH_SHSLOT=0: the shared expert in those launches, for measuring). Up to 8 rows:
     * each slot's blocks read the shared expert's weights, so at 16 rows it measured 6% slower
     * than the rows kernels that read them once (H100, bench/RESULTS.md session 42). Its rows of
     * hg, hu and D must fit the buffers sized for a chunk's T K + 1. */
    static int bsh = -1;
    const int shb = T > 1 && T <= 8 && mv_pass(s, T) && SI && mvx && cu_env_flag(&bsh, "LILY_CU_BATCH_SHSLOT", 1) &&
                    moe_shared_slot(s, L) && (size_t)T * (K + 1) <= (size_t)s->m->chunk * K + 1;
    const int side = !add && !mv_pass(s, T) && SI && s->st2; /* the shared expert on the second stream */
    int sh_swiglu = 0; /* sg holds silu(gate) * up already */
    int route = 0; /* the experts' gate|up launch routes itself (mvq_fuse.rlog): no top-k launch */
    if (add) {
        int ld[4] = { E, SI, SI, 1 };
        mvq_fuse fu;
        memset(&fu, 0, sizeof fu);
        fu.add = add; fu.nw = L->ln2; fu.eps = (float)c->eps; fu.tout = s->t;
        /* The top-k in its own launch after the group: faster on the H200 (tg128 381.9 -> 384.2) than
         * by the group's last block, which waits for the others (RESULTS.md). LILY_CU_TOPK_APART=0:
         * by the last block (mvq_fuse.sel), for measuring. */
        static int apart = -1;
        if (T == 1 && !cu_env_flag(&apart, "LILY_CU_TOPK_APART", 1)) { fu.E = E; fu.K = K; fu.sel = s->sel; fu.wt = s->wt; fu.count = s->fcount; }
        if (shx || shb) { /* (a slot a row) */
            int ld2[2] = { E, 1 };
            cu_matvec_group(q, 2, RW2, s->x, NULL, H, RY2, ld2, NULL, 1, T, &fu);
        } else cu_matvec_group(q, SI ? 4 : 1, RW, s->x, NULL, H, RY, ld, NULL, 1, T, &fu);
        route = !fu.sel && T == 1 && cu_route_fused() && E <= 256 && K <= 32;
        if (!fu.sel && !route && T == 1) cu_router_topk(q, s->rl, T, E, K, s->sel, s->wt);
        PM(s, "moe residual+norm|router|shared gate|up|gate|top-k");
    } else if (shb) {
        proj_group(s, 2, RW2, s->t, H, T, RY2);
    } else if (mv_pass(s, T)) {
        proj_group(s, SI ? 4 : 1, RW, s->t, H, T, RY);
    } else { /* the router and the shared expert's gate decide (which experts, how much of the
              * shared one): exact fp32 tiles, so routing does not turn on the tensor cores'
              * 10-bit mantissas (a near-tie in tests/fixtures/tinyq flipped an expert) */
        /* s->D (the experts' down outputs, [T*K][H]) is free until the experts run */
        if (side) { /* (a failed record or wait is the caller's cudaGetLastError, as a failed launch) */
            cudaEventRecord(s->evf, q);
            cudaStreamWaitEvent(s->st2, s->evf, 0);
            moe_shared_side(s, L, T);
            cudaEventRecord(s->evj, s->st2);
        }
        cu_router_exact_topk(q, &L->router, L->rtr, s->t, H, T, s->rl, s->D, (size_t)T * K * H, K, s->sel, s->wt);
        if (SI && !side) {
            /* the shared gate and up, sg = silu(gate) * up in one launch where the kernel takes them */
            const int in = xp_ready(s, s->t);
            sh_swiglu = cu_gemm_swiglu(q, &L->sh_gate, &L->sh_up, s->t, H, T, s->sg, SI, s->xpx, in);
            xp_used(s, in);
            if (!sh_swiglu) proj_group(s, 2, RW + 1, s->t, H, T, RY + 1);
            cu_matmul_exact(q, &L->sh_router, s->t, H, T, s->sr, 1, NULL, 0);
        }
    }
    if (!add || T > 1) { /* (T > 1 with add: the router group above took the residual and norm) */
        if (!add) PM(s, "moe router|shared gate|up|gate (+ top-k past 8 rows)");
        /* a decode batch's gate|up launch routes each token itself, as one token's does (the top-k
         * launch gone; LILY_CU_BATCH_ROUTE=0 restores it, for measuring: +0.3-0.7% on an H100) */
        static int broute = -1;
        if (mv_pass(s, T) && T > 1 && cu_env_flag(&broute, "LILY_CU_BATCH_ROUTE", 1) && cu_route_fused() && E <= 256 && K <= 32 &&
            !shx && mvx)
            route = 1;
        else if (mv_pass(s, T)) cu_router_topk(q, s->rl, T, E, K, s->sel, s->wt);
        PM(s, "moe top-k");
    }
    if (pf_on(s, T) && (pf_parts() & 6)) { /* the chosen experts' down, then the next layer's in-projection */
        const dmat *Wd[1] = { &L->down }, *Wn[4];
        if (!(pf_parts() & 2) || (route && T > 1)) pf_wait(s);
        else if (route) { /* the prefetch routes itself too: sel is written by the gate|up launch */
            pf_wait(s);
            cu_l2_prefetch_routed(s->st2, 1, Wd, s->rl, E, K);
        } else pf_fork(s, 1, Wd, s->sel, T * K);
        if (next && (pf_parts() & 4)) cu_l2_prefetch(s->st2, pf_mixer_in(next, Wn), Wn, NULL, 0);
    }
    const int *pos = NULL;
    if (mv_pass(s, T)) { /* decode (and its batches, mv_pass): one matrix-vector pass per (token, expert) slot */
        const dmat *W[2] = { &L->gate, &L->up };
        float *Y[2] = { s->hg, s->hu };
        int ld[2] = { I, I };
        if (mvx) {
            /* shx (T = 1): slot K is the shared expert, reading token 0, writing row K */
            mvq_fuse xg, xd;
            memset(&xg, 0, sizeof xg);
            memset(&xd, 0, sizeof xd);
            /* shb: slots T K .. T K + T - 1, token j's reading t row j, its down hg row T K + j */
            const int nx = shx ? 1 : shb ? T : 0;
            if (nx) {
                xg.xslot = xd.xslot = T * K;
                xg.xm[0] = L->sh_gate; xg.xm[1] = L->sh_up; xg.xrow = 0;
                xd.xm[0] = L->sh_down; xd.xrow = T * K;
            }
            if (route) { xg.rlog = s->rl; xg.E = E; xg.K = K; xg.rsel = s->sel; xg.rwt = s->wt; }
            cu_matvec_group(q, 2, W, s->t, NULL, H, Y, ld, s->sel, K, T * K + nx, nx || route ? &xg : NULL);
            PM(s, "moe experts gate|up");
            /* one token with the shared expert riding (or none), and a next layer whose
             * in-projection (or an lm_head) can take the norm: the combine folded into the down
             * launch, the norm left to that launch (a launch a layer fewer; LILY_CU_FOLD=0 for
             * measuring) */
            /* A batch (or short pass) of 2 rows the same, its shared expert riding (shb, or none), a
             * token a grid row, when a next layer's in-projections follow (cu_mvdpb_norm stages the
             * norm; the lm_head's rows keep the combine's). Only 2: the launch is a block an SM (288
             * threads of 128 registers) and T x 128 blocks, so 4 and 8 rows ran in 4 and 8 waves
             * and lost 7% and 12% against the down and the combine, where 2 gained 0.5% (H100,
             * bench/RESULTS.md session 43). LILY_CU_BATCH_COMB=N: up to N rows (at most 8; 0 none),
             * for measuring. */
            static int bcomb = INT_MIN;
            const int cmax = cu_env_int(&bcomb, "LILY_CU_BATCH_COMB", 2);
            const int rows_fold = T > 1 && T <= 8 && T <= cmax && (shb || !SI) && next;
            if ((T == 1 ? (shx || !SI) : rows_fold) && cu_mvdp_comb_enabled() && fold_in_ok(s, next) &&
                cu_mvdp_comb(q, &L->down, nx ? &L->sh_down : NULL, s->sel, s->wt, K, T, s->hg, s->hu, s->sr, s->x, add)) {
                s->fold_nw = nw;
                s->xp_src = NULL;
                PM(s, "moe experts swiglu+down + combine");
                return;
            }
            const dmat *Wd[1] = { &L->down };
            float *Yd[1] = { s->D };
            int ldd[1] = { H };
            cu_matvec_group(q, 1, Wd, s->hg, s->hu, I, Yd, ldd, s->sel, 1, T * K + nx, nx ? &xd : NULL);
            PM(s, "moe experts swiglu+down");
        } else {
            cu_matmul_slots(q, &L->gate, s->sel, s->t, K, H, T * K, s->hg, I);
            cu_matmul_slots(q, &L->up, s->sel, s->t, K, H, T * K, s->hu, I);
            cu_swiglu(q, s->hg, s->hu, s->hg, (long long)T * K * I);
            cu_matmul_slots(q, &L->down, s->sel, s->hg, 1, I, T * K, s->D, H);
            PM(s, "moe experts");
        }
    } else { /* prefill: tokens sorted by expert, one tiled GEMM per expert */
        dsort so = { s->cnt, s->off, s->src, s->spos, NULL };
        int bt = cu_moe_tile_rows(T * K, E), mt = cu_moe_max_tiles(T * K, E, bt);
        const int tc = E <= 1024 && cu_gemm_q4_enabled() && cu_gemm_q4_ok(&L->gate, s->t, H) && cu_gemm_q4_ok(&L->up, s->t, H) &&
                       cu_gemm_q4_ok(&L->down, s->hg, I);
        if (tc) cu_moe_sort_tiles(q, s->sel, T * K, E, s->cnt, s->off, s->src, s->spos, bt, s->tiles, mt);
        else cu_moe_sort(q, s->sel, T * K, E, s->cnt, s->off, s->src, s->spos);
        PM(s, "moe sort (+ tile map)");
        if (tc) { /* FP16 tensor cores over the (expert, tile) map */
            so.tiles = s->tiles;
            const int in = xp_ready(s, s->t);
            const int xp = cu_moe_gate_up_xp(q, &L->gate, &L->up, &L->down, &so, bt, mt, K, s->t, H, T, s->xpx, s->xph, in);
            xp_used(s, in);
            if (xp) {
                PM(s, "moe experts gate|up (grouped)");
                cu_moe_down_xp(q, &L->down, &so, bt, mt, s->xph, s->D, H);
            } else {
                if (!cu_gemm_swiglu_grouped(q, &L->gate, &L->up, &so, bt, mt, K, s->t, H, s->hg, I)) {
                    cu_gemm_q4_grouped(q, &L->gate, &so, bt, mt, K, s->t, H, s->hg, I);
                    cu_gemm_q4_grouped(q, &L->up, &so, bt, mt, K, s->t, H, s->hu, I);
                    cu_swiglu(q, s->hg, s->hu, s->hg, (long long)T * K * I);
                }
                PM(s, "moe experts gate|up (grouped)");
                cu_gemm_q4_grouped(q, &L->down, &so, bt, mt, 0, s->hg, I, s->D, H);
            }
        } else {
            cu_matmul_grouped(q, &L->gate, E, &so, K, s->t, H, T, s->hg, I);
            cu_matmul_grouped(q, &L->up, E, &so, K, s->t, H, T, s->hu, I);
            cu_swiglu(q, s->hg, s->hu, s->hg, (long long)T * K * I);
            PM(s, "moe experts gate|up (grouped)");
            cu_matmul_grouped(q, &L->down, E, &so, 0, s->hg, I, T, s->D, H);
        }
        PM(s, "moe experts down (grouped)");
        pos = s->spos;
    }
    const float *SD = NULL;
    if (shx || shb) SD = s->D + (size_t)T * K * H;
    else if (side) {
        cudaStreamWaitEvent(q, s->evj, 0);
        SD = s->SD;
    } else if (SI) {
        if (mv_rows_ok(s, T) && cu_mvq_ok(&L->sh_down)) {
            const dmat *W[1] = { &L->sh_down };
            float *Y[1] = { s->SD };
            int ld[1] = { H };
            cu_matvec_rows(q, 1, W, s->sg, s->su, SI, T, Y, ld);
        } else {
            if (!sh_swiglu) cu_swiglu(q, s->sg, s->su, s->sg, (long long)T * SI);
            proj(s, &L->sh_down, s->sg, SI, T, s->SD);
        }
        PM(s, "moe shared swiglu+down");
        SD = s->SD;
    }
    s->xp_src = cu_moe_combine_p(q, s->x, add, s->D, pos, s->wt, T, K, H, SD, s->sr, nw, (float)c->eps, s->t, xp_out(s)) ? s->t : NULL;
    PM(s, "moe combine + next norm");
}

void cu_enqueue_forward(lcuda_session *s, int T, int logits, int tc) {
    lcuda_model *m = s->m;
    const lily_config *c = &m->cfg;
    int H = c->hidden;
    float eps = (float)c->eps;
    PM(s, "start");
    s->fold_nw = NULL;
    s->attn_tc = tc;
    cu_embed(s->st, &m->embed, s->d_ids, T, s->x);
    s->xp_src = cu_rmsnorm2p(s->st, s->x, NULL, NULL, m->L[0].ln1, H, T, eps, s->t, xp_out(s)) ? s->t : NULL;
    PM(s, "embed + norm");
    const int pf = pf_on(s, T);
    if (pf && (pf_parts() & 4)) {
        const dmat *W[4];
        pf_fork(s, pf_mixer_in(&m->L[0], W), W, NULL, 0);
    }
    int li = 0, fi = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const cu_layer *L = &m->L[l];
        pf_layer(s, L, T, 0);
        if (L->full) mixer_attn(s, L, fi++, T);
        else mixer_gdn(s, L, li++, T);
        const int fused = moe_fused(s, L, T);
        LILY_ASSERT(!fused || !s->y2); /* (the fused norm reads s->y alone; it is decode's, never split) */
        if (!fused) {
            s->xp_src = cu_rmsnorm2p(s->st, s->x, s->y, s->y2, L->ln2, H, T, eps, s->t, xp_out(s)) ? s->t : NULL;
            PM(s, "residual + norm");
        } else s->xp_src = NULL; /* (the router group writes t unpacked) */
        /* the combine leaves the next layer's normed input, or the final norm's */
        const cu_layer *next = l + 1 < c->n_layers ? &m->L[l + 1] : NULL;
        moe(s, L, next, T, next ? next->ln1 : m->norm, fused ? s->y : NULL);
    }
    if (s->fold_nw) { /* (one token) the last combine was folded: the final norm in the lm_head's staging, or alone */
        const dmat *W[1] = { &m->lm_head };
        float *Y[1] = { s->lg };
        if (logits) fold_matvec(s, 1, W, Y);
        else {
            cu_rmsnorm(s->st, s->x, NULL, s->fold_nw, H, 1, eps, s->t);
            s->fold_nw = NULL;
        }
    } else if (logits == 2) {
        if (!proj_mv(s, &m->lm_head, s->t, H, T, s->lg)) cu_matmul(s->st, &m->lm_head, s->t, H, T, s->lg, c->vocab);
    }
    else if (logits) cu_matmul(s->st, &m->lm_head, s->t + (size_t)(T - 1) * H, H, 1, s->lg, c->vocab);
    PM(s, "lm_head");
    /* the prefetches joined after the lm_head, which reads nothing they fetch: joined before it, it
     * waited for the second stream's backlog (the last layer's downs, fetched after their launch
     * had run: ~20 us a token in session 19's timeline) */
    if (pf) pf_join(s); /* (every fork above was under the same condition) */
    s->attn_tc = 0;
}

void cu_enqueue_chunk(lcuda_session *s, int T, int pos, int logits, int tc) {
    cu_set_int(s->st, s->d_pos, pos);
    s->hpos = pos;
    cu_enqueue_forward(s, T, logits, tc);
    s->hpos = -1;
}

int cu_prof_on(void) { return prof.on; }

void cu_prof_start(void) {
    prof.on = 1;
    prof.n = 0;
}

/* the time between consecutive marks summed by label, largest first, as a markdown table */
void cu_prof_report(const char *title, char *out, size_t n) {
    prof.on = 0;
    const char *lab[64];
    double ms[64];
    int cnt[64], nl = 0;
    double tot = 0;
    for (int i = 1; i < prof.n; i++) {
        float f = 0;
        cudaEventElapsedTime(&f, prof.ev[i - 1], prof.ev[i]);
        int k = 0;
        while (k < nl && strcmp(lab[k], prof.lab[i])) k++;
        if (k == nl && nl < 64) { lab[nl] = prof.lab[i]; ms[nl] = 0; cnt[nl] = 0; nl++; }
        if (k < nl) { ms[k] += f; cnt[k]++; }
        tot += f;
    }
    size_t o = (size_t)snprintf(out, n, "| stage (%s) | launches | ms | %% |\n| --- | ---: | ---: | ---: |\n", title);
    for (int pass = 0; pass < nl; pass++) { /* largest first */
        int b = -1;
        for (int k = 0; k < nl; k++) if (cnt[k] >= 0 && (b < 0 || ms[k] > ms[b])) b = k;
        if (o < n) o += (size_t)snprintf(out + o, n - o, "| %s | %d | %.3f | %.1f |\n", lab[b], cnt[b], ms[b], 100 * ms[b] / tot);
        cnt[b] = -1;
    }
    if (o < n) snprintf(out + o, n - o, "| total | | %.3f | 100 |\n", tot);
}

lily_code lcuda_profile(lcuda_session *s, int T, int pos, char *out, size_t n, lily_status *st) {
    lcuda_model *m = s->m;
    if (T < 1 || T > m->chunk || pos + T > m->max_ctx) return lily_err(st, LILY_ERANGE, "profile: %d tokens at %d do not fit", T, pos);
    int32_t *ids = (int32_t *)malloc((size_t)T * sizeof *ids);
    if (!ids) return lily_err(st, LILY_ENOMEM, "out of memory");
    for (int i = 0; i < T; i++) ids[i] = (int32_t)((i * 7919u + 17u) % (unsigned)m->cfg.vocab);
    cudaError_t e = cudaMemcpy(s->d_ids, ids, (size_t)T * sizeof *ids, cudaMemcpyHostToDevice);
    free(ids);
    if (e != cudaSuccess) return cu_fail(st, e, "profile ids", __FILE__, __LINE__);
    cu_prof_start();
    cu_enqueue_chunk(s, T, pos, 1, 0);
    prof.on = 0;
    LCU_CHECK(cudaStreamSynchronize(s->st));
    LCU_CHECK(cudaGetLastError());
    char title[64];
    snprintf(title, sizeof title, "T=%d, pos=%d", T, pos);
    cu_prof_report(title, out, n);
    s->pos = pos + T;
    return LILY_OK;
}

lily_code cu_logit_rows(lcuda_session *s, int rows, lily_status *st) {
    if (s->lg_rows >= rows) return LILY_OK;
    int V = s->m->cfg.vocab;
    float *nl;
    LCU_CHECK(cudaStreamSynchronize(s->st));
    cudaError_t e = cudaMalloc((void **)&nl, (size_t)rows * V * sizeof(float));
    if (e != cudaSuccess) { cudaGetLastError(); return lily_err(st, LILY_ENOMEM, "GPU out of memory for %d rows of logits (%.2f GB)", rows, (double)rows * V * 4 / 1e9); }
    cudaFree(s->lg);
    s->lg = nl;
    s->lg_rows = rows;
    cu_graphs_drop(s); /* (they captured the freed buffer) */
    return LILY_OK;
}

int cu_decode_splits(const lcuda_session *s, int T) {
    /* s->part holds T x splits partials up to max(chunk, DECODE_SPLITS) (see lcuda_session_new) */
    int cap = s->m->chunk > DECODE_SPLITS ? s->m->chunk : DECODE_SPLITS;
    int sp = 64 / T < 16 ? 16 : 64 / T; /* (64 over the rows: the batches' measured split, session 14) */
    while (sp > 1 && (long long)T * sp > cap) sp /= 2;
    return sp;
}

/* One token's pass with its logits (s->d_ids, s->d_pos set) as a CUDA graph, captured on first use
 * and replayed: the server's streams feed one token a round (alone, or a batch of one) and took
 * ~300 launches a token without programmatic edges (tg32x1@1024 370 tok/s against the decode loop's
 * 567, bench/RESULTS.md session 27). Position-independent as the decode loop's graph is (the same
 * pass without its argmax and step). cu_logit_rows drops it with the logits it wrote.
 * LILY_CU_FWD_GRAPH=0: launches, for measuring. */
static lily_code forward1(lcuda_session *s, int pos, lily_status *st) {
    const int tc = cu_attn_tc_at(pos + 1);
    if (!s->fgraph[tc]) {
        LCU_CHECK(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal));
        cu_enqueue_forward(s, 1, 1, tc);
        lily_code rc = cu_graph_end(s->st, &s->fgraph[tc], "graph capture of a one-token pass", st);
        if (rc) return rc;
    }
    LCU_CHECK(cudaGraphLaunch(s->fgraph[tc], s->st));
    return LILY_OK;
}

/* One pass of T tokens whose ids sit in s->d_ids at pos (mode: cu_enqueue_forward's logits); one token
 * with its logits by its graph (one row: modes 1 and 2 are the same pass). */
static lily_code fwd_pass(lcuda_session *s, int T, int pos, int mode, lily_status *st) {
    static int fg = -1;
    if (T == 1 && mode && cu_env_flag(&fg, "LILY_CU_FWD_GRAPH", 1)) {
        cu_set_int(s->st, s->d_pos, pos);
        return forward1(s, pos, st);
    }
    cu_enqueue_chunk(s, T, pos, mode, T == 1 && cu_attn_tc_at(pos + 1));
    return LILY_OK;
}

lily_code lcuda_forward(lcuda_session *s, const int32_t *ids, int T, int pos, float *logits, int all_logits, lily_status *st) {
    lcuda_model *m = s->m;
    int V = m->cfg.vocab;
    if (T < 1 || pos < 0 || pos + T > m->max_ctx) return lily_err(st, LILY_ERANGE, "positions %d..%d outside the context of %d", pos, pos + T, m->max_ctx);
    if (all_logits && logits) {
        lily_code rc = cu_logit_rows(s, T < m->chunk ? T : m->chunk, st);
        if (rc) return rc;
    }
    for (int i = 0; i < T; i += m->chunk) {
        int k = T - i < m->chunk ? T - i : m->chunk;
        int last = i + k == T;
        LCU_CHECK(cudaMemcpyAsync(s->d_ids, ids + i, (size_t)k * sizeof(int32_t), cudaMemcpyHostToDevice, s->st));
        int mode = !logits ? 0 : all_logits ? 2 : last ? 1 : 0;
        lily_code rc = fwd_pass(s, k, pos + i, mode, st);
        if (rc) return rc;
        LCU_CHECK(cudaGetLastError());
        if (mode == 2) LCU_CHECK(cudaMemcpyAsync(logits + (size_t)i * V, s->lg, (size_t)k * V * sizeof(float), cudaMemcpyDeviceToHost, s->st));
        if (mode == 1) LCU_CHECK(cudaMemcpyAsync(logits, s->lg, (size_t)V * sizeof(float), cudaMemcpyDeviceToHost, s->st));
        /* the ids buffer is reused by the next chunk: wait until this one has read it */
        LCU_CHECK(cudaStreamSynchronize(s->st));
    }
    s->pos = pos + T;
    return LILY_OK;
}

/* A prompt's pass enqueued on the session's own stream and left running: several sessions' begins,
 * then their waits, run the passes side by side on the GPU, each the same launches lcuda_forward
 * makes for one chunk (so the same logits and state: nothing is shared but the weights), where one
 * after the other a short prompt's pass leaves most of the GPU idle (a 14-token prefill of the
 * 35B-A3B ~9 ms, latency-bound). The ids go through a pinned copy, so the begin does not wait on the
 * device either. */
lily_code lcuda_forward_begin(lcuda_session *s, const int32_t *ids, int T, int pos, lily_status *st) {
    lcuda_model *m = s->m;
    if (T < 1 || T > m->chunk || pos < 0 || pos + T > m->max_ctx)
        return lily_err(st, LILY_ERANGE, "a pass of %d tokens at %d (at most %d, inside the context of %d)", T, pos, m->chunk, m->max_ctx);
    memcpy(s->ids_h, ids, (size_t)T * sizeof *ids);
    LCU_CHECK(cudaMemcpyAsync(s->d_ids, s->ids_h, (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice, s->st));
    lily_code rc = fwd_pass(s, T, pos, 1, st);
    if (rc) return rc;
    LCU_CHECK(cudaGetLastError());
    s->pos = pos + T;
    return LILY_OK;
}

lily_code lcuda_forward_wait(lcuda_session *s, float *logits, lily_status *st) {
    LCU_CHECK(cudaMemcpyAsync(logits, s->lg, (size_t)s->m->cfg.vocab * sizeof(float), cudaMemcpyDeviceToHost, s->st));
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}

lily_code lcuda_last_logits(lcuda_session *s, float *out, lily_status *st) {
    LCU_CHECK(cudaMemcpyAsync(out, s->lg, (size_t)s->m->cfg.vocab * sizeof(float), cudaMemcpyDeviceToHost, s->st));
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}
