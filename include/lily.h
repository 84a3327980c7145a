/* lily: an inference engine for the Qwen3.5/3.6 MoE family (qwen3_5_moe).
 *
 * Contract
 * - A lily_model is an immutable, loaded checkpoint (weights mmapped or on the GPU).
 *   It may be shared by many sessions on many threads; only lily_model_free needs
 *   every session to be gone first.
 * - A lily_session is one conversation: its KV cache, DeltaNet state and the list of
 *   tokens it has consumed. A session is used by one thread at a time.
 * - Every fallible call returns LILY_OK or an error code and, when `st` is not NULL,
 *   fills st->msg with a sentence naming what was wrong (tensor, file, field).
 *   The library never exits the process and never prints except through the
 *   progress callback the caller installs.
 * - Token ids are int32; logits are float32 [vocab] rows.
 * - Nothing here exposes tensors: the server and CLI see tokens, logits, text.
 */
#ifndef LILY_H
#define LILY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LILY_OK = 0,
    LILY_EINVAL,      /* bad argument or request */
    LILY_EIO,         /* file or network I/O failed */
    LILY_ENOMEM,      /* allocation failed or model/context does not fit */
    LILY_EFORMAT,     /* malformed checkpoint, config or data */
    LILY_EUNSUPPORTED,/* valid input outside what lily handles */
    LILY_ERANGE,      /* context length or size limit exceeded */
    LILY_ECANCELED,   /* stopped by the caller's callback */
    LILY_EDEVICE,     /* GPU missing, wrong architecture, or a device call failed */
} lily_code;

typedef struct {
    lily_code code;
    char msg[512];
} lily_status;

const char *lily_code_name(lily_code c);

/* ---- model ---------------------------------------------------------------- */

typedef struct lily_model lily_model;
typedef struct lily_session lily_session;

typedef enum { LILY_BACKEND_AUTO = 0, LILY_BACKEND_CPU, LILY_BACKEND_CUDA } lily_backend;

typedef struct {
    lily_backend backend; /* AUTO: CUDA when built with it and a GPU is present */
    int n_threads;        /* CPU worker threads; 0 = all cores */
    int max_ctx;          /* largest context a session may reach; 0 = 4096 */
    int max_sessions;     /* sessions the backend must be able to hold at once; 0 = 1 */
    /* Round RoPE inverse frequencies to bf16, as transformers has them after a whole-model
     * .to(bfloat16) cast. The fixtures' reference outputs were made that way, so `lily check`
     * turns it on; serving keeps float32 frequencies (what transformers' from_pretrained,
     * vLLM and llama.cpp use). */
    int rope_bf16_freq;
    /* Optional load progress: done/total bytes. */
    void (*progress)(void *user, uint64_t done, uint64_t total);
    void *progress_user;
} lily_model_opts;

typedef struct {
    int vocab_size;
    int hidden_size;
    int n_layers;
    int n_full_attn_layers;
    int n_experts;
    int n_experts_per_tok;
    int max_ctx;
    int n_eos;
    int32_t eos_ids[8];      /* from generation_config.json / config.json */
    uint64_t n_params;       /* text-model parameters */
    uint64_t weight_bytes;   /* bytes of weights as held in memory */
    const char *backend;     /* "cpu" or "cuda" */
    const char *layout;      /* "hf", "hf-per-expert", "mlx4" ... */
    /* generation_config.json defaults (negative = absent) */
    float gen_temperature, gen_top_p, gen_min_p;
    int gen_top_k;
} lily_model_info;

void lily_model_opts_default(lily_model_opts *o);

/* Opens the checkpoint folder `dir` (config.json + safetensors). */
lily_code lily_model_open(const char *dir, const lily_model_opts *opts,
                          lily_model **out, lily_status *st);
void lily_model_free(lily_model *m);
void lily_model_get_info(const lily_model *m, lily_model_info *info);

/* ---- sessions --------------------------------------------------------------- */

lily_code lily_session_new(lily_model *m, lily_session **out, lily_status *st);
void lily_session_free(lily_session *s);
/* Forgets everything: position 0. */
void lily_session_reset(lily_session *s);
/* Number of tokens the session's caches hold, and the tokens themselves. */
int lily_session_len(const lily_session *s);
const int32_t *lily_session_tokens(const lily_session *s);

