/* Parked-conversation files (park_file_read) on arbitrary bytes, for a small stand-in model
 * whose state is a few hundred bytes. Each input is read as given (the checks before the
 * checksum) and again with its checksum made right, so mutations also reach the checks
 * behind it (token ids) and the copies into the arrays. */
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine/engine.h"

/* two layers (DeltaNet, attention) with tiny dimensions; no weights are needed to read */
static lily_model *fuzz_model(void) {
    static lily_model m;
    static int done;
    if (!done) {
        lily_config *c = &m.w.cfg;
        c->hidden = 16; c->n_layers = 2; c->vocab = 64; c->full_attn[1] = 1;
        c->n_heads = 2; c->n_kv_heads = 1; c->head_dim = 8; c->rot_dim = 2; c->rope_theta = 1e7;
        c->lin_nk = 1; c->lin_nv = 1; c->lin_dk = 4; c->lin_dv = 4; c->conv_k = 2;
        c->n_experts = 2; c->top_k = 1; c->moe_inter = 16; c->eps = 1e-6;
        m.w.layout = "hf";
        m.max_ctx = 64;
        done = 1;
    }
    return &m;
}

static void parse(const uint8_t *data, size_t size) {
    FILE *f = fmemopen((void *)data, size ? size : 1, "rb");
    if (!f) return;
    lily_parked *p = NULL;
    lily_status st;
    if (park_file_read(f, size, "fuzz", fuzz_model(), &p, &st) == LILY_OK) {
        int n;
        const int32_t *t = lily_parked_tokens(p, &n);
        if (n < 1 || t[n - 1] < 0 || t[n - 1] >= 64) abort();
    }
    lily_parked_free(p);
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    parse(data, size);
    if (size < 33) return 0;
    uint8_t *b = malloc(size);
    if (!b) return 0;
    memcpy(b, data, size);
    unsigned int len = 0;
    EVP_Digest(b, size - 32, b + size - 32, &len, EVP_sha256(), NULL);
    parse(b, size);
    free(b);
    return 0;
}
