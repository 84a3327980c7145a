/* Sampling on the GPU (cu_sample.cu): the whole lily_sampling pipeline of the CPU sampler
 * (src/engine/sampler.c) as a few kernels that a CUDA graph can hold, so the decode loop
 * never waits for the host. See docs/cuda.md ("Sampling on the GPU").
 *
 * Contract
 * - cu_sampler_setup uploads the parameters, the generated-token counts, the prompt mask and
 *   the lily_rng state; it must run (synchronously, on stream s) before the enqueued steps.
 * - Each cu_sampler_enqueue'd step reads logits [V], chooses a token as
 *   lily_sample_logits_ex would with the uniform draw taken from the device copy of the
 *   lily_rng (one xoroshiro128+ step per non-greedy draw, as on the CPU), counts it, writes
 *   tok[0] = id (0 after an error, so the next step stays in bounds) and tok[1] = its logprob
 *   bits, and its full record (id, logprob, top alternatives, error flag) into ring slot
 *   *step % LCU_RING of pinned mapped memory that cu_sampler_read decodes.
 * - The step is a pure function of (logits, counts, prompt mask, parameters, rng state):
 *   every sum is exact (fixed-point integers), so the result does not depend on the order
 *   blocks run in. */
#ifndef LILY_CU_SAMPLE_H
#define LILY_CU_SAMPLE_H
#include "cuda/cu_common.h"
extern "C" {
#include "cuda/cuda_backend.h"
}

typedef struct cu_sampler cu_sampler;

lily_code cu_sampler_new(int V, cu_sampler **out, lily_status *st);
void cu_sampler_free(cu_sampler *c);
/* LILY_EINVAL for a logit bias outside the vocabulary (as the CPU sampler). */
lily_code cu_sampler_setup(cu_sampler *c, cudaStream_t s, const lily_sampling *p, const lcuda_sample_state *ss,
                           lily_status *st);
void cu_sampler_enqueue(cu_sampler *c, cudaStream_t s, const float *logits, int *tok, const int *step);
/* The record of step `step` (after that step completed); 1 when the step failed (every token
 * at -inf), 0 when out holds the token. */
int cu_sampler_read(const cu_sampler *c, int step, lily_token *out);
/* The decode graph that samples with c, built once per session and attention form (tc: cu_attn_tc_at). */
cudaGraphExec_t *cu_sampler_graph(cu_sampler *c, int tc);
/* Drops them (the session's logits buffer they captured was reallocated: cu_logit_rows). */
void cu_sampler_graphs_drop(cu_sampler *c);
/* The rng state after the steps run so far (for the kernel test). */
lily_code cu_sampler_rng(const cu_sampler *c, uint64_t out[2], lily_status *st);
#endif
