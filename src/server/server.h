/* lily-server: the OpenAI-compatible HTTP server.
 *
 * Contract and shape
 * - request.c turns a request body into a validated srv_request (pure: no HTTP, no model;
 *   fuzzed by fuzz/fuzz_server_request.c). Any problem becomes an srv_error carrying the
 *   OpenAI error fields and the HTTP status; unknown fields are ignored.
 * - stop.c is the stop-string filter: text goes in as it is generated, text that can no
 *   longer be the start of a stop string comes out, and a stop string is never emitted.
 * - response.c builds the JSON bodies and SSE chunks from generated text (pure).
 * - sched.c owns the model: one scheduler thread, a fixed pool of session slots, a FIFO
 *   queue of jobs. Each round it gives every active job one step (prefill chunk or one
 *   token), so all streams progress. A job is shared by the scheduler and one HTTP
 *   thread (refcounted); the scheduler only appends to it and never blocks on a reader.
 * - http.c is libmicrohttpd in thread-per-connection mode: a handler may block on its
 *   own job (with short waits that also notice a closed socket) without stalling others.
 * - metrics.c keeps the Prometheus counters; main.c parses options and starts it all.
 * - park_dir.c keeps parked conversations in a folder across restarts (--cache-dir).
 */
#ifndef LILY_SERVER_H
#define LILY_SERVER_H
#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include "lily.h"
#include "text/chat.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

/* ---- errors ------------------------------------------------------------------------ */

typedef struct {
    int http;          /* status code */
    const char *type;  /* "invalid_request_error", "authentication_error", ... */
    char param[64];    /* offending field, "" = null */
    const char *code;  /* machine code or NULL */
    char message[512];
} srv_error;

void srv_error_set(srv_error *e, int http, const char *type, const char *param, const char *code,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}} as a malloc'd string. */
char *srv_error_json(const srv_error *e);

/* ---- requests ---------------------------------------------------------------------- */

typedef enum { SRV_CHAT = 0, SRV_COMPLETION } srv_kind;

#define SRV_MAX_STOP 16
#define SRV_MAX_STOP_LEN 256
#define SRV_MAX_BIAS 1024

typedef struct {
    srv_kind kind;
    json_t *body;             /* the parsed request (owned; chat rendering reads it) */
    char model[128];
    int stream, include_usage;
    int max_tokens;           /* -1 = not given */
    /* sampling: has_* says the request set it; unset ones take the model's defaults */
    float temperature, top_p, min_p, presence_penalty, frequency_penalty, repetition_penalty;
    int top_k;
    int has_temperature, has_top_p, has_min_p, has_top_k;
    int has_seed;
    uint64_t seed;
    int ignore_eos;           /* vLLM extension: end-of-sequence tokens do not stop it */
    int logprobs;             /* logprobs wanted */
    int top_logprobs;         /* 0..20 */
    int n_stop;
    char *stop[SRV_MAX_STOP];
    int tool_choice_none;     /* tools are not offered to the model */
    char *tool_force;         /* tool_choice "required" (""), or the named function; NULL = auto */
    int json_calls;           /* set by the server: the template writes Qwen3's JSON-form tool calls */
    int has_tools;
    int n_bias;               /* logit_bias entries (token id -> bias in [-100, 100]) */
    int32_t *bias_ids;
    float *bias_vals;
    int response_format;      /* 0 text, 1 json_object, 2 json_schema */
    char *schema;             /* json_schema: the schema as compact JSON text */
    /* completions: exactly one of prompt / prompt_ids */
    char *prompt;
    int32_t *prompt_ids;
    int n_prompt_ids;
} srv_request;

/* Parses and validates a body. Returns 0 on success (free with srv_request_free), or
 * -1 with *err filled (and nothing to free). */
int srv_request_parse(const char *body, size_t len, srv_kind kind, srv_request *out, srv_error *err);
void srv_request_free(srv_request *r);

