/* Entry points for the CUDA kernel test (tests/cuda/kernel_test.c): each uploads host
 * inputs, poisons the device output with NaN so unwritten elements show, runs one kernel
 * and copies the result back. Built only with CUDA=1. */
#ifndef LILY_CUDA_TEST_H
#define LILY_CUDA_TEST_H
#include "lily.h"
#include "loader/weights.h"

/* variant 0: matrix-vector (W[0], any T), 1: tiled fp32 (W[0]), 2: tiled TF32 tensor cores,
 * 3: per-slot experts, 4: grouped by expert after the on-GPU sort, 5: the FP16 GEMM for 4- and
 * 8-bit weights (cu_gemm_q4), 6: its grouped form over the on-GPU tile map, 7: a warp a token
 * (few weight rows, fp32), 8: cu_matmul_exact (~fp32 on the tensor cores; split along the
 * columns where it would be too few blocks), 9: the same on fp32 SIMT tiles. For 3, 4 and 6, W holds E experts, sel [T*K]
 * the expert of slot t*K+k (distinct within a token), and Y gets [T*K][rows] in slot order;
 * otherwise Y is [T][rows]. X is [T][cols]. */
lily_code lct_matmul(const lw_mat *W, int E, const float *X, int T, int variant, const int *sel, int K,
                     float *Y, lily_status *st);
/* The experts' gate and up in one grouped launch (cu_gemm_swiglu_grouped): G and U hold E
 * experts each; Y [T*K][rows] in slot order gets silu(x G^T) * (x U^T). sel NULL: one pair
 * (cu_gemm_swiglu, the shared expert at prefill), Y [T][rows], with X packed to fp16 first
 * where packed (as the model runs it). */
lily_code lct_experts_swiglu(const lw_mat *G, const lw_mat *U, int E, const float *X, int T, const int *sel, int K, int packed,
                             float *Y, lily_status *st);
/* The experts' whole FFN at prefill as the model runs it (cu_moe_gate_up_xp, cu_moe_down_xp) with
 * bt-token tiles: G, U [E][rows][cols] and D [E][cols][rows]; Y [T*K][cols] in slot order gets
 * (silu(x G^T) * (x U^T)) D^T. */
lily_code lct_experts_ffn(const lw_mat *G, const lw_mat *U, const lw_mat *D, int E, const float *X, int T, const int *sel, int K,
                          int bt, float *Y, lily_status *st);
/* DeltaNet's causal conv at prefill (cu_conv, and cu_l2norm_heads where it does not norm itself):
 * mixed [T][cd], w [cd][K], state [cd][K-1] the inputs before the first (updated to the last
 * K - 1); u [T][cd] gets silu(conv), its first 2 nk heads of dk l2-normalized, q's times dk^-0.5. */
/* gt not NULL: the gates in the same launch (cu_gates): bb, aa [T][nv], A_log, dt_bias [nv] in;
 * g, beta [T][nv] out. */
typedef struct {
    const float *bb, *aa, *A_log, *dt_bias;
    int nv;
    float *g, *beta;
} lct_gates;
lily_code lct_conv(const float *mixed, float *state, const float *w, int cd, int K, int T, int nk, int dk, float *u,
                   const lct_gates *gt, lily_status *st);
/* n <= 4 matrices of equal cols over the same T > 8 rows in one launch (cu_gemm_tc_group, the
 * prefill projection groups), Y[i] [T][W[i].rows]; packed: X packed to fp16 first, as the model
 * runs them (n = 1: cu_gemm_tc_xp, a single projection); packed 2 or 3: the same on wgmma in
 * 64-token tiles, form 1 or 2 (LILY_CU_GEMM_WG; fails where no launch took it). */
/* Whether this build and device run the wgmma GEMM form (cu_gemm_tc.cu, WG). */
int lct_has_wgmma(void);
lily_code lct_gemm_group(const lw_mat *W, int n, const float *X, int T, int packed, float *const *Y, lily_status *st);
/* One projection through cu_gemm_tc_xp2 (packed inputs), Y [T][W->rows] = the parts' sum;
 * *parts: how many it wrote (2: split in K); wg 1 or 2: on wgmma, that form (fails where no launch took it). */
