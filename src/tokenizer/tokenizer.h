/* tokenizer: byte-level BPE as Hugging Face `tokenizers` runs it for the Qwen2/3/3.5/3.6
 * families (NFC or no normalizer -> added-token split -> Split(regex, Isolated) ->
 * GPT-2 byte map -> BPE by merge rank -> ids; decoder ByteLevel).
 *
 * Contract
 * - A tok_tokenizer is immutable after tok_load and may be used from many threads at
 *   once (the word cache is internally locked). tok_free needs every user gone.
 * - Text is bytes. Ill-formed UTF-8 in the input is replaced by U+FFFD before anything
 *   else, one U+FFFD per maximal ill-formed subpart (what HF sees after a lossy decode).
 * - parse_special = 1: added tokens (special or not) written in the text are matched as
 *   whole strings (leftmost-longest) and become their ids. parse_special = 0: the text is
 *   plain text, so a user can never inject <|im_start|> and friends.
 * - Decoding concatenates each token's raw bytes (tok_piece) and replaces ill-formed UTF-8
 *   with U+FFFD like HF's errors="replace"; ids outside the vocabulary are skipped, as HF
 *   does. skip_special drops added tokens whose "special" flag is true.
 * - The stream decoder emits exactly what tok_decode would give for the ids pushed so
 *   far, minus at most one incomplete trailing UTF-8 character, which it holds until the
 *   next push or tok_stream_flush (which turns it into U+FFFD).
 * - Every fallible call returns LILY_OK or a code with st (may be NULL) filled in.
 */
#ifndef LILY_TOKENIZER_H
#define LILY_TOKENIZER_H
#include <stddef.h>
#include <stdint.h>
#include "lily.h"

typedef struct tok_tokenizer tok_tokenizer;
typedef struct tok_stream tok_stream;

/* path: a tokenizer.json file, or a checkpoint folder holding tokenizer.json, or
 * vocab.json + merges.txt (+ tokenizer_config.json for added tokens and the regex). */
lily_code tok_load(const char *path, tok_tokenizer **out, lily_status *st);
/* The same from tokenizer.json text already in memory (need not be NUL-terminated). */
lily_code tok_load_json(const char *json, size_t len, tok_tokenizer **out, lily_status *st);
void tok_free(tok_tokenizer *t);

/* *ids is malloc'ed (free() it); *n tokens. *ids may be NULL when *n == 0. */
lily_code tok_encode(const tok_tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **ids, int *n, lily_status *st);
/* A prompt made of pieces, e.g. template text (parse_special = 1) around user content
 * (parse_special = 0). Encodes like tok_encode on the concatenation, except that an added
 * token is recognized only where it lies wholly inside parts that allow it. So the ids equal
 * HF's for the whole prompt whenever the user content holds no added-token text, and such
 * text in it stays plain. Use this rather than joining separately encoded pieces (BPE and
 * the regex see across the joins). */
typedef struct { const char *text; size_t len; int parse_special; } tok_part;
lily_code tok_encode_parts(const tok_tokenizer *t, const tok_part *parts, int n_parts,
                           int32_t **ids, int *n, lily_status *st);

/* *out is malloc'ed and NUL-terminated; *len excludes the NUL (len may be NULL). */
lily_code tok_decode(const tok_tokenizer *t, const int32_t *ids, int n, int skip_special,
                     char **out, size_t *len);

/* Largest id + 1 (regular and added tokens); the model's embedding may be padded larger. */
int tok_vocab_size(const tok_tokenizer *t);
/* Id of a token by its exact string (added token content, or a vocabulary entry written
 * in the byte-level alphabet, e.g. "Ġthe"), or -1. */
int32_t tok_id(const tok_tokenizer *t, const char *token);
/* 1 if id is an added token flagged special, else 0. */
int tok_is_special(const tok_tokenizer *t, int32_t id);
/* 1 if id is any added token (special or not), else 0. */
int tok_is_added(const tok_tokenizer *t, int32_t id);
/* Raw bytes of a token (not NUL-terminated), or NULL for an unknown id. */
const char *tok_piece(const tok_tokenizer *t, int32_t id, size_t *len);

/* Incremental decoding for streaming output; a stream is used by one thread at a time. */
lily_code tok_stream_new(const tok_tokenizer *t, int skip_special, tok_stream **out,
                         lily_status *st);
/* Feeds one id; *text and *len receive the newly completed text (possibly empty), valid UTF-8,
 * pointing into the stream's buffer, valid until the next call on the stream. */
lily_code tok_stream_push(tok_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the stream: gives the held bytes (as one U+FFFD) and readies it for reuse. */
lily_code tok_stream_flush(tok_stream *s, const char **text, size_t *len);
void tok_stream_free(tok_stream *s);

/* Writes a small synthetic byte-level BPE tokenizer.json at `path` (256 byte tokens,
 * merges learned from built-in English/code text, the Qwen3.6 added tokens) and a
 * tokenizer_config.json beside it (eos_token <|im_end|>). Added tokens have Qwen3.6's
 * ids (248044..) when vocab_size >= 248077, else they sit at the top of the vocabulary.
 * vocab_size >= 300. */
lily_code tok_write_synth_json(const char *path, int vocab_size, lily_status *st);

#endif
