/* Internal to src/text: a growable byte buffer and the few Python behaviours the
 * templates depend on (json.dumps, str(), str.strip(), float repr), so rendered bytes
 * match what Jinja2 under Python produces. */
#ifndef LILY_TEXT_CHAT_PYSTR_H
#define LILY_TEXT_CHAT_PYSTR_H
#include <jansson.h>
#include <stddef.h>
#include "text/chat.h"

/* Appends never fail loudly: an allocation failure sets oom and later appends are
 * ignored, so callers check once at the end. p is always NUL-terminated when non-NULL. */
typedef struct {
    char *p;
    size_t n, cap;
    int oom;
    /* While `plain` is set, appended bytes are recorded as request-supplied text, which the
     * tokenizer must never read as special tokens (chat_render_ex). */
    int plain;
    chat_span *spans;
    int n_spans, cap_spans;
} chat_buf;

void chat_buf_add(chat_buf *b, const char *s, size_t n);
void chat_buf_adds(chat_buf *b, const char *s);
void chat_buf_addc(chat_buf *b, char c);
/* Hands over the NUL-terminated text (never NULL unless oom) and resets b. */
char *chat_buf_take(chat_buf *b);
void chat_buf_free(chat_buf *b);
/* Hands over the recorded plain spans (may be NULL when none) and their count. */
chat_span *chat_buf_take_spans(chat_buf *b, int *n);

/* json.dumps(v, ensure_ascii=False) with the default ", " and ": " separators. */
void chat_py_json(chat_buf *b, const json_t *v);
/* Python str(v) for a scalar (True, None, 1.5, the string itself); containers as json. */
void chat_py_str(chat_buf *b, const json_t *v);
/* Python repr(float): shortest round-trip digits, exponent form outside 1e-4..1e16. */
void chat_py_float(chat_buf *b, double x);

/* Python str.strip() on UTF-8 text: trims characters for which str.isspace() is true.
 * Sets [*lo, *hi) to the kept byte range of s[0..n). */
void chat_py_strip(const char *s, size_t n, size_t *lo, size_t *hi);

/* Finds needle in s[0..n) (memmem); returns offset or -1. */
long chat_find(const char *s, size_t n, const char *needle);
/* Offset of the last occurrence, or -1. */
long chat_rfind(const char *s, size_t n, const char *needle);

#endif
