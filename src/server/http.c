/* HTTP with libmicrohttpd, one thread per connection. A generation request blocks its own
 * connection thread: non-streaming ones wait for the job in the handler, streaming ones
 * in the response's content reader. Both wait in short slices and peek at the socket
 * between them, so a client that hangs up cancels its job within ~50 ms even when
 * nothing is being written to it. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "server/http_int.h"
#include "text/grammar.h"
#include "server/anthropic.h"
#include "server/responses.h"

enum { R_CHAT, R_COMPLETIONS, R_MODELS, R_HEALTH, R_METRICS, R_MESSAGES, R_COUNT, R_TOKENIZE, R_DETOKENIZE,
       R_RESPONSES, R_RESPONSE_ID, R_NONE };
static const char *route_names[] = { "/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics",
                                     "/v1/messages", "/v1/messages/count_tokens", "/tokenize", "/detokenize",
                                     "/v1/responses", "/v1/responses/{id}", "other" };
#define IS_POST(r) ((r) == R_CHAT || (r) == R_COMPLETIONS || (r) == R_MESSAGES || (r) == R_COUNT || \
                    (r) == R_TOKENIZE || (r) == R_DETOKENIZE || (r) == R_RESPONSES)
#define IS_ANTH(r) ((r) == R_MESSAGES || (r) == R_COUNT)

typedef struct {
    int route;
    char *body;
    size_t n, cap;
    int too_large;
    int fd;
    srv_resp_ctx *resp;    /* /v1/responses: the request's context (until a stream takes it) */
} conn_ctx;

static int route_of(const char *url) {
    if (!strncmp(url, "/v1/responses/", 14) && url[14]) return R_RESPONSE_ID;
    for (int r = 0; r < R_NONE; r++) {
        size_t l = strlen(route_names[r]);
        if (!strncmp(url, route_names[r], l) && (url[l] == 0 || (url[l] == '/' && url[l + 1] == 0))) return r;
    }
    return R_NONE;
}

static enum MHD_Result send_body(srv_http *h, struct MHD_Connection *c, int route, int status, const char *ctype,
                                 char *body /* freed */) {
    if (!body) { body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}"); status = 500; }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", ctype);
    if (status == 405)
        MHD_add_response_header(r, "Allow", IS_POST(route) ? "POST" : "GET, HEAD");
    if (status == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_request(h->m, route_names[route], status);
    return rc;
}

static enum MHD_Result send_json(srv_http *h, struct MHD_Connection *c, int route, int status, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return send_body(h, c, route, status, "application/json", s);
}

static enum MHD_Result send_error(srv_http *h, struct MHD_Connection *c, int route, const srv_error *e) {
    if (route == R_RESPONSES) { /* the chat validator's field names, as this route calls them */
        srv_error f = *e;
        srv_resp_fix_param(&f);
        return send_body(h, c, route, f.http, "application/json", srv_error_json(&f));
    }
    return send_body(h, c, route, e->http, "application/json", IS_ANTH(route) ? srv_anth_error_json(e) : srv_error_json(e));
}

int srv_peer_closed(int fd) {
    if (fd < 0) return 0;
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r == 0) return 1;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return 1;
    return 0;
}

void srv_abstime(double after_s, struct timespec *ts) {
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = ts->tv_nsec + (long long)(after_s * 1e9);
    ts->tv_sec += (time_t)(ns / 1000000000LL);
    ts->tv_nsec = (long)(ns % 1000000000LL);
}

/* Waits on the job until `ready` holds (0), the client leaves (-1) or, when max_s > 0,
 * max_s seconds pass (1). Called with j->mu held. */
int srv_wait_job(srv_job *j, int fd, int (*ready)(srv_job *, void *), void *arg, double max_s) {
    double t0 = lily_now();
    while (!ready(j, arg)) {
        if (max_s > 0 && lily_now() - t0 >= max_s) return 1;
        struct timespec ts;
        srv_abstime(0.05, &ts);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!ready(j, arg) && srv_peer_closed(fd)) return -1;
    }
    return 0;
}

static int job_done(srv_job *j, void *arg) { (void)arg; return j->finish != SRV_FINISH_NONE; }

