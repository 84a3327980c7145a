/* Text in and out: the chat template (request -> prompt text) and the parsing of what
 * the model writes (text -> reasoning, content, tool calls).
 *
 * Contract
 * - chat_render is specialized C for three real templates, not a Jinja interpreter.
 *   For every request the real template renders (Jinja2 with transformers' settings:
 *   trim_blocks, lstrip_blocks, tojson = json.dumps(ensure_ascii=False)), the output
 *   is byte-identical. Requests the template rejects with raise_exception are
 *   rejected with LILY_EINVAL and a message naming the message index and problem.
 *   Requests a text-only engine cannot express (images, video, unknown roles,
 *   malformed or non-object tool-call arguments, non-array tools/tool_calls) are
 *   rejected the same way even where the template would print something.
 * - Requests are jansson values. Load them with JSON_PRESERVE_ORDER: key order is part
 *   of the output (tools and arguments are printed the way Python's json.dumps would).
 * - Tool-call `function.arguments` may be a JSON string (OpenAI wire form) or an
 *   object. For the Qwen3.5/3.6 templates a string is parsed into an object first
 *   (it must be one); the Qwen3 template prints a string verbatim (after checking it
 *   parses as an object).
 * - Template switches come from request.chat_template_kwargs (or the same keys at the
 *   top level; chat_template_kwargs wins): enable_thinking (only JSON false turns it
 *   off), preserve_thinking (3.6 only; only JSON true turns it on),
 *   add_generation_prompt (truthiness; absent = true).
 * - The output parser splits generated text into reasoning, content and tool calls
 *   (Qwen XML form, and the Qwen3 JSON form inside <tool_call>). Streaming and
 *   one-shot parsing give the same result for every split of the input into chunks:
 *   the concatenated deltas equal the one-shot parse, ids included when both use the
 *   same id_seed. A partial tag is never emitted as text; a tool-call block is
 *   emitted only once complete and valid, otherwise its raw text becomes content.
 * - Invalid UTF-8 and NUL bytes in generated text become U+FFFD (the same way in both
 *   parsers, wherever the chunk boundaries fall), so every emitted string is valid
 *   UTF-8 that jansson accepts.
 * - Newline runs ('\n' only) at the edges of the reasoning and of every content
 *   segment (text start/end, around </think> and around each tool-call block) are
 *   dropped: the template puts them there, they are not part of the answer.
 */
#ifndef LILY_TEXT_CHAT_H
#define LILY_TEXT_CHAT_H
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include "lily.h"
#include "tokenizer/tokenizer.h"

/* ---- rendering -------------------------------------------------------------------- */

typedef enum {
    CHAT_TEMPLATE_QWEN36 = 0, /* Qwen3.6 (default) */
    CHAT_TEMPLATE_QWEN35,     /* Qwen3.5: no preserve_thinking, Python str() of scalar args */
    CHAT_TEMPLATE_QWEN3,      /* Qwen3: JSON tool calls, no trimming */
} chat_template_kind;

/* Renders request {messages, tools?, chat_template_kwargs?} to prompt text.
 * *out is malloc'd, NUL-terminated; free() it. */
lily_code chat_render(const json_t *request, chat_template_kind kind, char **out, lily_status *st);

/* A byte range of the rendered prompt. */
typedef struct { size_t off, len; } chat_span;
/* chat_render that also reports, in increasing order, the spans of the prompt that came
 * from the request (message content, reasoning, tool definitions, names and arguments)
 * rather than from the template. Encode those with special-token parsing off
 * (tok_encode_parts), so no message can inject <|im_start|> or </think>. *plain is
 * malloc'd (free() it; NULL when *n_plain is 0). */
lily_code chat_render_ex(const json_t *request, chat_template_kind kind, char **out,
                         chat_span **plain, int *n_plain, lily_status *st);

/* Encodes a rendered prompt: the template's text with special tokens parsed, the plain
 * spans as plain text, then n_suffix extra pieces (plain where suffix_plain[i]), as one
 * string (tok_encode_parts). *ids is malloc'd. */
