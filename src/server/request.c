/* Request bodies -> srv_request: JSON syntax, field types and ranges. The messages are
 * checked only for shape here; the chat template rejects what it cannot render. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/server.h"

/* Messages quote request bytes (jansson's error text does): replace anything that is not
 * well-formed UTF-8 by '?', so the error body is always valid JSON. */
static void utf8_clean(char *s) {
    for (unsigned char *p = (unsigned char *)s; *p;) {
        int l = *p < 0x80 ? 1 : (*p >> 5) == 6 && *p >= 0xc2 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 && *p <= 0xf4 ? 4 : 0;
        int ok = l > 0;
        for (int k = 1; ok && k < l; k++) ok = (p[k] >> 6) == 2;
        if (ok && l == 3) ok = !(p[0] == 0xe0 && p[1] < 0xa0) && !(p[0] == 0xed && p[1] >= 0xa0);
        if (ok && l == 4) ok = !(p[0] == 0xf0 && p[1] < 0x90) && !(p[0] == 0xf4 && p[1] >= 0x90);
        if (!ok) { *p++ = '?'; continue; }
        p += l;
    }
}

void srv_error_set(srv_error *e, int http, const char *type, const char *param, const char *code,
                   const char *fmt, ...) {
    e->http = http;
    e->type = type;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    utf8_clean(e->message);
    utf8_clean(e->param);
}

char *srv_error_json(const srv_error *e) {
    json_t *o = json_pack("{s:{s:s,s:s,s:o,s:o}}", "error", "message", e->message, "type",
                          e->type ? e->type : "invalid_request_error", "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s;
}

#define BAD(param, ...) (srv_error_set(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__), -1)

/* Field getters: absent or null leaves the default and returns 0; a wrong type
 * returns -1 with err set; present returns 1. */
static int get_number(json_t *o, const char *k, double lo, double hi, double *v, srv_error *err) {
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_number(x)) return BAD(k, "'%s' must be a number", k);
    double d = json_number_value(x);
    if (!isfinite(d) || d < lo || d > hi) return BAD(k, "'%s' must be between %g and %g (got %g)", k, lo, hi, d);
    *v = d;
    return 1;
}

static int get_int(json_t *o, const char *k, double lo, double hi, double *v, srv_error *err) {
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) return 0;
    double d;
    if (json_is_integer(x)) d = (double)json_integer_value(x);
    else if (json_is_real(x) && floor(json_real_value(x)) == json_real_value(x)) d = json_real_value(x);
    else return BAD(k, "'%s' must be an integer", k);
    if (d < lo || d > hi) return BAD(k, "'%s' must be between %.0f and %.0f (got %.0f)", k, lo, hi, d);
    *v = d;
    return 1;
}

static int get_bool(json_t *o, const char *k, int *v, srv_error *err) {
    json_t *x = json_object_get(o, k);
    if (!x || json_is_null(x)) return 0;
    if (!json_is_boolean(x)) return BAD(k, "'%s' must be a boolean", k);
    *v = json_is_true(x);
    return 1;
}

static int parse_stop(json_t *o, srv_request *r, srv_error *err) {
    json_t *x = json_object_get(o, "stop");
    if (!x || json_is_null(x)) return 0;
    if (json_is_string(x)) {
        if (json_string_length(x) == 0) return 0;
        if (json_string_length(x) > SRV_MAX_STOP_LEN) return BAD("stop", "a stop string is longer than %d bytes", SRV_MAX_STOP_LEN);
        r->stop[r->n_stop++] = strdup(json_string_value(x));
        return 0;
    }
    if (!json_is_array(x)) return BAD("stop", "'stop' must be a string or an array of strings");
    if (json_array_size(x) > SRV_MAX_STOP) return BAD("stop", "at most %d stop strings", SRV_MAX_STOP);
    size_t i;
    json_t *v;
    json_array_foreach(x, i, v) {
        if (!json_is_string(v)) return BAD("stop", "'stop' must be a string or an array of strings");
        if (json_string_length(v) > SRV_MAX_STOP_LEN) return BAD("stop", "a stop string is longer than %d bytes", SRV_MAX_STOP_LEN);
        if (json_string_length(v) == 0) continue;
        if (memchr(json_string_value(v), 0, json_string_length(v))) return BAD("stop", "stop strings may not contain NUL");
        r->stop[r->n_stop++] = strdup(json_string_value(v));
    }
    return 0;
}

