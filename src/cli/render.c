/* lily render: a chat request (JSON) on stdin -> the prompt text on stdout, exactly.
 * --jsonl: one request per input line, one {"prompt": s} or {"error": s} line out
 * (lets tests and scripts render many requests with one process). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/cli.h"
#include "text/chat.h"
#include "util/util.h"

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        if (n == cap) {
            char *q = realloc(p, cap *= 2);
            if (!q) { free(p); return NULL; }
            p = q;
        }
        size_t got = fread(p + n, 1, cap - n, stdin);
        if (!got) break;
        n += got;
    }
    *len = n;
    return p;
}

static int render_jsonl(chat_template_kind kind, const char *in, size_t len) {
    const char *p = in, *end = in + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
        json_error_t e;
        lily_status st = { 0 };
        json_t *req = json_loadb(p, n, JSON_PRESERVE_ORDER, &e), *res;
        char *prompt = NULL;
        if (!req) res = json_pack("{s:s}", "error", e.text);
        else if (chat_render(req, kind, &prompt, &st)) res = json_pack("{s:s}", "error", st.msg);
        else res = json_pack("{s:s}", "prompt", prompt);
        char *line = res ? json_dumps(res, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (!line) { fprintf(stderr, "lily render: out of memory\n"); return 1; }
        puts(line);
        free(line);
        free(prompt);
        json_decref(res);
        json_decref(req);
        p += n + 1;
    }
    return 0;
}

int cli_render(int argc, char **argv) {
    chat_template_kind kind = CHAT_TEMPLATE_QWEN36;
    lily_status st = { 0 };
    const char *name = cli_opt(argc, argv, "--template"), *file = cli_opt(argc, argv, "--template-file");
    if (cli_flag(argc, argv, "-h") || cli_flag(argc, argv, "--help")) {
        printf("usage: lily render [--template qwen3.6|qwen3.5|qwen3] [--template-file FILE] [--jsonl]\n"
               "  reads an OpenAI chat request (messages, tools, chat_template_kwargs) on stdin\n"
               "  and prints the prompt text. --template-file picks the template from a\n"
               "  checkpoint's chat_template.jinja or tokenizer_config.json.\n");
        return 0;
    }
    if (name && chat_template_from_name(name, &kind, &st)) {
        fprintf(stderr, "lily render: %s\n", st.msg);
        return 2;
    }
    if (file) {
        char *text = lily_read_file(file, NULL, &st);
        if (!text) { fprintf(stderr, "lily render: %s\n", st.msg); return 1; }
        kind = chat_template_detect(text);
        free(text);
    }
    size_t len;
    char *in = read_stdin(&len);
    if (!in) { fprintf(stderr, "lily render: out of memory reading stdin\n"); return 1; }
    if (cli_flag(argc, argv, "--jsonl")) {
        int rc = render_jsonl(kind, in, len);
        free(in);
        return rc;
    }
    json_error_t e;
    json_t *req = json_loadb(in, len, JSON_PRESERVE_ORDER, &e);
    free(in);
    if (!req) {
        fprintf(stderr, "lily render: stdin is not valid JSON: %s (line %d, column %d)\n", e.text, e.line, e.column);
        return 1;
    }
    char *prompt = NULL;
    lily_code rc = chat_render(req, kind, &prompt, &st);
    json_decref(req);
    if (rc) {
        fprintf(stderr, "lily render: %s\n", st.msg);
        return 1;
    }
    fwrite(prompt, 1, strlen(prompt), stdout);
    free(prompt);
    return 0;
}