static uint64_t random_seed(void) {
    uint64_t s;
    if (getrandom(&s, sizeof s, 0) != (ssize_t)sizeof s) s = (uint64_t)(lily_now() * 1e9);
    return s;
}

/* The request minus its tools, for tool_choice "none". */
static json_t *without_tools(json_t *body) {
    json_t *c = json_object();
    const char *k;
    json_t *v;
    json_object_foreach(body, k, v) if (strcmp(k, "tools")) json_object_set(c, k, v);
    return c;
}

/* Tool calls that always parse and match their schemas: the call's text is decoded under the
 * tools' grammar (text/grammar.h), from the start when tool_choice forces a call (the
 * prompt already holds its opening, which the matcher is fed first), else from the moment
 * the model writes <tool_call>. Tools whose schemas cannot be enforced stay unconstrained,
 * unless one is marked "strict", which then is a 400. Returns -1 with *e set. */
static int tool_grammar(srv_http *h, const srv_request *r, srv_job *j, srv_error *e) {
    json_t *tools = json_object_get(r->body, "tools");
    int strict = 0;
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) strict |= json_is_true(json_object_get(json_object_get(t, "function"), "strict"));
    char *tj = json_dumps(tools, JSON_COMPACT), *pre = NULL;
    lily_status st = { 0 };
    int multi = !json_is_false(json_object_get(r->body, "parallel_tool_calls")); /* false: exactly one call */
    lily_code rc = tj ? gram_tool_call(tj, strlen(tj), r->json_calls ? GRAM_TOOLS_JSON : GRAM_TOOLS_XML,
                                       r->tool_force && *r->tool_force ? r->tool_force : NULL,
                                       multi, &j->gram, &st)
                      : lily_err(&st, LILY_ENOMEM, "out of memory");
    free(tj);
    if (rc) {
        j->gram = NULL;
        if (rc == LILY_ENOMEM) { srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return -1; }
        if (strict) { srv_error_set(e, 400, "invalid_request_error", "tools", NULL, "%s", st.msg); return -1; }
        return 0;
    }
    if (r->tool_force && (pre = srv_tool_prefix(r, chat_think_open(r->body, h->o.template_kind)))) {
        const char *open = strstr(pre, "<tool_call>");
        j->gram_prefeed = open ? strdup(open + strlen("<tool_call>")) : NULL;
        free(pre);
        if (j->gram_prefeed) return 0;
    } else if (!r->tool_force && (j->gram_after = tok_id(h->tok, "<tool_call>")) >= 0) {
        return 0;
    }
    gram_free(j->gram); /* no way to line the grammar up with the output: leave it free */
    j->gram = NULL;
    j->gram_after = -1;
    return 0;
}

