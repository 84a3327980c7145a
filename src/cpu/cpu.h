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

/* One decode step for B sessions at once: row i is session i's next token ids[i] at
 * position pos[i] of its own caches k[i] (all distinct). The weights are read once for the
 * whole batch. logits: [B][V]. */
void cpu_forward_batch(const lily_weights *w, cpu_cache *const *k, const int *pos, lily_pool *pool,
                       const int32_t *ids, int B, float *logits);

/* ---- ops, exposed for the kernel tests ---- */
/* Y[T][rows] = X[T][cols] . W^T, through the kernel cpu_mm_path selects. */
void cpu_matmul(lily_pool *pool, const lw_mat *W, const float *X, int T, float *Y);
/* Several independent products in one parallel region (e.g. the routed experts of a
 * layer): the same results as calling cpu_matmul on each, with one thread hand-off. */
typedef struct { const lw_mat *W; const float *X; int T; float *Y; } cpu_mm_job;
void cpu_matmul_many(lily_pool *pool, const cpu_mm_job *jobs, int n);

/* Matmul kernels. The reference (row buffer, ops.c) is the slow obvious path and stays;
 * the fast ones fuse dequantization into the dot product and tile for many tokens, and
 * decline (falling back to the reference) for layouts they do not cover. Each output
 * element is computed by one thread in a fixed order, so results do not depend on the
 * thread count. CPU_MM_AUTO = AVX2 where the CPU has AVX2+FMA+F16C, else portable C. */
typedef enum { CPU_MM_AUTO = 0, CPU_MM_REF, CPU_MM_C, CPU_MM_AVX2 } cpu_mm_kind;
/* Process-wide switch (tests, benchmarks); set it before running, not during. */
extern cpu_mm_kind cpu_mm_path;
void cpu_matmul_ref(lily_pool *pool, const lw_mat *W, const float *X, int T, float *Y);
/* Runs jobs with kernel `kind` only: 1 when done, 0 (nothing written) when that kernel
 * cannot run here (AVX2 on another CPU) or declines one of the matrices. */
int cpu_matmul_kind(lily_pool *pool, const cpu_mm_job *jobs, int n, cpu_mm_kind kind);
int cpu_mm_avx2_available(void);
/* One attention row: o[hd] = softmax(q . k_j / sqrt(hd)) . v_j over n cached positions
 * (k, v rows of hd at stride ld); sc: n floats of scratch. The _fast one vectorizes the
 * dot products and the weighted sum (fast_attn.c); CPU_MM_REF runs the reference. */
void cpu_attn_row(int n, int hd, const float *q, const float *k, const float *v, int ld, float *sc, float *o);
void cpu_attn_row_fast(int n, int hd, const float *q, const float *k, const float *v, int ld, float *sc, float *o,
                       cpu_mm_kind kind);
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
/* The same two rules with vectorized inner loops (fast_gdn.c), kernel chosen like the
 * matmuls' (CPU_MM_REF runs the reference above); forward uses them with cpu_mm_path. */
void cpu_gdn_recurrent_fast(int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk,
                            const float *v, int ldv, const float *g, const float *beta, float *S,
                            float *o, int ldo, cpu_mm_kind kind);
void cpu_gdn_chunked_fast(int T, int dk, int dv, const float *q, int ldq, const float *k, int ldk,
                          const float *v, int ldv, const float *g, const float *beta, float *S,
                          float *o, int ldo, cpu_mm_kind kind);
#endif
