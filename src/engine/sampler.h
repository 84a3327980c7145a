/* Token sampling: one pure function from a logits row to a chosen token.
 *
 * Contract
 * - lily_sample_logits never changes `logits`; it is deterministic given the rng state
 *   (the same logits, parameters, counts and rng state give the same token), and it
 *   draws exactly one uniform number from `rng` per call unless it is greedy, when it
 *   draws none.
 * - temperature <= 0 is greedy: argmax of the penalized logits, lowest id on ties.
 *   Bit-for-bit deterministic; rng may be NULL.
 * - Otherwise the pipeline is: penalties -> temperature -> top-k -> top-p -> min-p ->
 *   draw. top-k keeps the k largest (lowest id first on ties); top-p keeps the smallest
 *   set of most likely tokens whose mass (renormalized after top-k) reaches top_p; min-p
 *   keeps tokens whose probability is at least min_p times the most likely one's. At
 *   least one token always survives.
 * - Penalties (OpenAI semantics): logit -= presence_penalty * (count > 0)
 *   + frequency_penalty * count, where count is how many times the token was generated.
 *   repetition_penalty (1 = off) divides positive logits and multiplies negative ones of
 *   every token that was generated or, with the _ex form, appears in the prompt.
 * - out->logprob and out->top_* come from the log-softmax of the unmodified logits
 *   (no penalties, no temperature), so they describe the model, not the sampler.
 *   out->n_top = min(p->n_logprobs, LILY_MAX_LOGPROBS, vocab), sorted by logprob
 *   descending, lowest id first on ties.
 * - Bad parameters (NaN, negative top_k, top_p outside (0,1], min_p outside [0,1],
 *   n_logprobs outside [0,20], vocab < 1) give LILY_EINVAL with a message.
 *   Non-finite logits are treated as -inf (never chosen unless all are).
 */
#ifndef LILY_SAMPLER_H
#define LILY_SAMPLER_H
#include <stdint.h>
#include "lily.h"
#include "util/util.h"

lily_code lily_sample_logits(const float *logits, int vocab, const lily_sampling *p,
                             lily_rng *rng, const int32_t *counts, lily_token *out,
                             lily_status *st);

/* The same with a prompt-token mask ([vocab], nonzero = token occurs in the prompt) that
 * widens repetition_penalty to the prompt; prompt_mask may be NULL. */
lily_code lily_sample_logits_ex(const float *logits, int vocab, const lily_sampling *p,
                                lily_rng *rng, const int32_t *counts,
                                const uint8_t *prompt_mask, lily_token *out,
                                lily_status *st);

/* The same restricted to the tokens with allowed[id] != 0 (allowed may be NULL = all):
 * the others count as -inf logits before penalties and truncation, so top-k, top-p and
 * min-p act on the allowed tokens alone (constrained decoding). Logprobs still describe the
 * unmodified model distribution. LILY_EINVAL if no allowed token has a finite logit. */
lily_code lily_sample_logits_mask(const float *logits, int vocab, const lily_sampling *p,
                                  lily_rng *rng, const int32_t *counts,
                                  const uint8_t *prompt_mask, const uint8_t *allowed,
                                  lily_token *out, lily_status *st);

/* Tests only: nonzero makes the row scans visit every token (the plain loops the skipping
 * ones must agree with, bit for bit). */
extern int lily_sampler_scan_all;

/* 1 when p chooses greedily (temperature <= 0, or top_k 1: the same set), drawing no uniform from the rng;
 * a device loop advances its caller's rng by one draw a token exactly where this is 0. */
int lily_sampling_greedy(const lily_sampling *p);

/* Validates p (the same checks lily_sample_logits makes). */
lily_code lily_sampling_check(const lily_sampling *p, lily_status *st);

/* lily_session_generate for a caller that keeps its own sampling state across calls (the
 * server's lone stream, src/server/sched.c): the first token is drawn on the host from the
 * session's logits, every later one on the GPU in its decode loop (no host sync a token).
 * Unlike lily_session_generate it neither seeds rng nor starts counts afresh: rng (and counts,
 * NULL when no penalty needs them) advance by exactly what a host loop drawing the same tokens
 * would have used, so the caller can go on sampling on the host afterwards and get the tokens
 * of one uninterrupted stream. cb sees each token after its count; a nonzero return stops.
 * *n_out tokens were reported, of which the session fed the first *n_fed (all of them or all
 * but the last). LILY_EUNSUPPORTED, with nothing drawn, when the session is not on a GPU. */
lily_code lily_session_generate_cont(lily_session *s, const lily_sampling *p, lily_rng *rng, int32_t *counts,
                                     const uint8_t *pmask, int max_tokens, lily_token_cb cb, void *user, int *n_out,
                                     int *n_fed, lily_status *st);

/* The server's concurrent streams in one decode loop on the GPU: each step feeds every row's
 * session a token in one batched pass (rows[i].first at step 0, drawn, counted and reported by the
 * caller) and draws each row's next token on the device with the row's parameters, rng, counts and
 * prompt mask, which advance as a host loop drawing the same tokens would advance them (as
 * lily_session_generate_cont); the host reads a step while the GPU runs the next. cb sees every
 * row's token of a step in row order (NULL: the row's every token was at -inf); a nonzero return ends
 * the loop after that step, as does max_steps (or a session's full context). rows[i].n_out: the
 * steps reported (the same for all rows); n_fed: the steps run, each feeding a token: first and the
 * reported ones, all of them or all but the last (n_fed == n_out: the last is not in the session).
 * LILY_EUNSUPPORTED, with nothing run, off a GPU or for n outside 2..32 (or past the backend's
 * chunk). */
typedef struct {
    lily_session *s;
    int32_t first;
    const lily_sampling *p;
    lily_rng *rng;
    int32_t *counts;          /* NULL when no penalty needs them */
    const uint8_t *pmask;     /* the prompt's tokens for repetition_penalty, or NULL */
    int n_out, n_fed;
} lily_batch_row;
typedef int (*lily_row_cb)(void *user, int row, const lily_token *tok);
lily_code lily_session_generate_batch(lily_batch_row *rows, int n, int max_steps, lily_row_cb cb, void *user,
                                      lily_status *st);

#endif
