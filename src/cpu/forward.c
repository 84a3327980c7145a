#include "cpu/cpu.h"
#include <math.h>
#include <stdlib.h>

static float silu(float x) { return x / (1.0f + expf(-x)); }
static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    LILY_ASSERT(p);
    return p;
}

size_t cpu_cache_recurrent_bytes(const lily_config *c) {
    int n_lin = c->n_layers - cfg_n_full(c);
    return (size_t)n_lin * ((size_t)cfg_conv_dim(c) * (c->conv_k - 1) + (size_t)c->lin_nv * c->lin_dk * c->lin_dv) * sizeof(float);
}

lily_code cpu_cache_new(const lily_config *c, int max_ctx, cpu_cache *k, lily_status *st) {
    memset(k, 0, sizeof *k);
    k->max_ctx = max_ctx;
    k->n_full = cfg_n_full(c);
    k->n_lin = c->n_layers - k->n_full;
    size_t kv = (size_t)k->n_full * max_ctx * c->n_kv_heads * c->head_dim;
    k->conv = calloc((size_t)k->n_lin * cfg_conv_dim(c) * (c->conv_k - 1) + 1, sizeof(float));
    k->S = calloc((size_t)k->n_lin * c->lin_nv * c->lin_dk * c->lin_dv + 1, sizeof(float));
    k->kc = malloc((kv + 1) * sizeof(float));
    k->vc = malloc((kv + 1) * sizeof(float));
    if (!k->conv || !k->S || !k->kc || !k->vc) {
        cpu_cache_free(k);
        return lily_err(st, LILY_ENOMEM, "cannot allocate caches for %d tokens (%.1f MB)", max_ctx,
                        (2.0 * kv * 4 + cpu_cache_recurrent_bytes(c)) / 1e6);
    }
    return LILY_OK;
}

void cpu_cache_free(cpu_cache *k) {
    free(k->conv); free(k->S); free(k->kc); free(k->vc);
    memset(k, 0, sizeof *k);
}

void cpu_cache_reset(cpu_cache *k, const lily_config *c) {
    memset(k->conv, 0, (size_t)k->n_lin * cfg_conv_dim(c) * (c->conv_k - 1) * sizeof(float));
    memset(k->S, 0, (size_t)k->n_lin * c->lin_nv * c->lin_dk * c->lin_dv * sizeof(float));
}

/* ---- Gated DeltaNet mixer ---- */
/* A row of a forward pass: its session's caches and position. One session's prefill
 * chunk has rows at consecutive positions of one cache; a decode batch has one row per
 * session. Every mixer reads its state through the row. */
typedef struct {
    cpu_cache *k;
    int pos;
} fw_row;

typedef struct {
    const lily_config *c;
    const lily_layer *L;
    int T, batch, li;
    const fw_row *rows;
    float *qkv, *g, *beta, *o;
} gdn_ctx;

static float *gdn_state(const gdn_ctx *x, const fw_row *r) {
    const lily_config *c = x->c;
    return r->k->S + (size_t)x->li * c->lin_nv * c->lin_dk * c->lin_dv;
}

/* Task i: value head i of the one session (chunked or recurrent over T rows), or in a
 * batch, head i % nv of row i / nv (one recurrent step on that row's own state). */
static void gdn_head(void *p, int i) {
    gdn_ctx *x = p;
    const lily_config *c = x->c;
    int kd = cfg_key_dim(c), cd = cfg_conv_dim(c), dk = c->lin_dk, dv = c->lin_dv, nv = c->lin_nv;
    int row = x->batch ? i / nv : 0, h = x->batch ? i % nv : i, T = x->batch ? 1 : x->T;
    int kh = h / (nv / c->lin_nk); /* v-head h reads k-head h / (nv/nk): grouped, as repeat_interleave */
    float *g = xmalloc((size_t)T * sizeof *g), *b = xmalloc((size_t)T * sizeof *b);
    for (int t = 0; t < T; t++) { g[t] = x->g[(size_t)(row + t) * nv + h]; b[t] = x->beta[(size_t)(row + t) * nv + h]; }
    void (*rule)(int, int, int, const float *, int, const float *, int, const float *, int, const float *,
                 const float *, float *, float *, int, cpu_mm_kind) = T == 1 ? cpu_gdn_recurrent_fast : cpu_gdn_chunked_fast;
    const float *qkv = x->qkv + (size_t)row * cd;
    rule(T, dk, dv, qkv + (size_t)kh * dk, cd, qkv + kd + (size_t)kh * dk, cd, qkv + 2 * kd + (size_t)h * dv, cd, g, b,
         gdn_state(x, &x->rows[row]) + (size_t)h * dk * dv, x->o + (size_t)row * nv * dv + (size_t)h * dv, nv * dv, cpu_mm_path);
    free(g); free(b);
}