/* Feeds n tokens after the current position. When `logits` is not NULL it receives
 * [n][vocab] logits, one row per fed token; the last row is always kept and readable
 * through lily_session_logits. */
lily_code lily_session_feed(lily_session *s, const int32_t *ids, int n, float *logits,
                            lily_status *st);

/* Makes the session hold exactly `ids`: reuses the longest prefix it can restore
 * (its own tokens, or a snapshot taken at a turn boundary), and feeds the rest.
 * `*reused` (may be NULL) gets the number of tokens not recomputed. n must be >= 1. */
lily_code lily_session_prefill(lily_session *s, const int32_t *ids, int n, int *reused,
                               lily_status *st);

/* lily_session_prefill with snapshot control. `marks` (increasing, may be NULL) are
 * positions where a later request is expected to diverge, e.g. where the prompt's last
 * turn begins: a follow-up conversation that re-renders that turn differently (the
 * Qwen3.6 template drops old reasoning) resumes from there instead of from scratch.
 * snapshot_end = 0 skips the snapshot at n (an intermediate chunk of a long prompt). */
lily_code lily_session_prefill_ex(lily_session *s, const int32_t *ids, int n, const int *marks,
                                  int n_marks, int snapshot_end, int *reused, lily_status *st);

/* Prefills several sessions at once (the server's arrivals): job i ends exactly as
 * lily_session_prefill_ex(s, ids, n, marks, n_marks, snapshot_end, &reused) would leave it,
 * with that call's result in rc and st, whatever the other jobs do. On the GPU the sessions'
 * passes run side by side. Sessions must be distinct and of one model; LILY_EINVAL (nothing
 * run) otherwise, else LILY_OK with each job's own result. */
typedef struct {
    lily_session *s;
    const int32_t *ids;
    int n;
    const int *marks;
    int n_marks;
    int snapshot_end;
    int reused;        /* out: tokens not recomputed */
    lily_code rc;      /* out */
    lily_status st;    /* out: the job's error, when rc is not LILY_OK */
} lily_prefill_job;
lily_code lily_prefill_batch(lily_prefill_job *jobs, int n, lily_status *st);

/* Feeds one token to each of n sessions of one model in a single pass, so the weights are
 * read once for all of them (continuous batching): session ss[i] gets ids[i]. The result
 * equals n separate lily_session_feed calls. Sessions must be distinct. */
lily_code lily_decode_batch(lily_session **ss, const int32_t *ids, int n, lily_status *st);

/* Parking: a conversation's state copied out of its session into a compact host-memory
 * object (its tokens, the used attention-cache rows, the recurrent state and the snapshots
 * on its path), so the session can serve another conversation and this one can come back
 * later without recomputing its prefix. The session is unchanged by parking; unparking
 * makes a session hold exactly the parked tokens and caches (its logits are gone: the next
 * lily_session_prefill recomputes at least one token). On the CUDA backend the state is
 * copied from and to the device. */
typedef struct lily_parked lily_parked;
lily_code lily_session_park(lily_session *s, lily_parked **out, lily_status *st);
lily_code lily_session_unpark(lily_session *s, const lily_parked *p, lily_status *st);
const int32_t *lily_parked_tokens(const lily_parked *p, int *n);
size_t lily_parked_bytes(const lily_parked *p);
/* Position of the parked snapshot i (0 when there is no such snapshot). */
int lily_parked_snapshot(const lily_parked *p, int i);
void lily_parked_free(lily_parked *p);
/* Parking's GPU tier (CUDA models): lily_session_park keeps the conversation in device memory
 * of its own, a device-to-device copy (~0.1 ms where the host tier takes tens of ms in fresh
 * host pages), while the model's conversations parked there take at most the budget set here;
 * past it parking falls back to the host. bytes < 0: half of the device memory free now; 0 (the
 * default): off. *effective (may be NULL) gets the budget. LILY_EUNSUPPORTED on a CPU model.
 * A conversation parked on the GPU unparks only into the same model's sessions; saving it
 * (lily_parked_save) copies it to the host first. */