/* For a forced tool_choice, the text the assistant turn is made to begin with (closing an
 * open <think>, opening <tool_call> and, for a named function, its <function=NAME> line, or
 * with json_calls Qwen3's {"name": "NAME", "arguments": opening);
 * NULL otherwise. malloc'd. The prompt ends with it and the output parser reads it first. */
char *srv_tool_prefix(const srv_request *r, int think_open);
/* The same prefix as pieces for the prompt encoder: up to 3 strings, with plain[i] set
 * where the piece is the request's (the function name). Returns the count (0: none). */
int srv_tool_prefix_parts(const srv_request *r, int think_open, const char *parts[3], int plain[3]);

/* ---- stop strings -------------------------------------------------------------------- */

typedef struct {
    int n;
    char *s[SRV_MAX_STOP];
    size_t len[SRV_MAX_STOP];
    char *held;               /* text that might still become a stop string */
    size_t n_held, cap;
    int stopped;
    int which;                /* the stop string that matched (when stopped) */
} srv_stop;

void srv_stop_init(srv_stop *f, char *const *stops, int n); /* copies the strings */
void srv_stop_free(srv_stop *f);
/* Feeds text; appends releasable text to *out (malloc'd/grown, *out_len updated).
 * Returns 1 when a stop string matched (everything before it released, the rest
 * dropped; further feeds release nothing), else 0. -1 on allocation failure. */
int srv_stop_feed(srv_stop *f, const char *text, size_t len, char **out, size_t *out_len, size_t *out_cap);
/* End of generation without a stop: releases what was held. */
int srv_stop_flush(srv_stop *f, char **out, size_t *out_len, size_t *out_cap);

/* ---- jobs and the scheduler --------------------------------------------------------- */

typedef enum {
    SRV_FINISH_NONE = 0, SRV_FINISH_STOP, SRV_FINISH_LENGTH, SRV_FINISH_CANCELLED, SRV_FINISH_ERROR,
    SRV_FINISH_SHUTDOWN       /* the server is stopping: answered with 503 */
} srv_finish;

#define SRV_MAX_SLOTS 256 /* --slots upper bound */

typedef struct srv_job {
    /* set by the submitter, read-only afterwards */
    int32_t *prompt;
    int n_prompt;
    int boundary;             /* a prefill step ends here (start of the last turn), 0 = none */
    int max_tokens;
    lily_sampling samp;
    int want_logprobs;
    int ignore_eos;
    char *stops[SRV_MAX_STOP];
    int n_stop;
    double t_submit;
    int32_t *bias_ids;        /* logit_bias, pointed to by samp (owned) */
    float *bias_vals;
    struct gram_grammar *gram; /* response_format: output constrained to it (owned), or NULL */
    int32_t gram_after;       /* the constraint starts after this token (</think>, <tool_call>), -1 = at once */
    char *gram_prefeed;       /* text the prompt already holds inside the constrained part (a forced call) */

    /* shared, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    char *text;               /* released text so far (NUL-terminated) */
    size_t text_len, text_cap;
    lily_token *toks;         /* every token, only when want_logprobs */
    int n_toks, toks_cap;
    int n_gen;                /* tokens generated */
    int n_reused;             /* prompt tokens restored from a cache */
    srv_finish finish;        /* != NONE: done */
    char error[512];
    int refs;

    int cancel;               /* atomic: the reader went away */
    /* scheduler-private */
    struct srv_job *next;
    int state;                /* 0 queued, 1 prefill, 2 decode */
    int n_fed;
    lily_rng rng;
    tok_stream *detok;
    srv_stop stop;
    double t_last, t_first;   /* the latest and the first generated token */
    struct gram_matcher *gm;  /* follows the constrained output */
    int gram_on;              /* the constraint applies to the next token */
} srv_job;

typedef struct srv_sched srv_sched;

