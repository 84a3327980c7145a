/* Internal to src/text: the pieces the one-shot and the streaming output parsers share.
 * The two parsers segment the text independently (that is what the tests compare);
 * they share the byte cleaning, the reading of one complete tool-call block and ids. */
#ifndef LILY_TEXT_PARSE_PRIV_H
#define LILY_TEXT_PARSE_PRIV_H
#include "text/chat.h"
#include "text/chat_pystr.h"
#include "util/util.h"

#define PARSE_THINK_OPEN "<think>"
#define PARSE_THINK_CLOSE "</think>"
#define PARSE_CALL_OPEN "<tool_call>"
#define PARSE_CALL_CLOSE "</tool_call>"

/* Incremental UTF-8 cleaner: invalid sequences (maximal subparts, as Python's
 * errors="replace" does) and NUL become U+FFFD; an incomplete sequence at the end of a
 * chunk waits for the next one. Output is the same for any split of the input. */
typedef struct {
    unsigned char pend[4];
    int n_pend, need;        /* bytes held, bytes the sequence needs in total */
    unsigned char lo, hi;    /* allowed range of the next continuation byte */
} parse_utf8;

void parse_utf8_feed(parse_utf8 *u, const char *s, size_t n, chat_buf *out);
void parse_utf8_flush(parse_utf8 *u, chat_buf *out);

/* Reads the inside of one <tool_call>...</tool_call> block (XML form, or the Qwen3
 * {"name", "arguments"} JSON form). Succeeds only for a well-formed call to a function
 * in `tools`; then *name and *arguments are malloc'd. Returns 0 on success. */
int parse_call_block(const char *s, size_t n, const json_t *tools, char **name, char **arguments);

/* What a parameter's schema allows, as the XML tool-call form types its value: bit 0 a
 * string (the value is kept as raw text), bit 1 something else (parsed as JSON); 0 for an
 * untyped schema (raw text). root resolves $ref. Shared with the tool-call grammar
 * (gram_tools.c), which must type values exactly as this parser reads them back. */
int parse_schema_kinds(const json_t *sch, const json_t *root, int depth);

/* "call_" + 24 alphanumerics from rng, malloc'd. */
char *parse_call_id(lily_rng *rng);
void parse_rng_init(lily_rng *rng, uint64_t seed);

#endif
