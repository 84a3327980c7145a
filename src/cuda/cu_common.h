/* Internal to the CUDA backend (C++ side): the device matrix descriptor, the model and
 * session structures, and the kernel launchers that cu_kernels.cu and its siblings define.
 *
 * Device activations are float32 row-major [T][dim], as in the CPU reference; weights
 * keep their checkpoint storage (bf16/f16/f32 or MLX affine 4/8-bit), copied into one
 * contiguous stack per expert group so an expert index selects a fixed stride. */
#ifndef LILY_CU_COMMON_H
#define LILY_CU_COMMON_H
#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>
#include <math.h>
extern "C" {
#include "lily.h"
#include "loader/weights.h"
#include "util/util.h"
}

/* First statement of every kernel. Programmatic dependent launch (Hopper): in the decode
 * graph a kernel may be scheduled while its predecessor still runs (cu_decode.cu turns the
 * kernel-to-kernel edges programmatic), hiding the ~450 launch gaps of a token; so a kernel
 * first waits until its predecessor has finished and its writes are visible (before it
 * reads or writes anything), then lets its own successor be scheduled. Outside such a
 * graph both are no-ops; the emulator and older GPUs compile them away. */
#if defined(LILY_CU_TRACE) && !defined(__CUDACC_EMU__)
#include "cuda/cu_trace.h"
#define CU_PDL() CU_TRACE_PDL()
#define CU_MARK(i) CU_TRACE_MARK(i)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CU_PDL() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define CU_PDL() do { } while (0)
#endif
/* CU_MARK(i), i < 3: in the timeline's build, when thread 0 of the block passed this point */
#ifndef CU_MARK
#define CU_MARK(i) do { } while (0)
#endif

/* Kernel launches: cu_go(kernel, grid, block[, smem[, stream]])(args...), in place of <<<>>>,
 * so that a launch can carry attributes. LILY_CU_PDL_STREAM=1 gives every launch programmatic
 * stream serialization (Hopper), the stream form of the decode graph's programmatic edges: a
 * kernel is scheduled while its predecessor still runs and waits in CU_PDL (every kernel here
 * starts with it, which makes that safe). Off by default: prefill measured 2.3% slower with it
 * on the H200 (pp512 21,856 against 22,373, bench/RESULTS.md), the waiting blocks holding SM
 * room that the predecessor's last wave and the second stream's launches want. The emulator
 * (tests/cuda/emu) rewrites cu_go into its own launch, as it does <<<>>>. */
int cu_pdl_stream(void);
/* Programmatic launch at all: LILY_CU_PDL not 0 and a GPU of compute capability 9.0 or more (the
 * decode graph's edges, cu_decode.cu, and cu_pdl_stream). */
int cu_pdl_on(void);
#ifndef __CUDACC_EMU__
template <class... P> struct cu_launcher {
    void (*k)(P...);
    cudaLaunchConfig_t c;
    cudaLaunchAttribute at[2];
    unsigned cl;
    void operator()(P... a) {
        int n = 0;
        if (cu_pdl_stream()) {
            at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[n++].val.programmaticStreamSerializationAllowed = 1;
        }
        if (cl > 1) {
            at[n].id = cudaLaunchAttributeClusterDimension;
            at[n].val.clusterDim.x = cl;
            at[n].val.clusterDim.y = 1;
            at[n++].val.clusterDim.z = 1;
        }
        c.attrs = at;
        c.numAttrs = n;
        (void)cudaLaunchKernelEx(&c, k, a...); /* errors stay for cudaGetLastError, as with <<<>>> */
    }
    /* cu_go(...).cluster(n)(args): clusters of n blocks along x (sm_90; the grid's x a multiple of n) */
    cu_launcher cluster(unsigned n) const {
        cu_launcher l = *this;
        l.cl = n;
        return l;
    }
};
template <class... P>
static inline cu_launcher<P...> cu_go(void (*k)(P...), dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0) {
    cu_launcher<P...> l;
    l.k = k;
    l.c.gridDim = g;
    l.c.blockDim = b;
    l.c.dynamicSmemBytes = smem;
    l.c.stream = s;
    l.c.attrs = NULL;
    l.c.numAttrs = 0;
    l.cl = 0;
    return l;
}
#endif

/* An on/off switch from the environment, read once into *cache (start it at -1): unset or
 * empty gives def, a value starting with '0' off, any other on. (LILY_CU_GEMM, LILY_MVQB, ...) */
int cu_env_flag(int *cache, const char *name, int def);
/* The integer value of an environment variable (def when unset or empty), read once into *cache,
 * which the caller starts at INT_MIN; the caller checks the range it takes. */
int cu_env_int(int *cache, const char *name, int def);

/* A weight matrix on the device; experts of one tensor group sit at fixed strides. */
typedef struct {
    int type;            /* lw_type: LW_F32, LW_BF16, LW_F16, LW_Q */
    int rows, cols;
    int bits, group;     /* LW_Q */
    int sbt;             /* scales/biases type (LW_F32/LW_BF16/LW_F16) */
    const void *w, *s, *b;
    long long ew, es;    /* bytes between experts: codes/values, and scales (= biases) */
    int sexp;            /* LW_Q: k_gemm_tc's dequantization exponent e, every |scale| 2^e within fp16
                          * (cu_q_sexp); 0: none (NaN or huge scales), the kernel declines */
} dmat;

/* Bytes of a matrix's codes/values (type lw_type, bits for LW_Q), and of its scales (as many of
 * its biases; 0 unless LW_Q): for lw_mat's fields at upload and dmat's on the device. */