static int check_content(json_t *c, size_t i, srv_error *err) {
    char p[64];
    snprintf(p, sizeof p, "messages[%zu].content", i);
    if (!c || json_is_null(c) || json_is_string(c)) return 0;
    if (!json_is_array(c)) return BAD(p, "%s must be a string, an array of content parts, or null", p);
    size_t j;
    json_t *part;
    json_array_foreach(c, j, part) {
        json_t *type = json_object_get(part, "type");
        if (!json_is_object(part) || !json_is_string(type))
            return BAD(p, "%s[%zu] must be an object with a string 'type'", p, j);
        if (strcmp(json_string_value(type), "text") != 0)
            return BAD(p, "%s[%zu]: content type '%s' is not supported (text only)", p, j, json_string_value(type));
        if (!json_is_string(json_object_get(part, "text")))
            return BAD(p, "%s[%zu].text must be a string", p, j);
    }
    return 0;
}

static int parse_messages(json_t *o, srv_error *err) {
    json_t *m = json_object_get(o, "messages");
    if (!m) return BAD("messages", "'messages' is required");
    if (!json_is_array(m)) return BAD("messages", "'messages' must be an array");
    if (json_array_size(m) == 0) return BAD("messages", "'messages' must not be empty");
    size_t i;
    json_t *msg;
    json_array_foreach(m, i, msg) {
        char p[48];
        snprintf(p, sizeof p, "messages[%zu]", i);
        if (!json_is_object(msg)) return BAD(p, "%s must be an object", p);
        json_t *role = json_object_get(msg, "role");
        if (!json_is_string(role)) return BAD(p, "%s.role must be a string", p);
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant") && strcmp(rs, "tool") &&
            strcmp(rs, "developer"))
            return BAD(p, "%s.role '%s' is not one of system, developer, user, assistant, tool", p, rs);
        if (check_content(json_object_get(msg, "content"), i, err)) return -1;
        json_t *tc = json_object_get(msg, "tool_calls");
        if (tc && !json_is_null(tc) && !json_is_array(tc)) return BAD(p, "%s.tool_calls must be an array", p);
    }
    return 0;
}

static int parse_tools(json_t *o, srv_request *r, srv_error *err) {
    json_t *t = json_object_get(o, "tools");
    if (t && !json_is_null(t)) {
        if (!json_is_array(t)) return BAD("tools", "'tools' must be an array");
        size_t i;
        json_t *x;
        json_array_foreach(t, i, x) {
            json_t *fn = json_object_get(x, "function");
            if (!json_is_object(x) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
                return BAD("tools", "tools[%zu] must be {\"type\": \"function\", \"function\": {\"name\": ...}}", i);
            json_t *ty = json_object_get(x, "type");
            if (ty && !(json_is_string(ty) && !strcmp(json_string_value(ty), "function")))
                return BAD("tools", "tools[%zu].type must be \"function\"", i);
        }
        r->has_tools = json_array_size(t) > 0;
    }
    json_t *c = json_object_get(o, "tool_choice");
    if (!c || json_is_null(c)) return 0;
    if (json_is_string(c)) {
        const char *s = json_string_value(c);
        if (!strcmp(s, "none")) r->tool_choice_none = 1;
        else if (!strcmp(s, "required")) {
            if (!r->has_tools) return BAD("tool_choice", "tool_choice \"required\" needs a non-empty 'tools' list");
            r->tool_force = strdup("");
        } else if (strcmp(s, "auto"))
            return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
        return 0;
    }
    json_t *fn = json_object_get(c, "function");
    if (!json_is_object(c) || !json_is_object(fn) || !json_is_string(json_object_get(fn, "name")))
        return BAD("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or a function");
    const char *name = json_string_value(json_object_get(fn, "name"));
    json_t *tools = json_object_get(o, "tools");
    int found = 0;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const char *tn = json_string_value(json_object_get(json_object_get(json_array_get(tools, i), "function"), "name"));
        found |= tn && !strcmp(tn, name);
    }
    if (!found) return BAD("tool_choice", "tool_choice names function '%s', which is not in 'tools'", name);
    if (!*name || strpbrk(name, "<>\n\"\\")) return BAD("tool_choice", "tool_choice function name '%s' cannot be written in a tool call", name);
    r->tool_force = strdup(name);
    return 0;
}