/* Causal depthwise conv of T consecutive rows over [cached K-1 inputs, the rows], then
 * SiLU; the cache keeps the last K-1 pre-conv inputs. */
static void conv_rows(const lily_config *c, const lily_layer *L, float *conv_state, const float *mixed, int T, float *u) {
    int cd = cfg_conv_dim(c), K = c->conv_k;
    for (int ch = 0; ch < cd; ch++) {
        const float *w = L->conv_w + (size_t)ch * K;
        float *cs = conv_state + (size_t)ch * (K - 1);
        for (int t = 0; t < T; t++) {
            float s = 0;
            for (int j = 0; j < K; j++) {
                int src = t - (K - 1) + j; /* tap j looks K-1-j steps back */
                float in = src >= 0 ? mixed[(size_t)src * cd + ch] : cs[K - 1 + src];
                s += w[j] * in;
            }
            u[(size_t)t * cd + ch] = silu(s);
        }
        float hist[64];
        for (int j = 0; j < K - 1; j++) {
            int src = T - (K - 1) + j;
            hist[j] = src >= 0 ? mixed[(size_t)src * cd + ch] : cs[K - 1 + src];
        }
        memcpy(cs, hist, (size_t)(K - 1) * sizeof(float));
    }
}

static void gdn(const lily_config *c, const lily_layer *L, int li, const fw_row *rows, int batch, lily_pool *pool,
                const float *x, int T, float *y) {
    int cd = cfg_conv_dim(c), vd = cfg_val_dim(c), nv = c->lin_nv;
    int dk = c->lin_dk, dv = c->lin_dv;
    size_t conv_sz = (size_t)cd * (c->conv_k - 1);
    float *mixed = xmalloc((size_t)T * cd * sizeof(float)), *u = xmalloc((size_t)T * cd * sizeof(float));
    float *z = xmalloc((size_t)T * vd * sizeof(float)), *bb = xmalloc((size_t)T * nv * sizeof(float));
    float *aa = xmalloc((size_t)T * nv * sizeof(float)), *o = xmalloc((size_t)T * vd * sizeof(float));
    cpu_mm_job in[4] = { { &L->qkv, x, T, mixed }, { &L->z, x, T, z }, { &L->b, x, T, bb }, { &L->a, x, T, aa } };
    cpu_matmul_many(pool, in, 4);
    if (batch)
        for (int t = 0; t < T; t++) conv_rows(c, L, rows[t].k->conv + li * conv_sz, mixed + (size_t)t * cd, 1, u + (size_t)t * cd);
    else
        conv_rows(c, L, rows[0].k->conv + li * conv_sz, mixed, T, u);
    /* L2-normalize q and k per head; q also takes the dk^-0.5 scale */
    float qscale = 1.0f / sqrtf((float)dk);
    for (int t = 0; t < T; t++)
        for (int hh = 0; hh < 2 * c->lin_nk; hh++) {
            float *v = u + (size_t)t * cd + (size_t)hh * dk;
            double ss = 0;
            for (int i = 0; i < dk; i++) ss += (double)v[i] * v[i];
            float r = (float)(1.0 / sqrt(ss + 1e-6)) * (hh < c->lin_nk ? qscale : 1.0f);
            for (int i = 0; i < dk; i++) v[i] *= r;
        }
    float *g = xmalloc((size_t)T * nv * sizeof(float)), *beta = xmalloc((size_t)T * nv * sizeof(float));
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            size_t i = (size_t)t * nv + h;
            beta[i] = sigm(bb[i]);
            g[i] = -expf(L->A_log[h]) * softplus(aa[i] + L->dt_bias[h]);
        }
    gdn_ctx gc = { c, L, T, batch, li, rows, u, g, beta, o };
    lily_pool_run(pool, batch ? T * nv : nv, gdn_head, &gc);
    /* gated RMSNorm per head (weight used directly), then the output projection */
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nv; h++) {
            float *oh = o + (size_t)t * vd + (size_t)h * dv;
            const float *zh = z + (size_t)t * vd + (size_t)h * dv;
            cpu_rmsnorm(oh, L->gnorm, dv, c->eps, oh);
            for (int j = 0; j < dv; j++) oh[j] *= silu(zh[j]);
        }
    cpu_matmul(pool, &L->out, o, T, y);

    free(mixed); free(u); free(z); free(bb); free(aa); free(o); free(g); free(beta);
}

