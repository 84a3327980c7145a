/* lily tokenize / detokenize: the tokenizer on stdin/stdout, for scripts and tests.
 * --batch: each stdin line is one hex-encoded text (or a line of ids, for detokenize),
 * answered by one output line (ids, or the hex of the decoded bytes). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "tokenizer/tokenizer.h"

static char *read_all(FILE *f, size_t *n) {
    size_t cap = 1 << 16, len = 0;
    char *b = malloc(cap);
    if (!b) return NULL;
    for (;;) {
        if (len == cap) {
            char *nb = realloc(b, cap * 2);
            if (!nb) { free(b); return NULL; }
            b = nb; cap *= 2;
        }
        size_t r = fread(b + len, 1, cap - len, f);
        if (!r) break;
        len += r;
    }
    *n = len;
    return b;
}

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static tok_tokenizer *open_tok(int argc, char **argv) {
    const char *path = cli_opt(argc, argv, "--tokenizer");
    if (!path) { fprintf(stderr, "lily %s: --tokenizer FILE|DIR is required\n", argv[0]); return NULL; }
    tok_tokenizer *t;
    lily_status st;
    if (tok_load(path, &t, &st)) { fprintf(stderr, "lily %s: %s\n", argv[0], st.msg); return NULL; }
    return t;
}

static void print_ids(const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
    putchar('\n');
}

/* --synth-out FILE [--vocab-size N]: writes the synthetic tokenizer (demo models, tests). */
static int write_synth(int argc, char **argv, const char *out) {
    const char *vs = cli_opt(argc, argv, "--vocab-size");
    lily_status st;
    if (tok_write_synth_json(out, vs ? atoi(vs) : 248320, &st)) { fprintf(stderr, "lily tokenize: %s\n", st.msg); return 1; }
    return 0;
}

int cli_tokenize(int argc, char **argv) {
    const char *synth = cli_opt(argc, argv, "--synth-out");
    if (synth) return write_synth(argc, argv, synth);
    tok_tokenizer *t = open_tok(argc, argv);
    if (!t) return 2;
    int special = cli_flag(argc, argv, "--special"), batch = cli_flag(argc, argv, "--batch");
    size_t n;
    char *in = read_all(stdin, &n);
    int rc = 0;
    lily_status st;
    if (!in) { fprintf(stderr, "lily tokenize: out of memory\n"); tok_free(t); return 1; }
    if (!batch) {
        int32_t *ids; int k;
        if (tok_encode(t, in, n, special, &ids, &k, &st)) { fprintf(stderr, "lily tokenize: %s\n", st.msg); rc = 1; }
        else { print_ids(ids, k); free(ids); }
    } else {
        char *buf = malloc(n / 2 + 1);
        for (char *p = in, *e = in + n; buf && p < e && !rc;) {
            char *nl = memchr(p, '\n', (size_t)(e - p));
            char *le = nl ? nl : e;
            size_t m = 0;
            for (char *q = p; q + 1 < le; q += 2) {
                int hi = hexval(q[0]), lo = hexval(q[1]);
                if (hi < 0 || lo < 0) { fprintf(stderr, "lily tokenize: --batch line is not hex\n"); rc = 1; break; }
                buf[m++] = (char)(hi * 16 + lo);
            }
            p = nl ? nl + 1 : e;
            int32_t *ids; int k;
            if (!rc && tok_encode(t, buf, m, special, &ids, &k, &st)) { fprintf(stderr, "lily tokenize: %s\n", st.msg); rc = 1; }
            if (!rc) { print_ids(ids, k); free(ids); }
        }
        free(buf);
    }
    free(in);
    tok_free(t);
    return rc;
}

/* Parses whitespace-separated ids from [p, e). */
static int parse_ids(const char *p, const char *e, int32_t **ids, int *k) {
    int cap = 64, n = 0;
    int32_t *v = malloc((size_t)cap * sizeof *v);
    while (v && p < e) {
        while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',')) p++;
        if (p >= e) break;
        char *end;
        errno = 0;
        long x = strtol(p, &end, 10);
        if (end == p || end > e || errno || x < INT32_MIN || x > INT32_MAX) { free(v); return -1; }
        if (n == cap) { int32_t *nv = realloc(v, (size_t)(cap *= 2) * sizeof *v); if (!nv) { free(v); return -1; } v = nv; }
        v[n++] = (int32_t)x;
        p = end;
    }
    if (!v) return -1;
    *ids = v; *k = n;
    return 0;
}

int cli_detokenize(int argc, char **argv) {
    tok_tokenizer *t = open_tok(argc, argv);
    if (!t) return 2;
    int skip = cli_flag(argc, argv, "--skip-special"), batch = cli_flag(argc, argv, "--batch");
    size_t n;
    char *in = read_all(stdin, &n);
    int rc = 0;
    if (!in) { tok_free(t); return 1; }
    for (char *p = in, *e = in + n; p < e || (!batch && p == in);) {
        char *nl = batch ? memchr(p, '\n', (size_t)(e - p)) : NULL;
        char *le = nl ? nl : e;
        int32_t *ids; int k;
        if (parse_ids(p, le, &ids, &k)) { fprintf(stderr, "lily detokenize: expected integer ids\n"); rc = 1; break; }
        char *out; size_t len;
        if (tok_decode(t, ids, k, skip, &out, &len)) { free(ids); rc = 1; break; }
        if (batch) { for (size_t i = 0; i < len; i++) printf("%02x", (unsigned char)out[i]); putchar('\n'); }
        else fwrite(out, 1, len, stdout);
        free(out); free(ids);
        p = nl ? nl + 1 : e;
        if (!batch) break;
    }
    free(in);
    tok_free(t);
    return rc;
}
