/* Streaming parse of generated text. A small state machine over a buffer of cleaned
 * text that has not been emitted yet. What stays in the buffer between feeds is only
 * what could still change meaning: a possible start of the next tag, the newlines right
 * before it (dropped if a tag follows), or a whole tool-call block until it closes. */
#include <stdlib.h>
#include <string.h>
#include "text/parse_priv.h"

enum { ST_DETECT, ST_REASON, ST_CONTENT, ST_CALL };

struct parse_stream {
    json_t *tools;
    lily_rng rng;
    parse_utf8 u;
    chat_buf buf;
    size_t scan;   /* ST_CALL: where the search for </tool_call> resumes */
    int state;
    int seg_start; /* no text of this segment emitted yet: leading newlines are dropped */
    int n_calls;
    int finished;
    size_t first_delta; /* index in the caller's array where this feed's deltas start */
};

lily_code parse_stream_new(const chat_parse_opts *o, parse_stream **out, lily_status *st) {
    parse_stream *s = calloc(1, sizeof *s);
    if (!s) return lily_err(st, LILY_ENOMEM, "out of memory");
    s->tools = json_incref((json_t *)o->tools);
    parse_rng_init(&s->rng, o->id_seed);
    s->state = o->think_open ? ST_REASON : ST_DETECT;
    s->seg_start = 1;
    *out = s;
    return LILY_OK;
}

void parse_stream_free(parse_stream *s) {
    if (!s) return;
    json_decref(s->tools);
    chat_buf_free(&s->buf);
    free(s);
}

static void consume(parse_stream *s, size_t n) {
    if (!n) return;
    memmove(s->buf.p, s->buf.p + n, s->buf.n - n + 1);
    s->buf.n -= n;
}

/* Appends text to the caller's deltas, joining it to this feed's previous delta when
 * that one is of the same kind. Returns nonzero on allocation failure. */
static int emit_text(parse_stream *s, json_t *deltas, const char *key, const char *p, size_t n) {
    if (!n) return 0;
    size_t last = json_array_size(deltas);
    json_t *prev = last > s->first_delta ? json_array_get(deltas, last - 1) : NULL;
    json_t *old = json_object_get(prev, key);
    if (old) {
        chat_buf b = { 0 };
        chat_buf_add(&b, json_string_value(old), json_string_length(old));
        chat_buf_add(&b, p, n);
        char *joined = chat_buf_take(&b);
        int bad = !joined || json_string_setn(old, joined, strlen(joined));
        free(joined);
        return bad;
    }
    json_t *d = json_object();
    return !d || json_object_set_new(d, key, json_stringn(p, n)) || json_array_append_new(deltas, d);
}

static int emit_call(parse_stream *s, json_t *deltas, char *name, char *args) {
    char *id = parse_call_id(&s->rng);
    json_t *d = id ? json_pack("{s:[{s:i,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index", s->n_calls, "id", id,
                               "type", "function", "function", "name", name, "arguments", args) : NULL;
    free(id);
    free(name);
    free(args);
    s->n_calls++;
    return !d || json_array_append_new(deltas, d);
}

/* Length of the longest proper prefix of tag that ends the buffer. */
static size_t partial_tag(const chat_buf *b, const char *tag) {
    size_t m = strlen(tag) - 1;
    for (size_t k = m < b->n ? m : b->n; k > 0; k--)
        if (!memcmp(b->p + b->n - k, tag, k)) return k;
    return 0;
}