/* ---- gated attention ---- */
/* NeoX-style rotation of the first `rot` dims, with the table built as transformers
 * builds it: inv_freq and pos * inv_freq in float32, then cos/sin of that float angle.
 * bf16_freq rounds inv_freq to bf16, as a model cast whole with .to(bfloat16) has it
 * (the fixtures' references were made that way). */
static void rope(float *v, int rot, int pos, double theta, int bf16_freq) {
    int half = rot / 2;
    for (int i = 0; i < half; i++) {
        float inv = 1.0f / powf((float)theta, (float)(2 * i) / (float)rot);
        if (bf16_freq) inv = lily_bf16_to_f32(lily_f32_to_bf16(inv));
        float ang = (float)pos * inv;
        float cs = cosf(ang), sn = sinf(ang);
        float a = v[i], b = v[i + half];
        v[i] = a * cs - b * sn;
        v[i + half] = b * cs + a * sn;
    }
}

typedef struct {
    const lily_config *c;
    int fi;
    const fw_row *rows;
    const float *q;
    float *o;
} attn_ctx;

static size_t kv_layer(const lily_config *c, const cpu_cache *k, int fi) {
    return (size_t)fi * k->max_ctx * c->n_kv_heads * c->head_dim;
}

static void attn_head(void *p, int idx) {
    attn_ctx *x = p;
    const lily_config *c = x->c;
    int nh = c->n_heads, hd = c->head_dim, nkv = c->n_kv_heads;
    int t = idx / nh, h = idx % nh, kvh = h / (nh / nkv);
    const fw_row *r = &x->rows[t];
    int n = r->pos + 1; /* causal: this row sees its own cache up to itself */
    const float *kc = r->k->kc + kv_layer(c, r->k, x->fi), *vc = r->k->vc + kv_layer(c, r->k, x->fi);
    float *sc = xmalloc((size_t)n * sizeof *sc);
    cpu_attn_row_fast(n, hd, x->q + (size_t)t * nh * hd + (size_t)h * hd, kc + (size_t)kvh * hd, vc + (size_t)kvh * hd,
                      nkv * hd, sc, x->o + (size_t)t * nh * hd + (size_t)h * hd, cpu_mm_path);
    free(sc);
}

static void attention(const lily_config *c, const lily_layer *L, int fi, const fw_row *rows, lily_pool *pool,
                      const float *x, int T, float *y) {
    int nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    float *qg = xmalloc((size_t)T * nh * hd * 2 * sizeof(float)), *q = xmalloc((size_t)T * nh * hd * sizeof(float));
    float *k = xmalloc((size_t)T * nkv * hd * sizeof(float)), *v = xmalloc((size_t)T * nkv * hd * sizeof(float));
    float *o = xmalloc((size_t)T * nh * hd * sizeof(float));
    cpu_mm_job in[3] = { { &L->q, x, T, qg }, { &L->k, x, T, k }, { &L->v, x, T, v } };
    cpu_matmul_many(pool, in, 3);
    /* every row's key and value reach its cache before any row attends (a chunk's rows see each other) */
    for (int t = 0; t < T; t++) {
        int pos = rows[t].pos;
        for (int h = 0; h < nh; h++) { /* per head: hd query rows, then hd gate rows */
            float *qh = q + ((size_t)t * nh + h) * hd;
            cpu_rmsnorm(qg + ((size_t)t * nh + h) * 2 * hd, L->q_norm, hd, c->eps, qh);
            rope(qh, c->rot_dim, pos, c->rope_theta, c->rope_bf16_freq);
        }
        for (int h = 0; h < nkv; h++) {
            float *kh = k + ((size_t)t * nkv + h) * hd;
            cpu_rmsnorm(kh, L->k_norm, hd, c->eps, kh);
            rope(kh, c->rot_dim, pos, c->rope_theta, c->rope_bf16_freq);
        }
        cpu_cache *kk = rows[t].k;
        memcpy(kk->kc + kv_layer(c, kk, fi) + (size_t)pos * nkv * hd, k + (size_t)t * nkv * hd, (size_t)nkv * hd * sizeof(float));
        memcpy(kk->vc + kv_layer(c, kk, fi) + (size_t)pos * nkv * hd, v + (size_t)t * nkv * hd, (size_t)nkv * hd * sizeof(float));
    }
    attn_ctx ac = { c, fi, rows, q, o };
    lily_pool_run(pool, T * nh, attn_head, &ac);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < hd; i++)
                o[((size_t)t * nh + h) * hd + i] *= sigm(qg[((size_t)t * nh + h) * 2 * hd + hd + i]);
    cpu_matmul(pool, &L->o, o, T, y);
    free(qg); free(q); free(k); free(v); free(o);
}