lily_code lct_gemm_split(const lw_mat *W, const float *X, int T, int wg, float *Y, int *parts, lily_status *st);
/* x rounded in place to the KV cache's fp16 (as the device stores it), for references over a cache */
void lct_kv_round(float *x, size_t n);
/* Decode attention's form (k_attn_gqa): the keys a warp loads together (1, 2, 4) and the blocks a
 * group of 8 query heads is split over (1, 2, 4); 0 the default */
void lct_attn_form(int u, int hs);
/* Decode attention for the 35B-A3B heads on the tensor cores (k_attn_dtc): 1 from dmin keys on, 0 never,
 * -1 as the environment says (cu_attn_tc_at) */
void lct_attn_dtc(int on, int dmin);
/* Prefill attention (cu_attention, one split): q [T][nh][hd], qg [T][nh][2 hd] (the gate in the
 * second half), kc/vc [ctx][nkv][hd] holding keys 0 .. pos0 + T - 1; token t sees 0 .. pos0 + t.
 * o [T][nh][hd]. h16: through cu_attention_h16 (the keys laid out in fp16 scratch once). kc and vc go to the
 * device as its cache holds them, fp16 (cu_kv_f2h): pass values lct_kv_round left unchanged. */
lily_code lct_attention(const float *q, const float *qg, const float *kc, const float *vc, int T, int nh, int nkv, int hd,
                        int pos0, int ctx, int h16, float *o, lily_status *st);
/* The same for one token (T 1) over the keys in `splits` parts merged after, as decode runs it. */
/* Decode attention with the q/k prep folded in (cu_attention_dec): qg [nh][2 hd] raw q and gates, k,
 * v [nkv][hd] the new token's raw key and value, at position pos0 of the caches kc, vc [ctx][nkv][hd]
 * (written there, fp16, and read back as fp32); o [nh][hd]. Fails where it declines. */
lily_code lct_attention_dec(const float *qg, const float *k, const float *v, const float *qn, const float *kn, const float *inv_freq,
                            int nh, int nkv, int hd, int rot, float eps, int pos0, int ctx, int splits, float *kc, float *vc, float *o,
                            lily_status *st);
lily_code lct_attention_split(const float *q, const float *qg, const float *kc, const float *vc, int nh, int nkv, int hd,
                              int pos0, int ctx, int splits, float *o, lily_status *st);
/* The gated RMSNorm of the delta rule's output at prefill (cu_gated_norm), in place on o
 * [T][nv][dv]: o * rsqrt(mean(o^2) + eps) * gw * silu(z) per (token, head). */
/* A producer's packed GEMM input (the _p forms: cu_rmsnorm2p, cu_gated_norm_p, cu_moe_combine_p)
 * beside k_xp_pack's packing of its fp32 output: the lct_ functions below that take one ask for
 * it where pk is not NULL; xp and xp_ref get [T][cols] halves ([T * cols] each, the output's
 * columns; xp poisoned before) and packed what the producer returned (1: it wrote xp). */
typedef struct { uint16_t *xp, *xp_ref; int packed; } lct_packed;
lily_code lct_gated_norm(float *o, const float *z, const float *gw, int T, int nv, int dv, float eps, lct_packed *pk,
                         lily_status *st);
/* Y [T][W.rows] = W g(O_t) through k_mvdpt's staged gated norm (cu_mvdpt_gated): g of heads of 128
 * columns, O_t rmsnorm'd (eps) times gw [128] times silu(Z_t); an error where it declines. */
lily_code lct_matvec_rows_gated(const lw_mat *W, const float *O, const float *Z, const float *gw, float eps, int T, float *Y,
                                lily_status *st);
/* The grouped matrix-vector product for T input rows (cu_matvec_rows): n <= 4 matrices of
 * equal cols (4/8-bit), X [T][cols], X2 NULL or [T][cols] (then the input is silu(X) * X2),
 * Y[i] [T][W[i].rows]. kern 0: the kernels cu_matvec_rows picks, 1: without k_mvdpb (k_mvqb),
 * 2: k_mvdpb alone (an error where it declines), 3: its other form (LILY_CU_MVDPB_PF=1), 4: k_mvdpt
 * (the int8 tensor-core form) alone. */
