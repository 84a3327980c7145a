/* Responses request -> OpenAI chat request (see responses.h). */
#include "server/responses.h"
#include <stdio.h>
#include <string.h>
#include <time.h>

#define RBAD(p, ...) (srv_error_set(err, 400, "invalid_request_error", p, NULL, __VA_ARGS__), -1)

static const char *type_of(json_t *o) {
    return json_is_object(o) ? json_string_value(json_object_get(o, "type")) : NULL;
}

/* Growing text for joined parts. */
typedef struct { char *s; size_t n, cap; } tbuf;

static int tb_add(tbuf *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->s, c);
        if (!p) return -1;
        b->s = p;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

/* A message's content: a string, or parts of the allowed text types joined. */
static int content_text(json_t *c, size_t i, int assistant, json_t **out, srv_error *err) {
    if (json_is_string(c)) { *out = json_incref(c); return 0; }
    if (!json_is_array(c)) return RBAD("input", "input[%zu].content must be a string or an array of content parts", i);
    tbuf b = { 0 };
    size_t k;
    json_t *p;
    json_array_foreach(c, k, p) {
        const char *t = type_of(p);
        const char *key = "text";
        if (!t) { free(b.s); return RBAD("input", "input[%zu].content[%zu] must be an object with a 'type'", i, k); }
        if (!strcmp(t, "input_image") || !strcmp(t, "input_file") || !strcmp(t, "input_audio")) {
            free(b.s);
            return RBAD("input", "input[%zu].content[%zu]: %s parts are not supported (this model reads text only)", i, k, t);
        }
        if (assistant ? !strcmp(t, "refusal") : 0) key = "refusal";
        else if (strcmp(t, "input_text") && strcmp(t, "output_text")) {
            free(b.s);
            return RBAD("input", "input[%zu].content[%zu]: content type '%s' is not supported (use input_text%s)", i, k, t,
                        assistant ? " or output_text" : "");
        }
        json_t *tx = json_object_get(p, key);
        if (!json_is_string(tx)) { free(b.s); return RBAD("input", "input[%zu].content[%zu].%s must be a string", i, k, key); }
        if (tb_add(&b, json_string_value(tx), json_string_length(tx))) { free(b.s); return RBAD("input", "out of memory"); }
    }
    *out = json_stringn(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? 0 : RBAD("input", "input[%zu].content is not valid UTF-8", i);
}

/* The text of a reasoning item: its reasoning_text content, else its summary. */
static int reasoning_text(json_t *it, size_t i, json_t **out, srv_error *err) {
    json_t *c = json_object_get(it, "content");
    if (!json_array_size(c)) c = json_object_get(it, "summary");
    if (c && !json_is_null(c) && !json_is_array(c)) return RBAD("input", "input[%zu]: reasoning content/summary must be arrays", i);
    tbuf b = { 0 };
    size_t k;
    json_t *p;
    json_array_foreach(c, k, p) {
        json_t *tx = json_object_get(p, "text");
        if (!json_is_string(tx)) { free(b.s); return RBAD("input", "input[%zu]: reasoning parts need a string 'text'", i); }
        if ((k && tb_add(&b, "\n\n", 2)) || tb_add(&b, json_string_value(tx), json_string_length(tx))) {
            free(b.s);
            return RBAD("input", "out of memory");
        }
    }
    *out = json_stringn(b.s ? b.s : "", b.n);
    free(b.s);
    return *out ? 0 : RBAD("input", "out of memory");
}

typedef struct {
    json_t *msgs;
    tbuf sys;         /* instructions and leading system/developer messages */
    int has_sys;
    json_t *asst;     /* the open assistant turn (in msgs), or NULL */
    int a_text, a_calls, a_reason;
} conv;

static json_t *new_asst(conv *v) {
    v->asst = json_pack("{s:s,s:s}", "role", "assistant", "content", "");
    json_array_append_new(v->msgs, v->asst);
    v->a_text = v->a_calls = v->a_reason = 0;
    return v->asst;
}

static int add_sys(conv *v, const char *s, size_t n) {
    if (v->has_sys && tb_add(&v->sys, "\n\n", 2)) return -1;
    v->has_sys = 1;
    return tb_add(&v->sys, s, n);
}

static int item(conv *v, json_t *it, size_t i, srv_error *err) {
    if (!json_is_object(it)) return RBAD("input", "input[%zu] must be an object", i);
    const char *ty = type_of(it);
    json_t *s = NULL;
    if (!ty || !strcmp(ty, "message")) {
        const char *role = json_string_value(json_object_get(it, "role"));
        json_t *c = json_object_get(it, "content");
        if (!role || !c) return RBAD("input", "input[%zu]: a message needs 'role' and 'content'", i);
        int assistant = !strcmp(role, "assistant");
        if (!assistant && strcmp(role, "user") && strcmp(role, "system") && strcmp(role, "developer"))
            return RBAD("input", "input[%zu].role '%s' is not one of user, system, developer, assistant", i, role);
        if (content_text(c, i, assistant, &s, err)) return -1;
        /* The template has one system message, at the start: later system/developer
         * messages (agents insert them mid-conversation) are kept as user turns. */
        if ((!strcmp(role, "system") || !strcmp(role, "developer")) && !json_array_size(v->msgs)) {
            int rc = add_sys(v, json_string_value(s), json_string_length(s));
            json_decref(s);
            return rc ? RBAD("input", "out of memory") : 0;
        }
        if (assistant) {
            if (!v->asst || v->a_text || v->a_calls) new_asst(v);
            json_object_set_new(v->asst, "content", s);
            v->a_text = 1;
            return 0;
        }
        v->asst = NULL;
        json_array_append_new(v->msgs, json_pack("{s:s,s:o}", "role", "user", "content", s));
        return 0;
    }
    if (!strcmp(ty, "reasoning")) {
        if (reasoning_text(it, i, &s, err)) return -1;
        if (!json_string_length(s)) { json_decref(s); return 0; } /* encrypted only: nothing to render */
        if (!v->asst || v->a_text || v->a_calls || v->a_reason) new_asst(v);
        json_object_set_new(v->asst, "reasoning_content", s);
        v->a_reason = 1;
        return 0;
    }
    if (!strcmp(ty, "function_call")) {
        const char *id = json_string_value(json_object_get(it, "call_id"));
        const char *name = json_string_value(json_object_get(it, "name"));
        json_t *args = json_object_get(it, "arguments");
        if (!id || !name || !json_is_string(args))
            return RBAD("input", "input[%zu]: a function_call needs string 'call_id', 'name' and 'arguments'", i);
        json_t *a = json_loads(json_string_value(args), 0, NULL);
        int obj = json_is_object(a);
        json_decref(a);
        if (!obj) return RBAD("input", "input[%zu].arguments must be a JSON object (as text)", i);
        if (!v->asst) new_asst(v);
        json_t *calls = json_object_get(v->asst, "tool_calls");
        if (!calls) json_object_set_new(v->asst, "tool_calls", calls = json_array());
        json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:O}}", "id", id, "type", "function", "function", "name",
                                               name, "arguments", args));
        v->a_calls = 1;
        return 0;
    }
    if (!strcmp(ty, "function_call_output")) {
        const char *id = json_string_value(json_object_get(it, "call_id"));
        json_t *o = json_object_get(it, "output");
        if (!id || !o) return RBAD("input", "input[%zu]: a function_call_output needs 'call_id' and 'output'", i);
        if (content_text(o, i, 0, &s, err)) return -1;
        v->asst = NULL;
        json_array_append_new(v->msgs, json_pack("{s:s,s:s,s:o}", "role", "tool", "tool_call_id", id, "content", s));
        return 0;
    }
    if (!strcmp(ty, "item_reference"))
        return RBAD("input", "input[%zu]: item_reference is not supported (send the item itself, or use previous_response_id)", i);
    return RBAD("input", "input[%zu]: item type '%s' is not supported (messages, function_call, function_call_output and "
                "reasoning are)", i, ty);
}

