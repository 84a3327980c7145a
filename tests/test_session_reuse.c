/* Prefix reuse must never restore a snapshot taken for a different token sequence:
 * a session that served prompt B then prompt A, asked for A again, must produce exactly
 * the logits a fresh session gives for A (the server's slots depend on this). */
#include <stdlib.h>
#include <string.h>
#include "lily.h"
#include "t.h"

int main(void) {
    const char *dir = "../shared/fixtures/tiny";
    lily_model_opts o;
    lily_model_opts_default(&o);
    o.n_threads = 2;
    o.max_ctx = 256;
    lily_model *m = NULL;
    lily_status st = { 0 };
    if (lily_model_open(dir, &o, &m, &st)) {
        fprintf(stderr, "cannot open %s: %s\n", dir, st.msg);
        printf("0 passed, 1 failed\n");
        return 1;
    }
    lily_model_info info;
    lily_model_get_info(m, &info);
    int32_t a[11], b[9];
    for (int i = 0; i < 11; i++) a[i] = (i * 37 + 5) % info.vocab_size;
    for (int i = 0; i < 9; i++) b[i] = i < 2 ? a[i] : (i * 53 + 11) % info.vocab_size;
    lily_session *fresh, *s;
    CHECK(lily_session_new(m, &fresh, &st) == LILY_OK && lily_session_new(m, &s, &st) == LILY_OK, "sessions");
    CHECK(lily_session_prefill(fresh, a, 11, NULL, &st) == LILY_OK, "fresh prefill");
    float *want = malloc(sizeof(float) * (size_t)info.vocab_size);
    memcpy(want, lily_session_logits(fresh), sizeof(float) * (size_t)info.vocab_size);

    int reused = -1;
    CHECK(lily_session_prefill(s, b, 9, &reused, &st) == LILY_OK && reused == 0, "prompt B");
    CHECK(lily_session_prefill(s, a, 11, &reused, &st) == LILY_OK, "prompt A after B");
    int32_t gen[3] = { 7, 8, 9 };
    CHECK(lily_session_feed(s, gen, 3, NULL, &st) == LILY_OK, "generated tokens");
    CHECK(lily_session_prefill(s, a, 11, &reused, &st) == LILY_OK, "prompt A again");
    CHECK(reused < 9 || reused > 9, "the snapshot at 9 belongs to B and must not be used (reused %d)", reused);
    CHECK(memcmp(lily_session_logits(s), want, sizeof(float) * (size_t)info.vocab_size) == 0,
          "logits equal a fresh session's");
    /* a follow-up turn that extends A reuses A's snapshot */
    int32_t a2[14];
    memcpy(a2, a, sizeof a);
    a2[11] = 3; a2[12] = 4; a2[13] = 5;
    CHECK(lily_session_prefill(s, a2, 14, &reused, &st) == LILY_OK && reused == 11, "extension reuses 11 (got %d)", reused);
    free(want);
    lily_session_free(s);
    lily_session_free(fresh);
    lily_model_free(m);
    return T_DONE();
}
