/* The CUDA backend behind a plain C interface. Only this header is visible to the
 * engine; kernels live in the .cu files of src/cuda, compiled with make CUDA=1 CUDA_ARCH=sm_90a.
 * Without CUDA=1, cuda_stub.c implements the same functions: lcuda_available says why
 * there is no GPU and every other call returns LILY_EDEVICE.
 *
 * Contract
 * - lcuda_model_new uploads (and may repack) the weights bound in a lily_weights; the
 *   host copy may be unmapped afterwards only if the caller wants (the engine keeps it).
 * - A session holds the device caches: KV cache [n_full][max_ctx][nkv*hd] and the
 *   recurrent state (conv [n_lin][conv_dim][K-1], DeltaNet S [n_lin][nv][dk][dv] fp32).
 * - lcuda_forward has the semantics of cpu_forward (src/cpu/cpu.h): T tokens at
 *   positions pos..pos+T-1, logits [T][V] or [V] copied to host memory.
 * - Snapshots copy the recurrent state to a device-side slot so prefix reuse works as
 *   on the CPU.
 * - lcuda_generate runs the decode loop on the GPU: the chosen token is written into the
 *   next step's input on the device, tokens reach the host through pinned memory, and
 *   the host never waits per token. It feeds `first` at `pos`, then keeps going until
 *   max_tokens are produced, an EOS token, or cb returns nonzero. */
#ifndef LILY_CUDA_BACKEND_H
#define LILY_CUDA_BACKEND_H
#include <stddef.h>
#include <stdio.h>
#include "lily.h"
#include "loader/weights.h"

typedef struct lcuda_model lcuda_model;
typedef struct lcuda_session lcuda_session;

/* 1 when a usable GPU is present; otherwise 0 and a reason in why. */
int lcuda_available(char *why, size_t n);

/* progress (may be NULL) gets bytes uploaded so far and the total. */
lily_code lcuda_model_new(const lily_weights *w, int max_ctx, int max_sessions,
                          void (*progress)(void *, uint64_t, uint64_t), void *progress_user,
                          lcuda_model **out, lily_status *st);
/* A model of shape `cfg` with random MLX-style 4-bit weights (8-bit router) made directly in
 * GPU memory, for lily-bench: no checkpoint file needed. */
lily_code lcuda_model_random(const lily_config *cfg, int max_ctx, uint64_t seed, lcuda_model **out,
                             lily_status *st);
/* Bytes of weights held on the device. */
uint64_t lcuda_model_bytes(const lcuda_model *m);
void lcuda_model_free(lcuda_model *m);

lily_code lcuda_session_new(lcuda_model *m, lcuda_session **out, lily_status *st);
void lcuda_session_free(lcuda_session *s);
void lcuda_session_reset(lcuda_session *s);

lily_code lcuda_forward(lcuda_session *s, const int32_t *ids, int T, int pos, float *logits,
                        int all_logits, lily_status *st);

/* lcuda_forward of T <= the backend's chunk (lcuda_chunk) tokens with the last row's logits, split
 * in two: _begin enqueues the pass on the session's own stream and returns without waiting; _wait
 * copies the logits [V] to `logits` and waits for the pass. Begins of several sessions followed by
 * their waits run the passes side by side on the GPU; each gives what lcuda_forward would. */
lily_code lcuda_forward_begin(lcuda_session *s, const int32_t *ids, int T, int pos, lily_status *st);
lily_code lcuda_forward_wait(lcuda_session *s, float *logits, lily_status *st);
int lcuda_chunk(const lcuda_session *s);

/* A decode batch: session ss[i] is fed ids[i] at position pos[i] (like lcuda_forward with
 * T = 1), all n in one pass that reads the weights once; row i's logits [V] to host memory at
 * logits[i] (best page-locked: lcuda_host_alloc). The sessions must be distinct and of one
 * model. Each session's state ends exactly as if fed alone. Batches the backend does not take
 * in one pass (more rows than its chunk) are fed one session at a time. */
lily_code lcuda_forward_batch(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits,
                              lily_status *st);

/* Page-locked host memory (cudaHostAlloc), which device-to-host copies fill at the link's
 * full speed instead of through a staging copy; NULL when it cannot be had (no GPU, built
 * without CUDA): the caller then uses malloc. Freed with lcuda_host_free. */
void *lcuda_host_alloc(size_t bytes);
void lcuda_host_free(void *p);

lily_code lcuda_snapshot_save(lcuda_session *s, int slot, lily_status *st);
lily_code lcuda_snapshot_load(lcuda_session *s, int slot, lily_status *st);

/* Parking (src/engine/park.c): the attention cache rows below position n and the recurrent
 * state, to the host (to_host = 1) or back. kv: [n_full][2][n][n_kv_heads*head_dim] (keys
 * then values of each attention layer); conv, S: [n_lin][...] as the CPU cache holds them.
 * _snapshot_copy: one snapshot slot's recurrent state (allocated on the way back). */
lily_code lcuda_state_copy(lcuda_session *s, int to_host, int n, float *kv, float *conv, float *S, lily_status *st);
lily_code lcuda_snapshot_copy(lcuda_session *s, int slot, int to_host, float *conv, float *S, lily_status *st);