static int tools_of(json_t *in, json_t *out, srv_error *err) {
    json_t *t = json_object_get(in, "tools");
    if (t && !json_is_null(t)) {
        if (!json_is_array(t)) return RBAD("tools", "'tools' must be an array");
        json_t *arr = json_array();
        json_object_set_new(out, "tools", arr);
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) {
            const char *ty = type_of(x);
            if (!ty) return RBAD("tools", "tools[%zu] must be an object with a 'type'", i);
            if (strcmp(ty, "function"))
                return RBAD("tools", "tools[%zu]: tool type '%s' is not supported (only function tools)", i, ty);
            json_t *name = json_object_get(x, "name"), *p = json_object_get(x, "parameters");
            if (!json_is_string(name)) return RBAD("tools", "tools[%zu] needs a string 'name'", i);
            if (p && !json_is_null(p) && !json_is_object(p)) return RBAD("tools", "tools[%zu].parameters must be an object", i);
            json_t *fn = json_pack("{s:O}", "name", name);
            json_object_set_new(fn, "parameters", json_is_object(p) ? json_incref(p) : json_pack("{s:s,s:{}}", "type",
                                                                                                  "object", "properties"));
            json_t *d = json_object_get(x, "description"), *st = json_object_get(x, "strict");
            if (json_is_string(d)) json_object_set(fn, "description", d);
            if (json_is_boolean(st)) json_object_set(fn, "strict", st);
            json_array_append_new(arr, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
    }
    json_t *tc = json_object_get(in, "tool_choice");
    if (!tc || json_is_null(tc)) return 0;
    if (json_is_string(tc)) { json_object_set(out, "tool_choice", tc); return 0; } /* the chat validator checks it */
    const char *ty = type_of(tc);
    if (!ty) return RBAD("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\":\"function\",\"name\":...}");
    if (strcmp(ty, "function"))
        return RBAD("tool_choice", "tool_choice type '%s' is not supported (\"auto\", \"none\", \"required\" or a function)", ty);
    json_t *n = json_object_get(tc, "name");
    if (!json_is_string(n)) return RBAD("tool_choice", "tool_choice {\"type\":\"function\"} needs a string 'name'");
    json_object_set_new(out, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", n));
    return 0;
}

static int text_format(json_t *in, json_t *out, srv_error *err) {
    json_t *t = json_object_get(in, "text");
    if (!t || json_is_null(t)) return 0;
    if (!json_is_object(t)) return RBAD("text", "'text' must be an object");
    json_t *f = json_object_get(t, "format");
    if (!f || json_is_null(f)) return 0;
    const char *ty = type_of(f);
    if (!ty) return RBAD("text.format", "'text.format' must be an object with a 'type'");
    if (!strcmp(ty, "text")) return 0;
    if (!strcmp(ty, "json_object")) {
        json_object_set_new(out, "response_format", json_pack("{s:s}", "type", "json_object"));
        return 0;
    }
    if (strcmp(ty, "json_schema")) return RBAD("text.format", "text.format.type '%s' is not one of text, json_object, json_schema", ty);
    json_t *sc = json_object_get(f, "schema");
    if (!json_is_object(sc) && !json_is_boolean(sc)) return RBAD("text.format", "text.format.schema must be a JSON schema (an object)");
    json_t *js = json_pack("{s:O}", "schema", sc);
    json_t *nm = json_object_get(f, "name"), *st = json_object_get(f, "strict");
    if (json_is_string(nm)) json_object_set(js, "name", nm);
    if (json_is_boolean(st)) json_object_set(js, "strict", st);
    json_object_set_new(out, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
    return 0;
}

static int reasoning_of(json_t *in, json_t *out, srv_error *err) {
    json_t *r = json_object_get(in, "reasoning");
    if (!r || json_is_null(r)) return 0;
    if (!json_is_object(r)) return RBAD("reasoning", "'reasoning' must be an object");
    json_t *e = json_object_get(r, "effort");
    if (!e || json_is_null(e)) return 0;
    static const char *ok[] = { "none", "minimal", "low", "medium", "high", "xhigh" };
    const char *s = json_string_value(e);
    size_t k = 0;
    while (s && k < sizeof ok / sizeof *ok && strcmp(s, ok[k])) k++;
    if (!s || k == sizeof ok / sizeof *ok)
        return RBAD("reasoning.effort", "reasoning.effort must be one of none, minimal, low, medium, high, xhigh");
    if (k < 2) { /* no reasoning wanted: the template's thinking off */
        json_t *kw = json_object_get(out, "chat_template_kwargs");
        if (!json_is_object(kw)) json_object_set_new(out, "chat_template_kwargs", kw = json_object());
        json_object_set_new(kw, "enable_thinking", json_false());
    }
    return 0;
}

/* The request fields a response object repeats, with the API's defaults. */
static json_t *echo_of(json_t *in) {
    json_t *e = json_object();
    static const struct { const char *k, *dflt; } f[] = {
        { "instructions", "null" }, { "max_output_tokens", "null" }, { "metadata", "{}" },
        { "parallel_tool_calls", "true" }, { "previous_response_id", "null" },
        { "reasoning", "{\"effort\":null,\"summary\":null}" }, { "store", "true" }, { "temperature", "null" },
        { "text", "{\"format\":{\"type\":\"text\"}}" }, { "tool_choice", "\"auto\"" }, { "tools", "[]" },
        { "top_p", "null" }, { "truncation", "\"disabled\"" }, { "user", NULL } };
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
        json_t *v = json_object_get(in, f[i].k);
        if (v && !json_is_null(v)) json_object_set(e, f[i].k, v);
        else if (f[i].dflt) json_object_set_new(e, f[i].k, json_loads(f[i].dflt, JSON_DECODE_ANY, NULL));
    }
    return e;
}

static int translate(json_t *in, json_t *prev, json_t *out, json_t *conv_items, srv_error *err) {
    if (!json_is_object(in)) return RBAD("", "the request body must be a JSON object");
    json_t *mt = json_object_get(in, "max_output_tokens");
    if (mt && !json_is_null(mt)) {
        if (!json_is_integer(mt) || json_integer_value(mt) < 1)
            return RBAD("max_output_tokens", "'max_output_tokens' must be a positive integer");
        json_object_set(out, "max_tokens", mt);
    }
    /* sampling is checked by the chat validator under the same names; top_k, min_p, seed
     * and chat_template_kwargs are lily's extensions */
    static const char *copy[] = { "model", "temperature", "top_p", "top_k", "min_p", "seed", "stream", "chat_template_kwargs",
                                  "parallel_tool_calls" };
    for (size_t i = 0; i < sizeof copy / sizeof *copy; i++) {
        json_t *v = json_object_get(in, copy[i]);
        if (v && !json_is_null(v)) json_object_set(out, copy[i], v);
    }
    if (json_is_true(json_object_get(in, "stream")))
        json_object_set_new(out, "stream_options", json_pack("{s:b}", "include_usage", 1));
    static const struct { const char *k, *what; } ty[] = {
        { "store", "a boolean" }, { "parallel_tool_calls", "a boolean" }, { "metadata", "an object" },
        { "user", "a string" }, { "truncation", "\"auto\" or \"disabled\"" } };
    for (size_t i = 0; i < sizeof ty / sizeof *ty; i++) {
        json_t *v = json_object_get(in, ty[i].k);
        if (!v || json_is_null(v)) continue;
        int good = i < 2 ? json_is_boolean(v) : i == 2 ? json_is_object(v) : i == 3 ? json_is_string(v)
                 : json_is_string(v) && (!strcmp(json_string_value(v), "auto") || !strcmp(json_string_value(v), "disabled"));
        if (!good) return RBAD(ty[i].k, "'%s' must be %s", ty[i].k, ty[i].what);
    }
    if (json_is_true(json_object_get(in, "background")))
        return RBAD("background", "background responses are not supported");
    json_t *ins = json_object_get(in, "instructions");
    if (ins && !json_is_null(ins) && !json_is_string(ins)) return RBAD("instructions", "'instructions' must be a string");
    json_t *inp = json_object_get(in, "input");
    if (!json_is_string(inp) && !json_is_array(inp))
        return RBAD("input", "'input' must be a string or an array of input items");
    if (prev) json_array_extend(conv_items, prev);
    if (json_is_string(inp))
        json_array_append_new(conv_items, json_pack("{s:s,s:s,s:O}", "type", "message", "role", "user", "content", inp));
    else json_array_extend(conv_items, inp);

    conv v = { .msgs = json_array() };
    int rc = 0;
    if (json_is_string(ins) && add_sys(&v, json_string_value(ins), json_string_length(ins))) rc = RBAD("instructions", "out of memory");
    size_t i;
    json_t *it;
    json_array_foreach(conv_items, i, it) if (!rc) rc = item(&v, it, i, err);
    if (!rc && !json_array_size(v.msgs)) rc = RBAD("input", "'input' has no message to answer");
    if (!rc && v.has_sys) {
        json_t *s = json_stringn(v.sys.s, v.sys.n);
        if (!s) rc = RBAD("instructions", "instructions are not valid UTF-8");
        else json_array_insert_new(v.msgs, 0, json_pack("{s:s,s:o}", "role", "system", "content", s));
    }
    free(v.sys.s);
    json_object_set_new(out, "messages", v.msgs);
    if (rc) return -1;
    return tools_of(in, out, err) || text_format(in, out, err) || reasoning_of(in, out, err) ? -1 : 0;
}

char *srv_resp_to_openai(const char *body, size_t len, srv_resp_store *store, const char *model, srv_resp_ctx **ctx,
                         srv_error *err) {
    *ctx = NULL;
    json_error_t je;
    json_t *in = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!in) {
        srv_error_set(err, 400, "invalid_request_error", NULL, "invalid_json", "request body is not valid JSON: %s", je.text);
        return NULL;
    }
    json_t *prev = NULL, *pid = json_object_get(in, "previous_response_id");
    if (pid && !json_is_null(pid)) {
        if (!json_is_string(pid)) {
            json_decref(in);
            srv_error_set(err, 400, "invalid_request_error", "previous_response_id", NULL, "'previous_response_id' must be a string");
            return NULL;
        }
        json_t *pin = NULL, *pr = store ? srv_resp_store_get(store, json_string_value(pid), &pin) : NULL;
        if (!pr) {
            /* OpenAI's status and code, which clients that recover by resending match on */
            srv_error_set(err, 400, "invalid_request_error", "previous_response_id", "previous_response_not_found",
                          "Previous response with id '%.100s' not found (it was not stored, was deleted, or was evicted).",
                          json_string_value(pid));
            json_decref(in);
            return NULL;
        }
        prev = pin;
        json_array_extend(prev, json_object_get(pr, "output"));
        json_decref(pr);
    }
    json_t *out = json_object(), *items = json_array();
    char *s = translate(in, prev, out, items, err) ? NULL : json_dumps(out, JSON_COMPACT);
    if (s) {
        srv_resp_ctx *c = calloc(1, sizeof *c);
        if (!c) { free(s); s = NULL; srv_error_set(err, 500, "server_error", NULL, NULL, "out of memory"); }
        else {
            srv_random_id(c->id, sizeof c->id, "resp_");
            c->created_at = (long)time(NULL);
            snprintf(c->model, sizeof c->model, "%s", model ? model : "lily");
            c->echo = echo_of(in);
            c->input = json_incref(items);
            c->store = !json_is_false(json_object_get(in, "store"));
            c->st = store;
            *ctx = c;
        }
    }
    json_decref(prev);
    json_decref(items);
    json_decref(in);
    json_decref(out);
    return s;
}

void srv_resp_ctx_free(srv_resp_ctx *c) {
    if (!c) return;
    json_decref(c->echo);
    json_decref(c->input);
    free(c);
}

void srv_resp_fix_param(srv_error *e) {
    static const struct { const char *from, *to; } m[] = {
        { "max_tokens", "max_output_tokens" }, { "max_completion_tokens", "max_output_tokens" },
        { "response_format", "text.format" }, { "messages", "input" } };
    for (size_t i = 0; i < sizeof m / sizeof *m; i++)
        if (!strncmp(e->param, m[i].from, strlen(m[i].from))) { snprintf(e->param, sizeof e->param, "%s", m[i].to); return; }
}

#undef RBAD
