/* lily synth: a random-weight checkpoint of any size of the family, with a synthetic
 * byte-level tokenizer beside it, so the whole pipeline runs without downloads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <sys/stat.h>
#include "cli/cli.h"
#include "loader/synth.h"
#include "tokenizer/tokenizer.h"
#include "util/util.h"

static void progress(void *user, uint64_t done, uint64_t total) {
    double *t0 = user;
    double el = lily_now() - *t0;
    fprintf(stderr, "\rsynth: %6.2f / %.2f GB  %5.1f%%  %.0f MB/s   ", done / 1e9, total / 1e9, 100.0 * done / total,
            el > 0 ? done / 1e6 / el : 0.0);
    if (done == total) fputc('\n', stderr);
}

static int geti(int argc, char **argv, const char *name, int *v) {
    const char *s = cli_opt(argc, argv, name);
    if (!s) return 1;
    char *end;
    long x = strtol(s, &end, 10);
    if (*end || x <= 0 || x > (1 << 24)) { fprintf(stderr, "lily synth: %s wants a positive integer, got '%s'\n", name, s); return 0; }
    *v = (int)x;
    return 1;
}

int cli_synth(int argc, char **argv) {
    const char *out = cli_opt(argc, argv, "--out"), *layout = cli_opt(argc, argv, "--layout");
    const char *preset = cli_opt(argc, argv, "--preset"), *seed = cli_opt(argc, argv, "--seed");
    if (!out) {
        fprintf(stderr, "usage: lily synth --out DIR [--layout hf|mlx4] [--preset 35b-a3b|tiny] [--hidden N] [--layers N]\n"
                        "                  [--experts N] [--top-k N] [--vocab N] [--moe-inter N] [--heads N] [--kv-heads N] [--seed N]\n");
        return 2;
    }
    synth_opts o;
    memset(&o, 0, sizeof o);
    lily_status st = { 0 };
    if (synth_preset(preset ? preset : "35b-a3b", &o.cfg, &st)) { fprintf(stderr, "lily synth: %s\n", st.msg); return 2; }
    if (layout && strcmp(layout, "hf") && strcmp(layout, "mlx4")) { fprintf(stderr, "lily synth: --layout is hf or mlx4\n"); return 2; }
    o.mlx4 = !layout || !strcmp(layout, "mlx4");
    o.seed = seed ? strtoull(seed, NULL, 10) : 1;
    lily_config *c = &o.cfg;
    int layers = c->n_layers;
    if (!geti(argc, argv, "--hidden", &c->hidden) || !geti(argc, argv, "--layers", &layers) ||
        !geti(argc, argv, "--experts", &c->n_experts) || !geti(argc, argv, "--top-k", &c->top_k) ||
        !geti(argc, argv, "--vocab", &c->vocab) || !geti(argc, argv, "--moe-inter", &c->moe_inter) ||
        !geti(argc, argv, "--heads", &c->n_heads) || !geti(argc, argv, "--kv-heads", &c->n_kv_heads))
        return 2;
    if (layers > LILY_MAX_LAYERS) { fprintf(stderr, "lily synth: at most %d layers\n", LILY_MAX_LAYERS); return 2; }
    c->n_layers = layers;
    for (int l = 0; l < layers; l++) c->full_attn[l] = (l + 1) % 4 == 0;
    if (cli_opt(argc, argv, "--moe-inter") && !cli_opt(argc, argv, "--shared-inter")) c->shared_inter = c->moe_inter;
    if (c->vocab < 300) { fprintf(stderr, "lily synth: --vocab must be at least 300 (the synthetic tokenizer needs 256 bytes + specials)\n"); return 2; }
    if (mkdir(out, 0755) != 0 && errno != EEXIST) { fprintf(stderr, "lily synth: %s: %s\n", out, strerror(errno)); return 1; }
    /* The tokenizer first: the model's EOS ids are wherever it puts <|im_end|> and <|endoftext|>. */
    char tpath[4096];
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", out);
    tok_tokenizer *tok = NULL;
    if (tok_write_synth_json(tpath, c->vocab, &st) || tok_load(tpath, &tok, &st)) {
        fprintf(stderr, "lily synth: %s\n", st.msg);
        return 1;
    }
    o.eos[0] = tok_id(tok, "<|im_end|>");
    o.eos[1] = tok_id(tok, "<|endoftext|>");
    tok_free(tok);
    double t0 = lily_now();
    if (isatty(2)) { o.progress = progress; o.progress_user = &t0; }
    if (synth_write(out, &o, &st)) { fprintf(stderr, "lily synth: %s\n", st.msg); return 1; }
    fprintf(stderr, "synth: wrote %s (%s layout, hidden %d, %d layers, %d experts top-%d, vocab %d) in %.1f s\n", out,
            o.mlx4 ? "mlx4" : "hf", c->hidden, c->n_layers, c->n_experts, c->top_k, c->vocab, lily_now() - t0);
    return 0;
}