/* Parking's GPU tier (cu_park.cu): the cache rows below n, the recurrent state and the snapshot
 * slots snaps[0..n_snaps) copied into device memory of their own, device to device. The model's
 * parked conversations take at most lcuda_park_limit's bytes (0, the default: the tier is off,
 * LILY_EUNSUPPORTED); past it, or when the GPU has no room, LILY_ENOMEM. lcuda_unpark restores
 * into any session of the same model, snapshot j into slot j. lcuda_parked_read copies the
 * state to the host in lcuda_state_copy's layout, snapshot j into snap_conv[j], snap_S[j]. */
typedef struct lcuda_parked lcuda_parked;
void lcuda_park_limit(lcuda_model *m, uint64_t bytes);
uint64_t lcuda_park_used(const lcuda_model *m);
lily_code lcuda_park(lcuda_session *s, int n, const int *snaps, int n_snaps, lcuda_parked **out, lily_status *st);
lily_code lcuda_unpark(lcuda_session *s, const lcuda_parked *p, lily_status *st);
lily_code lcuda_parked_read(const lcuda_parked *p, float *kv, float *conv, float *S, float *const *snap_conv,
                            float *const *snap_S, lily_status *st);
uint64_t lcuda_parked_bytes(const lcuda_parked *p);
const lily_config *lcuda_parked_config(const lcuda_parked *p);
void lcuda_parked_free(lcuda_parked *p);
/* Device memory free now, in bytes (0 without a GPU). */
uint64_t lcuda_mem_free(void);

/* Position the device state covers (after lcuda_generate: pos + tokens it fed). */
int lcuda_session_pos(const lcuda_session *s);
/* Logits [V] of the last token lcuda_generate fed. */
lily_code lcuda_last_logits(lcuda_session *s, float *out, lily_status *st);

/* Where sampling stands when the device takes over (after the host sampled `first`):
 * counts [V] of the tokens generated so far (NULL = none), the prompt mask [V] for
 * repetition_penalty (nonzero = in the prompt; NULL = none), and the lily_rng state
 * (lily_rng.s) the next draw continues from. */
typedef struct {
    const int32_t *counts;
    const uint8_t *prompt_mask;
    uint64_t rng[2];
} lcuda_sample_state;

/* Every lily_sampling option runs on the device (src/cuda/cu_sample.cu): each step chooses
 * the token lily_sample_logits_ex would (same uniform draw, see docs/cuda.md for the
 * equivalence rule) and reports logprob and top alternatives. Plain greedy (temperature 0,
 * no penalties, bias or logprobs) takes the argmax graph. ss may be NULL for greedy. */
lily_code lcuda_generate(lcuda_session *s, int pos, int32_t first, const lily_sampling *p,
                         const lcuda_sample_state *ss, int max_tokens, lily_token_cb cb, void *user,
                         int *n_out, lily_status *st);

/* The decode loop over a batch (cu_batch_gen.cu): lcuda_generate for n sessions read together,
 * one lcuda_forward_batch pass a step, each row's token chosen on the device (the argmax, or its
 * session's sampler set up from rows[i].ss) and written into the next step's ids there; the host
 * runs a step behind, reading the rows' tokens from pinned memory, and never waits on the GPU a
 * step. Step 0 feeds rows[i].first at rows[i].pos. After each step cb sees every row's token in
 * row order (tok NULL: that row's sampler found every token at -inf); a nonzero return from any
 * of them ends the loop after that step, as does max_steps. *steps: the steps reported; *fed: the
 * steps run (each fed every row a token: first, then each reported one but possibly the last), so
 * session i is at rows[i].pos + *fed with its last step's logits [V] in logits[i]. n from 2 to the
 * backend's chunk (and 32); LILY_EUNSUPPORTED past that, with nothing run. */
typedef struct {
    int pos;                       /* the row's position: its session's tokens so far */
    int32_t first;                 /* the token step 0 feeds */
    const lily_sampling *p;        /* NULL: greedy */
    const lcuda_sample_state *ss;  /* where the row's sampling stands after `first` (NULL: fresh) */
} lcuda_batch_row;
typedef int (*lcuda_row_cb)(void *user, int row, const lily_token *tok);
lily_code lcuda_generate_batch(lcuda_session **ss, const lcuda_batch_row *rows, int n, int max_steps, lcuda_row_cb cb,
                               void *user, float *const *logits, int *steps, int *fed, lily_status *st);

/* For lily-bench: device time in milliseconds (CUDA events) of a T-token forward at pos
 * (ids random when NULL), and of n decode steps from pos (no host sync per step), greedy
 * when p is NULL, else sampling with p on the device. */
lily_code lcuda_time_forward(lcuda_session *s, const int32_t *ids, int T, int pos, double *ms, lily_status *st);
lily_code lcuda_time_decode(lcuda_session *s, int pos, int n, const lily_sampling *p, double *ms, lily_status *st);
/* Runs one T-token forward at pos (T <= the backend's chunk) with an event after every stage
 * and writes a markdown table of the time per stage, largest first. */
lily_code lcuda_profile(lcuda_session *s, int T, int pos, char *out, size_t n, lily_status *st);
/* lcuda_forward_batch (logits to logits[i]) with the same table for the batch's round */
lily_code lcuda_profile_batch(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits, char *out,
                              size_t on, lily_status *st);
#endif
