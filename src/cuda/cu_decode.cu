/* The decode loop on the GPU: one CUDA graph per token step (forward, argmax or the
 * sampler of cu_sample.cu, the chosen token written into the next step's input), the host
 * one step behind, reading tokens from pinned mapped memory. Also the event-timed helpers
 * lily-bench uses. */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Turns each kernel-to-kernel edge of g whose kernel has that one predecessor into a
 * programmatic one (CU_PDL in cu_common.h): the successor is scheduled while the
 * predecessor runs and waits for it in its first statement. Off with LILY_CU_PDL=0 or below
 * compute capability 9.0. An edge that cannot be changed is left as it was. */
static void graph_pdl(cudaGraph_t g) {
#ifdef __CUDACC_EMU__ /* the emulator's graphs replay launches in order: nothing to overlap */
    (void)g;
#else
    size_t n = 0;
    if (!cu_pdl_on() || cudaGraphGetEdges(g, NULL, NULL, NULL, &n) != cudaSuccess || n == 0) return;
    cudaGraphNode_t *from = (cudaGraphNode_t *)malloc(n * sizeof *from), *to = (cudaGraphNode_t *)malloc(n * sizeof *to);
    cudaGraphEdgeData *ed = (cudaGraphEdgeData *)malloc(n * sizeof *ed);
    if (from && to && ed && cudaGraphGetEdges(g, from, to, ed, &n) == cudaSuccess) {
        for (size_t i = 0; i < n; i++) {
            size_t nin = 0;
            for (size_t k = 0; k < n; k++) nin += to[k] == to[i];
            cudaGraphNodeType a, b;
            if (nin != 1 || ed[i].type != cudaGraphDependencyTypeDefault || cudaGraphNodeGetType(from[i], &a) != cudaSuccess ||
                cudaGraphNodeGetType(to[i], &b) != cudaSuccess || a != cudaGraphNodeTypeKernel || b != cudaGraphNodeTypeKernel)
                continue;
            cudaGraphEdgeData pe;
            memset(&pe, 0, sizeof pe);
            pe.from_port = cudaGraphKernelNodePortProgrammatic;
            pe.type = cudaGraphDependencyTypeProgrammatic;
            if (cudaGraphRemoveDependencies(g, &from[i], &to[i], &ed[i], 1) != cudaSuccess) continue;
            if (cudaGraphAddDependencies(g, &from[i], &to[i], &pe, 1) != cudaSuccess)
                cudaGraphAddDependencies(g, &from[i], &to[i], &ed[i], 1);
        }
    }
    cudaGetLastError();
    free(from); free(to); free(ed);
#endif
}

lily_code cu_graph_end(cudaStream_t q, cudaGraphExec_t *out, const char *what, lily_status *st) {
    cudaGraph_t g;
    cudaError_t e = cudaStreamEndCapture(q, &g);
    if (e != cudaSuccess) return cu_fail(st, e, what, __FILE__, __LINE__);
    graph_pdl(g);
    e = cudaGraphInstantiate(out, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) { *out = NULL; return cu_fail(st, e, "cudaGraphInstantiate", __FILE__, __LINE__); }
    return LILY_OK;
}

/* The graph of the decode step whose token sits at position pos: greedy (argmax) into s->graph, or
 * with the sampler into its own; each captured once per attention form (tc, cu_attn_tc_at: the tensor
 * cores' from a context on), which the graph cannot switch itself, being replayed for every position. */
static lily_code step_graph(lcuda_session *s, cu_sampler *smp, int pos, cudaGraphExec_t *g, lily_status *st) {
    const int tc = cu_attn_tc_at(pos + 1);
    cudaGraphExec_t *out = smp ? cu_sampler_graph(smp, tc) : &s->graph[tc];
    *g = *out;
    if (*out) return LILY_OK;
    LCU_CHECK(cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal));
    cu_enqueue_forward(s, 1, 1, tc);
    if (smp) cu_sampler_enqueue(smp, s->st, s->lg, s->d_tok, s->d_step);
    else cu_argmax(s->st, s->lg, s->m->cfg.vocab, s->d_tok, s->part); /* (attention is done with part by then) */
    cu_step_advance(s->st, s->d_tok, s->d_ids, s->d_pos, s->d_step, s->ring_d, LCU_RING);
    lily_code rc = cu_graph_end(s->st, out, "graph capture of the decode step", st);
    *g = *out;
    return rc;
}