/* ---- sparse MoE ---- */
/* The MoE's row work besides the matmuls, on the pool (at a 512-token chunk it is tens of
 * MB of copies and two million expf a layer: serial, it would bound prefill on many cores).
 * Every element is computed as the serial loop would: gather copies rows, swiglu is
 * elementwise, and combine sums each token's experts in the same (sorted slot) order. */
typedef struct {
    int T, K, H, I, SI, TK;
    const float *x, *de, *tw, *sd, *sr;
    const int *slot;   /* [T*K] token t's j-th choice -> its row in the expert-sorted order */
    float *xe, *ge, *ue, *sg, *su, *y;
} moe_rows;

enum { MOE_ROWS_PER_TASK = 8, MOE_ELEMS_PER_TASK = 16384 };

static void moe_gather_task(void *p, int i) {
    const moe_rows *r = p;
    for (int t = i * MOE_ROWS_PER_TASK; t < r->T && t < (i + 1) * MOE_ROWS_PER_TASK; t++)
        for (int j = 0; j < r->K; j++)
            memcpy(r->xe + (size_t)r->slot[t * r->K + j] * r->H, r->x + (size_t)t * r->H, (size_t)r->H * sizeof(float));
}

static void moe_swiglu_task(void *p, int i) {
    const moe_rows *r = p;
    size_t ne = (size_t)r->TK * r->I, ns = (size_t)r->T * r->SI, a = (size_t)i * MOE_ELEMS_PER_TASK, b = a + MOE_ELEMS_PER_TASK;
    for (size_t k = a; k < b && k < ne; k++) r->ge[k] = silu(r->ge[k]) * r->ue[k];
    for (size_t k = a > ne ? a - ne : 0; k + ne < b && k < ns; k++) r->sg[k] = silu(r->sg[k]) * r->su[k];
}

static void moe_combine_task(void *p, int i) {
    const moe_rows *r = p;
    for (int t = i * MOE_ROWS_PER_TASK; t < r->T && t < (i + 1) * MOE_ROWS_PER_TASK; t++) {
        int m[64];
        for (int j = 0; j < r->K; j++) { /* this token's rows in ascending order, as the serial loop met them */
            int v = r->slot[t * r->K + j], k = j;
            while (k > 0 && m[k - 1] > v) { m[k] = m[k - 1]; k--; }
            m[k] = v;
        }
        float *yt = r->y + (size_t)t * r->H;
        for (int j = 0; j < r->K; j++) {
            const float *d = r->de + (size_t)m[j] * r->H;
            float w = r->tw[m[j]];
            for (int h = 0; h < r->H; h++) yt[h] += w * d[h];
        }
        if (r->SI) {
            float gsc = sigm(r->sr[t]);
            const float *d = r->sd + (size_t)t * r->H;
            for (int h = 0; h < r->H; h++) yt[h] += gsc * d[h];
        }
    }
}

