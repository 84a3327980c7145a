/* Anthropic Messages API (POST /v1/messages): the request is translated into the
 * equivalent OpenAI chat body, so validation, chat-template rendering, the scheduler and
 * sampling are shared with /v1/chat/completions. Pure (no HTTP, no model).
 * - system (string or text blocks) becomes a leading system message.
 * - user text blocks become one user message; tool_result blocks become role "tool"
 *   messages (in order, before the user's text); image blocks are refused.
 * - assistant text -> content, thinking -> reasoning_content, tool_use -> tool_calls.
 * - tools/tool_choice/thinking/stop_sequences map to tools/tool_choice/
 *   chat_template_kwargs.enable_thinking/stop. Unknown fields are ignored. */
#ifndef LILY_SERVER_ANTHROPIC_H
#define LILY_SERVER_ANTHROPIC_H
#include <stddef.h>
#include "server/server.h"

/* Returns the OpenAI chat JSON body (malloc'd) or NULL with *err set (HTTP 400).
 * count: for /v1/messages/count_tokens (max_tokens not required, never streamed). */
char *srv_anth_to_openai(const char *body, size_t len, int count, srv_error *err);


/* ---- responses: built from the OpenAI-shaped ones, so generation is shared ---------- */

/* Anthropic error type for an HTTP status (400 invalid_request_error, 401
 * authentication_error, 404 not_found_error, 503 overloaded_error, ...). */
const char *srv_anth_error_type(int http);
/* {"type":"error","error":{"type","message"}} as a malloc'd string. */
char *srv_anth_error_json(const srv_error *e);

/* The Anthropic message for a chat.completion body (not consumed). stop_seq: the stop
 * string that ended it, or NULL. */
json_t *srv_anth_message(const char *id, json_t *chat, const char *stop_seq);

/* Streaming: chat.completion.chunk objects in, Anthropic events out. */
typedef struct {
    char id[48];
    const char *model;
    int input_tokens, cached_tokens;
    int started, open, n_blocks; /* open: 0 none, 1 text, 2 thinking */
    const char *stop_reason;
    char *stop_seq;              /* set by the caller before the finish chunk (owned) */
    int done;
} srv_anth_stream;

/* Appends "event: NAME\ndata: JSON\n\n" for obj (consumed). */
int srv_anth_event(char **buf, size_t *len, size_t *cap, json_t *obj);
/* Feeds one chunk (consumed): a chat.completion.chunk, the usage chunk, or an error body
 * {"error":{...}}; appends the events it gives. -1 on allocation failure. */
int srv_anth_stream_feed(srv_anth_stream *a, json_t *chunk, char **buf, size_t *len, size_t *cap);
void srv_anth_stream_free(srv_anth_stream *a);

#endif