/* Request -> prompt tokens and a ready job. 0 ok, -1 with *e set. */
static int prepare_job(srv_http *h, const srv_request *r, srv_job **out, srv_error *e) {
    int32_t *ids = NULL;
    int n = 0;
    lily_status st = { 0 };
    if (r->kind == SRV_CHAT) {
        json_t *body = r->tool_choice_none ? without_tools(r->body) : json_incref(r->body);
        char *text = NULL;
        chat_span *plain = NULL;
        int n_plain = 0;
        lily_code rc = chat_render_ex(body, h->o.template_kind, &text, &plain, &n_plain, &st);
        json_decref(body);
        if (rc) {
            srv_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s", st.msg);
            return -1;
        }
        /* The template's own text may hold special tokens; what the request supplied
         * (message contents, tool arguments...) never does: no injected <|im_start|>.
         * A forced tool_choice: the turn already begins with the call (the name is the
         * request's, so plain); the output parser is given the same text first. */
        const char *sfx[3];
        int sfx_plain[3], n_sfx = srv_tool_prefix_parts(r, chat_think_open(r->body, h->o.template_kind), sfx, sfx_plain);
        rc = chat_encode(h->tok, text, plain, n_plain, sfx, sfx_plain, n_sfx, &ids, &n, &st);
        free(plain);
        free(text);
        if (rc) { srv_error_set(e, 400, "invalid_request_error", "messages", NULL, "%s", st.msg); return -1; }
    } else if (r->prompt) {
        if (tok_encode(h->tok, r->prompt, strlen(r->prompt), 1, &ids, &n, &st)) {
            srv_error_set(e, 400, "invalid_request_error", "prompt", NULL, "%s", st.msg);
            return -1;
        }
    } else {
        ids = malloc(sizeof *ids * (size_t)r->n_prompt_ids);
        if (ids) memcpy(ids, r->prompt_ids, sizeof *ids * (size_t)r->n_prompt_ids);
        n = r->n_prompt_ids;
    }
    if (n <= 0) {
        free(ids);
        srv_error_set(e, 400, "invalid_request_error", r->kind == SRV_CHAT ? "messages" : "prompt", NULL, "the prompt is empty");
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= h->info.vocab_size) { /* a tokenizer larger than the model */
            int32_t bad = ids[i];
            free(ids);
            srv_error_set(e, 400, "invalid_request_error", r->kind == SRV_CHAT ? "messages" : "prompt", NULL,
                          "the prompt has token %d, outside the model's vocabulary of %d (tokenizer and model do "
                          "not match)", bad, h->info.vocab_size);
            return -1;
        }
    if (n >= h->o.ctx_len) {
        free(ids);
        srv_error_set(e, 400, "invalid_request_error", r->kind == SRV_CHAT ? "messages" : "prompt",
                      "context_length_exceeded",
                      "This model's maximum context length is %d tokens; the prompt has %d tokens, which leaves no room "
                      "to generate. Shorten the prompt or restart the server with a larger --ctx-len.",
                      h->o.ctx_len, n);
        return -1;
    }
    srv_job *j = srv_job_new();
    if (!j) { free(ids); srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory"); return -1; }
    j->prompt = ids;
    j->n_prompt = n;
    int32_t im_start = tok_id(h->tok, "<|im_start|>");
    for (int i = n - 1; i > 0 && im_start >= 0; i--)
        if (ids[i] == im_start) { j->boundary = i; break; }
    int room = h->o.ctx_len - n;
    j->max_tokens = r->max_tokens > 0 && r->max_tokens < room ? r->max_tokens : room;
    lily_sampling *p = &j->samp;
    lily_sampling_default(p);
    const lily_model_info *mi = &h->info;
    p->temperature = r->has_temperature ? r->temperature : mi->gen_temperature >= 0 ? mi->gen_temperature : 1.0f;
    p->top_p = r->has_top_p ? r->top_p : mi->gen_top_p > 0 && mi->gen_top_p <= 1 ? mi->gen_top_p : 1.0f;
    p->top_k = r->has_top_k ? r->top_k : mi->gen_top_k > 0 ? mi->gen_top_k : 0;
    p->min_p = r->has_min_p ? r->min_p : mi->gen_min_p >= 0 && mi->gen_min_p <= 1 ? mi->gen_min_p : 0.0f;
    p->presence_penalty = r->presence_penalty;
    p->frequency_penalty = r->frequency_penalty;
    p->repetition_penalty = r->repetition_penalty;
    p->seed = r->has_seed ? r->seed : random_seed();
    p->n_logprobs = r->logprobs ? r->top_logprobs : 0;
    j->want_logprobs = r->logprobs;
    j->ignore_eos = r->ignore_eos;
    for (int i = 0; i < r->n_stop; i++)
        if ((j->stops[j->n_stop] = strdup(r->stop[i]))) j->n_stop++;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_ids[i] >= h->info.vocab_size) {
            srv_job_unref(j);
            srv_error_set(e, 400, "invalid_request_error", "logit_bias", NULL,
                          "logit_bias names token %d, outside the model's vocabulary of %d", r->bias_ids[i],
                          h->info.vocab_size);
            return -1;
        }
    if (r->n_bias) {
        j->bias_ids = malloc(sizeof *j->bias_ids * (size_t)r->n_bias);
        j->bias_vals = malloc(sizeof *j->bias_vals * (size_t)r->n_bias);
        if (!j->bias_ids || !j->bias_vals) {
            srv_job_unref(j);
            srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        memcpy(j->bias_ids, r->bias_ids, sizeof *j->bias_ids * (size_t)r->n_bias);
        memcpy(j->bias_vals, r->bias_vals, sizeof *j->bias_vals * (size_t)r->n_bias);
        p->n_bias = r->n_bias, p->bias_ids = j->bias_ids, p->bias_values = j->bias_vals;
    }
    j->gram_after = -1;
    if (r->response_format) {
        lily_code rc = r->response_format == 1 ? gram_json_object(&j->gram, &st)
                                               : gram_from_json_schema(r->schema, strlen(r->schema), &j->gram, &st);
        if (rc) {
            srv_job_unref(j);
            if (rc == LILY_ENOMEM) srv_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
            else srv_error_set(e, 400, "invalid_request_error", "response_format", NULL, "%s", st.msg);
            return -1;
        }
        /* with reasoning on, the answer (and so the constraint) begins after </think> */
        if (r->kind == SRV_CHAT && chat_think_open(r->body, h->o.template_kind))
            j->gram_after = tok_id(h->tok, "</think>");
    } else if (r->kind == SRV_CHAT && r->has_tools && !r->tool_choice_none && tool_grammar(h, r, j, e)) {
        srv_job_unref(j);
        return -1;
    }
    *out = j;
    return 0;
}

/* ---- non-streaming ---- */

static enum MHD_Result finish_blocking(srv_http *h, struct MHD_Connection *c, conn_ctx *x, const srv_request *r,
                                       srv_job *j) {
    /* no idle timeout while generating (nothing is sent until the end); setting it
     * again afterwards restarts MHD's timer */
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
    pthread_mutex_lock(&j->mu);
    int gone = srv_wait_job(j, x->fd, job_done, NULL, 0);
    pthread_mutex_unlock(&j->mu);
    MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)SRV_IDLE_TIMEOUT);
    if (gone) {
        srv_sched_cancel(h->sched, j);
        pthread_mutex_lock(&j->mu);
        srv_metrics_tokens(h->m, j->n_prompt, j->n_reused, j->n_gen);
        pthread_mutex_unlock(&j->mu);
        return MHD_NO; /* closes the connection */
    }
    srv_metrics_tokens(h->m, j->n_prompt, j->n_reused, j->n_gen);
    if (j->finish == SRV_FINISH_SHUTDOWN) {
        srv_error e;
        srv_error_set(&e, 503, "server_error", NULL, "shutting_down", "The server is shutting down. Retry elsewhere.");
        return send_error(h, c, x->route, &e);
    }
    if (j->finish == SRV_FINISH_ERROR) {
        srv_error e;
        srv_error_set(&e, 500, "server_error", NULL, NULL, "generation failed: %s", j->error);
        return send_error(h, c, x->route, &e);
    }
    char id[48];
    long now = (long)time(NULL);
    const char *text = j->text ? j->text : "";
    size_t text_len = j->text_len;
    json_t *resp;
    if (r->kind == SRV_CHAT) {
        int think_open = chat_think_open(r->body, h->o.template_kind);
        chat_parse_opts po = { think_open, r->tool_choice_none ? NULL : json_object_get(r->body, "tools"), 0 };
        chat_parsed parsed;
        lily_status st = { 0 };
        char *forced = srv_tool_prefix(r, think_open), *whole = NULL;
        if (forced) { /* the model's turn, as the parser must see it, starts with the forced call */
            size_t fl = strlen(forced);
            whole = malloc(fl + text_len + 1);
            if (whole) { memcpy(whole, forced, fl); memcpy(whole + fl, text, text_len + 1); text = whole; text_len += fl; }
            free(forced);
        }
        lily_code prc = parse_output(text, text_len, &po, &parsed, &st);
        free(whole);
        if (prc) {
            srv_error e;
            srv_error_set(&e, 500, "server_error", NULL, NULL, "cannot parse the output: %s", st.msg);
            return send_error(h, c, x->route, &e);
        }
        json_t *lp = NULL;
        if (j->want_logprobs) {
            lp = json_pack("{s:[]}", "content");
            srv_logprobs_chat(h->tok, j->toks, j->n_toks, json_object_get(lp, "content"));
        }
        srv_random_id(id, sizeof id, "chatcmpl-");
        resp = srv_chat_response(id, h->model_name, now, &parsed, srv_finish_name(j->finish, parsed.n_calls), lp,
                                 j->n_prompt, j->n_gen, j->n_reused);
        parse_free(&parsed);
        if (x->route == R_MESSAGES) { /* the same message, in Anthropic's shape */
            const char *seq = j->finish == SRV_FINISH_STOP && j->stop.stopped && j->stop.which >= 0 ? j->stop.s[j->stop.which] : NULL;
            srv_random_id(id, sizeof id, "msg_");
            json_t *a = srv_anth_message(id, resp, seq);
            json_decref(resp);
            resp = a;
        } else if (x->route == R_RESPONSES) { /* as a Responses object (stored when asked) */
            json_t *a = srv_resp_object(x->resp, resp, j->finish == SRV_FINISH_LENGTH);
            json_decref(resp);
            resp = a;
        }
    } else {
        json_t *lp = NULL;
        if (j->want_logprobs) {
            long off = 0;
            lp = srv_logprobs_completion_new();
            srv_logprobs_completion(h->tok, j->toks, j->n_toks, lp, &off);
        }
        srv_random_id(id, sizeof id, "cmpl-");
        resp = srv_completion_response(id, h->model_name, now, text, srv_finish_name(j->finish, 0), lp, j->n_prompt,
                                       j->n_gen, j->n_reused);
    }
    return send_json(h, c, x->route, 200, resp);
}