static void moe(const lily_config *c, const lily_layer *L, lily_pool *pool, const float *x, int T, float *y) {
    int H = c->hidden, E = c->n_experts, K = c->top_k, I = c->moe_inter;
    float *logits = xmalloc((size_t)T * E * sizeof(float));
    cpu_matmul(pool, &L->router, x, T, logits);
    int *sel = xmalloc((size_t)T * K * sizeof(int));
    float *wt = xmalloc((size_t)T * K * sizeof(float));
    for (int t = 0; t < T; t++) {
        float *p = logits + (size_t)t * E, mx = -INFINITY;
        for (int e = 0; e < E; e++) if (p[e] > mx) mx = p[e];
        double sum = 0;
        for (int e = 0; e < E; e++) { p[e] = expf(p[e] - mx); sum += p[e]; }
        for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
        double tot = 0;
        for (int j = 0; j < K; j++) { /* top-k by selection; ties go to the lower index */
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int m = 0; m < j; m++) taken |= sel[t * K + m] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[t * K + j] = best;
            wt[t * K + j] = p[best];
            tot += p[best];
        }
        for (int j = 0; j < K; j++) wt[t * K + j] = (float)(wt[t * K + j] / tot);
    }
    memset(y, 0, (size_t)T * H * sizeof(float));
    /* Gather the tokens routed to each expert (experts ascending, tokens ascending within),
     * then run every expert's gate and up (and the shared expert's) in one parallel region
     * and every down projection in a second: 2 thread hand-offs per layer, not 3 per expert. */
    int TK = T * K, SI = c->shared_inter;
    float *xe = xmalloc((size_t)TK * H * sizeof(float)), *ge = xmalloc((size_t)TK * I * sizeof(float));
    float *ue = xmalloc((size_t)TK * I * sizeof(float)), *de = xmalloc((size_t)TK * H * sizeof(float));
    int *off = xmalloc((size_t)(E + 1) * sizeof(int));
    float *tw = xmalloc((size_t)TK * sizeof(float));
    cpu_mm_job *jobs = xmalloc((size_t)(2 * E + 3) * sizeof *jobs);
    for (int e = 0; e <= E; e++) off[e] = 0;
    for (int i = 0; i < TK; i++) off[sel[i] + 1]++;
    for (int e = 0; e < E; e++) off[e + 1] += off[e];
    int *fillp = xmalloc((size_t)E * sizeof(int)), *slot = xmalloc((size_t)TK * sizeof(int));
    for (int e = 0; e < E; e++) fillp[e] = off[e];
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            int e = sel[t * K + j], m = fillp[e]++;
            tw[m] = wt[t * K + j];
            slot[t * K + j] = m;
        }
    free(fillp);
    LILY_ASSERT(K <= 64);
    moe_rows mr = { T, K, H, I, SI, TK, x, de, tw, NULL, NULL, slot, xe, ge, ue, NULL, NULL, y };
    int row_tasks = (T + MOE_ROWS_PER_TASK - 1) / MOE_ROWS_PER_TASK;
    lily_pool_run(pool, row_tasks, moe_gather_task, &mr);
    float *sg = NULL, *su = NULL, *sr = NULL, *sd = NULL;
    int nj = 0;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (!n) continue;
        jobs[nj++] = (cpu_mm_job){ &L->gate[e], xe + (size_t)off[e] * H, n, ge + (size_t)off[e] * I };
        jobs[nj++] = (cpu_mm_job){ &L->up[e], xe + (size_t)off[e] * H, n, ue + (size_t)off[e] * I };
    }
    if (SI) {
        sg = xmalloc((size_t)T * SI * sizeof(float)); su = xmalloc((size_t)T * SI * sizeof(float));
        sr = xmalloc((size_t)T * sizeof(float)); sd = xmalloc((size_t)T * H * sizeof(float));
        jobs[nj++] = (cpu_mm_job){ &L->sh_gate, x, T, sg };
        jobs[nj++] = (cpu_mm_job){ &L->sh_up, x, T, su };
        jobs[nj++] = (cpu_mm_job){ &L->sh_router, x, T, sr };
    }
    cpu_matmul_many(pool, jobs, nj);
    mr.sg = sg; mr.su = su;
    size_t nel = (size_t)TK * I + (SI ? (size_t)T * SI : 0);
    lily_pool_run(pool, (int)((nel + MOE_ELEMS_PER_TASK - 1) / MOE_ELEMS_PER_TASK), moe_swiglu_task, &mr);
    nj = 0;
    for (int e = 0; e < E; e++) {
        int n = off[e + 1] - off[e];
        if (n) jobs[nj++] = (cpu_mm_job){ &L->down[e], ge + (size_t)off[e] * I, n, de + (size_t)off[e] * H };
    }
    if (SI) jobs[nj++] = (cpu_mm_job){ &L->sh_down, sg, T, sd };
    cpu_matmul_many(pool, jobs, nj);
    mr.sd = sd; mr.sr = sr;
    lily_pool_run(pool, row_tasks, moe_combine_task, &mr);
    if (SI) { free(sg); free(su); free(sr); free(sd); }
    free(jobs); free(off); free(slot);
    free(logits); free(sel); free(wt); free(xe); free(ge); free(ue); free(de); free(tw);
}

