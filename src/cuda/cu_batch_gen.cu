/* The decode loop over a batch (lcuda_generate_batch): what lcuda_generate is for one stream, for
 * the n streams the server decodes together. A step is two graphs on the carrier's stream: the
 * batch's forward (cu_batch_pass, cached per row count) and the loop's tail, captured once per
 * call: each row's choice on its own session's stream (the argmax, or that session's sampler on
 * its row of the logits), forked from the forward and joined before one launch that writes the
 * tokens into the next step's ids, advances the rows' positions in the table and their step
 * counters, and copies each token to its session's ring (pinned, mapped). The host launches step
 * i + 1 before it waits for step i, so the GPU never idles on the host between rounds: no logits
 * copy, no host draw, no sync a step (the server's rounds lost 16-17% of lily-bench's batch rate
 * to those, bench/RESULTS.md session 37). */
#include "cuda/cu_model.h"
#include "cuda/cu_sample.h"
#include <stdlib.h>
#include <string.h>

/* The rows' tables (device): tok [n] (each row's [2]: id, logprob bits), step [n], ring [n]. */
typedef struct {
    int *tok[LCU_BGRAPHS], *step[LCU_BGRAPHS], *ring[LCU_BGRAPHS];
} bg_tab;

/* One block, a thread a row: after every row's choice, the token into the next step's ids and the
 * row's ring slot, then the position and step count (the ring is written first and fenced: the
 * host reads it once the step's event has fired). */
__global__ void k_batch_advance(const bg_tab *T, int *ids, int *pos, int n, int ring_n) {
    CU_PDL();
    const int i = threadIdx.x;
    if (i >= n) return;
    const int *t = T->tok[i];
    const int s = *T->step[i], slot = s % ring_n;
    ids[i] = t[0];
    T->ring[i][2 * slot] = t[0];
    T->ring[i][2 * slot + 1] = t[1];
    __threadfence_system();
    pos[i] += 1;
    *T->step[i] = s + 1;
}

/* Tears down what one call made. */
typedef struct {
    cudaEvent_t ev[LCU_BGRAPHS + 1]; /* [0] the fork, [1 + i] row i's join */
    cudaGraphExec_t tail;
    bg_tab *tab;
} bg_res;

static void bg_free(bg_res *r) {
    if (r->tail) cudaGraphExecDestroy(r->tail);
    for (int i = 0; i <= LCU_BGRAPHS; i++)
        if (r->ev[i]) cudaEventDestroy(r->ev[i]);
    cudaFree(r->tab);
    cudaGetLastError();
}

/* Row i's choice on stream q: its token into ss[i]->d_tok, its step's record (the sampler's) or the
 * argmax's pair. */
static void bg_choose(lcuda_session **ss, const lcuda_batch_row *rows, int i, cudaStream_t q) {
    lcuda_session *c = ss[0];
    const size_t V = (size_t)c->m->cfg.vocab;
    const float *lg = c->lg + i * V;
    if (!cu_greedy_only(rows[i].p)) cu_sampler_enqueue(ss[i]->samp, q, lg, ss[i]->d_tok, ss[i]->d_step);
    else cu_argmax(q, lg, (int)V, ss[i]->d_tok, ss[i]->part); /* (row 0's part: the forward is done with it) */
}

/* The tail's graph: the choices forked to the rows' streams (row 0 stays on the carrier's), joined,
 * then the advance. */
static lily_code bg_capture(lcuda_session **ss, const lcuda_batch_row *rows, int n, bg_res *r, int *pos_d,
                            lily_status *st) {
    lcuda_session *c = ss[0];
    LCU_CHECK(cudaStreamBeginCapture(c->st, cudaStreamCaptureModeThreadLocal));
    cudaError_t e = cudaEventRecord(r->ev[0], c->st);
    for (int i = 1; i < n && e == cudaSuccess; i++) {
        e = cudaStreamWaitEvent(ss[i]->st, r->ev[0], 0);
        if (e == cudaSuccess) bg_choose(ss, rows, i, ss[i]->st);
        if (e == cudaSuccess) e = cudaEventRecord(r->ev[1 + i], ss[i]->st);
    }
    if (e == cudaSuccess) bg_choose(ss, rows, 0, c->st);
    for (int i = 1; i < n && e == cudaSuccess; i++) e = cudaStreamWaitEvent(c->st, r->ev[1 + i], 0);
    if (e == cudaSuccess) cu_go(k_batch_advance, 1, 32, 0, c->st)(r->tab, c->d_ids, pos_d, n, LCU_RING);
    lily_code rc = cu_graph_end(c->st, &r->tail, "graph capture of a decode batch's token choice", st);
    if (!rc && e != cudaSuccess) rc = cu_fail(st, e, "a decode batch's fork", __FILE__, __LINE__);
    return rc;
}

/* Row i's token of step `step` from its ring; 1 when its sampler failed. */
static int bg_read(lcuda_session *s, const lcuda_batch_row *row, int step, lily_token *tok) {
    if (!cu_greedy_only(row->p)) return cu_sampler_read(s->samp, step, tok);
    memset(tok, 0, sizeof *tok);
    const volatile int *ring = s->ring_h;
    const int slot = step % LCU_RING;
    tok->id = ring[2 * slot];
    const int b = ring[2 * slot + 1];
    memcpy(&tok->logprob, &b, sizeof b);
    return 0;
}