/* POST /tokenize (vLLM's and llama.cpp's shapes): {"prompt"|"content": text} encoded as the
 * completions route does (special tokens written as text recognized unless
 * "add_special_tokens": false), or {"messages": [...], "tools"?: ...} rendered exactly as the
 * chat route would; "with_pieces": true adds each token's text. POST /detokenize:
 * {"tokens": [ids]} -> {"prompt": text}. */
static enum MHD_Result handle_tokenize(srv_http *h, struct MHD_Connection *c, conn_ctx *x) {
    srv_error e;
    json_error_t je;
    json_t *b = json_loadb(x->body ? x->body : "", x->n, 0, &je), *out = NULL;
    lily_status st = { 0 };
    if (!json_is_object(b)) {
        json_decref(b);
        srv_error_set(&e, 400, "invalid_request_error", NULL, "invalid_json", "the body must be a JSON object%s%s",
                      b ? "" : ": ", b ? "" : je.text);
        return send_error(h, c, x->route, &e);
    }
    if (x->route == R_DETOKENIZE) {
        json_t *t = json_object_get(b, "tokens");
        size_t n = json_array_size(t), i;
        int32_t *ids = malloc(sizeof *ids * (n + 1));
        json_t *v;
        int bad = !json_is_array(t) || !ids;
        json_array_foreach(t, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= h->info.vocab_size) bad = 1;
            else ids[i] = (int32_t)json_integer_value(v);
        }
        char *text = NULL;
        if (!bad && tok_decode(h->tok, ids, (int)n, 0, &text, NULL) == LILY_OK) out = json_pack("{s:s}", "prompt", text);
        free(text);
        free(ids);
        json_decref(b);
        if (bad) {
            srv_error_set(&e, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be an array of token ids below %d",
                          h->info.vocab_size);
            return send_error(h, c, x->route, &e);
        }
        return send_json(h, c, x->route, out ? 200 : 500, out);
    }
    int32_t *ids = NULL;
    int n = 0;
    json_t *p = json_object_get(b, "prompt");
    if (!p) p = json_object_get(b, "content");
    if (json_is_string(p)) {
        json_t *sp = json_object_get(b, "add_special_tokens");
        if (tok_encode(h->tok, json_string_value(p), json_string_length(p), !json_is_false(sp), &ids, &n, &st)) {
            json_decref(b);
            srv_error_set(&e, 400, "invalid_request_error", "prompt", NULL, "%s", st.msg);
            return send_error(h, c, x->route, &e);
        }
    } else if (json_object_get(b, "messages")) { /* exactly the chat route's prompt */
        srv_request r;
        srv_job *j = NULL;
        if (srv_request_parse(x->body, x->n, SRV_CHAT, &r, &e)) { json_decref(b); return send_error(h, c, x->route, &e); }
        r.json_calls = h->o.template_kind == CHAT_TEMPLATE_QWEN3;
        int rc = prepare_job(h, &r, &j, &e);
        srv_request_free(&r);
        if (rc) { json_decref(b); return send_error(h, c, x->route, &e); }
        ids = j->prompt;
        n = j->n_prompt;
        j->prompt = NULL;
        srv_job_unref(j);
    } else {
        json_decref(b);
        srv_error_set(&e, 400, "invalid_request_error", "prompt", NULL, "give 'prompt' (text) or 'messages'");
        return send_error(h, c, x->route, &e);
    }
    json_t *toks = json_array(), *pieces = json_is_true(json_object_get(b, "with_pieces")) ? json_array() : NULL;
    for (int i = 0; i < n; i++) {
        json_array_append_new(toks, json_integer(ids[i]));
        if (pieces) {
            char *t = NULL;
            tok_decode(h->tok, ids + i, 1, 0, &t, NULL);
            json_array_append_new(pieces, json_string(t ? t : ""));
            free(t);
        }
    }
    free(ids);
    json_decref(b);
    out = json_pack("{s:o,s:i,s:i}", "tokens", toks, "count", n, "max_model_len", h->o.ctx_len);
    if (out && pieces) json_object_set_new(out, "pieces", pieces);
    else json_decref(pieces);
    return send_json(h, c, x->route, 200, out);
}

