/* lily-server: options, startup checks with clear errors, then serve until SIGINT/SIGTERM. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "hub/hub.h"
#include <time.h>
#include "server/server.h"
#include "text/grammar.h"
#include "util/util.h"

static const char usage[] =
    "usage: lily-server --model-path DIR [options]\n"
    "  --model-path DIR|ID     checkpoint folder (config.json + *.safetensors), or a Hugging Face\n"
    "                          repo id ORG/NAME, pulled into $LILY_HOME (default ~/.cache/lily)\n"
    "  --tokenizer PATH        tokenizer.json or folder (default: the model folder)\n"
    "  --host ADDR             IPv4 or IPv6 address to listen on (default 127.0.0.1; :: is every address)\n"
    "  --port N                TCP port (default 8000; 0 = any free port, printed at startup)\n"
    "  --ctx-len N             longest context per request in tokens (default 4096)\n"
    "  --slots N               sessions kept in memory / requests generating at once (default 4)\n"
    "  --max-queue N           requests allowed to wait for a slot; beyond it 503 (default 64)\n"
    "  --api-key KEY           require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on /v1/* (default: none)\n"
    "  --threads N             CPU threads for the engine (default 0 = all cores)\n"
    "  --backend auto|cpu|cuda engine backend (default auto)\n"
    "  --served-model-name S   model id reported by /v1/models (default: folder name)\n"
    "  --template NAME         chat template qwen3.6|qwen3.5|qwen3 (default: detected)\n"
    "  --max-body BYTES        largest request body (default 8388608)\n"
    "  --max-connections N     simultaneous HTTP connections (default 1024)\n"
    "  --prefill-chunk N       prompt tokens per scheduling step (default 512; 0 = whole prompt)\n"
    "  --cache-mb N            host memory for conversations parked when their slot is reused,\n"
    "                          so they resume without recomputing (default 2048; 0 = off)\n"
    "  --gpu-cache-mb N        GPU memory for parked conversations (CUDA backend): a slot swap then\n"
    "                          copies on the device instead of to host memory; past it the oldest\n"
    "                          move to --cache-mb (default -1 = half the GPU memory free after the\n"
    "                          slots; 0 = off)\n"
    "  --cache-dir DIR         keep parked conversations in DIR across restarts: saved at shutdown\n"
    "                          (SIGINT/SIGTERM) within --cache-mb, loaded at startup (default: none)\n"
    "  --cache-sync-ms N       with --cache-dir, also sync the conversations to DIR once the server\n"
    "                          has been idle N ms after a request, so a crash loses none of them\n"
    "                          (default 5000; 0 = only at shutdown)\n"
    "  --log-requests 0|1      one line on stderr per finished request: tokens in, cached, out,\n"
    "                          finish reason, time to first token, decode rate (default 1)\n";

static const char *opt(int argc, char **argv, const char *name) {
    size_t n = strlen(name);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], name)) return i + 1 < argc ? argv[i + 1] : "";
        if (!strncmp(argv[i], name, n) && argv[i][n] == '=') return argv[i] + n + 1;
    }
    return NULL;
}

static int int_opt(int argc, char **argv, const char *name, long def, long lo, long hi, int *out) {
    const char *v = opt(argc, argv, name);
    if (!v) { *out = (int)def; return 0; }
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (!*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "lily-server: %s must be an integer in [%ld, %ld] (got '%s')\n", name, lo, hi, v);
        return -1;
    }
    *out = (int)x;
    return 0;
}

static const char *known[] = { "--model-path", "--tokenizer", "--host", "--port", "--ctx-len", "--slots",
                               "--max-queue", "--api-key", "--threads", "--backend", "--served-model-name",
                               "--template", "--max-body", "--max-connections", "--prefill-chunk", "--cache-mb",
                               "--log-requests", "--cache-dir", "--cache-sync-ms", "--gpu-cache-mb", NULL };

static int check_args(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--", 2)) { fprintf(stderr, "lily-server: unexpected argument '%s'\n%s", argv[i], usage); return -1; }
        int ok = 0;
        for (int k = 0; known[k] && !ok; k++) {
            size_t n = strlen(known[k]);
            if (!strcmp(argv[i], known[k])) { ok = 1; i++; }
            else if (!strncmp(argv[i], known[k], n) && argv[i][n] == '=') ok = 1;
        }
        if (!ok) { fprintf(stderr, "lily-server: unknown option '%s'\n%s", argv[i], usage); return -1; }
    }
    return 0;
}

static void progress(void *user, uint64_t done, uint64_t total) {
    int *last = user;
    int pct = total ? (int)(done * 100 / total) : 100;
    if (pct / 10 != *last / 10 || pct == 100) {
        fprintf(stderr, "\rlily-server: loading weights %3d%%", pct);
        if (pct == 100) fputc('\n', stderr);
        *last = pct;
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) { fputs(usage, stdout); return 0; }
    if (check_args(argc, argv)) return 2;
    lily_env_note("lily-server");
    const char *model_dir = opt(argc, argv, "--model-path");
    if (!model_dir || !*model_dir) { fprintf(stderr, "lily-server: --model-path DIR is required\n%s", usage); return 2; }
    srv_http_opts ho = { 0 };
    int ctx_len, slots, max_queue, threads, max_body, max_conn, chunk, cache_mb, log_requests, sync_ms, gpu_cache_mb;
    if (int_opt(argc, argv, "--port", 8000, 0, 65535, &ho.port) || int_opt(argc, argv, "--ctx-len", 4096, 16, 1 << 22, &ctx_len) ||
        int_opt(argc, argv, "--slots", 4, 1, SRV_MAX_SLOTS, &slots) || int_opt(argc, argv, "--max-queue", 64, 0, 100000, &max_queue) ||
        int_opt(argc, argv, "--threads", 0, 0, 1024, &threads) ||
        int_opt(argc, argv, "--max-body", 8 << 20, 1024, 1 << 30, &max_body) ||
        int_opt(argc, argv, "--max-connections", 1024, 1, 100000, &max_conn) ||
        int_opt(argc, argv, "--prefill-chunk", 512, 0, 1 << 22, &chunk) ||
        int_opt(argc, argv, "--cache-mb", 2048, 0, 1 << 24, &cache_mb) ||
        int_opt(argc, argv, "--gpu-cache-mb", -1, -1, 1 << 24, &gpu_cache_mb) ||
        int_opt(argc, argv, "--log-requests", 1, 0, 1, &log_requests) ||
        int_opt(argc, argv, "--cache-sync-ms", 5000, 0, 86400000, &sync_ms))
        return 2;
    const char *cache_dir = opt(argc, argv, "--cache-dir");
    if (cache_dir) {
        struct stat cb;
        if (!*cache_dir) { fprintf(stderr, "lily-server: --cache-dir needs a folder\n"); return 2; }
        if (stat(cache_dir, &cb) && mkdir(cache_dir, 0700)) {
            fprintf(stderr, "lily-server: --cache-dir: cannot create '%s': %s\n", cache_dir, strerror(errno));
            return 1;
        }
        if (!stat(cache_dir, &cb) && !S_ISDIR(cb.st_mode)) {
            fprintf(stderr, "lily-server: --cache-dir: '%s' is not a folder\n", cache_dir);
            return 1;
        }
        if (!cache_mb) fprintf(stderr, "lily-server: warning: --cache-dir does nothing with --cache-mb 0\n");
    }
    ho.host = opt(argc, argv, "--host") ? opt(argc, argv, "--host") : "127.0.0.1";
    ho.api_key = opt(argc, argv, "--api-key");
    if (ho.api_key && !*ho.api_key) { fprintf(stderr, "lily-server: --api-key needs a value\n"); return 2; }
    ho.max_body = (size_t)max_body;
    ho.ctx_len = ctx_len;
    ho.threads = max_conn;
    ho.slots = slots;

    lily_model_opts mo;
    lily_model_opts_default(&mo);
    const char *be = opt(argc, argv, "--backend");
    if (!be || !strcmp(be, "auto")) mo.backend = LILY_BACKEND_AUTO;
    else if (!strcmp(be, "cpu")) mo.backend = LILY_BACKEND_CPU;
    else if (!strcmp(be, "cuda")) mo.backend = LILY_BACKEND_CUDA;
    else { fprintf(stderr, "lily-server: --backend must be auto, cpu or cuda (got '%s')\n", be); return 2; }
    mo.n_threads = threads;
    mo.max_ctx = ctx_len;
    mo.max_sessions = slots;
    int last = -1;
    mo.progress = progress;
    mo.progress_user = &last;

    struct stat sb;
    char path[4400], resolved[4096];
    int is_dir = !stat(model_dir, &sb) && S_ISDIR(sb.st_mode);
    /* Not a folder but shaped like ORG/NAME: a Hugging Face repo id, pulled (and the bf16
     * release converted to 4-bit once) into the cache. */
    if (!is_dir && model_dir[0] != '/' && model_dir[0] != '.' && strchr(model_dir, '/') &&
        strchr(model_dir, '/') == strrchr(model_dir, '/')) {
        lily_status hs = { 0 };
        fprintf(stderr, "lily-server: '%s' is not a local folder; fetching it from the Hugging Face hub\n", model_dir);
        if (hub_resolve_model(model_dir, resolved, sizeof resolved, &hs)) {
            fprintf(stderr, "lily-server: %s\n", hs.msg);
            return 1;
        }
        model_dir = resolved;
        is_dir = 1;
    }
    if (!is_dir) {
        fprintf(stderr, "lily-server: model folder '%s' does not exist (--model-path is a checkpoint folder or a hub repo id ORG/NAME)\n", model_dir);
        return 1;
    }
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    if (stat(path, &sb)) {
        fprintf(stderr, "lily-server: '%s' has no config.json: not a checkpoint folder\n", model_dir);
        return 1;
    }

    /* the chat template: --template, else detected from the checkpoint's files */
    const char *tn = opt(argc, argv, "--template");
    lily_status st = { 0 };
    if (tn) {
        if (chat_template_from_name(tn, &ho.template_kind, &st)) { fprintf(stderr, "lily-server: %s\n", st.msg); return 2; }
    } else {
        ho.template_kind = chat_template_for_dir(model_dir);
    }

    char name[128];
    const char *smn = opt(argc, argv, "--served-model-name");
    if (!smn) {
        size_t l = strlen(model_dir);
        while (l > 1 && model_dir[l - 1] == '/') l--;
        size_t b = l;
        while (b > 0 && model_dir[b - 1] != '/') b--;
        snprintf(name, sizeof name, "%.*s", (int)(l - b), model_dir + b);
        smn = name;
    }
    ho.model_name = smn;

    const char *tok_path = opt(argc, argv, "--tokenizer") ? opt(argc, argv, "--tokenizer") : model_dir;
    tok_tokenizer *tok = NULL;
    if (tok_load(tok_path, &tok, &st)) {
        fprintf(stderr, "lily-server: cannot load the tokenizer from '%s': %s\n(pass --tokenizer FILE for a tokenizer.json elsewhere)\n",
                tok_path, st.msg);
        return 1;
    }

    /* signals go to sigwait in this thread only */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    srv_http *http = NULL;
    int port = 0;
    if (srv_http_bind(&ho, &http, &port, &st)) {
        fprintf(stderr, "lily-server: %s\n", st.msg);
        tok_free(tok);
        return 1;
    }

    lily_model *model = NULL;
    lily_code rc = lily_model_open(model_dir, &mo, &model, &st);
    if (rc) {
        if (rc == LILY_ENOMEM)
            fprintf(stderr, "lily-server: the model does not fit with --ctx-len %d and --slots %d: %s\n"
                            "(lower --ctx-len or --slots)\n", ctx_len, slots, st.msg);
        else fprintf(stderr, "lily-server: cannot open the model in '%s': %s\n", model_dir, st.msg);
        srv_http_stop(http);
        tok_free(tok);
        return 1;
    }
    lily_model_info info;
    lily_model_get_info(model, &info);
    if (info.max_ctx > 0 && ctx_len > info.max_ctx) {
        fprintf(stderr, "lily-server: --ctx-len %d is larger than the model's maximum context (%d)\n", ctx_len, info.max_ctx);
        lily_model_free(model);
        srv_http_stop(http);
        tok_free(tok);
        return 1;
    }
    if (tok_vocab_size(tok) > info.vocab_size)
        fprintf(stderr, "lily-server: warning: the tokenizer has %d tokens but the model only %d; "
                        "prompts using the extra tokens will be refused\n", tok_vocab_size(tok), info.vocab_size);

    /* token bytes for response_format, built once (a trie over the vocabulary) */
    gram_vocab *gv = NULL;
    if (gram_vocab_new(tok, info.vocab_size, &gv, &st)) {
        fprintf(stderr, "lily-server: cannot index the vocabulary for response_format: %s\n", st.msg);
        lily_model_free(model);
        srv_http_stop(http);
        tok_free(tok);
        return 1;
    }
    srv_metrics *metrics = srv_metrics_new();
    srv_sched_opts so = { .model = model, .tok = tok, .n_slots = slots, .max_queue = max_queue,
                          .prefill_chunk = chunk, .metrics = metrics, .gram_vocab = gv,
                          .park_bytes = (size_t)cache_mb << 20, .log_requests = log_requests,
                          .gpu_park_bytes = gpu_cache_mb < 0 ? -1 : (int64_t)gpu_cache_mb << 20,
                          .cache_dir = cache_dir, .cache_save_s = sync_ms / 1000.0 };
    srv_sched *sched = NULL;
    if ((rc = srv_sched_start(&so, &sched, &st))) {
        if (rc == LILY_ENOMEM || rc == LILY_ERANGE)
            fprintf(stderr, "lily-server: cannot allocate %d sessions of %d tokens: %s\n(lower --ctx-len or --slots)\n",
                    slots, ctx_len, st.msg);
        else fprintf(stderr, "lily-server: cannot create sessions: %s\n", st.msg);
        srv_metrics_free(metrics);
        gram_vocab_free(gv);
        lily_model_free(model);
        srv_http_stop(http);
        tok_free(tok);
        return 1;
    }
    if (srv_http_start(http, sched, tok, metrics, &st)) {
        fprintf(stderr, "lily-server: %s\n", st.msg);
        srv_sched_stop(sched);
        srv_metrics_free(metrics);
        gram_vocab_free(gv);
        lily_model_free(model);
        srv_http_stop(http);
        tok_free(tok);
        return 1;
    }
    int v6 = strchr(ho.host, ':') != NULL; /* an IPv6 literal is bracketed in a URL */
    fprintf(stderr, "lily-server: serving '%s' (%s backend, template %s, ctx %d, %d slots) on http://%s%s%s:%d\n", smn,
            info.backend ? info.backend : "?", chat_template_name(ho.template_kind), ctx_len, slots, v6 ? "[" : "",
            ho.host, v6 ? "]" : "", port);
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    fprintf(stderr, "lily-server: %s, shutting down\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* Every request in flight gets an answer: stop accepting, end the jobs (503 for the
     * unfinished), give the handlers a moment to send that, then close what is left. */
    srv_http_quiesce(http);
    srv_sched_shutdown(sched);
    struct timespec grace = { 0, 300 * 1000000L };
    nanosleep(&grace, NULL);
    srv_http_stop(http);
    srv_sched_save(sched); /* the scheduler thread has stopped: its parked store is ours now */
    srv_sched_stop(sched);
    srv_metrics_free(metrics);
    gram_vocab_free(gv);
    lily_model_free(model);
    tok_free(tok);
    return 0;
}
