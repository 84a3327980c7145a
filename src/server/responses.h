/* OpenAI Responses API (POST /v1/responses, GET/DELETE /v1/responses/{id}). Like the
 * Anthropic route, a request is translated into the equivalent chat body, so validation,
 * template, prefix reuse, scheduler, sampler, response_format and tool parsing are the
 * chat route's; the chat result (or its stream chunks) is then converted into the
 * Responses shapes. Everything here is pure (no HTTP, no model) except that the store is
 * shared between threads (it has its own lock).
 * - input: a string (one user message) or items: messages (user/system/developer/assistant;
 *   text parts only), function_call, function_call_output, reasoning (the assistant turn's
 *   reasoning). Consecutive reasoning / assistant message / function_call items form one
 *   assistant turn. instructions and leading system/developer messages form the system
 *   message (later ones become user turns). previous_response_id prepends that stored
 *   response's input and output items.
 * - tools: function tools only; tool_choice auto/none/required/{type:function,name};
 *   text.format -> response_format; reasoning.effort minimal/none -> thinking off.
 * - output: reasoning item, message item (output_text), function_call items; usage with
 *   cached and reasoning token counts; status completed or incomplete (max_output_tokens). */
#ifndef LILY_SERVER_RESPONSES_H
#define LILY_SERVER_RESPONSES_H
#include <stddef.h>
#include "server/server.h"

/* ---- the store of finished responses (previous_response_id, GET, DELETE) ---------------- */

#define SRV_RESP_STORE_MAX 1000                    /* responses kept */
#define SRV_RESP_STORE_BYTES ((size_t)64 << 20)    /* their JSON text, at most */

typedef struct srv_resp_store srv_resp_store;
srv_resp_store *srv_resp_store_new(int max_items, size_t max_bytes);
void srv_resp_store_free(srv_resp_store *s);
/* Keeps copies of the response object and the input items that led to it (not consumed),
 * evicting the oldest entries beyond the bounds. An existing id is replaced. 0 ok, -1 when
 * it alone exceeds the byte budget or on allocation failure (nothing kept). */
int srv_resp_store_put(srv_resp_store *s, const char *id, json_t *response, json_t *input);
/* Copies of the stored response and (if input != NULL) its input items; NULL when unknown. */
json_t *srv_resp_store_get(srv_resp_store *s, const char *id, json_t **input);
/* 1 removed, 0 unknown. */
int srv_resp_store_delete(srv_resp_store *s, const char *id);
void srv_resp_store_counts(srv_resp_store *s, int *n, size_t *bytes);

/* GET (del 0) or DELETE (del 1) of "ID" or, GET only, "ID/input_items" (the path after
 * /v1/responses/). Returns the HTTP status and sets *body (malloc'd JSON, OpenAI's error
 * shape on failure). */
int srv_resp_lookup(srv_resp_store *s, const char *path, int del, char **body);

/* ---- requests ------------------------------------------------------------------------- */

typedef struct srv_resp_ctx {
    char id[48];              /* resp_... */
    long created_at;
    char model[128];          /* the model name answered with */
    json_t *echo;             /* request fields echoed in the response object */
    json_t *input;            /* the conversation's items: the previous response's input and
                                 output items, then this request's input */
    int store;                /* keep the finished response in st */
    srv_resp_store *st;
    const tok_tokenizer *tok; /* re-encodes reasoning text to count its tokens; NULL: 0 */
} srv_resp_ctx;

/* Translates a Responses request body into the OpenAI chat body (malloc'd) and a context
 * (*ctx, free with srv_resp_ctx_free). previous_response_id is looked up in store (NULL:
 * none are known). NULL with *err set (400; an unknown previous response has code
 * previous_response_not_found, as OpenAI answers). */
char *srv_resp_to_openai(const char *body, size_t len, srv_resp_store *store, const char *model,
                         srv_resp_ctx **ctx, srv_error *err);
void srv_resp_ctx_free(srv_resp_ctx *c);
/* The chat route's field names in an error -> this route's (max_tokens ->
 * max_output_tokens, response_format -> text.format, messages... -> input). */
void srv_resp_fix_param(srv_error *e);

/* ---- responses ------------------------------------------------------------------------ */

/* The response object for a chat.completion body (not consumed); incomplete: the token
 * limit ended it. Stored when c->store. */
json_t *srv_resp_object(srv_resp_ctx *c, json_t *chat, int incomplete);

/* Streaming: chat.completion.chunk objects in, Responses events out. */
typedef struct {
    srv_resp_ctx *ctx;        /* owned */
    int seq;                  /* next sequence_number */
    int started, done;
    int incomplete;           /* set by the caller before the finish chunk */
    json_t *output;           /* output items so far (the open one last) */
    int open;                 /* the last item is open: 0 no, 1 message, 2 reasoning */
    char *text;               /* the open item's text so far */
    size_t len, cap;
} srv_resp_stream;

/* Feeds one chunk (consumed): a chat.completion.chunk, the usage chunk, or an error body
 * {"error":{...}}; appends "event: TYPE\ndata: JSON\n\n" events. -1 on allocation failure. */
int srv_resp_stream_feed(srv_resp_stream *s, json_t *chunk, char **buf, size_t *len, size_t *cap);
void srv_resp_stream_free(srv_resp_stream *s); /* frees what it holds, ctx included */

#endif
