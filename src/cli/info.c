/* lily info DIR [--ctx-len N]: what a checkpoint is and what it needs in memory. */
#include "cli/cli.h"
#include "cli/progress.h"
#include "convert/convert.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void mem_line(const convert_info *in, int ctx) {
    convert_memory m;
    convert_memory_estimate(&in->cfg, in->bytes, ctx, 2, &m);
    char a[32], b[32], c[32], d[32];
    printf("  ctx %7d: %s total = weights %s + KV cache %s (bf16) + DeltaNet state %s\n", ctx,
           cli_bytes(m.total, a, sizeof a), cli_bytes(m.weights, b, sizeof b), cli_bytes(m.kv_cache, c, sizeof c),
           cli_bytes(m.deltanet, d, sizeof d));
}

int cli_info(int argc, char **argv) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--ctx-len")) { i++; continue; }
        if (argv[i][0] != '-') { dir = argv[i]; break; }
    }
    if (!dir || cli_flag(argc, argv, "-h") || cli_flag(argc, argv, "--help")) {
        fprintf(dir ? stdout : stderr, "usage: lily info DIR [--ctx-len N]\n");
        return dir ? 0 : 2;
    }
    const char *v = cli_opt(argc, argv, "--ctx-len");
    int ctx = v ? atoi(v) : 0;
    if (v && ctx <= 0) { fprintf(stderr, "lily info: --ctx-len must be a positive integer\n"); return 2; }
    convert_info in;
    lily_status st = { 0 };
    if (convert_info_read(dir, &in, &st) != LILY_OK) {
        fprintf(stderr, "lily info: %s\n", st.msg);
        return 1;
    }
    const lily_config *c = &in.cfg;
    char a[32], b[32];
    printf("%s\n", dir);
    printf("  model_type  %s\n", in.model_type);
    printf("  layout      %s", in.layout);
    if (in.bits) printf(" (affine %d-bit, group %d%s)", in.bits, in.group, in.n_bits8 ? "; router and shared-expert gate 8-bit" : "");
    printf("\n  dtypes     ");
    for (int t = 0; t < ST_NDTYPES; t++)
        if (in.dtype_count[t]) printf(" %s x%d (%s)", st_dtype_name((st_dtype)t), in.dtype_count[t], cli_bytes(in.dtype_bytes[t], a, sizeof a));
    printf("\n  parameters  %llu (%.3f %s, text model)\n", (unsigned long long)in.n_params,
           in.n_params >= 1000000000ull ? in.n_params / 1e9 : in.n_params / 1e6, in.n_params >= 1000000000ull ? "B" : "M");
    printf("  tensors     %d, %s", in.n_tensors, cli_bytes(in.bytes, a, sizeof a));
    if (in.n_other) printf("; plus %d vision/MTP tensors, %s (not loaded)", in.n_other, cli_bytes(in.other_bytes, b, sizeof b));
    printf("\n  shape       hidden %d, %d layers (%d full attention, %d Gated DeltaNet), vocab %d\n",
           c->hidden, c->n_layers, cfg_n_full(c), c->n_layers - cfg_n_full(c), c->vocab);
    printf("              attention %d q / %d kv heads x %d; DeltaNet %d k / %d v heads x %d/%d, conv %d\n",
           c->n_heads, c->n_kv_heads, c->head_dim, c->lin_nk, c->lin_nv, c->lin_dk, c->lin_dv, c->conv_k);
    printf("              %d experts (top %d) x %d, shared expert %d\n", c->n_experts, c->top_k, c->moe_inter, c->shared_inter);
    printf("  lily loads  %s%s\n", in.loads ? "yes" : "no: ", in.loads ? "" : in.load_error);
    printf("memory for one session:\n");
    if (ctx) mem_line(&in, ctx);
    else {
        static const int ctxs[] = { 4096, 32768, 262144 };
        for (int i = 0; i < 3; i++) mem_line(&in, ctxs[i]);
    }
    return 0;
}