static inline size_t cu_mat_w_bytes(int type, int rows, int cols, int bits) {
    if (type == LW_Q) return (size_t)rows * cols * bits / 8;
    return (size_t)rows * cols * (type == LW_F32 ? 4 : 2);
}
static inline size_t cu_mat_s_bytes(int type, int rows, int cols, int group, int sbt) {
    return type == LW_Q ? (size_t)rows * (cols / group) * (sbt == LW_F32 ? 4 : 2) : 0;
}

/* e for dmat.sexp from the largest |scale|: the most (for precision: a weight below 2^(10 - e)
 * is an fp16 subnormal there, within 2^-e) that keeps s 2^e below fp16's largest, at most 24. */
static inline int cu_q_sexp(float maxs) {
    if (!(maxs < 256.f)) return 0;
    int e = 24;
    while (e > 1 && maxs * (float)(1 << e) >= 65000.f) e--;
    return e;
}

#define MVQ_MAX 4
/* Decode (one input row) fusions of the router group's launch, so the layer's MoE needs two
 * launches fewer (cu_matvec_group with a fuse; off with LILY_CU_FUSE=0):
 *   nw != NULL: the staged input is rmsnorm(X + add) * nw (add != NULL: the post-mixer residual
 *     and norm; X itself is not written: the combine adds `add` again; k_mvq reads X before its
 *     wait on the predecessor, so X's writer must be two launches back or more) or rmsnorm(X) * nw (add
 *     NULL: the next layer's in-projection after a folded combine, cu_mvdp_comb); block 0 writes
 *     it to tout (a dense launch of T slots: each slot's block 0 its row of T);
 *   sel != NULL: the block that finishes matrix 0 last (count, a zeroed int, tells) picks the
 *     top K of its E outputs (the router's logits) into sel/wt, as cu_router_topk. */
typedef struct {
    const float *add, *nw;
    float eps;
    float *tout;
    int E, K;
    int *sel;
    float *wt;
    unsigned *count;
    /* xslot > 0: slots xslot, xslot + 1, ... (past the routed ones, to the launch's last) multiply
     * xm[i] instead of an expert of m[i], slot xslot + j reading input row xrow + j (the shared
     * expert riding in the experts' launches: one slot for one token, one a token for a batch) */
    int xslot, xrow;
    dmat xm[MVQ_MAX];
    /* rlog (decode, one token): the router's logits [E]; the launch routes itself (the top K of E,
     * as k_router_topk) in place of a top-k launch before it: every block takes its slot's expert
     * from its own routing, block (0, 0) writes the choice to rsel [K] (the eidx the later
     * launches read) and rwt [K]. Launches that cannot route so run k_router_topk first. */
    const float *rlog;
    int *rsel;
    float *rwt;
    int epf; /* k_mvdp (set by its launcher; LILY_CU_MVDP_EPF=1): an expert's first codes fetched before the input's staging */
    int rovl; /* k_mvdp (set by its launcher): with rlog, the routing warp beside the staging (LILY_CU_ROUTE_OVL) */
    /* gz (one dense matrix, k_mvdp only): the input is the gated norm of heads of 128 columns,
     * x rmsnorm(x) gw silu(gz) a head (eps), applied while staging (cu_matvec_gated) */
    const float *gz, *gw;
    int nopre; /* k_mvdp (set by its launcher; LILY_CU_MVDP_PRE=0, for measuring): a dense matrix's first codes after the wait */
} mvq_fuse;
typedef struct {
    dmat m[MVQ_MAX];
    float *y[MVQ_MAX];
    int ldy[MVQ_MAX];
    int blk0[MVQ_MAX + 1];
    int n;
    mvq_fuse f;
} mvq_args;
/* A launch's n matrices W[i] and outputs Y[i] (row stride ldy[i]; ldy NULL: 0), f left as it is. */
static inline void mvq_args_set(mvq_args *a, int n, const dmat *const *W, float *const *Y, const int *ldy) {
    a->n = n;
    for (int i = 0; i < n; i++) {
        a->m[i] = *W[i];
        a->y[i] = Y[i];
        a->ldy[i] = ldy ? ldy[i] : 0;
    }
}
/* a->blk0 for tiles of rpt rows over the matrices a->m[0 .. a->n) (matrix i's tiles start at blk0[i]);
 * returns the tiles in all */
static inline int mvq_tiles(mvq_args *a, int rpt) {
    int nt = 0;
    for (int i = 0; i < a->n; i++) {
        a->blk0[i] = nt;
        nt += (a->m[i].rows + rpt - 1) / rpt;
    }
    a->blk0[a->n] = nt;
    return nt;
}

/* Per-expert counts and offsets after the on-GPU sort of (token, slot) pairs by expert. */
typedef struct {
    const int *count;    /* [E] */
    const int *off;      /* [E] start in the sorted order */
    const int *src;      /* [T*K] sorted position -> slot index t*K+k */
    const int *pos;      /* [T*K] slot -> sorted position */
    const int *tiles;    /* cu_moe_tiles' map for cu_gemm_q4_grouped, else NULL */
} dsort;

/* A decode batch (cu_batch.cu): row i of the activations is the next token of its own
 * session, at position pos[i], with that session's state. The kernels that touch session
 * state take it (pos == NULL: the usual one session, T consecutive positions). The
 * offsets select the current layer in each session's buffers. */
typedef struct {
    const int *pos;                      /* [n] each row's position */
    float *const *conv, *const *S;       /* [n] each row's session: conv state, DeltaNet S */
    uint16_t *const *kc, *const *vc;     /* [n] each row's session: KV cache (fp16) */
    long long conv_off, S_off, kv_off;   /* elements into each, for this layer */
} cu_rows;