/* OpenAI's logit_bias: {"token id": bias}. Ids are checked against the vocabulary by the
 * server, which knows it. */
static int parse_logit_bias(json_t *o, srv_request *r, srv_error *err) {
    json_t *lb = json_object_get(o, "logit_bias");
    if (!lb || json_is_null(lb)) return 0;
    if (!json_is_object(lb)) return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to numbers");
    size_t n = json_object_size(lb);
    if (n > SRV_MAX_BIAS) return BAD("logit_bias", "'logit_bias' has %zu entries; at most %d are allowed", n, SRV_MAX_BIAS);
    if (!n) return 0;
    r->bias_ids = malloc(sizeof *r->bias_ids * n);
    r->bias_vals = malloc(sizeof *r->bias_vals * n);
    if (!r->bias_ids || !r->bias_vals) return BAD("logit_bias", "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(lb, k, v) {
        char *end = NULL;
        long id = strtol(k, &end, 10);
        if (!*k || *end || id < 0 || id > INT32_MAX)
            return BAD("logit_bias", "logit_bias key '%s' is not a token id", k);
        if (!json_is_number(v) || json_number_value(v) < -100 || json_number_value(v) > 100)
            return BAD("logit_bias", "logit_bias value for token %ld must be a number in [-100, 100]", id);
        r->bias_ids[r->n_bias] = (int32_t)id;
        r->bias_vals[r->n_bias++] = (float)json_number_value(v);
    }
    return 0;
}

/* OpenAI's response_format. The schema is only extracted here; the server compiles it
 * (text/grammar.h) and reports what it cannot enforce. */
static int parse_response_format(json_t *o, srv_request *r, srv_error *err) {
    json_t *rf = json_object_get(o, "response_format");
    if (!rf || json_is_null(rf)) return 0;
    const char *ty = json_string_value(json_object_get(rf, "type"));
    if (!json_is_object(rf) || !ty)
        return BAD("response_format", "'response_format' must be an object with a 'type' (\"text\", \"json_object\" or "
                                      "\"json_schema\")");
    if (!strcmp(ty, "text")) return 0;
    if (r->tool_force)
        return BAD("response_format", "response_format cannot be combined with a tool_choice that forces a call");
    if (!strcmp(ty, "json_object")) { r->response_format = 1; return 0; }
    if (strcmp(ty, "json_schema"))
        return BAD("response_format", "response_format.type '%s' is not one of text, json_object, json_schema", ty);
    json_t *js = json_object_get(rf, "json_schema");
    if (!json_is_object(js)) return BAD("response_format", "response_format.json_schema must be an object");
    json_t *sc = json_object_get(js, "schema");
    if (!json_is_object(sc) && !json_is_boolean(sc))
        return BAD("response_format", "response_format.json_schema.schema must be a JSON schema (an object)");
    r->schema = json_dumps(sc, JSON_COMPACT | JSON_ENCODE_ANY | JSON_PRESERVE_ORDER);
    if (!r->schema) return BAD("response_format", "response_format.json_schema.schema cannot be serialized");
    r->response_format = 2;
    return 0;
}