static lily_code start_steps(lcuda_session *s, int pos, int32_t first, lily_status *st) {
    LCU_CHECK(cudaMemcpyAsync(s->d_ids, &first, sizeof first, cudaMemcpyHostToDevice, s->st));
    cu_set_int(s->st, s->d_pos, pos);
    cu_set_int(s->st, s->d_step, 0);
    LCU_CHECK(cudaStreamSynchronize(s->st));
    return LILY_OK;
}

/* Plain greedy: the argmax graph gives the same token as the sampler, with less work. */
int cu_greedy_only(const lily_sampling *p) {
    if (!p) return 1;
    return p->temperature <= 0 && p->presence_penalty == 0 && p->frequency_penalty == 0 &&
           p->repetition_penalty == 1.0f && p->n_logprobs == 0 && p->n_bias == 0;
}

static int is_eos(const lily_config *c, int id) {
    for (int i = 0; i < c->n_eos && i < 8; i++) if (c->eos[i] == id) return 1;
    return 0;
}

lily_code lcuda_generate(lcuda_session *s, int pos, int32_t first, const lily_sampling *p,
                         const lcuda_sample_state *ss, int max_tokens, lily_token_cb cb, void *user, int *n_out,
                         lily_status *st) {
    if (n_out) *n_out = 0;
    if (max_tokens <= 0) return LILY_OK;
    if (pos < 0 || pos + max_tokens > s->m->max_ctx)
        return lily_err(st, LILY_ERANGE, "decoding %d tokens from position %d passes the context of %d", max_tokens, pos, s->m->max_ctx);
    cu_sampler *smp = NULL;
    lily_code rc;
    if (!cu_greedy_only(p)) {
        if (!s->samp && (rc = cu_sampler_new(s->m->cfg.vocab, &s->samp, st))) return rc;
        smp = s->samp;
        if ((rc = cu_sampler_setup(smp, s->st, p, ss, st))) return rc;
    }
    cudaGraphExec_t graph;
    if ((rc = step_graph(s, smp, pos, &graph, st))) return rc;
    if ((rc = start_steps(s, pos, first, st))) return rc;
    volatile int *ring = s->ring_h;
    int launched = 0, n = 0, failed = 0;
    LCU_CHECK(cudaGraphLaunch(graph, s->st));
    LCU_CHECK(cudaEventRecord(s->ev[0], s->st));
    launched = 1;
    for (int i = 0; i < max_tokens; i++) {
        /* keep the GPU one step ahead: step i+1 reads the token step i wrote on the device */
        if (launched < max_tokens) {
            if ((rc = step_graph(s, smp, pos + launched, &graph, st))) return rc;
            LCU_CHECK(cudaGraphLaunch(graph, s->st));
            LCU_CHECK(cudaEventRecord(s->ev[launched % 4], s->st));
            launched++;
        }
        LCU_CHECK(cudaEventSynchronize(s->ev[i % 4]));
        lily_token tok;
        memset(&tok, 0, sizeof tok);
        if (smp) {
            if (cu_sampler_read(smp, i, &tok)) { failed = 1; break; }
        } else {
            int slot = i % LCU_RING;
            tok.id = ring[2 * slot];
            int lpb = ring[2 * slot + 1];
            memcpy(&tok.logprob, &lpb, sizeof lpb);
        }
        n++;
        int stop = cb ? cb(user, &tok) : 0;
        if (stop || is_eos(&s->m->cfg, tok.id)) break;
    }
    LCU_CHECK(cudaStreamSynchronize(s->st));
    s->pos = pos + launched;
    if (n_out) *n_out = n;
    if (failed) return lily_err(st, LILY_EINVAL, "sampler: every token is penalized to -inf");
    return LILY_OK;
}

#if defined(LILY_CU_TRACE) && !defined(__CUDACC_EMU__)
/* ---- the decode timeline (cu_trace.h; a measuring build only) ---- */
static int (*trace_set[64])(cu_trace_buf *);
static int trace_nset;
int cu_trace_register(int (*set)(cu_trace_buf *)) {
    if (trace_nset < 64) trace_set[trace_nset++] = set;
    return trace_nset;
}
int cu_trace_enable(cu_trace_buf *buf) {
    int ok = 1;
    for (int i = 0; i < trace_nset; i++) ok &= trace_set[i](buf);
    return ok;
}
/* LILY_CU_TRACE_OUT=FILE: after lily-bench's timed decode, LILY_CU_TRACE_STEPS (8) more steps of
 * the same graph with every block noted, appended to FILE as a header line ("lily-trace steps
 * records\n") and the records (cu_trace_rec) as they lie in memory. */
