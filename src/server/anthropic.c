/* Anthropic Messages request -> OpenAI chat request (see anthropic.h). */
#include "server/anthropic.h"
#include <string.h>

#define ABAD(p, ...) (srv_error_set(err, 400, "invalid_request_error", p, NULL, __VA_ARGS__), -1)

/* Concatenates text blocks (or takes a string); other block types are an error. */
static int text_of(json_t *c, const char *what, json_t **out, srv_error *err) {
    if (json_is_string(c)) { *out = json_incref(c); return 0; }
    if (!json_is_array(c)) return ABAD(what, "'%s' must be a string or an array of text blocks", what);
    size_t n = 0, i;
    json_t *b;
    json_array_foreach(c, i, b) {
        const char *t = json_string_value(json_object_get(b, "text"));
        if (!json_is_object(b) || strcmp(json_string_value(json_object_get(b, "type")) ?: "", "text") || !t)
            return ABAD(what, "'%s' blocks must be {\"type\":\"text\",\"text\":...}", what);
        n += strlen(t);
    }
    char *s = malloc(n + 1);
    if (!s) return ABAD(what, "out of memory");
    s[0] = 0;
    json_array_foreach(c, i, b) strcat(s, json_string_value(json_object_get(b, "text")));
    *out = json_string(s);
    free(s);
    return *out ? 0 : ABAD(what, "'%s' is not valid UTF-8", what);
}

static const char *btype(json_t *b) {
    return json_is_object(b) ? json_string_value(json_object_get(b, "type")) : NULL;
}

static int user_msg(json_t *c, json_t *msgs, srv_error *err) {
    if (json_is_string(c)) return json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", c)), 0;
    if (!json_is_array(c)) return ABAD("messages", "message content must be a string or an array of blocks");
    json_t *text = json_array();
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        const char *t = btype(b);
        if (!t) { json_decref(text); return ABAD("messages", "content blocks must be objects with a 'type'"); }
        if (!strcmp(t, "text")) {
            if (!json_is_string(json_object_get(b, "text"))) { json_decref(text); return ABAD("messages", "text block needs 'text'"); }
            json_array_append(text, b);
        } else if (!strcmp(t, "tool_result")) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            if (!id) { json_decref(text); return ABAD("messages", "tool_result block needs 'tool_use_id'"); }
            json_t *rc = json_object_get(b, "content"), *s = NULL;
            if (!rc) s = json_string("");
            else if (text_of(rc, "tool_result.content", &s, err)) { json_decref(text); return -1; }
            if (json_is_true(json_object_get(b, "is_error"))) {
                json_t *e = json_sprintf("Error: %s", json_string_value(s));
                json_decref(s);
                s = e;
            }
            json_array_append_new(msgs, json_pack("{s:s,s:s,s:o}", "role", "tool", "tool_call_id", id, "content", s));
        } else if (!strcmp(t, "image") || !strcmp(t, "document")) {
            json_decref(text);
            return ABAD("messages", "%s content blocks are not supported (text-only model)", t);
        } else {
            json_decref(text);
            return ABAD("messages", "content block type '%s' is not supported in a user message", t);
        }
    }
    if (json_array_size(text) || !json_array_size(c)) {
        json_t *s = NULL;
        int rc = text_of(text, "messages", &s, err);
        json_decref(text);
        if (rc) return -1;
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user", "content", s));
    } else json_decref(text);
    return 0;
}

static int assistant_msg(json_t *c, json_t *msgs, srv_error *err) {
    if (json_is_string(c))
        return json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "assistant", "content", c)), 0;
    if (!json_is_array(c)) return ABAD("messages", "message content must be a string or an array of blocks");
    json_t *m = json_pack("{s:s}", "role", "assistant"), *calls = json_array();
    json_t *text = json_array(), *think = json_array();
    size_t i;
    json_t *b;
    int rc = 0;
    json_array_foreach(c, i, b) {
        const char *t = btype(b);
        if (!t) { rc = ABAD("messages", "content blocks must be objects with a 'type'"); break; }
        if (!strcmp(t, "text")) {
            if (!json_is_string(json_object_get(b, "text"))) { rc = ABAD("messages", "text block needs 'text'"); break; }
            json_array_append(text, b);
        } else if (!strcmp(t, "thinking")) {
            json_t *th = json_object_get(b, "thinking");
            if (!json_is_string(th)) { rc = ABAD("messages", "thinking block needs 'thinking'"); break; }
            json_array_append_new(think, json_pack("{s:s,s:O}", "type", "text", "text", th));
        } else if (!strcmp(t, "redacted_thinking")) {
            continue;
        } else if (!strcmp(t, "tool_use")) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            json_t *in = json_object_get(b, "input");
            if (!id || !name || !json_is_object(in)) {
                rc = ABAD("messages", "tool_use block needs 'id', 'name' and an object 'input'");
                break;
            }
            char *args = json_dumps(in, JSON_COMPACT);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", args ? args : "{}"));
            free(args);
        } else {
            rc = ABAD("messages", "content block type '%s' is not supported in an assistant message", t);
            break;
        }
    }
    json_t *s = NULL;
    if (!rc && !(rc = text_of(text, "messages", &s, err))) json_object_set_new(m, "content", s);
    if (!rc && json_array_size(think) && !(rc = text_of(think, "messages", &s, err)))
        json_object_set_new(m, "reasoning_content", s);
    if (!rc && json_array_size(calls)) json_object_set(m, "tool_calls", calls);
    json_decref(calls);
    json_decref(text);
    json_decref(think);
    if (rc) { json_decref(m); return -1; }
    json_array_append_new(msgs, m);
    return 0;
}

