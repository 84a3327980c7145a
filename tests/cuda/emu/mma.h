/* nvcuda::wmma for the CPU emulator (see cuda_runtime.h): TF32 (m16n16k8), FP16 and BF16
 * (m16n16k16, m32n8k16, m8n32k16) inputs with float accumulators. Every lane holds the whole
 * tile (x[] has M*K, K*N or M*N elements): load reads the whole tile, mma_sync computes the
 * whole product, store writes it (all lanes the same values). That is exact for code that
 * touches fragments only through these functions and element-wise maps over x[], which is
 * all the real (unspecified) layouts allow anyway. Products are exact in fp32 and summed in
 * fp32 in k order. The tensor core reads the top 19 bits of each fp32 input (TF32), so
 * mma_sync truncates TF32 inputs; __float_to_tf32 rounds to nearest, ties away from zero
 * (cvt.rna.tf32.f32). LILY_EMU_TF32=fp32 keeps full fp32 instead, to tell a precision effect
 * from a logic error. */
#ifndef LILY_EMU_MMA_H
#define LILY_EMU_MMA_H
#include "cuda_runtime.h"
#include "cuda_fp16.h"
#include "cuda_bf16.h"

namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
} // namespace precision
enum layout_t { mem_row_major, mem_col_major };

static inline float __float_to_tf32(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u || emu::tf32_off) return f; /* inf, nan */
    u = (u + 0x1000u) & 0xffffe000u;
    return __uint_as_float(u);
}
static inline float emu_in(float f) { /* a TF32 input as the tensor core reads it */
    unsigned u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u || emu::tf32_off) return f;
    return __uint_as_float(u & 0xffffe000u);
}
static inline float emu_in(__half h) { return __half2float(h); }
static inline float emu_in(__nv_bfloat16 h) { return __bfloat162float(h); }

/* the element type a fragment of precision T holds */
template <class T> struct elem { typedef T type; };
template <> struct elem<precision::tf32> { typedef float type; };

template <class Use, int M, int N, int K> struct frag_dims;
template <int M, int N, int K> struct frag_dims<matrix_a, M, N, K> { static const int rows = M, cols = K; };
template <int M, int N, int K> struct frag_dims<matrix_b, M, N, K> { static const int rows = K, cols = N; };
template <int M, int N, int K> struct frag_dims<accumulator, M, N, K> { static const int rows = M, cols = N; };

/* x[r * cols + c] is element (r, c) of the logical tile, whatever the layout. */
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
    static_assert(std::is_same<T, precision::tf32>::value || std::is_same<T, float>::value || std::is_same<T, __half>::value ||
                      std::is_same<T, __nv_bfloat16>::value,
                  "emulated wmma: tf32, half or bf16 inputs, float accumulators");
    static_assert(!std::is_same<Use, accumulator>::value || std::is_same<T, float>::value, "emulated wmma: float accumulators only");
    typedef typename elem<T>::type element_type;
    static const int rows = frag_dims<Use, M, N, K>::rows, cols = frag_dims<Use, M, N, K>::cols;
    static const int num_elements = rows * cols;
    element_type x[rows * cols];
};

template <class Use, int M, int N, int K, class T, class L>
static inline void fill_fragment(fragment<Use, M, N, K, T, L> &f, const typename elem<T>::type &v) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = v;
}
template <class Use, int M, int N, int K, class T, class L>
static inline void load_matrix_sync(fragment<Use, M, N, K, T, L> &f, const typename elem<T>::type *p, unsigned ldm) {
    static_assert(std::is_same<L, row_major>::value || std::is_same<L, col_major>::value, "load of an accumulator needs a layout");
    const bool rm = std::is_same<L, row_major>::value;
    for (int r = 0; r < f.rows; r++)
        for (int c = 0; c < f.cols; c++) f.x[r * f.cols + c] = rm ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
template <int M, int N, int K>
static inline void load_matrix_sync(fragment<accumulator, M, N, K, float, void> &f, const float *p, unsigned ldm, layout_t l) {
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) f.x[r * N + c] = l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r];
}
template <int M, int N, int K>
static inline void store_matrix_sync(float *p, const fragment<accumulator, M, N, K, float, void> &f, unsigned ldm, layout_t l) {
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) (l == mem_row_major ? p[(size_t)r * ldm + c] : p[(size_t)c * ldm + r]) = f.x[r * N + c];
}
template <int M, int N, int K, class TA, class LA, class TB, class LB>
static inline void mma_sync(fragment<accumulator, M, N, K, float, void> &d, const fragment<matrix_a, M, N, K, TA, LA> &a,
                            const fragment<matrix_b, M, N, K, TB, LB> &b, const fragment<accumulator, M, N, K, float, void> &c) {
    static_assert(std::is_same<TA, TB>::value, "mma_sync: A and B of one precision");
    float in[M * K + K * N + M * N], out[M * N];
    float *at = in, *bt = in + M * K;
    for (int i = 0; i < M * K; i++) at[i] = emu_in(a.x[i]);
    for (int i = 0; i < K * N; i++) bt[i] = emu_in(b.x[i]);
    memcpy(in + M * K + K * N, c.x, sizeof c.x);
    /* the lanes of a warp normally multiply the same tiles: the product one lane computed
     * is reused when another lane's inputs are identical (compared in full) */
    if (!emu::mma_reuse(in, sizeof in, out, sizeof out)) {
        /* each out(i, j) sums c + a(i,0) b(0,j) + a(i,1) b(1,j) + ... in k order; j innermost vectorises */
        memcpy(out, c.x, sizeof out);
        for (int i = 0; i < M; i++)
            for (int k = 0; k < K; k++) {
                float av = at[i * K + k];
                for (int j = 0; j < N; j++) out[i * N + j] += av * bt[k * N + j];
            }
        emu::mma_keep(in, sizeof in, out, sizeof out);
    }
    memcpy(d.x, out, sizeof out);
}
} // namespace wmma
} // namespace nvcuda
#endif
