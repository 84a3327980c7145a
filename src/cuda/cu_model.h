/* Internal to the CUDA backend: the model and session as cu_backend.cu (the model), cu_session.cu,
 * cu_forward.cu, cu_batch.cu, cu_random.cu and cu_decode.cu share them. */
#ifndef LILY_CU_MODEL_H
#define LILY_CU_MODEL_H
#include "cuda/cu_common.h"
#include <limits.h>
extern "C" {
#include "cuda/cuda_backend.h"
}

#define LCU_SNAPSHOTS 4
#define LCU_RING 64
#define LCU_BGRAPHS 33 /* decode batches of up to 32 rows run as graphs (cu_batch.cu) */

typedef struct {
    int full;
    float *ln1, *ln2;
    dmat qkv, z, b, a, out;
    float *conv_w, *A_log, *dt_bias, *gnorm;
    dmat q, k, v, o;
    float *q_norm, *k_norm;
    dmat router, gate, up, down, sh_gate, sh_up, sh_down, sh_router;
    float *rtr; /* the router's codes in A-fragment order and its scales (cu_router_frag), or NULL */
} cu_layer;

struct lcuda_model {
    lily_config cfg;
    int max_ctx, max_sessions, chunk;
    dmat embed, lm_head;
    float *norm, *inv_freq;
    cu_layer *L;
    void **allocs;
    int n_alloc, cap_alloc;
    uint64_t bytes;
    uint64_t park_limit, park_used; /* parking's GPU tier (cu_park.cu): its budget and what it holds */
};

struct lcuda_session {
    lcuda_model *m;
    cudaStream_t st;
    cudaStream_t st2;              /* the shared expert at prefill, beside the routed ones (moe_shared_side); may be NULL */
    cudaEvent_t evf, evj;          /* fork to st2, join back */
    cudaEvent_t evp;               /* decode's L2 prefetch forks to st2 and their join (pf_fork); may be NULL */
    int n_lin, n_full;
    size_t conv_n, S_n, kv_n;     /* elements per layer (kv_n: [max_ctx][nkv][hd]) */
    float *conv, *S;
    uint16_t *kc, *vc;             /* fp16 [n_full][max_ctx][nkv][hd]: half the bytes of fp32 for decode attention's
                                    * reads at long context; prefill's tensor cores took fp16 keys already */
    float *snap_conv[LCU_SNAPSHOTS], *snap_S[LCU_SNAPSHOTS];
    /* step inputs/outputs on the device */
    int *d_ids, *d_pos, *d_tok, *d_step;
    int *ring_h, *ring_d;          /* pinned, mapped: [LCU_RING][2] (token, logprob bits) */
    int32_t *ids_h;                /* pinned [chunk]: lcuda_forward_begin's ids */
    /* scratch for up to `chunk` tokens */
    float *y2;                     /* NULL, or the out-projection's second part (proj_out): s->y + s->y2 */
    float *x, *t, *y, *mixed, *u, *zb, *bb, *aa, *g, *beta, *o;
    float *qg, *q, *kb, *vb, *ao, *part;
    float *rl, *wt, *hg, *hu, *D, *sg, *su, *sr, *SD;
    uint16_t *xps;                 /* fp16 [T][max(H, shared_inter)]: the shared expert's packed inputs on st2 */
    uint16_t *xpx, *xph;           /* fp16 [T][widest projection input] and [T*K][I]: packed GEMM inputs (cu_gemm_tc_xp, cu_moe_gate_up_xp) */
    const float *xp_src;           /* NULL, or the fp32 buffer (t or o) whose packed form its producer left in xpx for the
                                    * GEMMs that read it next (cu_rmsnorm2p and the other _p forms; cu_forward.cu) */
    int *sel, *cnt, *off, *src, *spos;
    int *tiles;                    /* [T*K/16 + E] the grouped GEMM's (expert, tile) map */
    unsigned *fcount;              /* [FCOUNT_N] block counters, 0 between launches: the fused router group's (mvq_fuse),
                                    * one unused, then cu_gdn_dec's (one a key head; a batch's row r at GDN_DEC_CNT r) */
    const float *fold_nw;          /* decode: the next in-projection's norm weight when the combine was folded into the
                                    * experts' down (cu_mvdp_comb): it normalizes x itself (mvq_fuse.nw); else NULL */
    float *gdn_scr;                /* [nv][T][dk + dv] the chunked delta rule's U/Vn and W */
    float *lg;                     /* [lg_rows][V] */
    int lg_rows;
    int pos;                       /* tokens the device state covers */
    int hpos;                      /* while a prefill chunk is enqueued, its first position (what d_pos holds); else -1 */
    const cu_rows *rows;           /* set while this session carries a decode batch (cu_batch.cu) */
    /* the row table of the batches this session carries, on the device and its host staging,
     * for up to bcap rows, grown on demand; per session (not per model) because batches of one
     * model may run on several threads at once */
    void *bmeta_d, *bmeta_h;
    int bcap;
    /* [tc]: the decode step's greedy graph and lcuda_forward's one-token pass with its logits
     * (cu_forward.cu), or NULL; tc 1 captured with decode attention on the tensor cores, which the host
     * picks for a step from its position (cu_attn_tc_at) */
    cudaGraphExec_t graph[2];
    cudaGraphExec_t fgraph[2];
    int attn_tc;                   /* cu_enqueue_forward's tc while it enqueues */
    cudaGraphExec_t bgraph[2][LCU_BGRAPHS]; /* [tc][n]: the pass of a decode batch of n rows this session carries,
                                             * or NULL; tc as graph's (every row's position past the form's start) */
    cudaEvent_t ev[4];
    struct cu_sampler *samp;       /* GPU sampling (cu_sample.cu), made on first use */
};

