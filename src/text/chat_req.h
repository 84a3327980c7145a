/* Internal to src/text: a chat request checked and reduced to what the templates read.
 * chat_req_load does every check that does not depend on the template's own logic
 * (roles, content types, tool-call shape); the renderers do the rest. */
#ifndef LILY_TEXT_CHAT_REQ_H
#define LILY_TEXT_CHAT_REQ_H
#include "text/chat.h"
#include "text/chat_pystr.h"

typedef enum { CHAT_ROLE_SYSTEM, CHAT_ROLE_USER, CHAT_ROLE_ASSISTANT, CHAT_ROLE_TOOL } chat_role;

typedef struct {
    const char *name;
    json_t *args;          /* object (own reference), or NULL when arguments were absent */
    const char *args_text; /* the string as given when arguments came as a JSON string */
} chat_req_call;

typedef struct {
    chat_role role;
    char *content;         /* text parts joined; "" for null/absent */
    int content_is_string; /* content was a plain JSON string (not parts, not null) */
    const char *reasoning; /* reasoning_content when a string, else NULL */
    int n_calls;
    chat_req_call *calls;
} chat_req_msg;

typedef struct {
    int n_msgs;
    chat_req_msg *msgs;
    const json_t *tools;   /* non-empty array, or NULL */
    int add_generation_prompt;
    int enable_thinking_false;  /* enable_thinking is false */
    int preserve_thinking_true; /* preserve_thinking is true */
} chat_req;

lily_code chat_req_load(const json_t *request, chat_req *r, lily_status *st);
void chat_req_free(chat_req *r);

lily_code chat_render_qwen35(const chat_req *r, int v36, chat_buf *b, lily_status *st);
lily_code chat_render_qwen3(const chat_req *r, chat_buf *b, lily_status *st);

#endif