static int parse_prompt(json_t *o, srv_request *r, srv_error *err) {
    json_t *p = json_object_get(o, "prompt");
    if (!p) return BAD("prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p)) {
        if (json_string_length(p) == 0) return BAD("prompt", "'prompt' must not be empty");
        r->prompt = malloc(json_string_length(p) + 1);
        memcpy(r->prompt, json_string_value(p), json_string_length(p) + 1);
        return 0;
    }
    if (json_is_array(p) && json_array_size(p) > 0) { /* token ids */
        size_t n = json_array_size(p), i;
        json_t *v;
        r->prompt_ids = malloc(sizeof *r->prompt_ids * n);
        json_array_foreach(p, i, v) {
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
                return BAD("prompt", "'prompt' must be a string, one string in an array, or an array of token ids");
            r->prompt_ids[i] = (int32_t)json_integer_value(v);
        }
        r->n_prompt_ids = (int)n;
        return 0;
    }
    return BAD("prompt", "'prompt' must be a string, one string in an array, or an array of token ids");
}

static int parse_fields(json_t *o, srv_request *r, srv_error *err) {
    double d;
    int rc, b = 0;
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return BAD("model", "'model' must be a string");
        snprintf(r->model, sizeof r->model, "%s", json_string_value(model));
    }
    if (get_bool(o, "stream", &r->stream, err) < 0) return -1;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return BAD("stream_options", "'stream_options' must be an object");
        if (get_bool(so, "include_usage", &r->include_usage, err) < 0) return -1;
    }
    /* max_completion_tokens wins over the older max_tokens */
    if ((rc = get_int(o, "max_tokens", 1, 1e9, &d, err)) < 0) return -1;
    if (rc) r->max_tokens = (int)d;
    if ((rc = get_int(o, "max_completion_tokens", 1, 1e9, &d, err)) < 0) return -1;
    if (rc) r->max_tokens = (int)d;
    if ((rc = get_number(o, "temperature", 0, 2, &d, err)) < 0) return -1;
    if (rc) { r->temperature = (float)d; r->has_temperature = 1; }
    if ((rc = get_number(o, "top_p", 0, 1, &d, err)) < 0) return -1;
    if (rc) {
        if (d <= 0) return BAD("top_p", "'top_p' must be greater than 0");
        r->top_p = (float)d; r->has_top_p = 1;
    }
    if ((rc = get_int(o, "top_k", -1, 1e9, &d, err)) < 0) return -1;
    if (rc) { r->top_k = d < 0 ? 0 : (int)d; r->has_top_k = 1; }
    if ((rc = get_number(o, "min_p", 0, 1, &d, err)) < 0) return -1;
    if (rc) { r->min_p = (float)d; r->has_min_p = 1; }
    if ((rc = get_number(o, "presence_penalty", -2, 2, &d, err)) < 0) return -1;
    if (rc) r->presence_penalty = (float)d;
    if ((rc = get_number(o, "frequency_penalty", -2, 2, &d, err)) < 0) return -1;
    if (rc) r->frequency_penalty = (float)d;
    if ((rc = get_number(o, "repetition_penalty", 0.01, 100, &d, err)) < 0) return -1;
    if (rc) r->repetition_penalty = (float)d;
    json_t *seed = json_object_get(o, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed)) return BAD("seed", "'seed' must be an integer");
        r->seed = (uint64_t)json_integer_value(seed);
        r->has_seed = 1;
    }
    if (get_bool(o, "ignore_eos", &r->ignore_eos, err) < 0) return -1;
    if ((rc = get_int(o, "n", 1, 1e9, &d, err)) < 0) return -1;
    if (rc && d != 1) return BAD("n", "only n = 1 is supported (got %.0f)", d);
    if (parse_stop(o, r, err) || parse_logit_bias(o, r, err)) return -1;

    if (r->kind == SRV_CHAT) {
        if ((rc = get_bool(o, "logprobs", &b, err)) < 0) return -1;
        if (rc) r->logprobs = b;
        if ((rc = get_int(o, "top_logprobs", 0, LILY_MAX_LOGPROBS, &d, err)) < 0) return -1;
        if (rc) {
            if (!r->logprobs && d > 0) return BAD("top_logprobs", "'top_logprobs' needs 'logprobs': true");
            r->top_logprobs = (int)d;
        }
        if (parse_messages(o, err) || parse_tools(o, r, err)) return -1;
        json_t *k = json_object_get(o, "chat_template_kwargs");
        if (k && !json_is_null(k)) {
            if (!json_is_object(k)) return BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object");
            if (get_bool(k, "enable_thinking", &b, err) < 0 || get_bool(k, "preserve_thinking", &b, err) < 0)
                return -1;
        }
    } else {
        /* completions: logprobs is the number of alternatives */
        if ((rc = get_int(o, "logprobs", 0, LILY_MAX_LOGPROBS, &d, err)) < 0) return -1;
        if (rc) { r->logprobs = 1; r->top_logprobs = (int)d; }
        b = 0;
        if (get_bool(o, "echo", &b, err) < 0) return -1;
        if (b) return BAD("echo", "'echo' is not supported");
        if ((rc = get_int(o, "best_of", 1, 1e9, &d, err)) < 0) return -1;
        if (rc && d != 1) return BAD("best_of", "only best_of = 1 is supported");
        json_t *suffix = json_object_get(o, "suffix");
        if (suffix && !json_is_null(suffix)) return BAD("suffix", "'suffix' is not supported");
        if (parse_prompt(o, r, err)) return -1;
    }
    return parse_response_format(o, r, err);
}

