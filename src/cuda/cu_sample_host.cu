/* The GPU sampler's host side (see cu_sample.h): device buffers, the parameter block and
 * the bias tables uploaded per generation, the pinned ring the steps report through. */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include "cuda/cu_sample_impl.h"
#include <math.h>
#include <stdlib.h>

static void *salloc(cu_sampler *c, size_t n, lily_status *st, lily_code *rc) {
    void *p = NULL;
    if (*rc) return NULL;
    cudaError_t e = cudaMalloc(&p, n ? n : 8);
    if (e != cudaSuccess) { *rc = cu_fail(st, e, "sampler buffer", __FILE__, __LINE__); return NULL; }
    c->bufs[c->nbuf++] = p;
    return p;
}

lily_code cu_sampler_new(int V, cu_sampler **out, lily_status *st) {
    *out = NULL;
    if (V < 1 || V >= (1 << 24)) return lily_err(st, LILY_EUNSUPPORTED, "GPU sampling takes vocabularies below 2^24 (got %d)", V);
    cu_sampler *c = (cu_sampler *)calloc(1, sizeof *c);
    if (!c) return lily_err(st, LILY_ENOMEM, "out of memory");
    int G = (V + CH - 1) / CH;
    c->V = V; c->G = G;
    lily_code rc = LILY_OK;
    samp_par *h = &c->h;
    h->V = V; h->G = G;
    h->counts = (int *)salloc(c, (size_t)V * 4, st, &rc);
    h->prompt = (unsigned char *)salloc(c, (size_t)V, st, &rc);
    h->bias_bits = (unsigned *)salloc(c, ((size_t)V / 32 + 1) * 4, st, &rc);
    h->z = (double *)salloc(c, (size_t)V * 8, st, &rc);
    h->p_zmax = (double *)salloc(c, (size_t)G * 8, st, &rc);
    h->p_arg = (int *)salloc(c, (size_t)G * 4, st, &rc);
    h->p_rmax = (float *)salloc(c, (size_t)G * 4, st, &rc);
    h->p_lse = (double *)salloc(c, (size_t)G * 8, st, &rc);
    h->p_mass = (ull *)salloc(c, (size_t)G * 8, st, &rc);
    h->tot_all = (ull *)salloc(c, 8, st, &rc);
    h->hc = (unsigned *)salloc(c, NB * 4, st, &rc);
    h->hm = (ull *)salloc(c, NB * 8, st, &rc);
    h->bstar = (int *)salloc(c, 4, st, &rc);
    h->p_topv = (float *)salloc(c, (size_t)G * LILY_MAX_LOGPROBS * 4, st, &rc);
    h->p_topi = (int *)salloc(c, (size_t)G * LILY_MAX_LOGPROBS * 4, st, &rc);
    h->cz = (double *)salloc(c, (size_t)V * 8, st, &rc);
    h->cid = (int *)salloc(c, (size_t)V * 4, st, &rc);
    h->cq = (ull *)salloc(c, (size_t)V * 8, st, &rc);
    h->cn = (int *)salloc(c, 4, st, &rc);
    h->rng = (ull *)salloc(c, 16, st, &rc);
    c->d = (samp_par *)salloc(c, sizeof(samp_par), st, &rc);
    if (!rc) {
        cudaError_t e = cudaHostAlloc((void **)&c->ring_h, (size_t)LCU_RING * RS * sizeof(int), cudaHostAllocMapped);
        if (e == cudaSuccess) e = cudaHostGetDevicePointer((void **)&h->ring, c->ring_h, 0);
        if (e != cudaSuccess) rc = cu_fail(st, e, "sampler ring", __FILE__, __LINE__);
    }
    if (rc) { cu_sampler_free(c); return rc; }
    *out = c;
    return LILY_OK;
}

void cu_sampler_free(cu_sampler *c) {
    if (!c) return;
    for (int i = 0; i < 2; i++)
        if (c->graph[i]) cudaGraphExecDestroy(c->graph[i]);
    for (int i = 0; i < c->nbuf; i++) cudaFree(c->bufs[i]);
    if (c->ring_h) cudaFreeHost(c->ring_h);
    free(c);
}

cudaGraphExec_t *cu_sampler_graph(cu_sampler *c, int tc) { return &c->graph[tc ? 1 : 0]; }
void cu_sampler_graphs_drop(cu_sampler *c) {
    for (int i = 0; i < 2; i++)
        if (c->graph[i]) {
            cudaGraphExecDestroy(c->graph[i]);
            c->graph[i] = NULL;
        }
}

typedef struct { int32_t id; int at; } bias_ent;
static int bias_cmp(const void *a, const void *b) {
    const bias_ent *x = (const bias_ent *)a, *y = (const bias_ent *)b;
    if (x->id != y->id) return x->id < y->id ? -1 : 1;
    return x->at - y->at; /* the CPU adds a token's entries in the order given */
}