static enum MHD_Result handle_generate(srv_http *h, struct MHD_Connection *c, conn_ctx *x) {
    srv_request r;
    srv_error e;
    char *anth = NULL; /* Anthropic and Responses routes: the request as the equivalent chat body */
    if (IS_ANTH(x->route) && !(anth = srv_anth_to_openai(x->body ? x->body : "", x->n, x->route == R_COUNT, &e)))
        return send_error(h, c, x->route, &e);
    if (x->route == R_RESPONSES) {
        if (!(anth = srv_resp_to_openai(x->body ? x->body : "", x->n, h->resp_store, h->model_name, &x->resp, &e)))
            return send_error(h, c, x->route, &e);
        x->resp->tok = h->tok;
    }
    int prc = srv_request_parse(anth ? anth : x->body ? x->body : "", anth ? strlen(anth) : x->n,
                                x->route == R_COMPLETIONS ? SRV_COMPLETION : SRV_CHAT, &r, &e);
    free(anth);
    if (prc) return send_error(h, c, x->route, &e);
    r.json_calls = h->o.template_kind == CHAT_TEMPLATE_QWEN3;
    srv_job *j = NULL;
    if (prepare_job(h, &r, &j, &e)) {
        srv_request_free(&r);
        return send_error(h, c, x->route, &e);
    }
    if (x->route == R_COUNT) {
        json_t *o = json_pack("{s:i}", "input_tokens", j->n_prompt);
        srv_job_unref(j);
        srv_request_free(&r);
        return send_json(h, c, x->route, 200, o);
    }
    if (srv_sched_submit(h->sched, j)) {
        srv_job_unref(j);
        srv_request_free(&r);
        srv_metrics_event(h->m, "rejected");
        srv_error_set(&e, 503, "server_error", NULL, "queue_full",
                      "The server is busy: the request queue is full. Retry later.");
        return send_error(h, c, x->route, &e);
    }
    enum MHD_Result rc;
    if (r.stream && x->route == R_RESPONSES) {
        rc = srv_stream_start_resp(h, c, x->fd, route_names[x->route], &r, j, x->resp);
        x->resp = NULL;
    } else if (r.stream) rc = srv_stream_start(h, c, x->fd, route_names[x->route], &r, j, x->route == R_MESSAGES);
    else rc = finish_blocking(h, c, x, &r, j);
    srv_job_unref(j);
    srv_request_free(&r);
    return rc;
}