static int tools_of(json_t *in, json_t *out, srv_error *err) {
    json_t *t = json_object_get(in, "tools");
    if (t && !json_is_null(t)) {
        if (!json_is_array(t)) return ABAD("tools", "'tools' must be an array");
        json_t *arr = json_array();
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) {
            const char *name = json_is_object(x) ? json_string_value(json_object_get(x, "name")) : NULL;
            json_t *schema = json_is_object(x) ? json_object_get(x, "input_schema") : NULL;
            if (!name || !json_is_object(schema)) {
                json_decref(arr);
                return ABAD("tools", "tools[%zu] needs 'name' and an object 'input_schema'", i);
            }
            json_t *fn = json_pack("{s:s,s:O}", "name", name, "parameters", schema);
            json_t *d = json_object_get(x, "description");
            if (json_is_string(d)) json_object_set(fn, "description", d);
            json_array_append_new(arr, json_pack("{s:s,s:o}", "type", "function", "function", fn));
        }
        json_object_set_new(out, "tools", arr);
    }
    json_t *tc = json_object_get(in, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *ty = json_is_object(tc) ? json_string_value(json_object_get(tc, "type")) : NULL;
        if (!ty) return ABAD("tool_choice", "'tool_choice' must be an object with a 'type'");
        if (!strcmp(ty, "auto")) json_object_set_new(out, "tool_choice", json_string("auto"));
        else if (!strcmp(ty, "any")) json_object_set_new(out, "tool_choice", json_string("required"));
        else if (!strcmp(ty, "none")) json_object_set_new(out, "tool_choice", json_string("none"));
        else if (!strcmp(ty, "tool")) {
            const char *n = json_string_value(json_object_get(tc, "name"));
            if (!n) return ABAD("tool_choice", "tool_choice type 'tool' needs 'name'");
            json_object_set_new(out, "tool_choice", json_pack("{s:s,s:{s:s}}", "type", "function", "function", "name", n));
        } else return ABAD("tool_choice", "tool_choice type must be auto, any, tool or none");
    }
    return 0;
}

static int translate(json_t *in, json_t *out, int count, srv_error *err) {
    if (!json_is_object(in)) return ABAD("", "the request body must be a JSON object");
    json_t *mt = json_object_get(in, "max_tokens");
    if (!mt && !count) return ABAD("max_tokens", "'max_tokens' is required");
    if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1))
        return ABAD("max_tokens", "'max_tokens' must be a positive integer");
    if (mt) json_object_set(out, "max_tokens", mt);
    static const char *copy[] = { "model", "temperature", "top_p", "top_k", "stream" };
    for (size_t i = 0; i < sizeof copy / sizeof *copy - (count ? 1 : 0); i++) {
        json_t *v = json_object_get(in, copy[i]);
        if (v) json_object_set(out, copy[i], v);
    }
    if (!count && json_is_true(json_object_get(in, "stream")))
        json_object_set_new(out, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_t *ss = json_object_get(in, "stop_sequences");
    if (ss && !json_is_null(ss)) json_object_set(out, "stop", ss);
    json_t *msgs = json_array();
    json_object_set_new(out, "messages", msgs);
    json_t *sys = json_object_get(in, "system");
    if (sys && !json_is_null(sys)) {
        json_t *s = NULL;
        if (text_of(sys, "system", &s, err)) return -1;
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "system", "content", s));
    }
    json_t *ms = json_object_get(in, "messages");
    if (!json_is_array(ms) || !json_array_size(ms)) return ABAD("messages", "'messages' must be a non-empty array");
    size_t i;
    json_t *m;
    json_array_foreach(ms, i, m) {
        const char *role = json_is_object(m) ? json_string_value(json_object_get(m, "role")) : NULL;
        json_t *c = json_is_object(m) ? json_object_get(m, "content") : NULL;
        if (!role || !c) return ABAD("messages", "messages[%zu] needs 'role' and 'content'", i);
        if (!strcmp(role, "user")) { if (user_msg(c, msgs, err)) return -1; }
        else if (!strcmp(role, "assistant")) { if (assistant_msg(c, msgs, err)) return -1; }
        else return ABAD("messages", "messages[%zu].role must be 'user' or 'assistant'", i);
    }
    if (tools_of(in, out, err)) return -1;
    json_t *th = json_object_get(in, "thinking");
    if (th && !json_is_null(th)) {
        const char *ty = json_is_object(th) ? json_string_value(json_object_get(th, "type")) : NULL;
        if (!ty || (strcmp(ty, "enabled") && strcmp(ty, "disabled")))
            return ABAD("thinking", "'thinking.type' must be 'enabled' or 'disabled'");
        json_object_set_new(out, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", !strcmp(ty, "enabled")));
    }
    return 0;
}

char *srv_anth_to_openai(const char *body, size_t len, int count, srv_error *err) {
    json_error_t je;
    json_t *in = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!in) {
        srv_error_set(err, 400, "invalid_request_error", "", NULL, "invalid JSON: %s", je.text);
        return NULL;
    }
    json_t *out = json_object();
    char *s = translate(in, out, count, err) ? NULL : json_dumps(out, JSON_COMPACT);
    json_decref(in);
    json_decref(out);
    return s;
}

#undef ABAD