/* The bias entries grouped by token (sorted), each token's in the caller's order. */
static lily_code upload_bias(cu_sampler *c, cudaStream_t s, const lily_sampling *p, lily_status *st) {
    samp_par *h = &c->h;
    int nb = p->n_bias, V = c->V;
    h->n_bias = 0;
    LCU_CHECK(cudaMemsetAsync(h->bias_bits, 0, ((size_t)V / 32 + 1) * 4, s));
    if (nb <= 0) return LILY_OK;
    for (int i = 0; i < nb; i++)
        if (p->bias_ids[i] < 0 || p->bias_ids[i] >= V)
            return lily_err(st, LILY_EINVAL, "logit bias for token %d, outside the vocabulary of %d", p->bias_ids[i], V);
    if (nb > c->bias_cap) {
        cudaFree(h->bias_ids); cudaFree(h->bias_off); cudaFree(h->bias_val);
        h->bias_ids = h->bias_off = NULL; h->bias_val = NULL;
        c->bias_cap = 0;
        LCU_CHECK(cudaMalloc((void **)&h->bias_ids, (size_t)nb * 4));
        LCU_CHECK(cudaMalloc((void **)&h->bias_off, (size_t)(nb + 1) * 4));
        LCU_CHECK(cudaMalloc((void **)&h->bias_val, (size_t)nb * 4));
        c->bias_cap = nb;
    }
    bias_ent *e = (bias_ent *)malloc((size_t)nb * sizeof *e);
    int *ids = (int *)malloc((size_t)nb * 4), *off = (int *)malloc((size_t)(nb + 1) * 4);
    float *val = (float *)malloc((size_t)nb * 4);
    unsigned *bits = (unsigned *)calloc((size_t)V / 32 + 1, 4);
    lily_code rc = LILY_OK;
    if (!e || !ids || !off || !val || !bits) rc = lily_err(st, LILY_ENOMEM, "out of memory");
    int nd = 0;
    if (!rc) {
        for (int i = 0; i < nb; i++) { e[i].id = p->bias_ids[i]; e[i].at = i; }
        qsort(e, (size_t)nb, sizeof *e, bias_cmp);
        for (int i = 0; i < nb; i++) {
            if (i == 0 || e[i].id != e[i - 1].id) { ids[nd] = e[i].id; off[nd++] = i; }
            val[i] = p->bias_values[e[i].at];
            bits[e[i].id >> 5] |= 1u << (e[i].id & 31);
        }
        off[nd] = nb;
        cudaError_t ce = cudaMemcpyAsync(h->bias_ids, ids, (size_t)nd * 4, cudaMemcpyHostToDevice, s);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(h->bias_off, off, (size_t)(nd + 1) * 4, cudaMemcpyHostToDevice, s);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(h->bias_val, val, (size_t)nb * 4, cudaMemcpyHostToDevice, s);
        if (ce == cudaSuccess) ce = cudaMemcpyAsync(h->bias_bits, bits, ((size_t)V / 32 + 1) * 4, cudaMemcpyHostToDevice, s);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(s); /* before the host buffers go */
        if (ce != cudaSuccess) rc = cu_fail(st, ce, "bias upload", __FILE__, __LINE__);
        h->n_bias = nd;
    }
    free(e); free(ids); free(off); free(val); free(bits);
    return rc;
}

lily_code cu_sampler_setup(cu_sampler *c, cudaStream_t s, const lily_sampling *p, const lcuda_sample_state *ss,
                           lily_status *st) {
    samp_par *h = &c->h;
    int V = c->V;
    int greedy = p->temperature <= 0 || p->top_k == 1;
    h->top_k = p->top_k > 0 && p->top_k < V ? p->top_k : 0;
    h->top_p = p->top_p;
    h->mode = greedy ? M_GREEDY : (h->top_k || p->top_p < 1.0f) ? M_SORTED : M_IDORDER;
    h->inv_t = greedy ? 1.0 : 1.0 / p->temperature;
    h->lmp = !greedy && p->min_p > 0 ? log(p->min_p) : -INFINITY;
    h->n_logprobs = p->n_logprobs < 0 ? 0 : p->n_logprobs > LILY_MAX_LOGPROBS ? LILY_MAX_LOGPROBS : p->n_logprobs;
    h->pp = p->presence_penalty; h->fp = p->frequency_penalty; h->rp = p->repetition_penalty;
    h->penal = p->presence_penalty != 0 || p->frequency_penalty != 0 || p->repetition_penalty != 1.0f;
    lily_code rc = upload_bias(c, s, p, st);
    if (rc) return rc;
    if (ss && ss->counts) LCU_CHECK(cudaMemcpyAsync(h->counts, ss->counts, (size_t)V * 4, cudaMemcpyHostToDevice, s));
    else LCU_CHECK(cudaMemsetAsync(h->counts, 0, (size_t)V * 4, s));
    if (ss && ss->prompt_mask) LCU_CHECK(cudaMemcpyAsync(h->prompt, ss->prompt_mask, (size_t)V, cudaMemcpyHostToDevice, s));
    else LCU_CHECK(cudaMemsetAsync(h->prompt, 0, (size_t)V, s));
    ull r[2] = { ss ? ss->rng[0] : 0, ss ? ss->rng[1] : 0 };
    LCU_CHECK(cudaMemcpyAsync(h->rng, r, 16, cudaMemcpyHostToDevice, s));
    LCU_CHECK(cudaMemcpyAsync(c->d, h, sizeof *h, cudaMemcpyHostToDevice, s));
    LCU_CHECK(cudaStreamSynchronize(s));
    return LILY_OK;
}

int cu_sampler_read(const cu_sampler *c, int step, lily_token *out) {
    const volatile int *r = c->ring_h + (step % LCU_RING) * RS;
    memset(out, 0, sizeof *out);
    if (r[3]) return 1;
    out->id = r[0];
    int b = r[1];
    memcpy(&out->logprob, &b, 4);
    out->n_top = r[2];
    for (int j = 0; j < out->n_top && j < LILY_MAX_LOGPROBS; j++) {
        out->top_ids[j] = r[4 + j];
        b = r[4 + LILY_MAX_LOGPROBS + j];
        memcpy(&out->top_logprobs[j], &b, 4);
    }
    return 0;
}

lily_code cu_sampler_rng(const cu_sampler *c, uint64_t out[2], lily_status *st) {
    ull r[2];
    LCU_CHECK(cudaMemcpy(r, c->h.rng, 16, cudaMemcpyDeviceToHost));
    out[0] = r[0]; out[1] = r[1];
    return LILY_OK;
}
