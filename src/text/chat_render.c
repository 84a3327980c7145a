/* The Qwen3.5 / Qwen3.6 chat templates (chat_template.jinja) and the Qwen3 one, written
 * out as C. Each block follows the template's statements in order; the comments name
 * the Jinja construct a step reproduces when the correspondence is not obvious. */
#include <stdlib.h>
#include <string.h>
#include "text/chat_pystr.h"
#include "text/chat_req.h"
#include "util/util.h"

#define S(lit) lit, sizeof(lit) - 1

static const char QWEN35_TOOLS_HEAD[] =
    "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char QWEN35_TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n"
    "- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested "
    "within <tool_call></tool_call> XML tags\n- Required parameters MUST be specified\n"
    "- You may provide optional reasoning for your function call in natural language BEFORE the function call, "
    "but NOT after\n- If there is no function call available, answer the question like normal with your current "
    "knowledge and do not tell the user about function calls\n</IMPORTANT>";

static const char QWEN3_TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char QWEN3_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

static const char *ROLE_NAME[] = { "system", "user", "assistant", "tool" };

/* A byte range of a string: the templates' string slicing without copies. */
typedef struct { const char *p; size_t n; } span;

static span trim(span s) { /* Jinja |trim = Python str.strip() */
    size_t lo, hi;
    chat_py_strip(s.p, s.n, &lo, &hi);
    return (span){ s.p + lo, hi - lo };
}
static span lstrip_nl(span s) { while (s.n && s.p[0] == '\n') { s.p++; s.n--; } return s; }
static span rstrip_nl(span s) { while (s.n && s.p[s.n - 1] == '\n') s.n--; return s; }
static span strip_nl(span s) { return rstrip_nl(lstrip_nl(s)); }
static span of(const char *s) { return (span){ s, strlen(s) }; }
/* Request-supplied text: recorded as plain so the tokenizer never parses specials in it. */
static void addp(chat_buf *b, const char *p, size_t n) { b->plain = 1; chat_buf_add(b, p, n); b->plain = 0; }
static void adds_p(chat_buf *b, const char *p) { addp(b, p, strlen(p)); }
static void add(chat_buf *b, span s) { addp(b, s.p, s.n); }

/* s.split(sep)[0] and s.split(sep)[-1] */
static span before_first(span s, const char *sep) {
    long i = chat_find(s.p, s.n, sep);
    return i < 0 ? s : (span){ s.p, (size_t)i };
}
static span after_last(span s, const char *sep) {
    long i = chat_rfind(s.p, s.n, sep);
    size_t m = strlen(sep);
    return i < 0 ? s : (span){ s.p + i + m, s.n - (size_t)i - m };
}
static int starts(span s, const char *t) { size_t m = strlen(t); return s.n >= m && !memcmp(s.p, t, m); }
static int ends(span s, const char *t) { size_t m = strlen(t); return s.n >= m && !memcmp(s.p + s.n - m, t, m); }

static void add_tools(chat_buf *b, const json_t *tools) {
    for (size_t i = 0; i < json_array_size(tools); i++) {
        chat_buf_addc(b, '\n');
        b->plain = 1;
        chat_py_json(b, json_array_get(tools, i));
        b->plain = 0;
    }
}