static void trace_decode(lcuda_session *s, cudaGraphExec_t graph, int pos) {
    const char *path = getenv("LILY_CU_TRACE_OUT");
    const char *se = getenv("LILY_CU_TRACE_STEPS");
    int steps = se && *se ? atoi(se) : 8;
    if (!path || !*path || steps < 1 || pos + steps > s->m->max_ctx) return;
    const unsigned cap = 1u << 22;
    cu_trace_buf hb, *db = NULL;
    cu_trace_rec *dr = NULL, *hr = NULL;
    FILE *f = NULL;
    if (cudaMalloc((void **)&db, sizeof *db) != cudaSuccess || cudaMalloc((void **)&dr, (size_t)cap * sizeof *dr) != cudaSuccess) goto out;
    hb.n = 0; hb.cap = cap; hb.r = dr;
    if (cudaMemcpy(db, &hb, sizeof hb, cudaMemcpyHostToDevice) != cudaSuccess || !cu_trace_enable(db)) goto out;
    for (int i = 0; i < steps; i++) cudaGraphLaunch(graph, s->st);
    if (cudaStreamSynchronize(s->st) != cudaSuccess || cudaMemcpy(&hb, db, sizeof hb, cudaMemcpyDeviceToHost) != cudaSuccess) goto out;
    if (hb.n > cap) { fprintf(stderr, "lily-trace: %u records, %u kept\n", hb.n, cap); hb.n = cap; }
    if (!(hr = (cu_trace_rec *)malloc((size_t)hb.n * sizeof *hr)) || cudaMemcpy(hr, dr, (size_t)hb.n * sizeof *hr, cudaMemcpyDeviceToHost) != cudaSuccess) goto out;
    if ((f = fopen(path, "ab"))) {
        fprintf(f, "lily-trace %d %u\n", steps, hb.n);
        fwrite(hr, sizeof *hr, hb.n, f);
        fclose(f);
    }
    s->pos += steps;
out:
    cu_trace_enable(NULL);
    cudaGetLastError();
    cudaFree(db); cudaFree(dr); free(hr);
}
#endif

