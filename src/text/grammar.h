/* grammar: constrained decoding. A JSON schema (or "any JSON object") is compiled into a
 * byte-level context-free grammar, and a matcher follows the bytes of the tokens sampled so
 * far, answering which tokens may come next. Used by the server for `response_format`;
 * gram_tool_call gives grammars for tool calls.
 *
 * Contract
 * - gram_grammar and gram_vocab are immutable once built and may be shared by many threads;
 *   a gram_matcher belongs to one request (one thread at a time).
 * - The grammar is over bytes, not code points: a token may end in the middle of a UTF-8
 *   character and the next token completes it. String contents are exactly the
 *   well-formed UTF-8 sequences (RFC 3629: no overlongs, surrogates, or code points above
 *   U+10FFFF) other than controls, '"' and '\\', plus JSON's escapes; minLength/maxLength
 *   count code points (one sequence or one escape, a surrogate-pair escape being one),
 *   as JSON-schema validators do. This holds wherever strings occur (values, keys).
 * - Added tokens (<tool_call>, <|im_end|>, ...) are terminals a grammar may list by their
 *   exact content: an added token is allowed (mask, accept_token) iff the grammar lists
 *   it and its bytes are allowed at that point. Ordinary tokens spelling the same bytes
 *   are allowed as usual. JSON-schema and json_object grammars list none.
 * - The language is exactly: optional leading whitespace, one JSON value valid against the
 *   schema, nothing after it (the caller ends generation, e.g. with EOS). Whitespace
 *   between tokens of the value is limited (GRAM_MAX_WS bytes per run) so a model cannot
 *   loop on blanks forever.
 * - Supported schema keywords: type (string or list), properties, required,
 *   additionalProperties (false, true or a schema; when absent no extra keys are generated,
 *   which every validator still accepts), items,
 *   prefixItems, minItems/maxItems (small bounds), enum, const, anyOf, oneOf (as anyOf),
 *   allOf with one member, $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" (recursion
 *   allowed), nullable, minLength/maxLength (small bounds), and the annotations title,
 *   description, default, examples, $schema, $id, format (not enforced), $comment.
 *   Anything else (pattern, minimum, not, if/then, patternProperties, ...) is refused with
 *   LILY_EINVAL and a message naming the keyword and its JSON pointer, never ignored
 *   silently. Objects are generated with their properties in the schema's order, required
 *   ones always present, optional ones possibly absent; no duplicate keys.
 * - Every failure is a lily_code with st filled in; nothing here aborts on bad input
 *   (schemas come from HTTP requests: they are fuzzed).
 */
#ifndef LILY_GRAMMAR_H
#define LILY_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>
#include "lily.h"
#include "tokenizer/tokenizer.h"

#define GRAM_MAX_WS 16

typedef struct gram_grammar gram_grammar;
typedef struct gram_vocab gram_vocab;
typedef struct gram_matcher gram_matcher;

/* Compiles a JSON schema given as JSON text; a schema of `true` or `{}` means any JSON
 * value. */
lily_code gram_from_json_schema(const char *schema, size_t len, gram_grammar **out,
                                lily_status *st);
/* Any JSON object (response_format json_object). */
lily_code gram_json_object(gram_grammar **out, lily_status *st);
void gram_free(gram_grammar *g);

/* Tool calls as Qwen models write them. The language is the text right after the model's
 * <tool_call> token, through the </tool_call> that closes the call, in exactly the shape
 * src/text/chat_render.c prints and src/text/parse_call.c reads back:
 * - GRAM_TOOLS_XML (Qwen3.5/3.6): "\n<function=NAME>\n", then per parameter in the
 *   schema's property order (required ones always, optional ones possibly skipped)
 *   "<parameter=P>\nVALUE\n</parameter>\n", then "</function>\n</tool_call>". A value
 *   whose schema allows a string (or is untyped: parse_call keeps those as text) is raw
 *   well-formed UTF-8 text without NUL, "</parameter>" or "</tool_call>" (parse_call and
 *   the output parser cut there), within minLength/maxLength and limited to the string
 *   members of enum/const where given; any other value is the JSON value per the
 *   property's schema (the JSON-schema compiler above).
 * - GRAM_TOOLS_JSON (Qwen3): "\n{\"name\": NAME, \"arguments\": ARGS}\n</tool_call>" with
 *   ARGS an object valid against the function's parameters (whitespace as above).
 * tools_json is an OpenAI `tools` array ({"type": "function", "function": {"name",
 * "parameters"}}; a bare function object also works); name restricts the call to that
 * function (NULL: any); a function without parameters takes none ({}). multi = 1 lets
 * further calls "\n<tool_call>" CALL follow each call; 0: exactly one. The grammar lists
 * the added token </tool_call> (and <tool_call> with multi), so the tokenizer's added
 * tokens or ordinary tokens spelling the same text may be used. Refused with LILY_EINVAL:
 * bad JSON, no tools, an unknown name, parameters that are not an object schema, schemas
 * the compiler refuses (the message names the tool), names the XML form cannot carry
 * ('<', '>', newlines, edge blanks). Not excluded: "</tool_call>" (or "</parameter>" in the
 * XML form) inside a JSON string of an argument, which would end the block early. */
typedef enum { GRAM_TOOLS_XML = 0 /* Qwen3.5/3.6 */, GRAM_TOOLS_JSON /* Qwen3 */ } gram_tool_format;
lily_code gram_tool_call(const char *tools_json, size_t len, gram_tool_format fmt, const char *name, int multi,
                         gram_grammar **out, lily_status *st);

/* The bytes of every token id in [0, n_vocab): ids the tokenizer does not know (padding)
 * are never allowed; added tokens (<|im_end|>, <tool_call>, ...) only by grammars that
 * list them (see the contract). n_vocab is the model's vocabulary size (the logits row
 * length), which may exceed the tokenizer's. */
lily_code gram_vocab_new(const tok_tokenizer *t, int n_vocab, gram_vocab **out, lily_status *st);
int gram_vocab_size(const gram_vocab *v);
void gram_vocab_free(gram_vocab *v);

lily_code gram_matcher_new(const gram_grammar *g, gram_matcher **out, lily_status *st);
void gram_matcher_free(gram_matcher *m);

/* Tries to advance over token id's bytes: returns 1 and advances if the grammar allows
 * them, else returns 0 and leaves the matcher unchanged. */
int gram_matcher_accept_token(gram_matcher *m, const gram_vocab *v, int32_t id);
/* The same for raw bytes. */
int gram_matcher_accept_bytes(gram_matcher *m, const char *bytes, size_t n);
/* 1 if the bytes so far form a complete value (the caller may end here). */
int gram_matcher_can_end(const gram_matcher *m);
/* 1 if no byte at all can follow (the caller must end here). */
int gram_matcher_must_end(const gram_matcher *m);
/* allowed[id] = 1 for every token whose bytes the grammar allows next, else 0 (n_vocab
 * entries). Does not set end-of-sequence tokens: the caller adds them when can_end. */
void gram_matcher_mask(const gram_matcher *m, const gram_vocab *v, uint8_t *allowed);

#endif