lily_code lily_model_set_park_gpu(lily_model *m, int64_t bytes, uint64_t *effective, lily_status *st);
/* lily_session_park choosing the tier: LILY_PARK_ANY (the GPU's when on and not full, else the
 * host's; what lily_session_park does), LILY_PARK_GPU (LILY_ENOMEM when its budget is full or
 * the GPU has no room, LILY_EUNSUPPORTED when the tier is off), LILY_PARK_HOST. */
enum { LILY_PARK_ANY = 0, LILY_PARK_GPU = 1, LILY_PARK_HOST = 2 };
lily_code lily_session_park_to(lily_session *s, int where, lily_parked **out, lily_status *st);
/* 1 when p is held in GPU memory (lily_parked_bytes then counts device bytes), else 0. */
int lily_parked_on_gpu(const lily_parked *p);
/* Moves p from GPU memory into host memory (nothing to do when it is there); on failure p
 * is unchanged. */
lily_code lily_parked_to_host(lily_parked *p, lily_status *st);
/* Parked conversations on disk, so they survive a restart (docs/engine.md has the format).
 * lily_parked_save writes p to `path` through a temporary file in the same folder that is
 * fsynced and then renamed over `path`: a crash or a full disk never leaves a file at `path`
 * that is not complete, and on failure (LILY_EIO naming the file and the reason) nothing is
 * left behind. The file records a fingerprint of the model's shape and weights (m must be the
 * model the conversation was parked from) and a SHA-256 of its contents.
 * lily_parked_load checks everything before using it: magic, version, every length against
 * the file's size before allocating, token ids, the checksum. Errors name the file and the
 * reason: LILY_EIO (cannot read), LILY_EFORMAT (not such a file, truncated, corrupted),
 * LILY_EUNSUPPORTED (written for a model of another shape or other weights, or by another
 * version), LILY_ERANGE (longer than m's context length). */
lily_code lily_parked_save(const lily_parked *p, const lily_model *m, const char *path, lily_status *st);
lily_code lily_parked_load(const lily_model *m, const char *path, lily_parked **out, lily_status *st);

/* Logits [vocab] after the last fed token, or NULL before any token. */
const float *lily_session_logits(lily_session *s);

/* ---- sampling and generation -------------------------------------------------- */

typedef struct {
    float temperature;       /* 0 = greedy, bit-for-bit deterministic */
    int top_k;               /* 0 = off */
    float top_p;             /* 1 = off */
    float min_p;             /* 0 = off */
    float presence_penalty;  /* OpenAI semantics, over generated tokens */
    float frequency_penalty;
    float repetition_penalty;/* 1 = off; multiplicative, over prompt and output */
    uint64_t seed;
    int n_logprobs;          /* top alternatives to report per token, 0..20 */
    int n_bias;              /* logit_bias: bias_values[i] is added to token bias_ids[i]'s */
    const int32_t *bias_ids; /*   logit before everything else (borrowed; n_bias entries) */
    const float *bias_values;
} lily_sampling;

void lily_sampling_default(lily_sampling *p);

#define LILY_MAX_LOGPROBS 20
typedef struct {
    int32_t id;
    float logprob;                     /* of the chosen token, under the unmodified distribution */
    int n_top;
    int32_t top_ids[LILY_MAX_LOGPROBS];
    float top_logprobs[LILY_MAX_LOGPROBS];
} lily_token;

/* Called once per generated token, in order. Return nonzero to stop
 * (the token is already part of the output). */
typedef int (*lily_token_cb)(void *user, const lily_token *tok);

/* Generates up to max_tokens after the session's current state, stopping early at an
 * EOS token (reported to the callback, with the reason), or when the callback says so.
 * Returns LILY_OK on EOS/length/callback stop; `*n_out` (may be NULL) = tokens made.
 * The session afterwards holds every generated token except possibly the last. */
lily_code lily_session_generate(lily_session *s, const lily_sampling *p, int max_tokens,
                                lily_token_cb cb, void *user, int *n_out, lily_status *st);

/* One sampling step on the current logits without feeding anything. */
lily_code lily_session_sample(lily_session *s, const lily_sampling *p, lily_token *out,
                              lily_status *st);

/* Is `id` an end-of-sequence token for this model? */
int lily_model_is_eos(const lily_model *m, int32_t id);

#ifdef __cplusplus
}
#endif
#endif
