/* Decode batches: n sessions, one token each at its own position, in one forward pass.
 * Every projection (attention, DeltaNet, router, shared expert, experts, lm_head) runs once
 * over the n rows with the T-token kernels, so the weights are read once per round instead
 * of once per session; the steps that touch session state (causal conv, delta rule, RoPE,
 * KV-cache write, attention) read each row's position and state pointers from a small
 * device table (cu_rows). The first session carries the batch: its stream, scratch (sized
 * for `chunk` tokens) and logits buffer. Each session's state ends as if it had been fed
 * its token alone. */
#include "cuda/cu_model.h"
#include <stdio.h>
#include <stdlib.h>

/* The row table: pos [cap] ints, then 4 x [cap] pointers (conv, S, kc, vc). */
static size_t meta_bytes(int cap) { return (size_t)cap * sizeof(int) + 4 * (size_t)cap * sizeof(float *) + 16; }
static size_t ptr_off(int cap) { return ((size_t)cap * sizeof(int) + 15) & ~(size_t)15; }

static lily_code meta_grow(lcuda_session *s, int n, lily_status *st) {
    if (n <= s->bcap) return LILY_OK;
    int cap = s->bcap ? s->bcap : 8;
    while (cap < n) cap *= 2;
    void *d = NULL, *h = NULL;
    cudaError_t e = cudaMalloc(&d, meta_bytes(cap));
    if (e == cudaSuccess) e = cudaHostAlloc(&h, meta_bytes(cap), cudaHostAllocDefault);
    if (e != cudaSuccess) {
        cudaGetLastError();
        cudaFree(d);
        return lily_err(st, LILY_ENOMEM, "out of memory for a decode batch of %d rows", n);
    }
    cudaFree(s->bmeta_d);
    cudaFreeHost(s->bmeta_h);
    cu_batch_graphs_drop(s); /* (they read the old table) */
    s->bmeta_d = d;
    s->bmeta_h = h;
    s->bcap = cap;
    return LILY_OK;
}

static lily_code one_by_one(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits,
                            lily_status *st) {
    for (int i = 0; i < n; i++) {
        lily_code rc = lcuda_forward(ss[i], &ids[i], 1, pos[i], logits[i], 0, st);
        if (rc) return rc;
    }
    return LILY_OK;
}

void cu_batch_graphs_drop(lcuda_session *s) {
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < LCU_BGRAPHS; i++)
            if (s->bgraph[t][i]) {
                cudaGraphExecDestroy(s->bgraph[t][i]);
                s->bgraph[t][i] = NULL;
            }
}

/* The batch's pass (c->rows set) as a CUDA graph, one a row count, captured on the carrier's first
 * batch of that many rows: a round's ~300 launches otherwise cost the host ~1 ms and the GPU a
 * launch gap each without programmatic edges (what the decode loop's graph removed for one row).
 * Every round reads its ids and row table from the carrier's device buffers, whose contents change
 * and addresses do not; meta_grow and cu_logit_rows drop the graphs when they reallocate. Not while
 * lily-bench profiles (events between stages). LILY_CU_BATCH_GRAPH=0: launches, for measuring. tc: the
 * rows' attention on the tensor cores (cu_attn_tc_at of the row with the fewest keys), a graph of each. */
static lily_code enqueue_pass(lcuda_session *c, int n, int tc, lily_status *st) {
    static int on = -1;
    if (n >= LCU_BGRAPHS || cu_prof_on() || !cu_env_flag(&on, "LILY_CU_BATCH_GRAPH", 1)) {
        cu_enqueue_forward(c, n, 2, tc);
        return LILY_OK;
    }
    if (!c->bgraph[tc][n]) {
        LCU_CHECK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
        cu_enqueue_forward(c, n, 2, tc);
        lily_code rc = cu_graph_end(c->st, &c->bgraph[tc][n], "graph capture of a decode batch", st);
        if (rc) return rc;
    }
    LCU_CHECK(cudaGraphLaunch(c->bgraph[tc][n], c->st));
    return LILY_OK;
}

lily_code cu_batch_check(lcuda_session **ss, const int *pos, int n, lily_status *st) {
    if (n < 1) return lily_err(st, LILY_EINVAL, "empty decode batch");
    lcuda_model *m = ss[0]->m;
    for (int i = 0; i < n; i++) {
        if (ss[i]->m != m) return lily_err(st, LILY_EINVAL, "decode batch mixes sessions of different models");
        if (pos[i] < 0 || pos[i] >= m->max_ctx) return lily_err(st, LILY_ERANGE, "position %d outside the context of %d", pos[i], m->max_ctx);
        for (int j = 0; j < i; j++)
            if (ss[j] == ss[i]) return lily_err(st, LILY_EINVAL, "a session appears twice in one decode batch");
    }
    return LILY_OK;
}

