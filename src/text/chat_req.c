#include "text/chat_req.h"
#include <stdlib.h>
#include <string.h>
#include "text/chat_pystr.h"
#include "util/util.h"

/* Python truthiness of a JSON value, for `{% if add_generation_prompt %}`. */
static int py_truthy(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0;
    case JSON_TRUE: return 1;
    default: return 0;
    }
}

static int has_nul(const json_t *s) { return strlen(json_string_value(s)) != json_string_length(s); }

/* Content is a string, null/absent, or a list of text parts (what render_content in the
 * Qwen3.5/3.6 templates prints); images and video are refused: lily is text-only. */
static lily_code load_content(const json_t *c, int i, chat_req_msg *m, lily_status *st) {
    chat_buf b = { 0 };
    if (!c || json_is_null(c)) {
        chat_buf_add(&b, "", 0);
    } else if (json_is_string(c)) {
        if (has_nul(c)) return lily_err(st, LILY_EINVAL, "messages[%d].content contains a NUL character", i);
        chat_buf_add(&b, json_string_value(c), json_string_length(c));
        m->content_is_string = 1;
    } else if (json_is_array(c)) {
        chat_buf_add(&b, "", 0);
        for (size_t j = 0; j < json_array_size(c); j++) {
            const json_t *part = json_array_get(c, j), *type = json_object_get(part, "type");
            const char *ts = json_is_string(type) ? json_string_value(type) : "";
            if (!json_is_object(part)) {
                chat_buf_free(&b);
                return lily_err(st, LILY_EINVAL, "messages[%d].content[%zu] is not an object (content parts are {\"type\": \"text\", \"text\": ...})", i, j);
            }
            if (json_object_get(part, "image") || json_object_get(part, "image_url") || !strcmp(ts, "image") ||
                json_object_get(part, "video") || !strcmp(ts, "video")) {
                chat_buf_free(&b);
                return lily_err(st, LILY_EINVAL, "messages[%d].content[%zu]: image and video content is not supported (text-only model)", i, j);
            }
            const json_t *text = json_object_get(part, "text");
            if (!text) {
                chat_buf_free(&b);
                return lily_err(st, LILY_EINVAL, "messages[%d].content[%zu]: unexpected content part type '%s' (only text parts are supported; the template says: Unexpected item type in content.)", i, j, ts);
            }
            if (!json_is_string(text) || has_nul(text)) {
                chat_buf_free(&b);
                return lily_err(st, LILY_EINVAL, "messages[%d].content[%zu].text must be a string without NUL characters", i, j);
            }
            chat_buf_add(&b, json_string_value(text), json_string_length(text));
        }
    } else {
        return lily_err(st, LILY_EINVAL, "messages[%d].content must be a string, a list of text parts or null (the template says: Unexpected content type.)", i);
    }
    m->content = chat_buf_take(&b);
    return m->content ? LILY_OK : lily_err(st, LILY_ENOMEM, "out of memory copying messages[%d].content", i);
}

static lily_code load_call(const json_t *tc, int i, int k, chat_req_call *c, lily_status *st) {
    if (!json_is_object(tc))
        return lily_err(st, LILY_EINVAL, "messages[%d].tool_calls[%d] is not an object", i, k);
    const json_t *fn = json_object_get(tc, "function");
    if (fn && !json_is_object(fn))
        return lily_err(st, LILY_EINVAL, "messages[%d].tool_calls[%d].function is not an object", i, k);
    if (!fn) fn = tc; /* the flat {name, arguments} form the templates also accept */
    const json_t *name = json_object_get(fn, "name"), *args = json_object_get(fn, "arguments");
    if (!json_is_string(name) || has_nul(name))
        return lily_err(st, LILY_EINVAL, "messages[%d].tool_calls[%d] has no function name (a string)", i, k);
    c->name = json_string_value(name);
    if (!args) return LILY_OK;
    if (json_is_string(args)) {
        const char *s = json_string_value(args);
        size_t lo, hi;
        chat_py_strip(s, json_string_length(args), &lo, &hi);
        c->args_text = s;
        if (lo == hi) { /* some clients send "" for a call without arguments */
            c->args = json_object();
            return c->args ? LILY_OK : lily_err(st, LILY_ENOMEM, "out of memory");
        }
        json_error_t e;
        c->args = json_loadb(s, json_string_length(args), JSON_PRESERVE_ORDER | JSON_DECODE_ANY, &e);
        if (!c->args)
            return lily_err(st, LILY_EINVAL, "messages[%d].tool_calls[%d].function.arguments is not valid JSON: %s", i, k, e.text);
    } else {
        c->args = json_incref((json_t *)args);
    }
    if (!json_is_object(c->args)) {
        json_decref(c->args);
        c->args = NULL;
        return lily_err(st, LILY_EINVAL, "messages[%d].tool_calls[%d].function.arguments must be a JSON object (or a string holding one)", i, k);
    }
    return LILY_OK;
}