/* ---- timing for lily-bench ---- */
lily_code lcuda_time_forward(lcuda_session *s, const int32_t *ids, int T, int pos, double *ms, lily_status *st) {
    lcuda_model *m = s->m;
    if (T < 1 || pos < 0 || pos + T > m->max_ctx) return lily_err(st, LILY_ERANGE, "positions %d..%d outside the context of %d", pos, pos + T, m->max_ctx);
    int32_t *own = NULL;
    if (!ids) {
        own = (int32_t *)malloc((size_t)T * sizeof *own);
        if (!own) return lily_err(st, LILY_ENOMEM, "out of memory");
        uint64_t x = 0x9e3779b97f4a7c15ull ^ (uint64_t)pos;
        for (int i = 0; i < T; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; own[i] = (int32_t)(x % (uint64_t)m->cfg.vocab); }
        ids = own;
    }
    int32_t *pinned = NULL;
    cudaEvent_t a = NULL, b = NULL;
    lily_code rc = LILY_OK;
    cudaError_t e = cudaMallocHost((void **)&pinned, (size_t)T * sizeof *pinned);
    if (e == cudaSuccess) e = cudaEventCreate(&a);
    if (e == cudaSuccess) e = cudaEventCreate(&b);
    if (e != cudaSuccess) { rc = cu_fail(st, e, "timing setup", __FILE__, __LINE__); goto out; }
    memcpy(pinned, ids, (size_t)T * sizeof *pinned);
    /* LILY_CU_TIME_GRAPH=1 (one chunk): the same pass captured once and replayed, so the time is the
     * GPU's alone, without the host's launches; stderr gets the host's enqueue time of the plain pass
     * beside it (whether a short prompt's prefill waits on the host) */
    static int tg = -1;
    if (cu_env_flag(&tg, "LILY_CU_TIME_GRAPH", 0) && T <= m->chunk) {
        cudaGraphExec_t g = NULL;
        const double h0 = lily_now();
        cudaMemcpyAsync(s->d_ids, pinned, (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice, s->st);
        cu_enqueue_chunk(s, T, pos, 1, 0);
        const double h1 = lily_now();
        if ((e = cudaStreamSynchronize(s->st)) != cudaSuccess) { rc = cu_fail(st, e, "timed forward", __FILE__, __LINE__); goto out; }
        if ((e = cudaStreamBeginCapture(s->st, cudaStreamCaptureModeThreadLocal)) != cudaSuccess) { rc = cu_fail(st, e, "capture", __FILE__, __LINE__); goto out; }
        cu_enqueue_chunk(s, T, pos, 1, 0);
        if ((rc = cu_graph_end(s->st, &g, "graph capture of a timed forward", st))) goto out;
        cudaGraphLaunch(g, s->st); /* (the graph's first replay uploads it) */
        cudaEventRecord(a, s->st);
        cudaGraphLaunch(g, s->st);
        cudaEventRecord(b, s->st);
        e = cudaEventSynchronize(b);
        cudaGraphExecDestroy(g);
        fprintf(stderr, "lily-bench: %d tokens at %d: host enqueue %.3f ms (plain pass)\n", T, pos, (h1 - h0) * 1e3);
    } else {
        cudaEventRecord(a, s->st);
        for (int i = 0; i < T; i += m->chunk) {
            int k = T - i < m->chunk ? T - i : m->chunk;
            cudaMemcpyAsync(s->d_ids, pinned + i, (size_t)k * sizeof(int32_t), cudaMemcpyHostToDevice, s->st);
            cu_enqueue_chunk(s, k, pos + i, i + k == T ? 1 : 0, 0);
        }
        cudaEventRecord(b, s->st);
        e = cudaEventSynchronize(b);
    }
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) { rc = cu_fail(st, e, "timed forward", __FILE__, __LINE__); goto out; }
    {
        float f = 0;
        cudaEventElapsedTime(&f, a, b);
        *ms = f;
    }
    s->pos = pos + T;
out:
    if (a) cudaEventDestroy(a);
    if (b) cudaEventDestroy(b);
    if (pinned) cudaFreeHost(pinned);
    free(own);
    return rc;
}

lily_code lcuda_time_decode(lcuda_session *s, int pos, int n, const lily_sampling *p, double *ms, lily_status *st) {
    if (pos < 0 || pos + n > s->m->max_ctx) return lily_err(st, LILY_ERANGE, "decoding %d tokens from %d passes the context of %d", n, pos, s->m->max_ctx);
    cu_sampler *smp = NULL;
    lily_code rc;
    if (!cu_greedy_only(p)) {
        if (!s->samp && (rc = cu_sampler_new(s->m->cfg.vocab, &s->samp, st))) return rc;
        smp = s->samp;
        lcuda_sample_state ss = { NULL, NULL, { 0x9e3779b97f4a7c15ull, 0x6a09e667f3bcc909ull } };
        if ((rc = cu_sampler_setup(smp, s->st, p, &ss, st))) return rc;
    }
    cudaGraphExec_t graph;
    /* (every graph the timed steps take captured before the clock starts: the first's and the last's) */
    if ((rc = step_graph(s, smp, pos + n - 1, &graph, st)) || (rc = step_graph(s, smp, pos, &graph, st))) return rc;
    if ((rc = start_steps(s, pos, 1, st))) return rc;
    cudaEvent_t a, b;
    LCU_CHECK(cudaEventCreate(&a));
    LCU_CHECK(cudaEventCreate(&b));
    cudaEventRecord(a, s->st);
    for (int i = 0; i < n && !rc; i++) /* (captured above: step_graph only picks) */
        if (!(rc = step_graph(s, smp, pos + i, &graph, st))) cudaGraphLaunch(graph, s->st);
    cudaEventRecord(b, s->st);
    cudaError_t e = cudaEventSynchronize(b);
    if (e == cudaSuccess) e = cudaGetLastError();
    float f = 0;
    cudaEventElapsedTime(&f, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (e != cudaSuccess) return cu_fail(st, e, "timed decode", __FILE__, __LINE__);
    if (rc) return rc;
    *ms = f;
    s->pos = pos + n;
#if defined(LILY_CU_TRACE) && !defined(__CUDACC_EMU__)
    if (!step_graph(s, smp, s->pos, &graph, st)) trace_decode(s, graph, s->pos);
#endif
    return LILY_OK;
}