#define BG_CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { rc = cu_fail(st, e_, #call, __FILE__, __LINE__); goto out; } } while (0)

lily_code lcuda_generate_batch(lcuda_session **ss, const lcuda_batch_row *rows, int n, int max_steps, lcuda_row_cb cb,
                               void *user, float *const *logits, int *steps, int *fed, lily_status *st) {
    *steps = *fed = 0;
    if (n < 2 || n >= LCU_BGRAPHS || n > ss[0]->m->chunk)
        return lily_err(st, LILY_EUNSUPPORTED, "a decode loop of %d rows (2 to %d)", n,
                        ss[0]->m->chunk < LCU_BGRAPHS - 1 ? ss[0]->m->chunk : LCU_BGRAPHS - 1);
    int pos[LCU_BGRAPHS], pmin = INT_MAX;
    for (int i = 0; i < n; i++) pos[i] = rows[i].pos;
    lily_code rc = cu_batch_check(ss, pos, n, st);
    if (rc) return rc;
    lcuda_session *c = ss[0];
    const lcuda_model *m = c->m;
    for (int i = 0; i < n; i++) {
        if (pos[i] + max_steps > m->max_ctx)
            return lily_err(st, LILY_ERANGE, "decoding %d tokens from position %d passes the context of %d", max_steps, pos[i], m->max_ctx);
        if (rows[i].first < 0 || rows[i].first >= m->cfg.vocab)
            return lily_err(st, LILY_EINVAL, "token id %d outside the vocabulary [0, %d)", rows[i].first, m->cfg.vocab);
        pmin = pos[i] < pmin ? pos[i] : pmin;
    }
    if (max_steps < 1) return LILY_OK;
    bg_res r;
    memset(&r, 0, sizeof r);
    cu_rows R;
    int launched = 0, done = 0, stop = 0;
    bg_tab h;
    memset(&h, 0, sizeof h);
    /* the samplers first: their setup synchronizes the carrier's stream */
    for (int i = 0; i < n && !rc; i++)
        if (!cu_greedy_only(rows[i].p)) {
            if (!ss[i]->samp && (rc = cu_sampler_new(m->cfg.vocab, &ss[i]->samp, st))) break;
            rc = cu_sampler_setup(ss[i]->samp, c->st, rows[i].p, rows[i].ss, st);
        }
    if (rc) return rc;
    if ((rc = cu_batch_table(ss, pos, n, &R, st))) return rc; /* (may drop graphs: before the tail's capture) */
    for (int i = 0; i <= n; i++) BG_CK(cudaEventCreateWithFlags(&r.ev[i], cudaEventDisableTiming));
    BG_CK(cudaMalloc((void **)&r.tab, sizeof *r.tab));
    for (int i = 0; i < n; i++) { h.tok[i] = ss[i]->d_tok; h.step[i] = ss[i]->d_step; h.ring[i] = ss[i]->ring_d; }
    BG_CK(cudaMemcpyAsync(r.tab, &h, sizeof h, cudaMemcpyHostToDevice, c->st));
    {
        int32_t ids[LCU_BGRAPHS];
        for (int i = 0; i < n; i++) { ids[i] = rows[i].first; cu_set_int(c->st, ss[i]->d_step, 0); }
        BG_CK(cudaMemcpyAsync(c->d_ids, ids, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, c->st));
        BG_CK(cudaStreamSynchronize(c->st)); /* (ids is on this stack) */
    }
    if ((rc = bg_capture(ss, rows, n, &r, (int *)R.pos, st))) goto out;
    c->rows = &R;
    for (int i = 0; i < max_steps && !stop; i++) {
        /* keep the GPU a step ahead: step launched + 1 reads the tokens step launched wrote */
        while (launched < max_steps && launched <= i + 1) {
            if ((rc = cu_batch_pass(c, n, cu_attn_tc_at(pmin + launched + 1), st))) goto out;
            BG_CK(cudaGraphLaunch(r.tail, c->st));
            BG_CK(cudaEventRecord(c->ev[launched % 4], c->st));
            launched++;
        }
        BG_CK(cudaEventSynchronize(c->ev[i % 4]));
        for (int k = 0; k < n; k++) {
            lily_token tok;
            int bad = bg_read(ss[k], &rows[k], i, &tok);
            stop |= cb ? cb(user, k, bad ? NULL : &tok) != 0 : 0;
            stop |= bad;
        }
        done = i + 1;
    }
    BG_CK(cudaStreamSynchronize(c->st));
    {
        const size_t V = (size_t)m->cfg.vocab;
        for (int i = 0; i < n; i++)
            BG_CK(cudaMemcpyAsync(logits[i], c->lg + i * V, V * sizeof(float), cudaMemcpyDeviceToHost, c->st));
        BG_CK(cudaStreamSynchronize(c->st));
    }
out:
    c->rows = NULL;
    if (rc) cudaStreamSynchronize(c->st); /* (nothing of this call may still run on what it frees) */
    for (int i = 0; i < n; i++) ss[i]->pos = pos[i] + launched;
    bg_free(&r);
    *steps = done;
    *fed = launched;
    return rc;
}
