/* Prometheus counters, gauges and histograms for /metrics, behind one mutex (updates are
 * a few per token, far below contention). */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/server.h"

#define N_BUCKETS 14
static const double bucket_le[N_BUCKETS] = { 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1,     2.5,  5,     10,   30 };
typedef struct { uint64_t n[N_BUCKETS]; uint64_t count; double sum; } histo;

#define N_ROUTES 11 /* the last entry is NULL */
#define R_OTHER 9
static const char *routes[N_ROUTES] = { "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                        "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/detokenize", "other",
                                        NULL };
#define N_STATUS 8
static const int statuses[N_STATUS] = { 200, 400, 401, 404, 405, 413, 500, 503 };

struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t req[N_ROUTES][N_STATUS + 1]; /* last column: other statuses */
    uint64_t prompt_tokens, reused_tokens, gen_tokens;
    uint64_t cancelled, rejected, errors;
    uint64_t parks, unparks, parked_bytes, parked_gpu_bytes;
    uint64_t dl_bursts, dl_tokens; /* the lone stream's device loop (sched.c burst) */
    int parked;
    histo ttft, itl;
};

srv_metrics *srv_metrics_new(void) {
    srv_metrics *m = calloc(1, sizeof *m);
    if (m) pthread_mutex_init(&m->mu, NULL);
    return m;
}

void srv_metrics_free(srv_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void srv_metrics_request(srv_metrics *m, const char *route, int status) {
    int r = R_OTHER, s = N_STATUS;
    for (int i = 0; routes[i]; i++)
        if (!strcmp(routes[i], route)) { r = i; break; }
    for (int i = 0; i < N_STATUS; i++)
        if (statuses[i] == status) { s = i; break; }
    pthread_mutex_lock(&m->mu);
    m->req[r][s]++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_tokens(srv_metrics *m, int prompt, int reused, int generated) {
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)prompt;
    m->reused_tokens += (uint64_t)reused;
    m->gen_tokens += (uint64_t)generated;
    pthread_mutex_unlock(&m->mu);
}

static void observe(srv_metrics *m, histo *h, double v) {
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < N_BUCKETS; i++)
        if (v <= bucket_le[i]) h->n[i]++;
    h->count++;
    h->sum += v;
    pthread_mutex_unlock(&m->mu);
}
void srv_metrics_ttft(srv_metrics *m, double s) { observe(m, &m->ttft, s); }
void srv_metrics_itl(srv_metrics *m, double s) { observe(m, &m->itl, s); }