static lily_code load_msg(const json_t *mj, int i, chat_req_msg *m, lily_status *st) {
    if (!json_is_object(mj)) return lily_err(st, LILY_EINVAL, "messages[%d] is not an object", i);
    const json_t *role = json_object_get(mj, "role");
    const char *rs = json_is_string(role) ? json_string_value(role) : NULL;
    if (!rs) return lily_err(st, LILY_EINVAL, "messages[%d] has no role (a string)", i);
    if (!strcmp(rs, "system")) m->role = CHAT_ROLE_SYSTEM;
    else if (!strcmp(rs, "user")) m->role = CHAT_ROLE_USER;
    else if (!strcmp(rs, "assistant")) m->role = CHAT_ROLE_ASSISTANT;
    else if (!strcmp(rs, "tool")) m->role = CHAT_ROLE_TOOL;
    else return lily_err(st, LILY_EINVAL, "messages[%d]: unknown role '%.60s' (expected system, user, assistant or tool)", i, rs);
    lily_code rc = load_content(json_object_get(mj, "content"), i, m, st);
    if (rc) return rc;
    if (m->role != CHAT_ROLE_ASSISTANT) return LILY_OK;
    const json_t *rsn = json_object_get(mj, "reasoning_content");
    if (json_is_string(rsn)) {
        if (has_nul(rsn)) return lily_err(st, LILY_EINVAL, "messages[%d].reasoning_content contains a NUL character", i);
        m->reasoning = json_string_value(rsn);
    } else if (rsn && !json_is_null(rsn)) {
        return lily_err(st, LILY_EINVAL, "messages[%d].reasoning_content must be a string or null", i);
    }
    const json_t *tcs = json_object_get(mj, "tool_calls");
    if (!tcs || json_is_null(tcs)) return LILY_OK;
    if (!json_is_array(tcs)) return lily_err(st, LILY_EINVAL, "messages[%d].tool_calls must be an array", i);
    size_t n = json_array_size(tcs);
    if (!n) return LILY_OK;
    m->calls = calloc(n, sizeof *m->calls);
    if (!m->calls) return lily_err(st, LILY_ENOMEM, "out of memory");
    for (size_t k = 0; k < n; k++) {
        m->n_calls = (int)k + 1;
        rc = load_call(json_array_get(tcs, k), i, (int)k, &m->calls[k], st);
        if (rc) return rc;
    }
    return LILY_OK;
}

/* A switch from chat_template_kwargs, else from the request's top level. */
static const json_t *kwarg(const json_t *req, const char *name) {
    const json_t *kw = json_object_get(req, "chat_template_kwargs");
    const json_t *v = json_object_get(kw, name);
    return v ? v : json_object_get(req, name);
}

lily_code chat_req_load(const json_t *req, chat_req *r, lily_status *st) {
    memset(r, 0, sizeof *r);
    if (!json_is_object(req)) return lily_err(st, LILY_EINVAL, "the chat request must be a JSON object");
    const json_t *kw = json_object_get(req, "chat_template_kwargs");
    if (kw && !json_is_object(kw) && !json_is_null(kw))
        return lily_err(st, LILY_EINVAL, "chat_template_kwargs must be an object");
    const json_t *agp = kwarg(req, "add_generation_prompt");
    r->add_generation_prompt = agp ? py_truthy(agp) : 1;
    r->enable_thinking_false = json_is_false(kwarg(req, "enable_thinking"));
    r->preserve_thinking_true = json_is_true(kwarg(req, "preserve_thinking"));

    const json_t *tools = json_object_get(req, "tools");
    if (tools && !json_is_null(tools) && !json_is_array(tools))
        return lily_err(st, LILY_EINVAL, "tools must be an array");
    if (json_array_size(tools)) r->tools = tools;

    const json_t *msgs = json_object_get(req, "messages");
    if (msgs && !json_is_null(msgs) && !json_is_array(msgs))
        return lily_err(st, LILY_EINVAL, "messages must be an array");
    size_t n = json_array_size(msgs);
    if (!n) return lily_err(st, LILY_EINVAL, "no messages provided");
    r->msgs = calloc(n, sizeof *r->msgs);
    if (!r->msgs) return lily_err(st, LILY_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        r->n_msgs = (int)i + 1;
        lily_code rc = load_msg(json_array_get(msgs, i), (int)i, &r->msgs[i], st);
        if (rc) { chat_req_free(r); return rc; }
    }
    return LILY_OK;
}