typedef struct {
    lily_model *model;
    const tok_tokenizer *tok;
    int n_slots;
    int max_queue;            /* queued + active jobs allowed; beyond it submit says full */
    int prefill_chunk;        /* tokens per prefill step; 0 = whole prompt */
    const struct gram_vocab *gram_vocab; /* token bytes for response_format (NULL: refused) */
    size_t park_bytes;        /* host memory for parked conversations; 0 = none are kept there */
    int64_t gpu_park_bytes;   /* parking's GPU tier on the CUDA backend: its budget; < 0: half the GPU
                               * memory free after the slots' sessions; 0: off */
    struct srv_metrics *metrics;
    int log_requests;         /* one stderr line per finished job */
    const char *cache_dir;    /* parked conversations are loaded from here at start and saved by
                               * srv_sched_save (NULL: kept in memory only) */
    double cache_save_s;      /* with cache_dir: after this long idle with changes, the slots' and the
                               * parked conversations are synced to it (0: only at shutdown) */
} srv_sched_opts;

lily_code srv_sched_start(const srv_sched_opts *o, srv_sched **out, lily_status *st);
/* The CLOCK_REALTIME time after_s seconds from now, for pthread_cond_timedwait. */
struct timespec;
void srv_abstime(double after_s, struct timespec *ts);
/* Stops the scheduler thread; every unfinished job ends with SRV_FINISH_SHUTDOWN. The
 * object stays valid (cancel, counts, submit refusing) until srv_sched_stop. */
void srv_sched_shutdown(srv_sched *s);
void srv_sched_stop(srv_sched *s); /* shutdown (if not done) and free */
/* After srv_sched_shutdown: parks every slot's conversation and writes the parked ones to
 * o.cache_dir (most recently used first, within park_bytes). Does nothing without a cache_dir. */
void srv_sched_save(srv_sched *s);

/* park_dir.c: one file per conversation, named by a hash of its tokens (*.lpark).
 * Load calls add for each file that loads, with its age in seconds; a file that does not
 * is reported on stderr and skipped, or deleted when it was written for another model or
 * format version. Save writes ps[0..n) (most recent first) and removes every other *.lpark
 * file in dir; it returns how many it wrote, reporting failures on stderr. */
int srv_park_dir_load(const char *dir, const lily_model *m, void (*add)(void *u, lily_parked *p, double age), void *u);
/* One conversation to keep in the folder: a parked one (p), or a live session's (sess,
 * parked only when the folder lacks it); name from srv_park_name of its tokens. */
typedef struct {
    lily_parked *p;
    lily_session *sess;
    char name[64];
    double used;              /* lily_now() of its last use: orders the set (sync ignores it) */
} srv_park_entry;
void srv_park_name(const int32_t *t, int n, char out[64]);
/* Makes dir hold exactly es[0..n) (most recently used first): writes those it lacks, touches
 * the others in order, deletes the rest. stop (may be NULL) is asked before each write; once
 * it says so, no more are written (the rest of the set is still kept). Returns how many of
 * es the folder holds. */
int srv_park_dir_sync(const char *dir, const lily_model *m, const srv_park_entry *es, int n, int (*stop)(void *), void *u);
/* New job owning nothing yet; the caller fills the submitter fields. refs = 1. */
srv_job *srv_job_new(void);
void srv_job_unref(srv_job *j);
/* Queues the job (takes a reference). 0 ok, -1 queue full. */
int srv_sched_submit(srv_sched *s, srv_job *j);
/* The reader is gone: stop the job at the next step and free its slot. */
void srv_sched_cancel(srv_sched *s, srv_job *j);
void srv_sched_counts(srv_sched *s, int *queued, int *active);
int srv_model_vocab(srv_sched *s);
void srv_sched_info(srv_sched *s, lily_model_info *info);

/* ---- metrics ------------------------------------------------------------------------ */