/* Tracks a device allocation for lcuda_model_free. */
lily_code cu_model_alloc(lcuda_model *m, void **p, size_t n, lily_status *st);
/* Uploads n same-shape matrices into one expert stack (for the kernel test too). */
lily_code cu_upload_mats(lcuda_model *m, const lw_mat *src, int n, dmat *d, lily_status *st);
lily_code cu_model_finish(lcuda_model *m, lily_status *st); /* chunk size, rope table */
/* Enqueues the whole forward of T tokens (ids in s->d_ids, position in s->d_pos);
 * logits: 0 none, 1 last row into s->lg, 2 all rows into s->lg. tc: decode attention on the tensor
 * cores (cu_attn_tc_at; s->attn_tc while enqueuing). */
void cu_enqueue_forward(lcuda_session *s, int T, int logits, int tc);
/* The same for a prefill chunk at position pos: sets d_pos, and hpos while enqueuing. */
void cu_enqueue_chunk(lcuda_session *s, int T, int pos, int logits, int tc);
/* lcuda_profile's marks: on from cu_prof_start; cu_prof_report (after the stream's sync) turns
 * them off and writes the time a stage as a markdown table */
void cu_prof_start(void);
int cu_prof_on(void);
void cu_prof_mark(lcuda_session *s, const char *lab);
void cu_prof_report(const char *title, char *out, size_t n);
/* Makes s->lg hold at least `rows` rows of logits (the decode graph, which captured the
 * old buffer, is dropped and rebuilt on next use). */
lily_code cu_logit_rows(lcuda_session *s, int rows, lily_status *st);
/* Drops the decode batches' graphs s carries (their buffers were reallocated, or s is freed). */
void cu_batch_graphs_drop(lcuda_session *s);
/* A decode batch's parts (cu_batch.cu), which lcuda_forward_batch and the batch's decode loop
 * (cu_batch_gen.cu) share. _check: the sessions distinct, of one model, the positions inside the
 * context. _table: the rows' table (positions and state pointers) into the carrier ss[0]'s device
 * buffer, R pointing at it, and the carrier's logits grown to n rows (the other sessions' streams
 * synchronized first). _pass: the forward of the n rows whose ids sit in c->d_ids (c->rows set),
 * their logits into c->lg [n][V]; a graph of each row count, replayed. */
lily_code cu_batch_check(lcuda_session **ss, const int *pos, int n, lily_status *st);
lily_code cu_batch_table(lcuda_session **ss, const int *pos, int n, cu_rows *R, lily_status *st);
lily_code cu_batch_pass(lcuda_session *c, int n, int tc, lily_status *st);
/* Plain greedy (temperature 0, no penalties, bias or logprobs): the argmax gives the sampler's token
 * with less work (cu_decode.cu). */
int cu_greedy_only(const lily_sampling *p);
/* Drops every graph that captured s's buffers: the decode step's, the one-token pass's, the batches'
 * and the sampler's (cu_logit_rows reallocated the logits; or s is freed). */
void cu_graphs_drop(lcuda_session *s);
/* Ends the capture begun on q (cudaStreamCaptureModeThreadLocal) and instantiates it into *out, its
 * kernel-to-kernel edges made programmatic where cu_pdl_on (cu_decode.cu); *out NULL on failure. */
lily_code cu_graph_end(cudaStream_t q, cudaGraphExec_t *out, const char *what, lily_status *st);
/* Splits of the decode attention for T rows that s->part holds. */
int cu_decode_splits(const lcuda_session *s, int T);
/* One token's decode attention: 128 key splits a KV head, of which as many as give each at least
 * 32 keys and at least half are used (attn_splits_used): up to 2,048 keys the 64 splits of before,
 * at 4K and 32K every split's loads in flight (H200, bench/RESULTS.md session 22: a fixed 128
 * took tg128@32768 333 -> 404 and tg128@4096 504 -> 515, tg128 555 -> 549). LILY_CU_DEC_KMIN=0:
 * always all 128, for measuring. The decode batches' rows keep cu_decode_splits. */
#define DECODE_SPLITS 128
static inline int cu_dec_kmin(void) {
    static int k = INT_MIN;
    cu_env_int(&k, "LILY_CU_DEC_KMIN", 32);
    return k < 0 ? 0 : k;
}
/* a session's device bytes for max_ctx tokens of context and chunk-token scratch (cu_session.cu) */
uint64_t cu_session_bytes(const lily_config *c, int max_ctx, int chunk);
lily_code cu_snap_alloc(lcuda_session *s, int slot, lily_status *st); /* the snapshot slot's buffers, once */
/* floats of s->D, the experts' down outputs of a chunk's T * K slots (+ the shared expert's row) */
static inline size_t moe_d_floats(const lcuda_model *m) { return ((size_t)m->chunk * m->cfg.top_k + 1) * m->cfg.hidden; }

#define FCOUNT_N (2 + GDN_DEC_CNT * GDN_DEC_ROWS)

#endif