/* T rows of W[i] n(x_t), n(x) = rmsnorm(x) * nw (eps), with the norm staged (cu_mvdpb_norm), writing n(x_t) to
 * tout [T][cols]; kern 0 as the forward pass chooses, 2 k_mvdpb, 4 k_mvdpt, 5 a row at a time through
 * cu_matvec_group's norm (one token's step after its folded combine). Fails where the launch declines. */
lily_code lct_matvec_rows_norm(const lw_mat *W, int n, const float *X, const float *nw, float eps, int T, float *const *Y,
                               float *tout, int kern, lily_status *st);
lily_code lct_matvec_rows(const lw_mat *W, int n, const float *X, const float *X2, int T, float *const *Y, int kern,
                          lily_status *st);
/* Decode's grouped matrix-vector launch (cu_matvec_group) in slot mode: n <= 4 matrices of equal
 * cols, W[i * E + e] expert e of matrix i; slot j < nslots multiplies expert sel[j] with input row
 * j / xdiv of X [.][cols] (silu(X) * X2 when X2); with XM (n matrices) one more slot multiplies
 * XM[i] with input row xrow (the shared expert in the routed experts' launch). Y[i] [slots][rows_i].
 * dp: 0 the launch as the forward pass takes it, -1 without k_mvdp, R = 1, 2, 4 k_mvdp with R rows a
 * lane group, 3 its two-group form (rows of more than 32 groups). */
/* sel NULL: one dense launch (E 1, nslots 1). nm not NULL (dense only): the router group's fused
 * residual add and norm, the input rmsnorm(X + add) * nw, which tout [cols] gets too. */
/* gz, gw (nw NULL): the gated norm of heads of 128 columns instead, x rmsnorm(x) gw silu(gz) a head
 * (cu_matvec_gated: k_mvdp only; dp -1 fails) */
typedef struct { const float *add, *nw; float eps; float *tout; const float *gz, *gw; } lct_mvnorm;
/* rt: the launch routes itself from logits lg [T][E] (top K a token; T 0 or 1: one token, K = nslots;
 * T > 1: a decode batch's, xdiv = K, nslots = T K), writing sel [T K] and wt [T K] */
typedef struct { const float *lg; int E, K; int *sel; float *wt; int T; } lct_mvroute;
/* decode attention's adaptive splits (cu_attention's amin) in the split and folded calls that follow; 0 off */
void lct_attn_amin(int amin);
/* XM: nsh extra slots after the nslots routed ones, slot nslots + j multiplying XM[i] by X row xrow + j */
lily_code lct_matvec_group(const lw_mat *W, int n, int E, const lw_mat *XM, int nsh, const int *sel, int nslots, int xdiv, int xrow,
                           const float *X, const float *X2, int nx, const lct_mvnorm *nm, int dp, const lct_mvroute *rt,
                           float *const *Y, lily_status *st);
/* Recurrent delta rule for all heads: u [T][2*nk*dk + nv*dv] (q already normalized and
 * scaled), g, beta [T][nv], S [nv][dk][dv] in/out, o [T][nv*dv]. */
lily_code lct_gdn(int T, int nk, int nv, int dk, int dv, const float *u, const float *g, const float *beta,
                  float *S, float *o, lily_status *st);
/* Decode's DeltaNet steps (dk = dv = 128), one launch a token for steps tokens: fused 1 (cu_gdn_dec), 2
 * split (cu_gdn_dec_split, then cu_gated_norm), 0 as cu_gdn_prep1 then the delta rule with its gated norm. mixed [steps][cd], bb, aa [steps][nv],
 * z [steps][nv*128] in; state [cd][K-1] and S [nv][128][128] in/out; o [steps][nv*128] out. Fails if
 * a counter of the fused form is not 0 after the launches. */
lily_code lct_gdn_dec(int fused, int steps, int nk, int nv, int K, const float *mixed, float *state, const float *cw, const float *bb,
                      const float *aa, const float *A_log, const float *dt_bias, float *S, const float *z, const float *gw, float eps,
                      float *o, lily_status *st);