lily_code chat_encode(const tok_tokenizer *tok, const char *text, const chat_span *plain, int n_plain,
                      const char *const *suffix, const int *suffix_plain, int n_suffix, int32_t **ids, int *n,
                      lily_status *st);

/* Picks the template from a checkpoint's chat_template.jinja or tokenizer_config.json
 * text (either works: detection uses substrings that survive JSON escaping).
 * Unknown or NULL text gives CHAT_TEMPLATE_QWEN36. */
chat_template_kind chat_template_detect(const char *text);
/* The same from a checkpoint folder: chat_template.jinja, else tokenizer_config.json. */
chat_template_kind chat_template_for_dir(const char *dir);
/* "qwen3.6", "qwen3.5", "qwen3" (also "3.6" etc.); LILY_EINVAL for anything else. */
lily_code chat_template_from_name(const char *name, chat_template_kind *out, lily_status *st);
const char *chat_template_name(chat_template_kind kind);

/* Does the prompt that chat_render makes for this request end inside an open <think>?
 * (Qwen3.5/3.6 with a generation prompt and thinking not disabled.) Feed the answer to
 * chat_parse_opts.think_open. */
int chat_think_open(const json_t *request, chat_template_kind kind);

/* ---- parsing what the model writes -------------------------------------------------- */

typedef struct {
    int think_open;       /* the prompt ended inside <think>: text starts as reasoning */
    const json_t *tools;  /* the request's tools array (types the arguments); NULL = none,
                             and then every tool call is returned as content */
    uint64_t id_seed;     /* seeds the call_<random> ids; 0 = fresh randomness */
} chat_parse_opts;

typedef struct {
    char *id;        /* "call_" + 24 alphanumerics */
    char *name;
    char *arguments; /* JSON object text, json.dumps style: {"a": 1, "b": "x"} */
} chat_tool_call;

typedef struct {
    char *reasoning; /* never NULL; "" when there was none */
    char *content;   /* never NULL */
    int n_calls;
    chat_tool_call *calls;
} chat_parsed;

/* Fills o for a request rendered with chat_render(request, kind): think_open from
 * chat_think_open, tools from request.tools (borrowed: keep the request alive while
 * parsing), id_seed 0. */
void chat_parse_opts_for(const json_t *request, chat_template_kind kind, chat_parse_opts *o);

/* One-shot parse of the whole generated text (n bytes, any bytes). */
lily_code parse_output(const char *text, size_t n, const chat_parse_opts *o, chat_parsed *out,
                       lily_status *st);
void parse_free(chat_parsed *p);

/* Streaming parse. Each feed/finish appends OpenAI delta objects, in order, to the
 * json array `deltas`: {"reasoning_content": s}, {"content": s}, or
 * {"tool_calls": [{"index": i, "id": s, "type": "function",
 *                  "function": {"name": s, "arguments": s}}]}
 * (a tool call comes whole, once its </tool_call> has been read). */
typedef struct parse_stream parse_stream;
lily_code parse_stream_new(const chat_parse_opts *o, parse_stream **out, lily_status *st);
lily_code parse_stream_feed(parse_stream *s, const char *text, size_t n, json_t *deltas,
                            lily_status *st);
/* End of generation: flushes held-back text (a partial tag is then plain text, an
 * unterminated tool call becomes content). Further feeds are refused. */
lily_code parse_stream_finish(parse_stream *s, json_t *deltas, lily_status *st);
void parse_stream_free(parse_stream *s);

/* ---- building responses ------------------------------------------------------------- */

/* The OpenAI assistant message: {"role": "assistant", "content": s or null,
 * "reasoning_content": s (only when non-empty), "tool_calls": [...] (only when any)}.
 * content is null when it is empty and tool calls exist. NULL on allocation failure. */
json_t *out_message(const chat_parsed *p);
/* "tool_calls" when calls exist, else "length" when the token limit stopped it, else "stop". */
const char *out_finish_reason(const chat_parsed *p, int hit_length);
/* Folds one streaming delta object into an accumulated result (start from a zeroed
 * chat_parsed). LILY_EINVAL for an object that is not a delta of the form above. */
lily_code out_accumulate(chat_parsed *acc, const json_t *delta, lily_status *st);

#endif