static int process(parse_stream *s, json_t *deltas, int final) {
    for (;;) {
        chat_buf *b = &s->buf;
        size_t k = 0;
        if (s->state == ST_DETECT) {
            while (k < b->n && b->p[k] == '\n') k++;
            consume(s, k);
            size_t m = strlen(PARSE_THINK_OPEN);
            if (!b->n) return 0;
            if (b->n >= m && !memcmp(b->p, PARSE_THINK_OPEN, m)) {
                consume(s, m);
                s->state = ST_REASON;
            } else if (b->n < m && !memcmp(b->p, PARSE_THINK_OPEN, b->n) && !final) {
                return 0;
            } else {
                s->state = ST_CONTENT;
            }
            s->seg_start = 1;
        } else if (s->state == ST_REASON || s->state == ST_CONTENT) {
            int reason = s->state == ST_REASON;
            const char *tag = reason ? PARSE_THINK_CLOSE : PARSE_CALL_OPEN;
            const char *key = reason ? "reasoning_content" : "content";
            if (s->seg_start) {
                while (k < b->n && b->p[k] == '\n') k++;
                consume(s, k);
                if (!b->n) return 0;
                s->seg_start = 0;
            }
            long i = chat_find(b->p, b->n, tag);
            size_t end = i >= 0 ? (size_t)i : final ? b->n : b->n - partial_tag(b, tag);
            size_t keep = end;
            while (end && b->p[end - 1] == '\n') end--;
            if (i < 0 && !final) keep = end; /* these newlines may yet end the segment */
            if (emit_text(s, deltas, key, b->p, end)) return -1;
            if (i < 0) { consume(s, final ? b->n : keep); return 0; }
            consume(s, keep + strlen(tag));
            s->state = reason ? ST_CONTENT : ST_CALL;
            s->seg_start = 1;
            s->scan = 0;
        } else { /* ST_CALL: the buffer holds what follows <tool_call> */
            long j = chat_find(b->p + s->scan, b->n - s->scan, PARSE_CALL_CLOSE);
            if (j < 0 && !final) {
                size_t m = strlen(PARSE_CALL_CLOSE);
                s->scan = b->n >= m ? b->n - m + 1 : 0;
                return 0;
            }
            char *name, *args;
            size_t body = j < 0 ? b->n : s->scan + (size_t)j;
            if (j >= 0 && !parse_call_block(b->p, body, s->tools, &name, &args)) {
                if (emit_call(s, deltas, name, args)) return -1;
            } else { /* malformed or unterminated: the raw text is content */
                chat_buf raw = { 0 };
                chat_buf_adds(&raw, PARSE_CALL_OPEN);
                chat_buf_add(&raw, b->p, body);
                if (j >= 0) chat_buf_adds(&raw, PARSE_CALL_CLOSE);
                int bad = raw.oom || emit_text(s, deltas, "content", raw.p, raw.n);
                chat_buf_free(&raw);
                if (bad) return -1;
            }
            if (j < 0) { consume(s, b->n); return 0; }
            consume(s, body + strlen(PARSE_CALL_CLOSE));
            s->state = ST_CONTENT;
            s->seg_start = 1;
        }
    }
}

lily_code parse_stream_feed(parse_stream *s, const char *text, size_t n, json_t *deltas, lily_status *st) {
    if (s->finished) return lily_err(st, LILY_EINVAL, "parse_stream_feed after parse_stream_finish");
    if (!json_is_array(deltas)) return lily_err(st, LILY_EINVAL, "deltas must be a JSON array");
    s->first_delta = json_array_size(deltas);
    parse_utf8_feed(&s->u, text, n, &s->buf);
    if (s->buf.oom || process(s, deltas, 0)) return lily_err(st, LILY_ENOMEM, "out of memory parsing model output");
    return LILY_OK;
}

lily_code parse_stream_finish(parse_stream *s, json_t *deltas, lily_status *st) {
    if (s->finished) return lily_err(st, LILY_EINVAL, "parse_stream_finish called twice");
    if (!json_is_array(deltas)) return lily_err(st, LILY_EINVAL, "deltas must be a JSON array");
    s->finished = 1;
    s->first_delta = json_array_size(deltas);
    parse_utf8_flush(&s->u, &s->buf);
    if (s->buf.oom || process(s, deltas, 1)) return lily_err(st, LILY_ENOMEM, "out of memory parsing model output");
    return LILY_OK;
}