/* ---- routing ---- */

static int authorized(srv_http *h, struct MHD_Connection *c) {
    if (!h->o.api_key) return 1;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (a && !strncasecmp(a, "Bearer ", 7)) a += 7;
    else if (!(a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key"))) return 0; /* Anthropic clients */
    while (*a == ' ') a++;
    size_t la = strlen(a), lk = strlen(h->o.api_key);
    unsigned diff = (unsigned)(la ^ lk);
    for (size_t i = 0; i < la; i++) diff |= (unsigned char)a[i] ^ (unsigned char)h->o.api_key[i % (lk ? lk : 1)];
    return diff == 0;
}

static enum MHD_Result handle_get(srv_http *h, struct MHD_Connection *c, int route) {
    if (route == R_HEALTH) return send_json(h, c, route, 200, json_pack("{s:s}", "status", "ok"));
    if (route == R_MODELS)
        return send_json(h, c, route, 200,
                         json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:i}]}", "object", "list", "data", "id", h->model_name,
                                   "object", "model", "created", (json_int_t)h->started, "owned_by", "lily",
                                   "max_model_len", h->o.ctx_len));
    int q, a;
    srv_sched_counts(h->sched, &q, &a);
    return send_body(h, c, route, 200, "text/plain; version=0.0.4", srv_metrics_render(h->m, q, a, h->o.slots));
}

