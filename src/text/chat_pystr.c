#define _GNU_SOURCE
#include "text/chat_pystr.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void chat_buf_add(chat_buf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    if (b->plain && n) {
        chat_span *last = b->n_spans ? &b->spans[b->n_spans - 1] : NULL;
        if (last && last->off + last->len == b->n) last->len += n;
        else {
            if (b->n_spans == b->cap_spans) {
                int cap = b->cap_spans ? b->cap_spans * 2 : 16;
                chat_span *g = realloc(b->spans, (size_t)cap * sizeof *g);
                if (!g) { b->oom = 1; return; }
                b->spans = g;
                b->cap_spans = cap;
            }
            b->spans[b->n_spans++] = (chat_span){ b->n, n };
        }
    }
    b->n += n;
    b->p[b->n] = 0;
}

void chat_buf_adds(chat_buf *b, const char *s) { chat_buf_add(b, s, strlen(s)); }
void chat_buf_addc(chat_buf *b, char c) { chat_buf_add(b, &c, 1); }

char *chat_buf_take(chat_buf *b) {
    if (!b->oom && !b->p) chat_buf_add(b, "", 0);
    char *p = b->oom ? NULL : b->p;
    if (b->oom) free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
    b->oom = 0;
    return p;
}

void chat_buf_free(chat_buf *b) {
    free(b->p);
    free(b->spans);
    b->p = NULL;
    b->spans = NULL;
    b->n = b->cap = 0;
    b->n_spans = b->cap_spans = 0;
}

chat_span *chat_buf_take_spans(chat_buf *b, int *n) {
    chat_span *s = b->spans;
    *n = b->n_spans;
    b->spans = NULL;
    b->n_spans = b->cap_spans = 0;
    return s;
}

/* Python's json string encoder with ensure_ascii=False: only '"', '\\' and C0
 * controls are escaped; everything else, DEL and non-ASCII included, passes through. */
static void py_json_string(chat_buf *b, const char *s, size_t n) {
    chat_buf_addc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char u[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(u, sizeof u, "\\u%04x", c); esc = u; }
        }
        if (esc) {
            chat_buf_add(b, s + run, i - run);
            chat_buf_adds(b, esc);
            run = i + 1;
        }
    }
    chat_buf_add(b, s + run, n - run);
    chat_buf_addc(b, '"');
}

void chat_py_float(chat_buf *b, double x) {
    char buf[64];
    if (isnan(x)) { chat_buf_adds(b, "NaN"); return; }
    if (isinf(x)) { chat_buf_adds(b, x > 0 ? "Infinity" : "-Infinity"); return; }
    if (x == 0) { chat_buf_adds(b, signbit(x) ? "-0.0" : "0.0"); return; }
    /* Shortest digit string that reads back to the same double, the nearest one when
     * several do (what Python's repr does). The correctly rounded p-digit string
     * (glibc rounds correctly) is the nearest; at a power of two the interval that
     * reads back is lopsided, so a neighbour one unit away may read back when it does not. */
    int neg = signbit(x) != 0, k = 0;
    unsigned long long mant = 0;
    double ax = fabs(x);
    for (int p = 1; p <= 17 && !mant; p++) {
        snprintf(buf, sizeof buf, "%.*e", p - 1, ax);
        unsigned long long m = 0;
        const char *q = buf;
        for (; *q && *q != 'e'; q++)
            if (*q >= '0' && *q <= '9') m = m * 10 + (unsigned long long)(*q - '0');
        int e = atoi(q + 1) - (p - 1);
        unsigned long long cand[3] = { m, m - 1, m + 1 };
        for (int c = 0; c < 3 && !mant; c++) {
            if (!cand[c]) continue;
            snprintf(buf, sizeof buf, "%llue%d", cand[c], e);
            if (strtod(buf, NULL) == ax) { mant = cand[c]; k = e; }
        }
    }
    char digits[32];
    int nd = snprintf(digits, sizeof digits, "%llu", mant);
    int decpt = nd + k, exp10 = decpt - 1;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    if (neg) chat_buf_addc(b, '-');
    if (decpt > 16 || decpt < -3) {
        chat_buf_addc(b, digits[0]);
        if (nd > 1) { chat_buf_addc(b, '.'); chat_buf_add(b, digits + 1, nd - 1); }
        snprintf(buf, sizeof buf, "e%c%02d", exp10 < 0 ? '-' : '+', abs(exp10));
        chat_buf_adds(b, buf);
    } else if (decpt <= 0) {
        chat_buf_adds(b, "0.");
        for (int i = 0; i < -decpt; i++) chat_buf_addc(b, '0');
        chat_buf_add(b, digits, nd);
    } else if (decpt >= nd) {
        chat_buf_add(b, digits, nd);
        for (int i = nd; i < decpt; i++) chat_buf_addc(b, '0');
        chat_buf_adds(b, ".0");
    } else {
        chat_buf_add(b, digits, decpt);
        chat_buf_addc(b, '.');
        chat_buf_add(b, digits + decpt, nd - decpt);
    }
}