/* Qwen3.5 (v36 = 0) and Qwen3.6 (v36 = 1). */
lily_code chat_render_qwen35(const chat_req *r, int v36, chat_buf *bp, lily_status *st) {
#define b (*bp)
    const chat_req_msg *m0 = &r->msgs[0];
    if (r->tools) {
        chat_buf_add(&b, S(QWEN35_TOOLS_HEAD));
        add_tools(&b, r->tools);
        chat_buf_add(&b, S(QWEN35_TOOLS_TAIL));
        if (m0->role == CHAT_ROLE_SYSTEM) {
            span c = trim(of(m0->content));
            if (c.n) { chat_buf_adds(&b, "\n\n"); add(&b, c); }
        }
        chat_buf_adds(&b, "<|im_end|>\n");
    } else if (m0->role == CHAT_ROLE_SYSTEM) {
        chat_buf_adds(&b, "<|im_start|>system\n");
        add(&b, trim(of(m0->content)));
        chat_buf_adds(&b, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user turn that is not only a wrapped tool response. */
    int last_query = -1;
    for (int i = r->n_msgs - 1; i >= 0 && last_query < 0; i--) {
        if (r->msgs[i].role != CHAT_ROLE_USER) continue;
        span c = trim(of(r->msgs[i].content));
        if (!(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) last_query = i;
    }
    if (last_query < 0) {
        return lily_err(st, LILY_EINVAL, "no user query found in messages (the template needs a user message that is not only a <tool_response>)");
    }
    for (int i = 0; i < r->n_msgs; i++) {
        const chat_req_msg *m = &r->msgs[i];
        span content = trim(of(m->content));
        switch (m->role) {
        case CHAT_ROLE_SYSTEM:
            if (i) {
                        return lily_err(st, LILY_EINVAL, "messages[%d]: a system message must be at the beginning", i);
            }
            break;
        case CHAT_ROLE_USER:
            chat_buf_adds(&b, "<|im_start|>user\n");
            add(&b, content);
            chat_buf_adds(&b, "<|im_end|>\n");
            break;
        case CHAT_ROLE_ASSISTANT: {
            span reasoning = { "", 0 };
            if (m->reasoning) {
                reasoning = of(m->reasoning);
            } else if (chat_find(content.p, content.n, "</think>") >= 0) {
                reasoning = lstrip_nl(after_last(rstrip_nl(before_first(content, "</think>")), "<think>"));
                content = lstrip_nl(after_last(content, "</think>"));
            }
            reasoning = trim(reasoning);
            chat_buf_adds(&b, "<|im_start|>assistant\n");
            if ((v36 && r->preserve_thinking_true) || i > last_query) {
                chat_buf_adds(&b, "<think>\n");
                add(&b, reasoning);
                chat_buf_adds(&b, "\n</think>\n\n");
            }
            add(&b, content);
            for (int k = 0; k < m->n_calls; k++) {
                const chat_req_call *c = &m->calls[k];
                if (k) chat_buf_adds(&b, "\n<tool_call>\n<function=");
                else if (trim(content).n) chat_buf_adds(&b, "\n\n<tool_call>\n<function=");
                else chat_buf_adds(&b, "<tool_call>\n<function=");
                adds_p(&b, c->name);
                chat_buf_adds(&b, ">\n");
                const char *key;
                json_t *val;
                json_object_foreach(c->args, key, val) {
                    chat_buf_adds(&b, "<parameter=");
                    adds_p(&b, key);
                    chat_buf_adds(&b, ">\n");
                    if (json_is_string(val)) addp(&b, json_string_value(val), json_string_length(val));
                    else {
                        b.plain = 1;
                        if (v36 || json_is_object(val) || json_is_array(val)) chat_py_json(&b, val);
                        else chat_py_str(&b, val); /* 3.5: args_value | string */
                        b.plain = 0;
                    }
                    chat_buf_adds(&b, "\n</parameter>\n");
                }
                chat_buf_adds(&b, "</function>\n</tool_call>");
            }
            chat_buf_adds(&b, "<|im_end|>\n");
            break;
        }
        case CHAT_ROLE_TOOL:
            /* loop.previtem is undefined for the first message: no header then. */
            if (i > 0 && r->msgs[i - 1].role != CHAT_ROLE_TOOL) chat_buf_adds(&b, "<|im_start|>user");
            chat_buf_adds(&b, "\n<tool_response>\n");
            add(&b, content);
            chat_buf_adds(&b, "\n</tool_response>");
            if (i == r->n_msgs - 1 || r->msgs[i + 1].role != CHAT_ROLE_TOOL) chat_buf_adds(&b, "<|im_end|>\n");
            break;
        }
    }
    if (r->add_generation_prompt) {
        chat_buf_adds(&b, "<|im_start|>assistant\n");
        chat_buf_adds(&b, r->enable_thinking_false ? "<think>\n\n</think>\n\n" : "<think>\n");
    }
    return LILY_OK;
#undef b
}

lily_code chat_render_qwen3(const chat_req *r, chat_buf *bp, lily_status *st) {
#define b (*bp)
    (void)st; /* Qwen3's template raises nothing chat_req_load has not checked */
    const chat_req_msg *m0 = &r->msgs[0];
    if (r->tools) {
        chat_buf_adds(&b, "<|im_start|>system\n");
        if (m0->role == CHAT_ROLE_SYSTEM) { adds_p(&b, m0->content); chat_buf_adds(&b, "\n\n"); }
        chat_buf_add(&b, S(QWEN3_TOOLS_HEAD));
        add_tools(&b, r->tools);
        chat_buf_add(&b, S(QWEN3_TOOLS_TAIL));
    } else if (m0->role == CHAT_ROLE_SYSTEM) {
        chat_buf_adds(&b, "<|im_start|>system\n");
        adds_p(&b, m0->content);
        chat_buf_adds(&b, "<|im_end|>\n");
    }
    /* Without a real user query the template keeps last_query_index = len - 1. */
    int last_query = r->n_msgs - 1;
    for (int i = r->n_msgs - 1; i >= 0; i--) {
        span c = of(r->msgs[i].content);
        if (r->msgs[i].role == CHAT_ROLE_USER && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < r->n_msgs; i++) {
        const chat_req_msg *m = &r->msgs[i];
        switch (m->role) {
        case CHAT_ROLE_SYSTEM:
        case CHAT_ROLE_USER:
            if (m->role == CHAT_ROLE_SYSTEM && !i) break; /* printed in the header */
            chat_buf_adds(&b, "<|im_start|>");
            chat_buf_adds(&b, ROLE_NAME[m->role]);
            chat_buf_adds(&b, "\n");
            adds_p(&b, m->content);
            chat_buf_adds(&b, "<|im_end|>\n");
            break;
        case CHAT_ROLE_ASSISTANT: {
            span content = of(m->content), reasoning = { "", 0 };
            if (m->reasoning) {
                reasoning = of(m->reasoning);
            } else if (chat_find(content.p, content.n, "</think>") >= 0) {
                reasoning = lstrip_nl(after_last(rstrip_nl(before_first(content, "</think>")), "<think>"));
                content = lstrip_nl(after_last(content, "</think>"));
            }
            chat_buf_adds(&b, "<|im_start|>assistant\n");
            if (i > last_query && (i == r->n_msgs - 1 || reasoning.n)) {
                chat_buf_adds(&b, "<think>\n");
                add(&b, strip_nl(reasoning));
                chat_buf_adds(&b, "\n</think>\n\n");
                add(&b, lstrip_nl(content));
            } else {
                add(&b, content);
            }
            for (int k = 0; k < m->n_calls; k++) {
                const chat_req_call *c = &m->calls[k];
                if (k || content.n) chat_buf_addc(&b, '\n');
                chat_buf_adds(&b, "<tool_call>\n{\"name\": \"");
                adds_p(&b, c->name);
                chat_buf_adds(&b, "\", \"arguments\": ");
                if (c->args_text) adds_p(&b, c->args_text);
                else if (c->args) { b.plain = 1; chat_py_json(&b, c->args); b.plain = 0; }
                else chat_buf_adds(&b, "{}");
                chat_buf_adds(&b, "}\n</tool_call>");
            }
            chat_buf_adds(&b, "<|im_end|>\n");
            break;
        }
        case CHAT_ROLE_TOOL:
            if (i == 0 || r->msgs[i - 1].role != CHAT_ROLE_TOOL) chat_buf_adds(&b, "<|im_start|>user");
            chat_buf_adds(&b, "\n<tool_response>\n");
            adds_p(&b, m->content);
            chat_buf_adds(&b, "\n</tool_response>");
            if (i == r->n_msgs - 1 || r->msgs[i + 1].role != CHAT_ROLE_TOOL) chat_buf_adds(&b, "<|im_end|>\n");
            break;
        }
    }
    if (r->add_generation_prompt) {
        chat_buf_adds(&b, "<|im_start|>assistant\n");
        if (r->enable_thinking_false) chat_buf_adds(&b, "<think>\n\n</think>\n\n");
    }
    return LILY_OK;
#undef b
}
