/* Built when CUDA=1 is not given: the GPU backend reports that it is absent. */
#include "cuda/cuda_backend.h"
#include "util/util.h"

#define NO_GPU "this lily was built without CUDA (rebuild with make CUDA=1 CUDA_ARCH=sm_90a)"

int lcuda_available(char *why, size_t n) {
    snprintf(why, n, NO_GPU);
    return 0;
}
lily_code lcuda_model_new(const lily_weights *w, int max_ctx, int max_sessions,
                          void (*progress)(void *, uint64_t, uint64_t), void *progress_user,
                          lcuda_model **out, lily_status *st) {
    (void)w; (void)max_ctx; (void)max_sessions; (void)progress; (void)progress_user; *out = NULL;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_model_random(const lily_config *cfg, int max_ctx, uint64_t seed, lcuda_model **out, lily_status *st) {
    (void)cfg; (void)max_ctx; (void)seed; *out = NULL;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
uint64_t lcuda_model_bytes(const lcuda_model *m) { (void)m; return 0; }
int lcuda_session_pos(const lcuda_session *s) { (void)s; return 0; }
lily_code lcuda_last_logits(lcuda_session *s, float *out, lily_status *st) { (void)s; (void)out; return lily_err(st, LILY_EDEVICE, NO_GPU); }
lily_code lcuda_time_forward(lcuda_session *s, const int32_t *ids, int T, int pos, double *ms, lily_status *st) {
    (void)s; (void)ids; (void)T; (void)pos; (void)ms;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_time_decode(lcuda_session *s, int pos, int n, const lily_sampling *p, double *ms, lily_status *st) {
    (void)s; (void)pos; (void)n; (void)p; (void)ms;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
void lcuda_model_free(lcuda_model *m) { (void)m; }
lily_code lcuda_session_new(lcuda_model *m, lcuda_session **out, lily_status *st) {
    (void)m; *out = NULL;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
void lcuda_session_free(lcuda_session *s) { (void)s; }
void lcuda_session_reset(lcuda_session *s) { (void)s; }
lily_code lcuda_forward(lcuda_session *s, const int32_t *ids, int T, int pos, float *logits, int all_logits, lily_status *st) {
    (void)s; (void)ids; (void)T; (void)pos; (void)logits; (void)all_logits;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_forward_begin(lcuda_session *s, const int32_t *ids, int T, int pos, lily_status *st) {
    (void)s; (void)ids; (void)T; (void)pos;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_forward_wait(lcuda_session *s, float *logits, lily_status *st) {
    (void)s; (void)logits;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
int lcuda_chunk(const lcuda_session *s) { (void)s; return 0; }
lily_code lcuda_forward_batch(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits,
                              lily_status *st) {
    (void)ss; (void)ids; (void)pos; (void)n; (void)logits;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
void *lcuda_host_alloc(size_t bytes) { (void)bytes; return NULL; }
void lcuda_host_free(void *p) { (void)p; }
lily_code lcuda_snapshot_save(lcuda_session *s, int slot, lily_status *st) { (void)s; (void)slot; return lily_err(st, LILY_EDEVICE, NO_GPU); }
lily_code lcuda_snapshot_load(lcuda_session *s, int slot, lily_status *st) { (void)s; (void)slot; return lily_err(st, LILY_EDEVICE, NO_GPU); }
lily_code lcuda_state_copy(lcuda_session *s, int to_host, int n, float *kv, float *conv, float *S, lily_status *st) {
    (void)s; (void)to_host; (void)n; (void)kv; (void)conv; (void)S;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_snapshot_copy(lcuda_session *s, int slot, int to_host, float *conv, float *S, lily_status *st) {
    (void)s; (void)slot; (void)to_host; (void)conv; (void)S;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
void lcuda_park_limit(lcuda_model *m, uint64_t bytes) { (void)m; (void)bytes; }
uint64_t lcuda_park_used(const lcuda_model *m) { (void)m; return 0; }
lily_code lcuda_park(lcuda_session *s, int n, const int *snaps, int n_snaps, lcuda_parked **out, lily_status *st) {
    (void)s; (void)n; (void)snaps; (void)n_snaps;
    *out = NULL;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_unpark(lcuda_session *s, const lcuda_parked *p, lily_status *st) {
    (void)s; (void)p;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_parked_read(const lcuda_parked *p, float *kv, float *conv, float *S, float *const *snap_conv,
                            float *const *snap_S, lily_status *st) {
    (void)p; (void)kv; (void)conv; (void)S; (void)snap_conv; (void)snap_S;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
uint64_t lcuda_parked_bytes(const lcuda_parked *p) { (void)p; return 0; }
const lily_config *lcuda_parked_config(const lcuda_parked *p) { (void)p; return NULL; }
void lcuda_parked_free(lcuda_parked *p) { (void)p; }
uint64_t lcuda_mem_free(void) { return 0; }
lily_code lcuda_generate(lcuda_session *s, int pos, int32_t first, const lily_sampling *p, const lcuda_sample_state *ss,
                         int max_tokens, lily_token_cb cb, void *user, int *n_out, lily_status *st) {
    (void)s; (void)pos; (void)first; (void)p; (void)ss; (void)max_tokens; (void)cb; (void)user;
    if (n_out) *n_out = 0;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_generate_batch(lcuda_session **ss, const lcuda_batch_row *rows, int n, int max_steps, lcuda_row_cb cb,
                               void *user, float *const *logits, int *steps, int *fed, lily_status *st) {
    (void)ss; (void)rows; (void)n; (void)max_steps; (void)cb; (void)user; (void)logits;
    *steps = *fed = 0;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_profile(lcuda_session *s, int T, int pos, char *out, size_t n, lily_status *st) {
    (void)s; (void)T; (void)pos; (void)out; (void)n;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
lily_code lcuda_profile_batch(lcuda_session **ss, const int32_t *ids, const int *pos, int n, float *const *logits, char *out,
                              size_t on, lily_status *st) {
    (void)ss; (void)ids; (void)pos; (void)n; (void)logits; (void)out; (void)on;
    return lily_err(st, LILY_EDEVICE, NO_GPU);
}