/* MHD's own messages, minus the one it prints for every client that hangs up mid-answer
 * (that is normal here and counted in the metrics). */
static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    if (strstr(msg, "Application reported internal error")) return;
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    fprintf(stderr, "lily-server: http: %s\n", msg);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv_http *h = cls;
    conn_ctx *x = *con_cls;
    srv_error e;
    if (!x) {
        x = calloc(1, sizeof *x);
        if (!x) return MHD_NO;
        *con_cls = x;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        x->fd = ci ? ci->connect_fd : -1;
        x->route = route_of(url);
        int post = IS_POST(x->route);
        if (x->route == R_NONE) {
            srv_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route %s %s", method, url);
            return send_error(h, c, x->route, &e);
        }
        int get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
        int del = x->route == R_RESPONSE_ID && !strcmp(method, "DELETE");
        if (post ? strcmp(method, "POST") != 0 : !get && !del) {
            srv_error_set(&e, 405, "invalid_request_error", NULL, "method_not_allowed", "%s does not accept %s (use %s)",
                          url, method, post ? "POST" : "GET");
            return send_error(h, c, x->route, &e);
        }
        if ((!strncmp(url, "/v1/", 4) || post) && !authorized(h, c)) {
            srv_error_set(&e, 401, "invalid_request_error", NULL, "invalid_api_key",
                          "Missing or incorrect API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'.");
            return send_error(h, c, x->route, &e);
        }
        if (x->route == R_RESPONSE_ID) { /* a stored response: GET, DELETE */
            char *body = NULL;
            int status = srv_resp_lookup(h->resp_store, url + 14, del, &body);
            return send_body(h, c, x->route, status, "application/json", body);
        }
        if (!post) return handle_get(h, c, x->route);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > h->o.max_body) {
            srv_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                          "the request body (%s bytes) is larger than the limit of %zu bytes", cl, h->o.max_body);
            return send_error(h, c, x->route, &e);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (x->too_large || x->n + n > h->o.max_body) {
            x->too_large = 1; /* drop the rest; answer 413 at the end */
            free(x->body);
            x->body = NULL;
            x->n = x->cap = 0;
            return MHD_YES;
        }
        if (x->n + n + 1 > x->cap) {
            size_t cap = x->cap ? x->cap : 4096;
            while (cap < x->n + n + 1) cap *= 2;
            char *b = realloc(x->body, cap);
            if (!b) return MHD_NO;
            x->body = b;
            x->cap = cap;
        }
        memcpy(x->body + x->n, upload, n);
        x->n += n;
        x->body[x->n] = 0;
        return MHD_YES;
    }
    if (x->too_large) {
        srv_error_set(&e, 413, "invalid_request_error", NULL, "request_too_large",
                      "the request body is larger than the limit of %zu bytes", h->o.max_body);
        return send_error(h, c, x->route, &e);
    }
    if (x->route == R_TOKENIZE || x->route == R_DETOKENIZE) return handle_tokenize(h, c, x);
    return handle_generate(h, c, x);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)c; (void)toe;
    conn_ctx *x = *con_cls;
    if (!x) return;
    srv_resp_ctx_free(x->resp);
    free(x->body);
    free(x);
    *con_cls = NULL;
}