int srv_request_parse(const char *body, size_t len, srv_kind kind, srv_request *r, srv_error *err) {
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->max_tokens = -1;
    r->repetition_penalty = 1.0f;
    json_error_t je;
    /* key order is part of what the chat template prints */
    r->body = json_loadb(body, len, JSON_PRESERVE_ORDER | JSON_REJECT_DUPLICATES, &je);
    if (!r->body) {
        srv_error_set(err, 400, "invalid_request_error", NULL, "invalid_json",
                      "request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return -1;
    }
    if (!json_is_object(r->body)) {
        srv_error_set(err, 400, "invalid_request_error", NULL, "invalid_json", "request body must be a JSON object");
        srv_request_free(r);
        return -1;
    }
    if (parse_fields(r->body, r, err)) {
        srv_request_free(r);
        return -1;
    }
    return 0;
}

void srv_request_free(srv_request *r) {
    json_decref(r->body);
    free(r->tool_force);
    free(r->schema);
    free(r->bias_ids);
    free(r->bias_vals);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->prompt);
    free(r->prompt_ids);
    memset(r, 0, sizeof *r);
}

int srv_tool_prefix_parts(const srv_request *r, int think_open, const char *parts[3], int plain[3]) {
    if (!r->tool_force) return 0;
    if (r->json_calls) {
        parts[0] = think_open ? "\n</think>\n\n<tool_call>\n{\"name\": \"" : "<tool_call>\n{\"name\": \"";
        parts[2] = "\", \"arguments\": ";
    } else {
        parts[0] = think_open ? "\n</think>\n\n<tool_call>\n<function=" : "<tool_call>\n<function=";
        parts[2] = ">\n";
    }
    parts[1] = r->tool_force;
    plain[0] = plain[2] = 0;
    plain[1] = 1;
    return *r->tool_force ? 3 : 1; /* "required": the model writes the name */
}

char *srv_tool_prefix(const srv_request *r, int think_open) {
    const char *parts[3];
    int plain[3], n = srv_tool_prefix_parts(r, think_open, parts, plain);
    if (!n) return NULL;
    size_t len = 1;
    for (int i = 0; i < n; i++) len += strlen(parts[i]);
    char *p = malloc(len);
    if (!p) return NULL;
    p[0] = 0;
    for (int i = 0; i < n; i++) strcat(p, parts[i]);
    return p;
}
