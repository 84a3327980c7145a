/* Engine internals shared by engine.c (model, sessions, prefix reuse) and generate.c. */
#ifndef LILY_ENGINE_H
#define LILY_ENGINE_H
#include <stdio.h>
#include "lily.h"
#include "cpu/cpu.h"
#include "loader/weights.h"
#include "util/util.h"

/* A copy of the recurrent state (conv + DeltaNet) at a token boundary. Attention
 * caches need no copy: restoring to position p only forgets keys past p. */
typedef struct {
    int pos;          /* tokens covered; 0 = unused */
    uint64_t stamp;   /* for least-recently-used replacement */
    float *conv, *S;
    int32_t *tokens;  /* [pos]: the tokens it covers; the KV rows below pos must match too */
    float *logits;    /* [V] after pos, kept when the session had them: the same prompt again (a
                       * regenerated answer, a retried request) then recomputes nothing */
    int has_logits;
} lily_snapshot;

#define LILY_SNAPSHOTS 4

struct lily_model {
    lily_weights w;
    lily_pool *pool;
    int max_ctx;
    int use_cuda;
    void *cuda;       /* backend state when use_cuda */
    char dir[1024];
};

struct lily_session {
    lily_model *m;
    cpu_cache cache;
    void *cuda;       /* backend session state when the model runs on the GPU */
    int32_t *tokens;  /* [max_ctx] consumed tokens */
    int n;
    float *logits;    /* [V] after the last fed token; page-locked on the GPU backend when it can */
    int logits_pinned;
    int has_logits;
    lily_snapshot snap[LILY_SNAPSHOTS];
    uint64_t clock;
    lily_rng rng;
};

/* A parked conversation (park.c); park_file.c writes and reads the same fields. */
struct lily_parked {
    int n;
    int32_t *tokens;      /* [n] */
    float *kv;            /* [n_full][2][n][nkv*hd]: keys then values of each attention layer */
    float *conv, *S;      /* recurrent state after token n-1 */
    int n_snap;
    int snap_pos[LILY_SNAPSHOTS];
    float *snap_conv[LILY_SNAPSHOTS], *snap_S[LILY_SNAPSHOTS];
    size_t bytes;
    struct lcuda_parked *dev; /* the GPU tier (cuda/cu_park.cu): when set, kv, conv, S and the snapshots'
                               * arrays are NULL and the state is there */
};

/* h = p's host form, read from p's GPU tier: arrays of its own (park_host_form_free frees them)
 * but p's tokens. */
lily_code park_host_form(const lily_parked *p, lily_parked *h, lily_status *st);
void park_host_form_free(lily_parked *h);

/* Reads a parked-conversation file already opened as f (size bytes, named `name` in errors):
 * the body of lily_parked_load, on a FILE so the fuzzer can feed it memory. */
lily_code park_file_read(FILE *f, uint64_t size, const char *name, const lily_model *m, lily_parked **out,
                         lily_status *st);

/* Runs n tokens through the backend at the session's position; logits as lily_session_feed. */
lily_code engine_forward(lily_session *s, const int32_t *ids, int n, float *all_logits, lily_status *st);
#endif
