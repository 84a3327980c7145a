/* Private to cu_sample.cu (kernels) and cu_sample_host.cu (allocation, parameter upload,
 * ring reads): the launch geometry, the parameter block the kernels read from device memory
 * (so one captured graph serves every lily_sampling) and the sampler object. */
#ifndef LILY_CU_SAMPLE_IMPL_H
#define LILY_CU_SAMPLE_IMPL_H
#include "cuda/cu_sample.h"

#define SB 256            /* threads of the grid passes */
#define SPT 4             /* entries per thread */
#define CH (SB * SPT)     /* vocabulary entries per block */
#define FB 1024           /* threads of the finishing block (== CH: one entry each in the id walk) */
#define NB 512            /* histogram bins of zmax - z */
#define BPU 8.0           /* bins per unit of scaled logit */
#define QONE 17592186044416.0 /* 2^44 */
#define RS (4 + 2 * LILY_MAX_LOGPROBS)
#define NOID 0x7fffffff

typedef unsigned long long ull;

enum { M_GREEDY = 0, M_IDORDER = 1, M_SORTED = 2 };

typedef struct {
    int V, G, mode, top_k, n_logprobs, penal, n_bias; /* top_k 0 = off; n_bias = distinct ids */
    float pp, fp, rp;                                 /* presence, frequency, repetition */
    double inv_t, lmp, top_p;                         /* 1/T (1 when greedy), log(min_p) or -inf */
    int *counts;                                      /* [V] generated tokens, updated by each step */
    unsigned char *prompt;                            /* [V] prompt mask */
    unsigned *bias_bits;                              /* [V/32+1] which tokens have bias entries */
    int *bias_ids, *bias_off;                         /* sorted distinct ids, their entry ranges */
    float *bias_val;                                  /* entries grouped by id, caller's order */
    double *z;                                        /* [V] penalized, scaled logits */
    double *p_zmax;                                   /* [G] per block: max z, its id, max raw logit */
    int *p_arg;
    float *p_rmax;
    double *p_lse;                                    /* [G] raw exp sums (log Z) */
    ull *p_mass, *tot_all, *hm;                       /* [G] id-order masses; total; [NB] bin masses */
    unsigned *hc;                                     /* [NB] bin counts */
    int *bstar;                                       /* last candidate bin */
    float *p_topv;                                    /* [G][n_logprobs] per block best raw logits */
    int *p_topi;
    double *cz;                                       /* [V] candidates: z, id, weight; cn of them */
    int *cid;
    ull *cq;
    int *cn;
    ull *rng;                                         /* [2] the lily_rng state */
    int *ring;                                        /* device view of the pinned ring [LCU_RING][RS] */
} samp_par;

struct cu_sampler {
    int V, G, bias_cap;
    samp_par h;           /* host copy of the parameters */
    samp_par *d;          /* device copy the kernels read */
    int *ring_h;
    cudaGraphExec_t graph[2]; /* [tc] (as lcuda_session's graph) */
    void *bufs[32];
    int nbuf;
};
#endif
