/* Turning a parse result into what an OpenAI chat completion response carries. */
#include <stdlib.h>
#include <string.h>
#include "text/chat.h"
#include "text/chat_pystr.h"
#include "util/util.h"

json_t *out_message(const chat_parsed *p) {
    json_t *m = json_object(), *calls = NULL;
    int bad = !m || json_object_set_new(m, "role", json_string("assistant"));
    const char *content = p->content ? p->content : "";
    if (!*content && p->n_calls) bad |= json_object_set_new(m, "content", json_null());
    else bad |= json_object_set_new(m, "content", json_string(content));
    if (p->reasoning && *p->reasoning) bad |= json_object_set_new(m, "reasoning_content", json_string(p->reasoning));
    if (p->n_calls) {
        calls = json_array();
        bad |= json_object_set_new(m, "tool_calls", calls);
        for (int i = 0; i < p->n_calls && !bad; i++)
            bad |= json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", p->calls[i].id, "type",
                                                          "function", "function", "name", p->calls[i].name,
                                                          "arguments", p->calls[i].arguments));
    }
    if (bad) { json_decref(m); return NULL; }
    return m;
}

const char *out_finish_reason(const chat_parsed *p, int hit_length) {
    if (p->n_calls) return "tool_calls";
    return hit_length ? "length" : "stop";
}

static int append(char **dst, const char *s, size_t n) {
    chat_buf b = { 0 };
    if (*dst) chat_buf_adds(&b, *dst);
    chat_buf_add(&b, s, n);
    char *joined = chat_buf_take(&b);
    if (!joined) return -1;
    free(*dst);
    *dst = joined;
    return 0;
}

static char *dup_field(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_string(v) ? strdup(json_string_value(v)) : NULL;
}

lily_code out_accumulate(chat_parsed *acc, const json_t *delta, lily_status *st) {
    if (!json_is_object(delta)) return lily_err(st, LILY_EINVAL, "a delta must be a JSON object");
    const json_t *r = json_object_get(delta, "reasoning_content"), *c = json_object_get(delta, "content");
    const json_t *calls = json_object_get(delta, "tool_calls");
    if ((r && !json_is_string(r)) || (c && !json_is_string(c)) || (calls && !json_is_array(calls)))
        return lily_err(st, LILY_EINVAL, "delta fields have the wrong types");
    if ((!acc->reasoning && append(&acc->reasoning, "", 0)) || (!acc->content && append(&acc->content, "", 0)) ||
        (r && append(&acc->reasoning, json_string_value(r), json_string_length(r))) ||
        (c && append(&acc->content, json_string_value(c), json_string_length(c))))
        return lily_err(st, LILY_ENOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(calls); i++) {
        const json_t *tc = json_array_get(calls, i), *fn = json_object_get(tc, "function");
        json_int_t idx = json_integer_value(json_object_get(tc, "index"));
        if (!json_is_integer(json_object_get(tc, "index")) || idx < 0 || idx > acc->n_calls)
            return lily_err(st, LILY_EINVAL, "tool call delta has a bad index");
        if (idx == acc->n_calls) {
            chat_tool_call *grown = realloc(acc->calls, (size_t)(acc->n_calls + 1) * sizeof *grown);
            if (!grown) return lily_err(st, LILY_ENOMEM, "out of memory");
            acc->calls = grown;
            memset(&grown[acc->n_calls++], 0, sizeof *grown);
        }
        chat_tool_call *t = &acc->calls[idx];
        char *id = dup_field(tc, "id"), *name = dup_field(fn, "name");
        if (id) { free(t->id); t->id = id; }
        if (name) { free(t->name); t->name = name; }
        const json_t *args = json_object_get(fn, "arguments");
        if (json_is_string(args) && append(&t->arguments, json_string_value(args), json_string_length(args)))
            return lily_err(st, LILY_ENOMEM, "out of memory");
    }
    return LILY_OK;
}