/* ---- lifecycle ---- */

/* --host: an IPv4 or IPv6 literal ("localhost" is 127.0.0.1). "::" listens on both families
 * (IPV6_V6ONLY off), as "0.0.0.0" does on IPv4. */
lily_code srv_http_bind(const srv_http_opts *o, srv_http **out, int *bound_port, lily_status *st) {
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&ss;
    const char *host = !strcmp(o->host, "localhost") ? "127.0.0.1" : o->host;
    socklen_t al;
    if (inet_pton(AF_INET, host, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET; a4->sin_port = htons((uint16_t)o->port); al = sizeof *a4;
    } else if (inet_pton(AF_INET6, host, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6; a6->sin6_port = htons((uint16_t)o->port); al = sizeof *a6;
    } else
        return lily_err(st, LILY_EINVAL, "--host %s is not an IP address (use e.g. 127.0.0.1, 0.0.0.0, ::1 or ::)", o->host);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return lily_err(st, LILY_EIO, "socket for %s: %s", o->host, strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ss.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, (struct sockaddr *)&ss, al) < 0) {
        int err = errno;
        close(fd);
        if (err == EADDRINUSE)
            return lily_err(st, LILY_EIO, "port %d on %s is already in use (is another server running? pick another --port)",
                            o->port, o->host);
        return lily_err(st, LILY_EIO, "cannot bind %s:%d: %s", o->host, o->port, strerror(err));
    }
    if (listen(fd, 512) < 0) {
        int err = errno;
        close(fd);
        return lily_err(st, LILY_EIO, "listen: %s", strerror(err));
    }
    al = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &al);
    srv_http *h = calloc(1, sizeof *h);
    if (!h) { close(fd); return lily_err(st, LILY_ENOMEM, "out of memory"); }
    h->o = *o;
    snprintf(h->model_name, sizeof h->model_name, "%s", o->model_name ? o->model_name : "lily");
    h->o.model_name = h->model_name;
    h->fd = fd;
    h->started = (long)time(NULL);
    if (!(h->resp_store = srv_resp_store_new(SRV_RESP_STORE_MAX, SRV_RESP_STORE_BYTES))) {
        close(fd);
        free(h);
        return lily_err(st, LILY_ENOMEM, "out of memory");
    }
    *bound_port = ntohs(ss.ss_family == AF_INET6 ? a6->sin6_port : a4->sin_port);
    *out = h;
    return LILY_OK;
}

lily_code srv_http_start(srv_http *h, srv_sched *sched, const tok_tokenizer *tok, srv_metrics *m, lily_status *st) {
    h->sched = sched;
    h->tok = tok;
    h->m = m;
    srv_sched_info(sched, &h->info);
    h->d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                                MHD_USE_ERROR_LOG | MHD_USE_ITC,
                            0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, MHD_OPTION_LISTEN_SOCKET, h->fd, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)(h->o.threads > 0 ? h->o.threads : 512), MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned)SRV_IDLE_TIMEOUT, MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1 << 20), MHD_OPTION_NOTIFY_COMPLETED, on_completed, h,
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(256 * 1024), MHD_OPTION_END);
    if (!h->d) return lily_err(st, LILY_EIO, "cannot start the HTTP daemon on %s:%d", h->o.host, h->o.port);
    return LILY_OK;
}

void srv_http_quiesce(srv_http *h) {
    if (!h || !h->d) return;
    MHD_socket fd = MHD_quiesce_daemon(h->d);
    if (fd != MHD_INVALID_SOCKET) close(fd);
}

void srv_http_stop(srv_http *h) {
    if (!h) return;
    if (h->d) MHD_stop_daemon(h->d);
    else if (h->fd >= 0) close(h->fd);
    srv_resp_store_free(h->resp_store);
    free(h);
}