/* The KV cache's fp16 on the host (parking, the kernel test): nearest even, saturated at 65504 as
 * the kernels' cu_f2h (cvt.rn.satfinite), NaN kept */
static inline uint16_t cu_kv_f2h(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    const uint32_t s = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
    if (a >= 0x477fe000u) return (uint16_t)(s | 0x7bffu);           /* 65504 and past it (infinity too) */
    if (a < 0x38800000u) return (uint16_t)(s | (uint32_t)nearbyintf(fabsf(f) * 16777216.0f)); /* below 2^-14: units of 2^-24 */
    const uint32_t r = a - 0x38000000u;                              /* the exponent's bias 127 -> 15 */
    return (uint16_t)(s | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
static inline float cu_kv_h2f(uint16_t h) {
    const uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 31u, m = h & 0x3ffu;
    if (!e) return s ? -(float)m * (1.0f / 16777216.0f) : (float)m * (1.0f / 16777216.0f);
    const uint32_t x = s | (e == 31u ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &x, 4);
    return f;
}

#define LCU_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) return cu_fail(st, e_, #call, __FILE__, __LINE__); } while (0)
lily_code cu_fail(lily_status *st, cudaError_t e, const char *what, const char *file, int line);

/* ---- launchers (all asynchronous on `s`) ---- */
/* Y[T][rows] = X[T][ldx..] . W^T; picks the matrix-vector kernel for small T. */
void cu_matmul(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy);
/* The same to fp32 accuracy whatever T (the router and the shared expert's gate, whose outputs are
 * decisions): matrix-vector, a warp a token for <= 8 weight rows, or tiles (tensor cores with
 * split TF32 operands, ~22 bits; fp32 SIMT with LILY_CU_ROUTER_TC=0), split along the columns when
 * the tiles alone are too few blocks (partials in scr, [S][T][ldy], S <= 16, as many as
 * scr_floats holds). */
void cu_matmul_exact(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                     size_t scr_floats);
/* For the kernel test: 1 the tensor-core tiles, 0 the SIMT ones, -1 the environment's choice */
void cu_matmul_exact_tc(int on);
int cu_splitk_enabled(void);
/* With the GEMM off (LILY_CU_GEMM=0), batches of at least this many rows run on the TF32 tiles. */
#define CU_TC_MIN_T 128
/* Forces one kernel: 0 = matrix-vector, 1 = tiled fp32, 2 = tiled TF32 tensor cores, 7 = a warp a
 * token (few weight rows). For the kernel test and cu_matmul_exact. */
void cu_matmul_variant(cudaStream_t s, int variant, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy);
/* Expert rows: slot i uses expert eidx[i] and input row i / xdiv; Y row i. */
void cu_matmul_slots(cudaStream_t s, const dmat *W, const int *eidx, const float *X, int xdiv,
                     int ldx, int nslots, float *Y, int ldy);
/* Grouped by expert after cu_moe_sort: sorted row r (expert e) reads X row
 * (xdiv ? src[r] / xdiv : r) and writes Y row r. maxcount bounds the rows of one expert
 * (the chunk's token count); it also picks fp32 or TF32 tiles as cu_matmul does. */
/* Can cu_matvec_group take W (4/8-bit, cols % 32 == 0, group % 32 == 0)? */
int cu_mvq_ok(const dmat *W);
/* One launch for n <= MVQ_MAX matrices of equal cols reading the same input row:
 * Y[i] = W[i] x, with x = silu(X) * X2 when X2. Slot mode when eidx: slot j uses expert
 * eidx[j], input row j / xdiv, output row j of each Y[i] (stride ldy[i]). Without eidx, slot j
 * reads row j of X (and of the fuse's add and tout) and writes row j (a decode batch's router
 * group with its fused residual and norm; only k_mvq's ROWS instance takes more than one slot so). */
void cu_matvec_group(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx,
                     float *const *Y, const int *ldy, const int *eidx, int xdiv, int nslots, const mvq_fuse *fu);
/* The same on the tensor cores for 4-bit codes in groups of 64 2^k columns (cu_mvtc.cu), a's
 * matrices, outputs and fuse (not add or sel) filled in, sbt their group constants' common type
 * (-1 when they differ); 0 when it declines. */
int cu_mvtc_group(cudaStream_t s, const mvq_args *a, int sbt, const float *X, const float *X2, int ldx, const int *eidx,
                  int xdiv, int nslots);
/* The same as integer dot products (cu_mvdp.cu: the input in three signed bytes a 64-column group,
 * ~fp32 exact) for 4-bit codes in groups of 64 2^k columns, cols % 64 == 0; 0 when it declines. */
int cu_mvdp_group(cudaStream_t s, const mvq_args *a, int sbt, const float *X, const float *X2, int ldx, const int *eidx,
                  int xdiv, int nslots);
/* For the kernel test: 0 the usual choice, -1 k_mvdp declines, 1/2/4 rows a lane group (R), 3 the
 * two-group form at R 2 where the rows take it (LILY_CU_MVDP_G2) */
void cu_mvdp_test_r(int r);
/* Whether decode uses the fused router group (mvq_fuse; default, LILY_CU_FUSE=0 for measuring). */
int cu_fuse_enabled(void);
/* The same for T input rows (decode batches; any T, 2-8 in one pass when cols <= 6144):
 * Y[i] + t * ldy[i] = W[i] x_t for t < T, x_t = X + t * ldx (silu(X) * X2 when X2). */
void cu_matvec_rows(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T,
                    float *const *Y, const int *ldy);
/* cu_matvec_rows' 2-8-row kernel (k_mvdpb, cu_mvdpb.cu): 1 when it took the launch, 0 when it
 * declines (then k_mvqb). _test_off(1): declines every launch, for the kernel test. */
int cu_mvdpb(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
             const int *ldy);
/* The same on the int8 tensor cores (k_mvdpt, cu_mvdpt.cu), 1 to 16 rows a pass; cu_mvdpb takes it
 * first for the batches cu_mvdpt_on(T) names (6 rows or more; LILY_CU_MVDPT=N) */
int cu_mvdpt(cudaStream_t s, int n, const dmat *const *W, const float *X, const float *X2, int ldx, int T, float *const *Y,
             const int *ldy);
int cu_mvdpt_on(int T);
/* y [T][W->rows] = W g(o_t), g the gated norm of heads of 128 columns (o, z [T][W->cols], gw [128], eps) applied
 * by k_mvdpt's staging; 0 (nothing launched) where it declines */
int cu_mvdpt_gated(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, int T, float *y);
/* Y[i] + t * ldy[i] = W[i] n(x_t), n(x) = rmsnorm(x) * nw (eps), x_t = X + t * ldx, the norm applied by the
 * staging of k_mvdpt or k_mvdpb (as cu_mvdpb chooses), which write n(x_t) to tout + t * ldx: a decode
 * batch's in-projection after its folded combine (cu_mvdp_comb with T rows). 0 (nothing launched)
 * where neither takes it. */
int cu_mvdpb_norm(cudaStream_t s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y, const int *ldy,
                  const float *nw, float eps, float *tout);
/* the same on k_mvdpt alone (any T from 1; the kernel test) */
int cu_mvdpt_norm(cudaStream_t s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y, const int *ldy,
                  const float *nw, float eps, float *tout);
void cu_mvdpb_test_off(int off);
/* Whether the forward pass uses cu_matvec_rows for 2-8 rows (default; LILY_MVQB=0: the older
 * k_mv with 4-byte loads, one launch per matrix, for measuring the difference). */
int cu_mvqb_enabled(void);
void cu_matmul_grouped(cudaStream_t s, const dmat *W, int E, const dsort *so, int xdiv, const float *X,
                       int ldx, int maxcount, float *Y, int ldy);
/* The FP16 tensor-core GEMM for 4- and 8-bit weights (cu_gemm.cu): can it take W and X?
 * (4- or 8-bit, cols % 64 == 0, group % 32 == 0, X rows 16-byte aligned.) _enabled: whether the forward
 * pass uses it for T > 8 (default; LILY_CU_GEMM=0 for the older tiles, to measure against). */
int cu_gemm_q4_ok(const dmat *W, const float *X, int ldx);
int cu_gemm_q4_enabled(void);
void cu_gemm_q4(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy);
/* Grouped form over the (expert, token tile) map that cu_moe_tiles builds from so->count:
 * bt = cu_moe_tile_rows(T*K, E) tokens a tile, max_tiles = cu_moe_max_tiles(T*K, E, bt)
 * entries (E <= 1024). Rows as cu_matmul_grouped. */
int cu_moe_tile_rows(int rows_total, int E);
int cu_moe_max_tiles(int rows_total, int E, int bt);
void cu_moe_tiles(cudaStream_t s, const int *count, int E, int bt, int *tiles, int max_tiles);
void cu_gemm_q4_grouped(cudaStream_t s, const dmat *W, const dsort *so, int bt, int max_tiles, int xdiv,
                        const float *X, int ldx, float *Y, int ldy);
/* The same GEMMs with the codes dequantized in registers and streamed by cp.async (cu_gemm_tc.cu),
 * which cu_gemm_q4 and cu_gemm_q4_grouped use where _ok (4-bit, cols % 128 == 0, group 32, 64 or
 * 128 with (128 / group) scale bytes 4, 8 or 16, X under 2^31 floats; LILY_CU_GEMM_TC=0: never). W2 != NULL (the
 * experts' gate and up, the same shape): Y = silu(X W^T) * (X W2^T). */
int cu_gemm_tc_ok(const dmat *W, const float *X, int ldx, long long xrows); /* xrows: X's rows, at most */
/* X [T][ldx] fp32 -> xp [T][C] in the packed GEMM input form (xp_chunk in cu_dev.h), C % 128 == 0 */
void cu_xp_pack(cudaStream_t s, const float *X, int ldx, int T, int C, uint16_t *xp);
void cu_gemm_tc(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy);
void cu_gemm_tc_grouped(cudaStream_t s, const dmat *W, const dmat *W2, const dsort *so, int bt, int max_tiles, int xdiv,
                        const float *X, int ldx, float *Y, int ldy);
/* The experts' gate and up with SwiGLU in one grouped launch, Y = silu(gate) * up; 0 when the
 * kernel does not take the pair (then: two grouped GEMMs and cu_swiglu). */
int cu_gemm_swiglu_grouped(cudaStream_t s, const dmat *G, const dmat *U, const dsort *so, int bt, int max_tiles, int xdiv,
                           const float *X, int ldx, float *Y, int ldy);
/* The experts' FFN at prefill in two k_gemm_tc launches whose fp16 inputs are packed in the
 * mma's order, so the blocks convert nothing: cu_moe_gate_up_xp packs X [xrows][ldx] into xpx
 * ([xrows][G->cols] fp16) and writes silu(gate) * up into xph ([T*K][G->rows] fp16, sorted
 * order), 0 (and nothing launched) when the kernel does not take G, U and D; cu_moe_down_xp
 * then writes Y [T*K][ldy] in sorted order, as cu_gemm_q4_grouped. */
int cu_moe_gate_up_xp(cudaStream_t s, const dmat *G, const dmat *U, const dmat *D, const dsort *so, int bt, int max_tiles,
                      int xdiv, const float *X, int ldx, int xrows, uint16_t *xpx, uint16_t *xph, int xp_in);
void cu_moe_down_xp(cudaStream_t s, const dmat *D, const dsort *so, int bt, int max_tiles, const uint16_t *xph, float *Y, int ldy);
/* n <= 4 matrices of the same columns, group and scale type reading the same T > 8 rows of X, in
 * one launch, Y[i] [T][W[i]->rows]; 0 when the kernel does not take them all. xp: NULL, or fp16
 * scratch of T x cols for X packed in the mma's order first (then the launch's blocks copy their
 * inputs as they are and more fit an SM). xp_in (here and below): xp holds X packed already (a
 * producer's _p form wrote it), so where the launch takes the packed input it packs nothing. */
int cu_gemm_tc_group(cudaStream_t s, int n, const dmat *const *W, const float *X, int ldx, int T, float *const *Y, uint16_t *xp,
                     int xp_in);
/* The same for one matrix; 0 when not taken (T <= 8 or the kernel declines). */
int cu_gemm_tc_xp(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, int ldy, uint16_t *xp);
/* The same with Y2 (NULL, or [T][ldy] as Y): where the launch is small for the GPU it splits the
 * columns in two, Y + Y2 the product; returns the parts written (1: Y alone, 2: Y and Y2), 0 when
 * not taken. */
int cu_gemm_tc_xp2(cudaStream_t s, const dmat *W, const float *X, int ldx, int T, float *Y, float *Y2, int ldy, uint16_t *xp,
                   int xp_in);
/* The same for one gate/up pair of T > 8 rows (the shared expert at prefill), Y [T][rows]. */
int cu_gemm_swiglu(cudaStream_t s, const dmat *G, const dmat *U, const float *X, int ldx, int T, float *Y, int ldy, uint16_t *xp,
                   int xp_in);
/* Prefill attention on the tensor cores (cu_attn_tc.cu), which cu_attention takes where _ok:
 * T > 1 rows of one session, head dim 256, 8 query heads a KV head (LILY_CU_ATTN_TC=0: never). */
int cu_attn_tc_ok(int T, int nh, int nkv, int hd);
/* Returns the key splits it left in part for k_attn_merge (1: o is written). With p0h >= 0 (the
 * host's copy of *pos) and h16 holding cu_attn_h16_bytes(p0h + T, nkv), the keys and values are
 * converted to fp16 there once (one launch more), not by every block, where the chunk reads at least
 * LILY_CU_ATTN_H16_MIN keys (1,024; LILY_CU_ATTN_H16=0/1 never/always; bench/RESULTS.md, session 17). */
int cu_attn_tc(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T, int nh, int nkv,
               const int *pos, float *o, float *part, size_t part_floats, int p0h, void *h16, size_t h16_bytes);
size_t cu_attn_h16_bytes(int keys, int nkv);
/* For the kernel test: 1 the fp16 keys wherever the scratch holds them, 0 never, -1 the environment's choice */
void cu_attn_h16_test(int on);
/* For the kernel test: decode's k_attn_gqa form, the keys a warp loads together (1, 2, 4) and the blocks
 * a group of 8 query heads is split over (1, 2, 4); 0 the environment's */
void cu_attn_form_test(int u, int hs);
/* For the kernel test: cu_attn_tc_at's answer from dmin keys on (on 1), never (on 0), or the environment's
 * (on -1) */
void cu_attn_dtc_test(int on, int dmin);
/* For the kernel test: 1 or 2 the dense packed-input GEMMs on wgmma in 64-token tiles, that form,
 * wherever the build and device have it (cu_gemm_tc.cu's WG), 0 never, -1 the environment's
 * (LILY_CU_GEMM_WG=0/1/2, default 1); and how many launches took it so far. */
void cu_gemm_wg_test(int on);
int cu_gemm_wg_launches(void);
int cu_gemm_wg_available(void);
void cu_embed(cudaStream_t s, const dmat *E, const int *ids, int T, float *x);
/* y = rmsnorm(x) * w per row of n; with add != NULL first x += add (x is updated). */
void cu_rmsnorm(cudaStream_t s, float *x, const float *add, const float *w, int n, int T, float eps, float *y);
/* The same with x += add + add2 (add2 may be NULL): a split projection's two parts (cu_gemm_tc_xp2). */
void cu_rmsnorm2(cudaStream_t s, float *x, const float *add, const float *add2, const float *w, int n, int T, float eps, float *y);
/* Producers that also write their output as the prefill GEMMs' packed fp16 input (xp_chunk in
 * cu_dev.h, [T][n] halves at yp), so the GEMM that reads it packs nothing (its xp_in): each
 * returns 1 where it did (T > 8, n % 128 == 0, aligned), 0 where it wrote the fp32 output alone. */
int cu_rmsnorm2p(cudaStream_t s, float *x, const float *add, const float *add2, const float *w, int n, int T, float eps, float *y,
                 uint16_t *yp);
/* The delta rule's gates from the in-projection's b and a ([T][nv] each): beta = sigmoid(b),
 * g = -exp(A_log) softplus(a + dt_bias) per (token, head). */
typedef struct {
    const float *bb, *aa, *A_log, *dt_bias; /* [T][nv], [T][nv], [nv], [nv] */
    int nv;
    float *g, *beta;                        /* [T][nv] */
} cu_gates;
/* Causal depthwise conv + SiLU (K <= 8), updating the [cd][K-1] state; with G, the gates in the
 * same launch. (returns 1 when it also l2-normalized the q and k heads, which it does for head
 * dim 128: then cu_gdn_prep's normed) */
int cu_conv(cudaStream_t s, const float *mixed, float *state, const float *w, int cd, int K, int T, float *u, int nk, int dk,
            const cu_gates *G);
/* q and k heads of u [T][cd] (the first 2 nk of dk channels) l2-normalized per token, q also
 * times dk^-0.5: what cu_conv does itself where it returns 1. */
void cu_l2norm_heads(cudaStream_t s, float *u, int T, int cd, int nk, int dk);
/* L2 norm of q,k heads (q also scaled by dk^-0.5) unless normed, g and beta (bb NULL: the gates
 * are written already, by cu_conv). */
void cu_gdn_prep(cudaStream_t s, float *u, int T, int cd, int nk, int dk, const float *bb, const float *aa,
                 const float *A_log, const float *dt_bias, int nv, float *g, float *beta, int normed);
/* Recurrent delta rule over T steps for all nv heads; S [nv][dk][dv] fp32. */
void cu_gdn_rec(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd,
                const float *g, const float *beta, float *S, float *o);
/* The recurrence with the gated norm below fused in; 0 (nothing launched) when the shape has
 * no fused kernel. */
int cu_gdn_rec_norm(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                    const float *beta, float *S, float *o, const float *z, const float *gw, float eps);
/* The same recurrence in the chunked (WY) form for prefill (cu_gdn_chunk.cu); scratch holds
 * cu_gdn_chunk_scratch_floats(T, ...) floats. 0 (nothing launched) for shapes it does not take
 * (dk or dv > 128). _enabled: whether the forward pass uses it (LILY_CU_GDN_CHUNK=1; off by
 * default, see cu_gdn_chunk.cu). */
int cu_gdn_chunked(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                   const float *beta, float *S, float *o, float *scratch);
size_t cu_gdn_chunk_scratch_floats(int T, int nv, int dk, int dv);
/* Which chunked kernels cu_gdn_chunked runs, for the kernel test: 1 the tensor-core ones (where
 * the shape fits), 2 the tiled SIMT ones (dk 128), 3 the generic ones, 0 the environment's
 * choice (LILY_CU_GDN_TC, LILY_CU_GDN_C128). */
void cu_gdn_chunk_variant(int v);
/* The chunked delta rule on the tensor cores (cu_gdn_tc.cu): dk 128, dv a multiple of 32 up to
 * 128, u 16-byte aligned with cd % 4 == 0; 0 (nothing launched) otherwise. */
int cu_gdn_tc(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g, const float *beta,
              float *S, float *o, float *scratch);
size_t cu_gdn_tc_scratch_floats(int T, int nv);
/* The recurrence for prefill (cu_gdn_staged.cu): k_gdn_rec128's arithmetic, a block per 32
 * columns of a head and 32 steps staged in shared memory at a time; the gated norm is left to
 * cu_gated_norm. 0 (nothing launched) unless dk == 128, dv % 32 == 0 and u's rows are
 * 16-byte aligned. */
int cu_gdn_staged_ok(int dk, int dv, int cd);
int cu_gdn_staged(cudaStream_t s, int T, int nk, int nv, int dk, int dv, const float *u, int cd, const float *g,
                  const float *beta, float *S, float *o);
int cu_gdn_chunk_enabled(void);
/* Decode form of conv + SiLU + q/k L2 norm + g/beta, one launch (T = 1). */
void cu_gdn_prep1(cudaStream_t s, const float *mixed, float *state, const float *w, int K, int nk, int dk, int vd,
                  const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                  float *u, float *g, float *beta);
/* Decode batches: one step of each of n rows on its own session's state (cu_rows). */
void cu_gdn_prep1_rows(cudaStream_t s, const cu_rows *R, int n, const float *mixed, const float *w, int K, int nk, int dk,
                       int vd, const float *bb, const float *aa, const float *A_log, const float *dt_bias, int nv,
                       float *u, float *g, float *beta);
/* Decode's DeltaNet step in one launch (one token, one session): cu_gdn_prep1's conv + SiLU + q/k
 * norm + gates, then the delta rule step and the gated norm (z [nv*dv], gw [dv]) into o [nv*dv];
 * mixed [cd] the in-projection's q|k|v, state [cd][K-1] the conv state and S [nv][dk][dv] updated;
 * cnt [GDN_DEC_CNT] zeroed, 0 again after each launch. 0 (nothing launched) for shapes it does
 * not take (dk = dv = 128, K <= 8, nk <= GDN_DEC_CNT) or with LILY_CU_GDN_DEC=0. */
#define GDN_DEC_CNT 64
#define GDN_DEC_ROWS 16 /* a decode batch's rows in one split step (cu_gdn_dec_split_rows): counters a row */
int cu_gdn_dec_ok(int nk, int nv, int dk, int dv, int K);
int cu_gdn_dec(cudaStream_t s, int nk, int nv, int dk, int dv, int K, const float *mixed, float *state, const float *cw,
               const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *S, float *o, const float *z,
               const float *gw, float eps, unsigned *cnt);
/* The same step split four ways a value head (k_gdn_dec_split), o [nv*dv] written before the gated
 * norm (cu_matvec_gated, or cu_gated_norm, applies it); 0 where cu_gdn_dec_ok says no or with
 * LILY_CU_GDN_SPLIT=0. */
int cu_gdn_dec_split(cudaStream_t s, int nk, int nv, int dk, int dv, int K, const float *mixed, float *state, const float *cw,
                     const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *S, float *o, unsigned *cnt);
/* The same for a decode batch's n <= GDN_DEC_ROWS rows (mixed [n][2 nk dk + nv dv], bb, aa [n][nv], o
 * [n][nv dv]), each on its own session's conv state and S (R), cnt [GDN_DEC_ROWS][GDN_DEC_CNT] zeroed;
 * the gated norm left to the caller. 0 where it declines (as cu_gdn_dec_split, or n too large), and
 * with LILY_CU_GDN_SPLIT_ROWS=0 (for measuring; on, +1.5-3% tok/s at 2-16 rows on an H100). */
int cu_gdn_dec_split_rows(cudaStream_t s, const cu_rows *R, int n, int nk, int nv, int dk, int dv, int K, const float *mixed,
                          const float *cw, const float *bb, const float *aa, const float *A_log, const float *dt_bias, float *o,
                          unsigned *cnt);
/* y [W->rows] = W g(o), g the gated norm of heads of 128 (o [cols] as k_gdn_dec_split leaves it, z
 * [cols], gw [128]) applied by k_mvdp's staging: 0 (nothing launched) where k_mvdp declines. */
int cu_matvec_gated(cudaStream_t s, const dmat *W, const float *o, const float *z, const float *gw, float eps, float *y);
/* The delta rule step with the gated norm (z, gw) fused when the shape allows, else plain;
 * returns whether the norm was applied. */
int cu_gdn_rec_rows(cudaStream_t s, const cu_rows *R, int n, int nk, int nv, int dk, int dv, const float *u, int cd,
                    const float *g, const float *beta, float *o, const float *z, const float *gw, float eps);
void cu_qk_prep_rows(cudaStream_t s, const cu_rows *R, int n, const float *qg, float *q, const float *k, const float *v,
                     const float *qn, const float *kn, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps);
/* (tc: on the tensor cores, as cu_attention's) */
void cu_attention_rows(cudaStream_t s, const cu_rows *R, int n, const float *q, const float *qg, int nh, int nkv, int hd,
                       int splits, float *part, float *o, int tc);
/* o = rmsnorm(o) * gw * silu(z), per head of dv. */
void cu_gated_norm(cudaStream_t s, float *o, const float *z, const float *gw, int T, int nv, int dv, float eps);
int cu_gated_norm_p(cudaStream_t s, float *o, const float *z, const float *gw, int T, int nv, int dv, float eps, uint16_t *op);
/* q (from qg) and k: per-head rmsnorm + partial RoPE at positions *pos + t; k and v go to the
 * cache rows *pos + t. */
void cu_qk_prep(cudaStream_t s, const float *qg, float *q, const float *k, const float *v, const float *qn,
                const float *kn, int T, int nh, int nkv, int hd, int rot, const float *inv_freq, float eps,
                const int *pos, uint16_t *kc, uint16_t *vc);
/* Causal attention of T queries at *pos+t over the cache; o *= sigmoid(gate from qg). */
/* Decode (one token, one session): q/k norm, RoPE and the cache write (cu_qk_prep's) folded into the
 * attention launch, qg/k/v the in-projection's raw outputs; then cu_attention's merge into o. 0
 * when it declines (rot not a multiple of 64, head shapes k_attn_gqa does not take): then
 * cu_qk_prep and cu_attention. _enabled: whether the forward pass uses it (default; LILY_CU_QK_FOLD=0
 * for k_qk_prep's launch, for measuring). */
int cu_qk_fold_enabled(void);
int cu_attention_dec(cudaStream_t s, const float *qg, const float *k, const float *v, const float *qn, const float *kn, int nh,
                     int nkv, int hd, int rot, const float *inv_freq, float eps, const int *pos, uint16_t *kc, uint16_t *vc,
                     int splits, float *part, float *o, int amin, int tc);
/* (amin > 0, T 1: of the splits, as many as give each amin keys, at least half and at most all:
 * attn_splits_used in cu_attn.cu. tc: the 35B-A3B heads on the tensor cores (k_attn_dtc), as
 * cu_attn_tc_at says for the step's position) */
void cu_attention(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T,
                  int nh, int nkv, int hd, const int *pos, int splits, float *part, float *o, int amin, int tc);
/* Whether a decode step over `keys` keys (its position + 1) takes the tensor cores' attention: the
 * decode step's graphs are captured once per form and picked by the host a step (cu_decode.cu) */
int cu_attn_tc_at(int keys);
/* The same for a prefill chunk whose first position the host knows (p0h == *pos), with scratch for
 * the tensor-core kernel's fp16 keys (cu_attn_tc); where that kernel does not take the shape, or the
 * scratch is short, as cu_attention. */
void cu_attention_h16(cudaStream_t s, const float *q, const float *qg, const uint16_t *kc, const uint16_t *vc, int T, int nh, int nkv,
                      int hd, const int *pos, int p0h, void *h16, size_t h16_bytes, float *part, float *o);
/* Floats of scratch cu_attention needs for `part`. */
size_t cu_attention_part_floats(int T, int nh, int hd, int splits);
/* Router: softmax, top-k (lower index on ties), renormalized weights. */
void cu_router_topk(cudaStream_t s, const float *logits, int T, int E, int K, int *sel, float *wt);
/* Weights into L2 ahead of their launch (decode's side stream, cu_forward.cu): the codes, scales
 * and biases of n <= 6 matrices (expert 0's where they are a stack), or with sel the experts
 * sel[0..slots-1] of W[0] (sel written by an earlier kernel). Fire and forget: nothing is read
 * into registers, so this only moves bytes from DRAM into L2 while the main stream's kernels,
 * bound by latency, leave the DRAM idle. LILY_CU_PREFETCH=0 turns it off (cu_prefetch_enabled). */
void cu_l2_prefetch(cudaStream_t s, int n, const dmat *const *W, const int *sel, int slots);
/* the same for the experts chosen by routing rlog [E] (top K, as k_router_topk; E <= 256, K <= 32)
 * in the prefetch's own blocks, where the top-k's launch is folded into the experts' (mvq_fuse.rlog) */
void cu_l2_prefetch_routed(cudaStream_t s, int n, const dmat *const *W, const float *rlog, int E, int K);
/* whether decode (one token) routes inside the experts' gate|up launch: LILY_CU_ROUTE_FUSED, on */
int cu_route_fused(void);
int cu_prefetch_enabled(void);
/* cu_router_tc where it takes the router (rf from cu_router_frag, T > 8), else cu_matmul_exact
 * (Y = logits [T][W->rows]), then cu_router_topk, the column slices' sum done by the top-k's launch (one launch fewer;
 * the same sums in the same order) */
void cu_router_exact_topk(cudaStream_t s, const dmat *W, const float *rf, const float *X, int ldx, int T, float *logits, float *scr,
                          size_t scr_floats, int K, int *sel, float *wt);
/* The router copied for cu_router_tc (cu_router.cu), once at load: its codes (or bf16/fp16 values) as
 * floats in the mma's A-fragment order, [rows / 16][cols / 8][32][4], then each (row, group)'s scale and
 * bias, [rows][cols / group] float2. cu_router_frag_floats is its size, 0 where the matrix is not
 * taken (rows a multiple of 64, cols of 32 and of the group; codes of 2, 4 or 8 bits, or bf16/fp16). */
size_t cu_router_frag_floats(int type, int bits, int group, int rows, int cols);
void cu_router_frag(cudaStream_t s, const dmat *W, float *rf);
/* The prefill router's logits from rf (cu_router.cu): 0 when it declines (no rf, T <= 8, the matrix,
 * X not 16-byte rows, LILY_CU_RTR=0), else S: S == 1 wrote Y [T][ldy], S > 1 left S column slices' partials in scr
 * ([S][T][ldy]) for k_router_topk to add in slice order. LILY_CU_RTR=0 leaves the router to
 * cu_matmul_exact's tiles, for measuring; cu_router_tc_splits(n > 0) forces n slices (tests). */
int cu_router_tc(cudaStream_t s, const dmat *W, const float *rf, const float *X, int ldx, int T, float *Y, int ldy, float *scr,
                 size_t scr_floats);
int cu_router_tc_enabled(void);
void cu_router_tc_splits(int s);
void cu_moe_sort(cudaStream_t s, const int *sel, int n, int E, int *count, int *off, int *src, int *pos);
/* The same and cu_moe_tiles' map in one launch. */
void cu_moe_sort_tiles(cudaStream_t s, const int *sel, int n, int E, int *count, int *off, int *src, int *pos, int bt, int *tiles,
                       int max_tiles);
void cu_swiglu(cudaStream_t s, const float *g, const float *u, float *h, long long n);
/* x[t] = (x[t] (+ add[t])) + sum_k wt[t,k] D[row(t,k)] (+ sigmoid(sr[t]) SD[t] when SD).
 * row = pos ? pos[t*K+k] : t*K+k. add: the mixer's output when the residual add was left to here
 * (mvq_fuse). With nw: tout[t] = rmsnorm(x[t]) * nw (the next layer's input norm, fused). */
void cu_moe_combine(cudaStream_t s, float *x, const float *add, const float *D, const int *pos, const float *wt, int T, int K,
                    int H, const float *SD, const float *sr, const float *nw, float eps, float *tout);
int cu_moe_combine_p(cudaStream_t s, float *x, const float *add, const float *D, const int *pos, const float *wt, int T, int K,
                     int H, const float *SD, const float *sr, const float *nw, float eps, float *tout, uint16_t *tp);
/* Decode's experts' down with the combine folded in (k_mvdp_comb, cu_mvdp_comb.cu), for each of T
 * tokens j: x[j] = (x[j] + add[j]) + sum_k wt[j][k] D_sel[j][k] h_jk (+ sigmoid(sr[j]) SD h_j with the
 * shared expert's down SD), h_jk = silu(hg) * hu of row j K + k, h_j of row T K + j (hg, hu [T K (+ T)][I]:
 * one token's [K (+1)][I]); the next norm is left to the next launch (mvq_fuse.nw). 0 when it declines
 * (and nothing is launched). _enabled: the forward pass folds (LILY_CU_FOLD=0: the down and the
 * one-block combine, for measuring). */
int cu_mvdp_comb_enabled(void);
int cu_mvdp_comb(cudaStream_t s, const dmat *D, const dmat *SD, const int *sel, const float *wt, int K, int T, const float *hg,
                 const float *hu, const float *sr, float *x, const float *add);
/* out[0] = argmax (lowest id on ties, NaN never chosen), out[1] = its log-probability (float bits). */
#define CU_ARGMAX_PARTS 64
#define CU_ARGMAX_PARTS1 256 /* k_argmax_part1's blocks (the default) */
void cu_argmax(cudaStream_t s, const float *logits, int V, int *out, float *part /* [3 * CU_ARGMAX_PARTS1] scratch */);
void cu_set_int(cudaStream_t s, int *p, int v);
/* A kernel of this build, to ask the runtime whether the GPU can run it. */
const void *cu_probe_kernel(void);
/* Decode bookkeeping: ids[0] = tok[0]; ring[2*(step % ring_n)..] = tok[0..1]; *pos += 1; *step += 1. */
void cu_step_advance(cudaStream_t s, const int *tok, int *ids, int *pos, int *step, int *ring, int ring_n);
#endif