typedef struct srv_metrics srv_metrics;
srv_metrics *srv_metrics_new(void);
void srv_metrics_free(srv_metrics *m);
void srv_metrics_request(srv_metrics *m, const char *route, int status);
void srv_metrics_tokens(srv_metrics *m, int prompt, int reused, int generated);
void srv_metrics_ttft(srv_metrics *m, double seconds);
void srv_metrics_itl(srv_metrics *m, double seconds);
void srv_metrics_event(srv_metrics *m, const char *what); /* "cancelled", "rejected", "error", "parked", "unparked" */
void srv_metrics_parked(srv_metrics *m, int n, uint64_t bytes, uint64_t gpu_bytes);
/* a lone stream's run in the device loop starting (tokens -1), or the tokens it chose there when
 * it ended (after the host's first) */
void srv_metrics_device_loop(srv_metrics *m, int tokens);
/* Prometheus text exposition; malloc'd. */
char *srv_metrics_render(srv_metrics *m, int queued, int active, int slots);

/* ---- responses ------------------------------------------------------------------------ */

/* Fills a unique id "<prefix><24 alphanumerics>" (always NUL-terminated within n). */
void srv_random_id(char *out, size_t n, const char *prefix);

/* Streaming state for one response: turns released text into SSE chunks. */
typedef struct {
    srv_kind kind;
    char id[48];
    const char *model;
    long created;
    int include_usage, want_logprobs;
    parse_stream *parser;     /* chat only */
    int n_calls;              /* tool calls emitted */
    int sent_role;
    const tok_tokenizer *tok; /* token text for logprobs */
} srv_stream;

/* Appends one SSE event "data: <json>\n\n" for obj (consumed) to a growing buffer. */
int srv_sse_append(char **buf, size_t *len, size_t *cap, json_t *obj);

/* The chat.completion / text_completion body (non-streaming). parsed: chat only. */
json_t *srv_chat_response(const char *id, const char *model, long created, const chat_parsed *parsed,
                          const char *finish, json_t *logprobs, int prompt_tokens, int completion_tokens,
                          int cached_tokens);
json_t *srv_completion_response(const char *id, const char *model, long created, const char *text,
                                const char *finish, json_t *logprobs, int prompt_tokens,
                                int completion_tokens, int cached_tokens);
json_t *srv_usage(int prompt_tokens, int completion_tokens, int cached_tokens);
/* Logprobs objects for tokens [from, to): chat form {"content":[...]} entries appended to
 * `content` (an array), completion form appended into its four arrays. */
void srv_logprobs_chat(const tok_tokenizer *tok, const lily_token *t, int n, json_t *content);
void srv_logprobs_completion(const tok_tokenizer *tok, const lily_token *t, int n, json_t *lp, long *offset);
json_t *srv_logprobs_completion_new(void); /* {"tokens":[],"token_logprobs":[],"top_logprobs":[],"text_offset":[]} */
/* One chat.completion.chunk with a single delta (consumed) and finish (may be NULL). */
json_t *srv_chat_chunk(const srv_stream *s, json_t *delta, const char *finish, json_t *logprobs);
json_t *srv_completion_chunk(const srv_stream *s, const char *text, size_t len, const char *finish,
                             json_t *logprobs);
/* Finish reason of a chat response given the parse and how generation ended. */
const char *srv_finish_name(srv_finish f, int n_calls);

/* ---- server ------------------------------------------------------------------------- */

typedef struct {
    const char *host;
    int port;                 /* 0 = any free port */
    const char *api_key;      /* NULL = no auth */
    size_t max_body;
    const char *model_name;
    int ctx_len;
    chat_template_kind template_kind;
    int threads;              /* HTTP connection limit */
    int slots;
} srv_http_opts;

typedef struct srv_http srv_http;
/* Binds and listens (clear error for a port in use), but serves nothing until started. */
lily_code srv_http_bind(const srv_http_opts *o, srv_http **out, int *bound_port, lily_status *st);
lily_code srv_http_start(srv_http *h, srv_sched *sched, const tok_tokenizer *tok, srv_metrics *m,
                         lily_status *st);
/* Stops accepting connections; requests in flight carry on. */
void srv_http_quiesce(srv_http *h);
void srv_http_stop(srv_http *h);

#endif
