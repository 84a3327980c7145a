/* The CPU reference engine: float32 arithmetic on the checkpoint's own weights.
 * It is the oracle for every faster path: clarity first, threads across rows.
 *
 * Activations are row-major [T][dim] for T tokens processed together (a prefill
 * chunk, or T = 1 when decoding). */
#ifndef LILY_CPU_H
#define LILY_CPU_H
#include "loader/weights.h"
#include "util/util.h"

/* Per-session recurrent and attention caches. */
typedef struct {
    int max_ctx;
    int n_lin, n_full;
    float *conv;   /* [n_lin][conv_dim][K-1]: the last K-1 pre-conv inputs, oldest first */
    float *S;      /* [n_lin][nv][dk][dv]: DeltaNet state, fp32 */
    float *kc, *vc;/* [n_full][max_ctx][nkv*hd]: keys after norm + RoPE, values */
} cpu_cache;

lily_code cpu_cache_new(const lily_config *c, int max_ctx, cpu_cache *k, lily_status *st);
void cpu_cache_free(cpu_cache *k);
void cpu_cache_reset(cpu_cache *k, const lily_config *c);
size_t cpu_cache_recurrent_bytes(const lily_config *c); /* conv + S */

/* Runs T tokens at positions pos..pos+T-1 (pos + T <= max_ctx).
 * logits: [T][V] when all_logits, else [V] for the last token (may be NULL).
 * hidden: optional [L+1][T][H], transformers' hidden_states layout. */
void cpu_forward(const lily_weights *w, cpu_cache *k, lily_pool *pool, const int32_t *ids, int T,
                 int pos, float *logits, int all_logits, float *hidden);

/* ---- ops, exposed for the kernel tests ---- */
/* Y[T][rows] = X[T][cols] . W^T */
void cpu_matmul(lily_pool *pool, const lw_mat *W, const float *X, int T, float *Y);
/* y = x * rsqrt(mean(x^2) + eps) * w, over n (in place allowed) */
void cpu_rmsnorm(const float *x, const float *w, int n, double eps, float *y);
/* Gated DeltaNet core for one value head over T steps, recurrent form.
 * q,k: [T] rows of dk with stride ldq/ldk; v: [T][dv] stride ldv; g, beta: [T] (stride 1);
 * S: [dk][dv] in/out; o: [T][dv] stride ldo. q must already carry the dk^-0.5 scale. */
void cpu_gdn_recurrent(int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk,
                       const float *v, int ldv, const float *g, const float *beta, float *S,
                       float *o, int ldo);
/* Same result through the chunked (WY) form, chunk 64, as prefill uses. */
void cpu_gdn_chunked(int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk,
                     const float *v, int ldv, const float *g, const float *beta, float *S,
                     float *o, int ldo);
#endif