void chat_py_json(chat_buf *b, const json_t *v) {
    char num[32];
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k;
        json_t *x;
        int first = 1;
        chat_buf_addc(b, '{');
        json_object_foreach((json_t *)v, k, x) {
            if (!first) chat_buf_adds(b, ", ");
            first = 0;
            py_json_string(b, k, strlen(k));
            chat_buf_adds(b, ": ");
            chat_py_json(b, x);
        }
        chat_buf_addc(b, '}');
        break;
    }
    case JSON_ARRAY:
        chat_buf_addc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) chat_buf_adds(b, ", ");
            chat_py_json(b, json_array_get(v, i));
        }
        chat_buf_addc(b, ']');
        break;
    case JSON_STRING: py_json_string(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER:
        snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        chat_buf_adds(b, num);
        break;
    case JSON_REAL: chat_py_float(b, json_real_value(v)); break;
    case JSON_TRUE: chat_buf_adds(b, "true"); break;
    case JSON_FALSE: chat_buf_adds(b, "false"); break;
    case JSON_NULL: chat_buf_adds(b, "null"); break;
    }
}

void chat_py_str(chat_buf *b, const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_STRING: chat_buf_add(b, json_string_value(v), json_string_length(v)); break;
    case JSON_TRUE: chat_buf_adds(b, "True"); break;
    case JSON_FALSE: chat_buf_adds(b, "False"); break;
    case JSON_NULL: chat_buf_adds(b, "None"); break;
    default: chat_py_json(b, v); break;
    }
}

/* str.isspace(): Unicode White_Space plus the C0 separators 0x1C..0x1F. */
static int py_isspace(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

/* Decodes the code point at s[i] (valid UTF-8 assumed, as jansson guarantees);
 * returns its length. */
static size_t utf8_at(const char *s, size_t n, size_t i, unsigned *cp) {
    unsigned char c = (unsigned char)s[i];
    size_t len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (i + len > n) len = n - i;
    unsigned v = len == 1 ? c : len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    for (size_t k = 1; k < len; k++) v = (v << 6) | ((unsigned char)s[i + k] & 0x3f);
    *cp = v;
    return len;
}

void chat_py_strip(const char *s, size_t n, size_t *lo, size_t *hi) {
    size_t a = 0, z = n;
    unsigned cp;
    while (a < z) {
        size_t len = utf8_at(s, z, a, &cp);
        if (!py_isspace(cp)) break;
        a += len;
    }
    while (z > a) {
        size_t start = z - 1;
        while (start > a && ((unsigned char)s[start] & 0xc0) == 0x80) start--;
        utf8_at(s, z, start, &cp);
        if (!py_isspace(cp)) break;
        z = start;
    }
    *lo = a;
    *hi = z;
}

long chat_find(const char *s, size_t n, const char *needle) {
    const char *p = memmem(s, n, needle, strlen(needle));
    return p ? (long)(p - s) : -1;
}

long chat_rfind(const char *s, size_t n, const char *needle) {
    size_t m = strlen(needle);
    if (m > n) return -1;
    for (size_t i = n - m + 1; i-- > 0;)
        if (!memcmp(s + i, needle, m)) return (long)i;
    return -1;
}