lily_code cu_batch_table(lcuda_session **ss, const int *pos, int n, cu_rows *R, lily_status *st) {
    lcuda_session *c = ss[0];
    lily_code rc = meta_grow(c, n, st);
    if (!rc) rc = cu_logit_rows(c, n, st);
    if (rc) return rc;
    /* earlier work queued on the other sessions' streams (a reset's memsets) must be done
     * before this stream reads their state */
    for (int i = 1; i < n; i++) LCU_CHECK(cudaStreamSynchronize(ss[i]->st));
    int cap = c->bcap;
    int *hpos = (int *)c->bmeta_h;
    float **hp = (float **)((char *)c->bmeta_h + ptr_off(cap));
    for (int i = 0; i < n; i++) {
        hpos[i] = pos[i];
        hp[i] = ss[i]->conv;
        hp[cap + i] = ss[i]->S;
        hp[2 * cap + i] = (float *)ss[i]->kc; /* (the table's pointers are only carried: kc, vc are fp16) */
        hp[3 * cap + i] = (float *)ss[i]->vc;
    }
    memset(R, 0, sizeof *R);
    float **dp = (float **)((char *)c->bmeta_d + ptr_off(cap));
    R->pos = (const int *)c->bmeta_d;
    R->conv = dp;
    R->S = dp + cap;
    R->kc = (uint16_t *const *)(dp + 2 * cap);
    R->vc = (uint16_t *const *)(dp + 3 * cap);
    LCU_CHECK(cudaMemcpyAsync(c->bmeta_d, c->bmeta_h, meta_bytes(cap), cudaMemcpyHostToDevice, c->st));
    return LILY_OK;
}

lily_code cu_batch_pass(lcuda_session *c, int n, int tc, lily_status *st) { return enqueue_pass(c, n, tc, st); }

lily_code lcuda_forward_batch(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits,
                              lily_status *st) {
    lily_code rc = cu_batch_check(ss, pos, n, st);
    if (rc) return rc;
    lcuda_model *m = ss[0]->m;
    /* the carrier's scratch holds `chunk` rows; larger batches (or one row) go one by one */
    if (n == 1 || n > m->chunk) return one_by_one(ss, ids, pos, n, logits, st);
    lcuda_session *c = ss[0];
    cu_rows R;
    if ((rc = cu_batch_table(ss, pos, n, &R, st))) return rc;
    LCU_CHECK(cudaMemcpyAsync(c->d_ids, ids, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, c->st));
    c->rows = &R;
    int pmin = pos[0];
    for (int i = 1; i < n; i++) pmin = pos[i] < pmin ? pos[i] : pmin;
    lily_code rc2 = enqueue_pass(c, n, cu_attn_tc_at(pmin + 1), st);
    c->rows = NULL;
    if (rc2) return rc2;
    LCU_CHECK(cudaGetLastError());
    /* each row straight to its session's buffer (page-locked in lily's sessions: no staging
     * copy, no [n][V] host array to fill and copy out again) */
    size_t V = (size_t)m->cfg.vocab;
    for (int i = 0; i < n; i++)
        LCU_CHECK(cudaMemcpyAsync(logits[i], c->lg + i * V, V * sizeof(float), cudaMemcpyDeviceToHost, c->st));
    cu_prof_mark(c, "logits to the host");
    /* the staging table and ids are reused by the next batch: wait until this one has read them */
    LCU_CHECK(cudaStreamSynchronize(c->st));
    for (int i = 0; i < n; i++) ss[i]->pos = pos[i] + 1;
    return LILY_OK;
}

lily_code lcuda_profile_batch(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits, char *out,
                              size_t on, lily_status *st) {
    cu_prof_start();
    lily_code rc = lcuda_forward_batch(ss, ids, pos, n, logits, st);
    char title[64];
    snprintf(title, sizeof title, "decode batch of %d, pos=%d", n, pos[0]);
    cu_prof_report(title, out, on); /* (lcuda_forward_batch synchronized the stream) */
    return rc;
}

void *lcuda_host_alloc(size_t bytes) {
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        cudaGetLastError();
        return NULL;
    }
    return p;
}

void lcuda_host_free(void *p) {
    if (p) cudaFreeHost(p);
}
