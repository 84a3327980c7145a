/* Server-sent events: a content-reader callback that relays one job. Each call waits
 * (in 50 ms slices, peeking at the socket) for new text, turns it into chunks — for chat
 * through the streaming output parser, so reasoning, content and whole tool calls come
 * as separate deltas — and ends with the finish chunk, the usage chunk when asked for,
 * and "data: [DONE]". The job lives on with its own reference until the response is
 * freed; a reader that goes away cancels it. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "server/anthropic.h"
#include "server/http_int.h"
#include "server/responses.h"

typedef struct {
    srv_http *h;
    srv_job *j;
    int fd;
    const char *route;
    srv_stream s;
    json_t *body;          /* the request (the parser reads its tools) */
    size_t text_off;
    int tok_off;
    char *out;
    size_t out_len, out_cap, out_off;
    int done, counted;
    json_t *lp;            /* logprobs not yet attached to a chunk */
    long lp_offset;
    srv_anth_stream *anth; /* Anthropic events instead of chunks, or NULL */
    srv_resp_stream *resp; /* Responses events instead of chunks, or NULL */
} stream_ctx;

static int has_news(srv_job *j, void *arg) {
    stream_ctx *x = arg;
    return j->text_len > x->text_off || j->n_toks > x->tok_off || j->finish != SRV_FINISH_NONE;
}

static void count_tokens(stream_ctx *x) {
    if (x->counted) return;
    x->counted = 1;
    pthread_mutex_lock(&x->j->mu);
    int p = x->j->n_prompt, r = x->j->n_reused, g = x->j->n_gen;
    pthread_mutex_unlock(&x->j->mu);
    srv_metrics_tokens(x->h->m, p, r, g);
}

static json_t *take_lp(stream_ctx *x) {
    json_t *lp = x->lp;
    x->lp = NULL;
    if (lp && x->s.kind == SRV_CHAT) {
        json_t *o = json_object();
        json_object_set_new(o, "content", lp);
        return o;
    }
    return lp;
}

static int emit(stream_ctx *x, json_t *chunk) {
    if (x->anth) return srv_anth_stream_feed(x->anth, chunk, &x->out, &x->out_len, &x->out_cap);
    if (x->resp) return srv_resp_stream_feed(x->resp, chunk, &x->out, &x->out_len, &x->out_cap);
    return srv_sse_append(&x->out, &x->out_len, &x->out_cap, chunk);
}

/* Appends literal SSE text (a comment, the [DONE] line) to the output buffer. */
static int emit_raw(stream_ctx *x, const char *s, size_t n) {
    if (x->out_len + n + 1 > x->out_cap) {
        char *b = realloc(x->out, x->out_len + n + 1);
        if (!b) return -1;
        x->out = b;
        x->out_cap = x->out_len + n + 1;
    }
    memcpy(x->out + x->out_len, s, n);
    x->out_len += n;
    return 0;
}

