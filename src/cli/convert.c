/* lily convert --from DIR --to DIR [--bits 4] [--group 64] [--quant minmax|search]:
 * official bf16 checkpoint -> MLX affine low-bit layout, with an error report. */
#include "cli/cli.h"
#include "cli/progress.h"
#include "convert/convert.h"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static volatile int canceled;
static void on_sigint(int sig) { (void)sig; canceled = 1; }

static void on_progress(void *user, const convert_progress *p) {
    cli_progress *pr = user;
    if (!strcmp(p->phase, "verify")) {
        if (!pr->verify_t0) pr->verify_t0 = p->elapsed;
        cli_progress_update(pr, p->bytes_out_done, p->bytes_out_total, p->elapsed - pr->verify_t0,
                            "verifying tensor %d/%d", p->tensors_done, p->tensors_total);
        return;
    }
    cli_progress_update(pr, p->bytes_in_done, p->bytes_in_total, p->elapsed, "tensor %d/%d %s",
                        p->tensors_done + (p->tensors_done < p->tensors_total), p->tensors_total,
                        p->current ? p->current : "");
}

static void on_tensor(void *user, const char *name, int bits, double rel) {
    (void)user;
    printf("  %d-bit  rel_err %.5f  %s\n", bits, rel, name);
}

int cli_convert(int argc, char **argv) {
    const char *from = cli_opt(argc, argv, "--from"), *to = cli_opt(argc, argv, "--to");
    if (!from || !to || cli_flag(argc, argv, "-h") || cli_flag(argc, argv, "--help")) {
        fprintf(from && to ? stdout : stderr,
                "usage: lily convert --from DIR --to DIR [--bits 4|8] [--group 32|64|128] [--quant minmax|search]\n"
                "                    [--threads N] [--shard-mb N] [--quiet]\n"
                "  official-layout checkpoint (bf16) -> MLX affine quantized layout that lily runs.\n");
        return from && to ? 0 : 2;
    }
    signal(SIGXFSZ, SIG_IGN);
    convert_opts o;
    convert_opts_default(&o);
    const char *v;
    if ((v = cli_opt(argc, argv, "--bits"))) o.bits = atoi(v);
    if ((v = cli_opt(argc, argv, "--group"))) o.group = atoi(v);
    if ((v = cli_opt(argc, argv, "--threads"))) o.n_threads = atoi(v);
    if ((v = cli_opt(argc, argv, "--shard-mb"))) o.shard_bytes = (uint64_t)atoll(v) * 1000000ull;
    if ((v = cli_opt(argc, argv, "--quant"))) {
        if (!strcmp(v, "search")) o.method = CONVERT_QUANT_SEARCH;
        else if (strcmp(v, "minmax")) { fprintf(stderr, "lily convert: --quant must be minmax or search\n"); return 2; }
    }
    cli_progress pr;
    cli_progress_init(&pr, "convert");
    o.progress = (void (*)(void *, const struct convert_progress *))on_progress;
    o.progress_user = &pr;
    if (!cli_flag(argc, argv, "--quiet")) o.tensor_done = on_tensor;
    o.cancel = &canceled;
    signal(SIGINT, on_sigint);
    signal(SIGTERM, on_sigint);
    convert_result res;
    lily_status st = { 0 };
    lily_code rc = convert_run(from, to, &o, &res, &st);
    cli_progress_end(&pr);
    if (rc != LILY_OK) {
        fprintf(stderr, "lily convert: %s\n", st.msg);
        return 1;
    }
    char a[32], b[32];
    printf("converted %s -> %s: %d tensors (%d quantized, %d source tensors dropped), %s -> %s in %.1f s\n",
           from, to, res.n_tensors, res.n_quantized, res.n_dropped, cli_bytes(res.bytes_in, a, sizeof a),
           cli_bytes(res.bytes_out, b, sizeof b), res.seconds);
    printf("relative weight error: model %.5f, worst %.5f (%s)\n", res.rel_err, res.max_rel_err, res.worst);
    return 0;
}