void chat_req_free(chat_req *r) {
    for (int i = 0; i < r->n_msgs; i++) {
        for (int k = 0; k < r->msgs[i].n_calls; k++) json_decref(r->msgs[i].calls[k].args);
        free(r->msgs[i].calls);
        free(r->msgs[i].content);
    }
    free(r->msgs);
    memset(r, 0, sizeof *r);
}

chat_template_kind chat_template_detect(const char *text) {
    if (!text) return CHAT_TEMPLATE_QWEN36;
    if (strstr(text, "preserve_thinking")) return CHAT_TEMPLATE_QWEN36;
    if (strstr(text, "<parameter=")) return CHAT_TEMPLATE_QWEN35;
    if (strstr(text, "<function-name>") || strstr(text, "<tool_call>")) return CHAT_TEMPLATE_QWEN3;
    return CHAT_TEMPLATE_QWEN36;
}

lily_code chat_template_from_name(const char *name, chat_template_kind *out, lily_status *st) {
    if (!name) return lily_err(st, LILY_EINVAL, "no template name");
    if (!strcmp(name, "qwen3.6") || !strcmp(name, "3.6")) *out = CHAT_TEMPLATE_QWEN36;
    else if (!strcmp(name, "qwen3.5") || !strcmp(name, "3.5")) *out = CHAT_TEMPLATE_QWEN35;
    else if (!strcmp(name, "qwen3") || !strcmp(name, "3")) *out = CHAT_TEMPLATE_QWEN3;
    else return lily_err(st, LILY_EINVAL, "unknown chat template '%.60s' (expected qwen3.6, qwen3.5 or qwen3)", name);
    return LILY_OK;
}

const char *chat_template_name(chat_template_kind kind) {
    switch (kind) {
    case CHAT_TEMPLATE_QWEN36: return "qwen3.6";
    case CHAT_TEMPLATE_QWEN35: return "qwen3.5";
    case CHAT_TEMPLATE_QWEN3: return "qwen3";
    }
    return "?";
}

int chat_think_open(const json_t *req, chat_template_kind kind) {
    if (kind == CHAT_TEMPLATE_QWEN3 || !json_is_object(req)) return 0;
    const json_t *agp = kwarg(req, "add_generation_prompt");
    if (agp && !py_truthy(agp)) return 0;
    return !json_is_false(kwarg(req, "enable_thinking"));
}

void chat_parse_opts_for(const json_t *request, chat_template_kind kind, chat_parse_opts *o) {
    const json_t *tools = json_object_get(request, "tools");
    o->think_open = chat_think_open(request, kind);
    o->tools = json_is_array(tools) ? tools : NULL;
    o->id_seed = 0;
}

lily_code chat_render_ex(const json_t *request, chat_template_kind kind, char **out,
                         chat_span **plain, int *n_plain, lily_status *st) {
    chat_req r;
    *out = NULL;
    if (plain) { *plain = NULL; *n_plain = 0; }
    lily_code rc = chat_req_load(request, &r, st);
    if (rc) return rc;
    chat_buf b = { 0 };
    if (kind == CHAT_TEMPLATE_QWEN3) rc = chat_render_qwen3(&r, &b, st);
    else rc = chat_render_qwen35(&r, kind == CHAT_TEMPLATE_QWEN36, &b, st);
    chat_req_free(&r);
    if (!rc && b.oom) rc = lily_err(st, LILY_ENOMEM, "out of memory rendering the chat template");
    if (!rc) {
        int ns = 0;
        chat_span *sp = chat_buf_take_spans(&b, &ns);
        if (plain) { *plain = sp; *n_plain = ns; } else free(sp);
        *out = chat_buf_take(&b);
    }
    chat_buf_free(&b);
    return rc;
}

lily_code chat_render(const json_t *request, chat_template_kind kind, char **out, lily_status *st) {
    return chat_render_ex(request, kind, out, NULL, NULL, st);
}