/* Produces the next piece of output into x->out. -1: the client is gone. */
static int produce(stream_ctx *x) {
    srv_job *j = x->j;
    if (x->s.kind == SRV_CHAT && !x->s.sent_role) {
        x->s.sent_role = 1;
        return emit(x, srv_chat_chunk(&x->s, json_pack("{s:s,s:s}", "role", "assistant", "content", ""), NULL, NULL));
    }
    pthread_mutex_lock(&j->mu);
    int w = srv_wait_job(j, x->fd, has_news, x, SRV_SSE_PING);
    if (w < 0) {
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    if (w > 0) { /* still waiting (queued or a long prefill): an SSE comment, ignored by clients */
        pthread_mutex_unlock(&j->mu);
        static const char ping[] = ": keep-alive\n\n";
        if (emit_raw(x, ping, sizeof ping - 1)) return -1;
        return 0;
    }
    size_t n = j->text_len - x->text_off;
    char *text = malloc(n + 1);
    if (text && n) memcpy(text, j->text + x->text_off, n);
    x->text_off = j->text_len;
    int nt = j->n_toks - x->tok_off;
    lily_token *toks = nt ? malloc(sizeof *toks * (size_t)nt) : NULL;
    if (toks) memcpy(toks, j->toks + x->tok_off, sizeof *toks * (size_t)nt);
    x->tok_off = j->n_toks;
    srv_finish fin = j->finish;
    int n_prompt = j->n_prompt, n_gen = j->n_gen, n_reused = j->n_reused;
    char err[512];
    snprintf(err, sizeof err, "%s", j->error);
    if (x->anth && fin == SRV_FINISH_STOP && j->stop.stopped && j->stop.which >= 0 && !x->anth->stop_seq)
        x->anth->stop_seq = strdup(j->stop.s[j->stop.which]);
    if (x->resp && fin == SRV_FINISH_LENGTH) x->resp->incomplete = 1;
    pthread_mutex_unlock(&j->mu);
    if (!text) { free(toks); return -1; }

    if (toks && x->s.want_logprobs) {
        if (!x->lp) x->lp = x->s.kind == SRV_CHAT ? json_array() : srv_logprobs_completion_new();
        if (x->s.kind == SRV_CHAT) srv_logprobs_chat(x->h->tok, toks, nt, x->lp);
        else srv_logprobs_completion(x->h->tok, toks, nt, x->lp, &x->lp_offset);
    }
    free(toks);
    int rc = 0;
    if (x->s.kind == SRV_CHAT) {
        json_t *deltas = json_array();
        lily_status st = { 0 };
        if (n) parse_stream_feed(x->s.parser, text, n, deltas, &st);
        if (fin != SRV_FINISH_NONE && fin != SRV_FINISH_CANCELLED) parse_stream_finish(x->s.parser, deltas, &st);
        size_t i;
        json_t *d;
        json_array_foreach(deltas, i, d) {
            json_t *tc = json_object_get(d, "tool_calls");
            if (tc) x->s.n_calls += (int)json_array_size(tc);
            rc |= emit(x, srv_chat_chunk(&x->s, json_incref(d), NULL, take_lp(x)));
        }
        json_decref(deltas);
    } else if (n) {
        rc |= emit(x, srv_completion_chunk(&x->s, text, n, NULL, take_lp(x)));
    }
    free(text);
    if (fin == SRV_FINISH_NONE) return rc;
    if (fin == SRV_FINISH_CANCELLED) return -1;
    if (fin == SRV_FINISH_ERROR || fin == SRV_FINISH_SHUTDOWN) {
        srv_error e;
        if (fin == SRV_FINISH_SHUTDOWN)
            srv_error_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down.");
        else srv_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", err);
        rc |= emit(x, json_loads(srv_error_json(&e), 0, NULL));
    } else {
        const char *fr = srv_finish_name(fin, x->s.n_calls);
        if (x->s.kind == SRV_CHAT) rc |= emit(x, srv_chat_chunk(&x->s, json_object(), fr, take_lp(x)));
        else rc |= emit(x, srv_completion_chunk(&x->s, "", 0, fr, take_lp(x)));
        if (x->s.include_usage)
            rc |= emit(x, json_pack("{s:s,s:s,s:I,s:s,s:[],s:o}", "id", x->s.id, "object",
                                    x->s.kind == SRV_CHAT ? "chat.completion.chunk" : "text_completion", "created",
                                    (json_int_t)x->s.created, "model", x->s.model, "choices", "usage",
                                    srv_usage(n_prompt, n_gen, n_reused)));
    }
    static const char done[] = "data: [DONE]\n\n";
    if (!x->anth && !x->resp && emit_raw(x, done, sizeof done - 1)) return -1;
    x->done = 1;
    count_tokens(x);
    return rc;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream_ctx *x = cls;
    while (x->out_off == x->out_len) {
        if (x->done) return MHD_CONTENT_READER_END_OF_STREAM;
        x->out_len = x->out_off = 0;
        if (produce(x) < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = x->out_len - x->out_off < max ? x->out_len - x->out_off : max;
    memcpy(buf, x->out + x->out_off, n);
    x->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) {
    stream_ctx *x = cls;
    pthread_mutex_lock(&x->j->mu);
    int running = x->j->finish == SRV_FINISH_NONE;
    pthread_mutex_unlock(&x->j->mu);
    if (running) srv_sched_cancel(x->h->sched, x->j);
    count_tokens(x);
    srv_job_unref(x->j);
    parse_stream_free(x->s.parser);
    json_decref(x->body);
    json_decref(x->lp);
    if (x->anth) srv_anth_stream_free(x->anth);
    free(x->anth);
    if (x->resp) srv_resp_stream_free(x->resp);
    free(x->resp);
    free(x->out);
    free(x);
}

static enum MHD_Result stream_begin(srv_http *h, struct MHD_Connection *c, int fd, const char *route,
                                    const srv_request *r, srv_job *j, int anthropic, srv_resp_ctx *rctx) {
    stream_ctx *x = calloc(1, sizeof *x);
    if (x && rctx && !(x->resp = calloc(1, sizeof *x->resp))) { free(x); x = NULL; }
    if (!x) { srv_resp_ctx_free(rctx); srv_sched_cancel(h->sched, j); return MHD_NO; }
    if (rctx) x->resp->ctx = rctx;
    x->h = h;
    x->j = j;
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    x->fd = fd;
    x->route = route;
    x->body = json_incref(r->body);
    x->s.kind = r->kind;
    srv_random_id(x->s.id, sizeof x->s.id, r->kind == SRV_CHAT ? "chatcmpl-" : "cmpl-");
    x->s.model = h->model_name;
    x->s.created = (long)time(NULL);
    x->s.include_usage = r->include_usage;
    x->s.want_logprobs = r->logprobs;
    x->s.tok = h->tok;
    if (anthropic && (x->anth = calloc(1, sizeof *x->anth))) {
        srv_random_id(x->anth->id, sizeof x->anth->id, "msg_");
        x->anth->model = h->model_name;
        pthread_mutex_lock(&j->mu);
        x->anth->input_tokens = j->n_prompt;
        pthread_mutex_unlock(&j->mu);
    }
    if (r->kind == SRV_CHAT) {
        chat_parse_opts po = { chat_think_open(r->body, h->o.template_kind),
                               r->tool_choice_none ? NULL : json_object_get(x->body, "tools"), 0 };
        lily_status st = { 0 };
        if (parse_stream_new(&po, &x->s.parser, &st)) {
            x->s.parser = NULL;
            stream_free(x);
            return MHD_NO;
        }
        char *forced = srv_tool_prefix(r, po.think_open);
        if (forced) { /* already in the prompt: the parser reads it first, nothing is sent for it */
            json_t *skip = json_array();
            parse_stream_feed(x->s.parser, forced, strlen(forced), skip, &st);
            json_decref(skip);
            free(forced);
        }
    }
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, x, stream_free);
    if (!resp) {
        stream_free(x);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result rc = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    srv_metrics_request(h->m, route, 200);
    return rc;
}

enum MHD_Result srv_stream_start(srv_http *h, struct MHD_Connection *c, int fd, const char *route,
                                 const srv_request *r, srv_job *j, int anthropic) {
    return stream_begin(h, c, fd, route, r, j, anthropic, NULL);
}

enum MHD_Result srv_stream_start_resp(srv_http *h, struct MHD_Connection *c, int fd, const char *route,
                                      const srv_request *r, srv_job *j, srv_resp_ctx *ctx) {
    return stream_begin(h, c, fd, route, r, j, 0, ctx);
}