/* The same through the chunked kernels (cu_gdn_chunked; variant as cu_gdn_chunk_variant: 1 tensor
 * cores, 2 tiled, 3 generic), and the staged prefill kernel (cu_gdn_staged: dk 128, dv a multiple
 * of 32; LILY_EUNSUPPORTED otherwise). */
lily_code lct_gdn_chunked(int variant, int T, int nk, int nv, int dk, int dv, const float *u, const float *g,
                          const float *beta, float *S, float *o, lily_status *st);
lily_code lct_gdn_staged(int T, int nk, int nv, int dk, int dv, const float *u, const float *g, const float *beta,
                         float *S, float *o, lily_status *st);
/* y = rmsnorm(x (+ add)) * w for T rows of n; x_out gets x after the add (may be NULL). */
/* The MoE sort of n slots (sel [n], experts < E) on the GPU: count, off [E], src, pos [n]; with
 * merged, the sort that also writes the bt-token tile map into tiles [mt] (cu_moe_sort_tiles),
 * else cu_moe_sort alone (tiles untouched). */
/* The wgmma building block (cu_wg_mma64 in cu_dev.h, the instruction on sm_90a, the emulation
 * elsewhere) over two k steps: A [64][32] and B [64][32] fp16 bits, row-major; D [64][64] =
 * A B^T. */
lily_code lct_wgmma(const uint16_t *A, const uint16_t *B, float *D, lily_status *st);
lily_code lct_moe_sort(const int *sel, int n, int E, int bt, int merged, int *count, int *off, int *src, int *pos, int *tiles,
                       int mt, lily_status *st);
lily_code lct_rmsnorm(const float *x, const float *add, const float *w, int n, int T, float eps, float *y,
                      float *x_out, lct_packed *pk, lily_status *st);
/* cu_moe_combine (rows in order, no pos) reps times in place on x [T][H]; tout [T][H] when nw. */
lily_code lct_moe_combine(float *x, const float *add, const float *D, const float *wt, int T, int K, int H, const float *SD,
                          const float *sr, const float *nw, float eps, float *tout, int reps, lct_packed *pk, lily_status *st);
/* cu_mvdp_comb reps times in place on x [T][H] (D: E experts [H][I]; SD the shared expert's down or
 * NULL; sel, wt [T][K]; hg, hu [T K (+ T)][I]; sr, add per token). Fails where it declines. */
lily_code lct_mvdp_comb(const lw_mat *D, int E, const lw_mat *SD, const int *sel, const float *wt, int K, int T, const float *hg,
                        const float *hu, const float *sr, float *x, const float *add, int reps, lily_status *st);
lily_code lct_router(const float *logits, int T, int E, int K, int *sel, float *wt, lily_status *st);
/* The prefill router: logits [T][W->rows] = X W^T to fp32 accuracy and their top-K, with the column
 * slices' sum in the top-k's launch (cu_router_exact_topk). splits: -1 cu_matmul_exact's tiles (no
 * fragment copy), 0 cu_router_tc's own choice, n > 0 n column slices; *used gets cu_router_tc's S (0
 * where it declined or was not asked). */
lily_code lct_router_exact(const lw_mat *W, const float *X, int T, int K, int splits, float *logits, int *sel, float *wt,
                           int *used, lily_status *st);
/* out[0] = argmax, out[1] = its log-probability bits. */
lily_code lct_argmax(const float *x, int V, int out[2], lily_status *st);
/* `steps` sampling steps of the GPU sampler (cu_sample.cu) on one logits row [V], as the
 * decode loop runs them: counts [V] (may be NULL) start as given and count each chosen token,
 * rng (lily_rng.s) is the state the first draw continues from and gets the state after the
 * last. out[i] = step i's token; err[i] = 1 where the step failed (every token at -inf). */
lily_code lct_sample(const float *logits, int V, const lily_sampling *p, const int32_t *counts,
                     const uint8_t *prompt_mask, uint64_t rng[2], int steps, lily_token *out, int *err,
                     lily_status *st);
#endif