void srv_metrics_event(srv_metrics *m, const char *what) {
    pthread_mutex_lock(&m->mu);
    if (!strcmp(what, "cancelled")) m->cancelled++;
    else if (!strcmp(what, "rejected")) m->rejected++;
    else if (!strcmp(what, "parked")) m->parks++;
    else if (!strcmp(what, "unparked")) m->unparks++;
    else m->errors++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_device_loop(srv_metrics *m, int tokens) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    if (tokens < 0) m->dl_bursts++;
    else m->dl_tokens += (uint64_t)tokens;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_parked(srv_metrics *m, int n, uint64_t bytes, uint64_t gpu_bytes) {
    pthread_mutex_lock(&m->mu);
    m->parked = n;
    m->parked_bytes = bytes;
    m->parked_gpu_bytes = gpu_bytes;
    pthread_mutex_unlock(&m->mu);
}

typedef struct { char *b; size_t n, cap; } sbuf;
static void pr(sbuf *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void pr(sbuf *s, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(s->b ? s->b + s->n : NULL, s->b ? s->cap - s->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) return;
        if (s->b && s->n + (size_t)k < s->cap) { s->n += (size_t)k; return; }
        size_t c = s->cap ? s->cap * 2 : 4096;
        while (c < s->n + (size_t)k + 1) c *= 2;
        char *nb = realloc(s->b, c);
        if (!nb) return;
        s->b = nb;
        s->cap = c;
    }
}

static void histo_out(sbuf *s, const char *name, const char *help, const histo *h) {
    pr(s, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (int i = 0; i < N_BUCKETS; i++) pr(s, "%s_bucket{le=\"%g\"} %llu\n", name, bucket_le[i], (unsigned long long)h->n[i]);
    pr(s, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->count, name, h->sum,
       name, (unsigned long long)h->count);
}

char *srv_metrics_render(srv_metrics *m, int queued, int active, int slots) {
    sbuf s = { 0 };
    pthread_mutex_lock(&m->mu);
    pr(&s, "# HELP lily_requests_total HTTP requests answered, by route and status.\n# TYPE lily_requests_total counter\n");
    for (int r = 0; routes[r]; r++)
        for (int k = 0; k <= N_STATUS; k++)
            if (m->req[r][k] || (k == 0 && r < 2))
                pr(&s, "lily_requests_total{route=\"%s\",status=\"%s%d\"} %llu\n", routes[r], k < N_STATUS ? "" : "other",
                   k < N_STATUS ? statuses[k] : 0, (unsigned long long)m->req[r][k]);
    pr(&s, "# HELP lily_prompt_tokens_total Prompt tokens of admitted requests.\n# TYPE lily_prompt_tokens_total counter\n"
           "lily_prompt_tokens_total %llu\n", (unsigned long long)m->prompt_tokens);
    pr(&s, "# HELP lily_prompt_tokens_cached_total Prompt tokens restored from a session cache instead of computed.\n"
           "# TYPE lily_prompt_tokens_cached_total counter\nlily_prompt_tokens_cached_total %llu\n",
       (unsigned long long)m->reused_tokens);
    pr(&s, "# HELP lily_generation_tokens_total Tokens generated.\n# TYPE lily_generation_tokens_total counter\n"
           "lily_generation_tokens_total %llu\n", (unsigned long long)m->gen_tokens);
    pr(&s, "# HELP lily_requests_cancelled_total Generations stopped because the client went away.\n"
           "# TYPE lily_requests_cancelled_total counter\nlily_requests_cancelled_total %llu\n",
       (unsigned long long)m->cancelled);
    pr(&s, "# HELP lily_requests_rejected_total Requests refused with 503 because the queue was full.\n"
           "# TYPE lily_requests_rejected_total counter\nlily_requests_rejected_total %llu\n",
       (unsigned long long)m->rejected);
    pr(&s, "# HELP lily_request_errors_total Generations that failed inside the engine.\n"
           "# TYPE lily_request_errors_total counter\nlily_request_errors_total %llu\n", (unsigned long long)m->errors);
    pr(&s, "# HELP lily_parked_total Conversations parked (in GPU or host memory) when their slot was reused.\n"
           "# TYPE lily_parked_total counter\nlily_parked_total %llu\n", (unsigned long long)m->parks);
    pr(&s, "# HELP lily_unparked_total Parked conversations restored into a slot instead of recomputed.\n"
           "# TYPE lily_unparked_total counter\nlily_unparked_total %llu\n", (unsigned long long)m->unparks);
    pr(&s, "# HELP lily_device_loop_runs_total Times streams were handed to a decode loop on the GPU (a lone stream's, or the batched one of concurrent streams).\n"
           "# TYPE lily_device_loop_runs_total counter\nlily_device_loop_runs_total %llu\n", (unsigned long long)m->dl_bursts);
    pr(&s, "# HELP lily_device_loop_tokens_total Tokens chosen and fed on the GPU without a host sync.\n"
           "# TYPE lily_device_loop_tokens_total counter\nlily_device_loop_tokens_total %llu\n", (unsigned long long)m->dl_tokens);
    pr(&s, "# HELP lily_parked_conversations Conversations parked now.\n# TYPE lily_parked_conversations gauge\n"
           "lily_parked_conversations %d\n", m->parked);
    pr(&s, "# HELP lily_parked_bytes Host memory held by parked conversations.\n# TYPE lily_parked_bytes gauge\n"
           "lily_parked_bytes %llu\n", (unsigned long long)m->parked_bytes);
    pr(&s, "# HELP lily_parked_gpu_bytes GPU memory held by parked conversations.\n# TYPE lily_parked_gpu_bytes gauge\n"
           "lily_parked_gpu_bytes %llu\n", (unsigned long long)m->parked_gpu_bytes);
    histo_out(&s, "lily_time_to_first_token_seconds", "Time from submission to the first generated token.", &m->ttft);
    histo_out(&s, "lily_inter_token_latency_seconds", "Time between consecutive tokens of one request.", &m->itl);
    pthread_mutex_unlock(&m->mu);
    pr(&s, "# HELP lily_queue_depth Requests waiting for a slot.\n# TYPE lily_queue_depth gauge\nlily_queue_depth %d\n", queued);
    pr(&s, "# HELP lily_requests_running Requests holding a slot.\n# TYPE lily_requests_running gauge\nlily_requests_running %d\n", active);
    pr(&s, "# HELP lily_slots Session slots.\n# TYPE lily_slots gauge\nlily_slots %d\n", slots);
    return s.b;
}