/* The layer stack over T rows; batch = each row is its own session's next token. */
static void forward_rows(const lily_weights *w, const fw_row *rows, int batch, lily_pool *pool, const int32_t *ids,
                         int T, float *logits, int all_logits, float *hidden) {
    const lily_config *c = &w->cfg;
    int H = c->hidden;
    float *x = xmalloc((size_t)T * H * sizeof(float)), *t = xmalloc((size_t)T * H * sizeof(float));
    float *y = xmalloc((size_t)T * H * sizeof(float));
    for (int i = 0; i < T; i++) {
        LILY_ASSERT(ids[i] >= 0 && ids[i] < c->vocab);
        lw_row_f32(&w->embed, ids[i], x + (size_t)i * H);
    }
    if (hidden) memcpy(hidden, x, (size_t)T * H * sizeof(float));
    int li = 0, fi = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const lily_layer *L = &w->layers[l];
        for (int i = 0; i < T; i++) cpu_rmsnorm(x + (size_t)i * H, L->ln1, H, c->eps, t + (size_t)i * H);
        if (L->full_attn) attention(c, L, fi++, rows, pool, t, T, y);
        else gdn(c, L, li++, rows, batch, pool, t, T, y);
        for (size_t i = 0; i < (size_t)T * H; i++) x[i] += y[i];
        for (int i = 0; i < T; i++) cpu_rmsnorm(x + (size_t)i * H, L->ln2, H, c->eps, t + (size_t)i * H);
        moe(c, L, pool, t, T, y);
        for (size_t i = 0; i < (size_t)T * H; i++) x[i] += y[i];
        if (hidden && l + 1 < c->n_layers) memcpy(hidden + (size_t)(l + 1) * T * H, x, (size_t)T * H * sizeof(float));
    }
    for (int i = 0; i < T; i++) cpu_rmsnorm(x + (size_t)i * H, w->norm, H, c->eps, x + (size_t)i * H);
    if (hidden) memcpy(hidden + (size_t)c->n_layers * T * H, x, (size_t)T * H * sizeof(float));
    if (logits) {
        if (all_logits) cpu_matmul(pool, &w->lm_head, x, T, logits);
        else cpu_matmul(pool, &w->lm_head, x + (size_t)(T - 1) * H, 1, logits);
    }
    free(x); free(t); free(y);
}

void cpu_forward(const lily_weights *w, cpu_cache *k, lily_pool *pool, const int32_t *ids, int T,
                 int pos, float *logits, int all_logits, float *hidden) {
    LILY_ASSERT(T >= 1 && pos >= 0 && pos + T <= k->max_ctx);
    fw_row *rows = xmalloc((size_t)T * sizeof *rows);
    for (int i = 0; i < T; i++) rows[i] = (fw_row){ k, pos + i };
    forward_rows(w, rows, 0, pool, ids, T, logits, all_logits, hidden);
    free(rows);
}

void cpu_forward_batch(const lily_weights *w, cpu_cache *const *k, const int *pos, lily_pool *pool,
                       const int32_t *ids, int B, float *logits) {
    LILY_ASSERT(B >= 1);
    fw_row *rows = xmalloc((size_t)B * sizeof *rows);
    for (int i = 0; i < B; i++) {
        LILY_ASSERT(pos[i] >= 0 && pos[i] < k[i]->max_ctx);
        for (int j = 0; j < i; j++) LILY_ASSERT(k[j] != k[i]); /* one row per session */
        rows[i] = (fw_row){ k[i], pos[i] };
    }
    forward_rows(w, rows, 1, pool, ids, B, logits, 1, NULL);
    free(rows);
}
