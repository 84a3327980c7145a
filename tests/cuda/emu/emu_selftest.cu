/* Self-test of the CPU emulator against the CUDA semantics lily's kernels rely on: warp
 * shuffles (all four kinds, with widths), ballot, block barriers, shared and dynamic shared
 * memory, atomics, wmma TF32, half/bf16 conversions, launch configuration errors, graph
 * capture (arguments captured by value, copies read at replay), events; and, emulator only,
 * that its fault checks fire (divergent barrier, shuffle from an absent lane, host pointer
 * as a kernel argument, dynamic shared memory overrun). Plain CUDA: nvcc builds it too
 * (nvcc -std=c++17 -arch=sm_90 tests/cuda/emu/emu_selftest.cu), so a GPU can confirm the
 * expectations (with -Isrc, for the persistent kernels' primitives of src/cuda/cu_persist.h:
 * mbarrier phases and bulk copies through a ring, named barriers, grid flags across a
 * cooperative launch's blocks). Last line: "N passed, N failed". */
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __CUDACC_EMU__
#include <sys/wait.h>
#include <unistd.h>
#endif
#include "cuda/cu_persist.h"
using namespace nvcuda;

static int n_pass, n_fail;
static void check(bool ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (ok) n_pass++; else n_fail++;
}

__global__ void k_shfl(int *out, int width) {
    int t = threadIdx.x, v = 1000 + t;
    out[t * 4 + 0] = __shfl_sync(0xffffffffu, v, 5, width);
    out[t * 4 + 1] = __shfl_xor_sync(0xffffffffu, v, 3, width);
    out[t * 4 + 2] = __shfl_up_sync(0xffffffffu, v, 2, width);
    out[t * 4 + 3] = __shfl_down_sync(0xffffffffu, v, 4, width);
}
static void test_shfl(void) {
    for (int width = 32; width >= 8; width /= 2) {
        int *d, h[64 * 4];
        cudaMalloc(&d, sizeof h);
        k_shfl<<<1, 64>>>(d, width);
        cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
        cudaFree(d);
        bool ok = cudaGetLastError() == cudaSuccess;
        for (int t = 0; t < 64; t++) {
            int lane = t % 32, seg = lane & ~(width - 1), base = t - lane;
            int e0 = 1000 + base + seg + (5 % width);
            int e1 = 1000 + base + (((lane ^ 3) & ~(width - 1)) == seg ? lane ^ 3 : lane);
            int e2 = 1000 + base + (lane - seg >= 2 ? lane - 2 : lane);
            int e3 = 1000 + base + (lane - seg + 4 < width ? lane + 4 : lane);
            ok = ok && h[t * 4] == e0 && h[t * 4 + 1] == e1 && h[t * 4 + 2] == e2 && h[t * 4 + 3] == e3;
        }
        char what[80];
        snprintf(what, sizeof what, "shuffles idx/xor/up/down, width %d", width);
        check(ok, what);
    }
}

/* a warp sum the way the kernels do it, plus ballot */
__global__ void k_warp(const float *x, float *sum, unsigned *ballot) {
    float v = x[threadIdx.x];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    unsigned b = __ballot_sync(0xffffffffu, x[threadIdx.x] > 0);
    if (threadIdx.x % 32 == 0) { sum[threadIdx.x / 32] = v; ballot[threadIdx.x / 32] = b; }
}
static void test_warp(void) {
    float hx[96], hs[3];
    unsigned hb[3];
    for (int i = 0; i < 96; i++) hx[i] = (float)((i * 37) % 11) - 5.0f;
    float *x, *s;
    unsigned *b;
    cudaMalloc(&x, sizeof hx); cudaMalloc(&s, sizeof hs); cudaMalloc(&b, sizeof hb);
    cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
    k_warp<<<1, 96>>>(x, s, b);
    cudaMemcpy(hs, s, sizeof hs, cudaMemcpyDeviceToHost);
    cudaMemcpy(hb, b, sizeof hb, cudaMemcpyDeviceToHost);
    bool ok = true;
    for (int w = 0; w < 3; w++) {
        float e = 0;
        unsigned eb = 0;
        for (int l = 0; l < 32; l++) { e += hx[w * 32 + l]; if (hx[w * 32 + l] > 0) eb |= 1u << l; }
        ok = ok && hs[w] == e && hb[w] == eb;
    }
    check(ok, "warp_sum by xor shuffles and __ballot_sync, three warps");
    cudaFree(x); cudaFree(s); cudaFree(b);
}

/* barrier ordering, static + dynamic shared memory, shared and global atomics */
__global__ void k_block(int *out, int *total) {
    __shared__ int sh[256];
    __shared__ int count;
    extern __shared__ int dyn[];
    int t = threadIdx.x;
    if (t == 0) count = 0;
    sh[t] = t * 3 + (int)blockIdx.x;
    dyn[255 - t] = t;
    __syncthreads();
    atomicAdd(&count, sh[(t + 1) % 256]);
    __syncthreads();
    out[blockIdx.x * 256 + t] = sh[(t + 17) % 256] + dyn[t] * 1000;
    if (t == 0) atomicAdd(total, count);
}
static void test_block(void) {
    int *out, *total, h[4 * 256], ht = 0;
    cudaMalloc(&out, sizeof h);
    cudaMalloc(&total, sizeof ht);
    cudaMemset(total, 0, sizeof ht);
    k_block<<<4, 256, 256 * sizeof(int)>>>(out, total);
    cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost);
    cudaMemcpy(&ht, total, sizeof ht, cudaMemcpyDeviceToHost);
    bool ok = cudaGetLastError() == cudaSuccess;
    long e = 0;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 256; t++) {
            ok = ok && h[b * 256 + t] == ((t + 17) % 256) * 3 + b + (255 - t) * 1000;
            e += t * 3 + b;
        }
    check(ok && ht == e, "__syncthreads orders shared memory; dynamic shared memory; atomics");
    cudaFree(out); cudaFree(total);
}

/* wmma TF32 16x16x8: A row-major, B col-major, C row-major */
__global__ void k_wmma(const float *A, const float *B, float *C) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> b;
    wmma::fragment<wmma::accumulator, 16, 16, 8, float> c;
    wmma::fill_fragment(c, 0.5f);
    wmma::load_matrix_sync(a, A, 8);
    wmma::load_matrix_sync(b, B, 8);
    for (int i = 0; i < a.num_elements; i++) a.x[i] = wmma::__float_to_tf32(a.x[i]);
    for (int i = 0; i < b.num_elements; i++) b.x[i] = wmma::__float_to_tf32(b.x[i]);
    wmma::mma_sync(c, a, b, c);
    wmma::store_matrix_sync(C, c, 16, wmma::mem_row_major);
}
__global__ void k_tf32(const float *x, float *y) { y[threadIdx.x] = wmma::__float_to_tf32(x[threadIdx.x]); }
static void test_wmma(void) {
    float hA[16 * 8], hB[16 * 8], hC[256];
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 8; k++) hA[i * 8 + k] = (float)((i + 2 * k) % 7) - 3.0f;
    for (int j = 0; j < 16; j++)
        for (int k = 0; k < 8; k++) hB[j * 8 + k] = (float)((3 * j + k) % 5) - 2.0f; /* B(k, j), col-major */
    float *A, *B, *C;
    cudaMalloc(&A, sizeof hA); cudaMalloc(&B, sizeof hB); cudaMalloc(&C, sizeof hC);
    cudaMemcpy(A, hA, sizeof hA, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hB, sizeof hB, cudaMemcpyHostToDevice);
    k_wmma<<<1, 32>>>(A, B, C);
    cudaMemcpy(hC, C, sizeof hC, cudaMemcpyDeviceToHost);
    bool ok = true;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            float e = 0.5f;
            for (int k = 0; k < 8; k++) e += hA[i * 8 + k] * hB[j * 8 + k];
            ok = ok && hC[i * 16 + j] == e;
        }
    check(ok, "wmma m16n16k8 tf32: small integers exact, B col-major");
    /* rounding to 10 mantissa bits, to nearest with ties away from zero */
    float hx[4] = { 1.0f + 1.0f / 2048, 1.0f + 1.0f / 4096, -(1.0f + 3.0f / 2048), 1.0f + 1.0f / 1024 + 1.0f / 8192 };
    float ex[4] = { 1.0f + 1.0f / 1024, 1.0f, -(1.0f + 2.0f / 1024), 1.0f + 1.0f / 1024 }, hy[4];
    cudaMemcpy(A, hx, sizeof hx, cudaMemcpyHostToDevice);
    k_tf32<<<1, 4>>>(A, B);
    cudaMemcpy(hy, B, sizeof hy, cudaMemcpyDeviceToHost);
    check(!memcmp(hy, ex, sizeof ex), "__float_to_tf32 rounds to nearest, ties away from zero");
    cudaFree(A); cudaFree(B); cudaFree(C);
}

__global__ void k_conv(const unsigned short *h, float *f, unsigned short *back, unsigned short *bf) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = __half2float(__ushort_as_half(h[i]));
    f[i] = v;
    back[i] = __half_as_ushort(__float2half(v));
    bf[i] = __bfloat16_as_ushort(__float2bfloat16(__uint_as_float(((unsigned)h[i] << 16) | 0x8000u | (i & 0x7fffu))));
}
static void test_convert(void) {
    const int n = 65536;
    unsigned short *h = (unsigned short *)malloc(n * 2), *back = (unsigned short *)malloc(n * 2), *bf = (unsigned short *)malloc(n * 2);
    float *f = (float *)malloc(n * 4);
    for (int i = 0; i < n; i++) h[i] = (unsigned short)i;
    unsigned short *dh, *db, *dbf;
    float *df;
    cudaMalloc(&dh, n * 2); cudaMalloc(&db, n * 2); cudaMalloc(&dbf, n * 2); cudaMalloc(&df, n * 4);
    cudaMemcpy(dh, h, n * 2, cudaMemcpyHostToDevice);
    k_conv<<<n / 256, 256>>>(dh, df, db, dbf);
    cudaMemcpy(f, df, n * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(back, db, n * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(bf, dbf, n * 2, cudaMemcpyDeviceToHost);
    bool ok = true, okb = true;
    for (int i = 0; i < n; i++) {
        bool nan = (i & 0x7c00) == 0x7c00 && (i & 0x3ff);
        if (!nan) ok = ok && back[i] == h[i];
        /* bf16: x.8000 + low bits rounds up unless the low bits are exactly the tie and h is even */
        unsigned e = (unsigned)i + (((i & 0x7fff) != 0 || (i & 1)) ? 1u : 0u);
        bool fnan = (i & 0x7f80) == 0x7f80; /* the low bits are never zero: every input with this exponent is NaN */
        if (!fnan) okb = okb && bf[i] == (unsigned short)e;
    }
    ok = ok && f[0x3c00] == 1.0f && f[0x0001] == 5.9604644775390625e-8f && f[0x7bff] == 65504.0f && f[0xc000] == -2.0f;
    check(ok, "half -> float -> half round trip of every half, known values");
    check(okb, "float -> bf16 rounds to nearest even");
    /* float -> half rounding at the edges */
    float hx[6] = { 65519.0f, 65520.0f, 5.9604644775390625e-8f / 2, 3 * 5.9604644775390625e-8f / 2, 1.0f / 3, 1.0f + 1.0f / 2048 };
    unsigned short ex[6] = { 0x7bff, 0x7c00, 0x0000, 0x0002, 0x3555, 0x3c00 };
    bool oke = true;
    for (int i = 0; i < 6; i++) oke = oke && __half_as_ushort(__float2half(hx[i])) == ex[i];
    check(oke, "float -> half: overflow, subnormal ties to even, 1/3");
    cudaFree(dh); cudaFree(db); cudaFree(dbf); cudaFree(df);
    free(h); free(back); free(bf); free(f);
}

__global__ void k_add(int *p, int v) { *p += v; }
__global__ void __launch_bounds__(64) k_bounded(int *p) { p[threadIdx.x] = 1; }
static void test_errors_graphs_events(void) {
    int *d;
    cudaMalloc(&d, 16);
    cudaGetLastError();
    k_add<<<0, 32>>>(d, 1);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "a grid of 0 blocks: cudaErrorInvalidConfiguration");
    k_add<<<1, 1025>>>(d, 1);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads a block: cudaErrorInvalidConfiguration");
    k_add<<<1, 1, 64 << 10>>>(d, 1);
    check(cudaGetLastError() != cudaSuccess, "64 KB of dynamic shared memory without the opt-in: an error");
    check(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
    k_bounded<<<1, 128>>>(d);
    check(cudaGetLastError() != cudaSuccess, "more threads than __launch_bounds__: an error");
    k_bounded<<<1, 4>>>(d);
    check(cudaGetLastError() == cudaSuccess, "within __launch_bounds__: runs");

    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    int *h;
    cudaMallocHost((void **)&h, 4);
    *h = 5;
    cudaMemsetAsync(d, 0, 4, s);
    cudaStreamSynchronize(s);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    int v = 3;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    k_add<<<1, 1, 0, s>>>(d, v);
    cudaMemcpyAsync(d + 1, h, 4, cudaMemcpyHostToDevice, s);
    cudaError_t e = cudaStreamEndCapture(s, &g);
    v = 100;   /* the captured launch keeps 3 */
    *h = 42;   /* the captured copy reads the host buffer when it runs */
    int before = -1;
    cudaMemcpy(&before, d, 4, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
    if (e == cudaSuccess) { cudaGraphLaunch(ge, s); cudaGraphLaunch(ge, s); }
    cudaStreamSynchronize(s);
    int r[2] = { -1, -1 };
    cudaMemcpy(r, d, 8, cudaMemcpyDeviceToHost);
    check(e == cudaSuccess && before == 0 && r[0] == 6 && r[1] == 42,
          "graph capture: nothing runs while capturing, arguments captured by value, copies read at replay");
    if (e == cudaSuccess) { cudaGraphExecDestroy(ge); cudaGraphDestroy(g); }

    /* a fork to a second stream inside a capture, joined back (decode's L2 prefetch does this);
     * and one left unjoined, which ending the capture refuses */
    cudaStream_t s2;
    cudaEvent_t fk;
    cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&fk, cudaEventDisableTiming);
    cudaMemsetAsync(d + 2, 0, 4, s);
    cudaStreamSynchronize(s);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    k_add<<<1, 1, 0, s>>>(d + 3, 1);
    cudaEventRecord(fk, s);
    cudaStreamWaitEvent(s2, fk, 0);
    k_add<<<1, 1, 0, s2>>>(d + 2, 7);
    cudaEventRecord(fk, s2);
    cudaStreamWaitEvent(s, fk, 0);
    e = cudaStreamEndCapture(s, &g);
    int mid = -1;
    cudaMemcpy(&mid, d + 2, 4, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaGraphInstantiate(&ge, g, 0);
    if (e == cudaSuccess) { cudaGraphLaunch(ge, s); cudaGraphLaunch(ge, s); }
    cudaStreamSynchronize(s);
    int r2 = -1;
    cudaMemcpy(&r2, d + 2, 4, cudaMemcpyDeviceToHost);
    check(e == cudaSuccess && mid == 0 && r2 == 14, "graph capture: a fork to another stream and its join, replayed");
    if (e == cudaSuccess) { cudaGraphExecDestroy(ge); cudaGraphDestroy(g); }
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    cudaEventRecord(fk, s);
    cudaStreamWaitEvent(s2, fk, 0);
    k_add<<<1, 1, 0, s2>>>(d + 2, 7);
    e = cudaStreamEndCapture(s, &g);
    check(e == cudaErrorStreamCaptureUnjoined, "graph capture: a fork never joined fails the capture");
    if (e == cudaSuccess) cudaGraphDestroy(g);
    cudaGetLastError();
    cudaEventDestroy(fk);
    cudaStreamDestroy(s2);

    cudaEvent_t a, b, nt;
    cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventCreateWithFlags(&nt, cudaEventDisableTiming);
    cudaEventRecord(a, s);
    k_add<<<64, 256, 0, s>>>(d, 1);
    cudaEventRecord(b, s);
    cudaEventRecord(nt, s);
    cudaEventSynchronize(b);
    float ms = -1, ms2 = 0;
    check(cudaEventElapsedTime(&ms, a, b) == cudaSuccess && ms >= 0, "cudaEventElapsedTime between two events");
    check(cudaEventElapsedTime(&ms2, a, nt) != cudaSuccess, "cudaEventElapsedTime refuses an event made without timing");
    cudaGetLastError();
    cudaEventDestroy(a); cudaEventDestroy(b); cudaEventDestroy(nt);
    cudaStreamDestroy(s);
    cudaFreeHost(h);
#ifdef __CUDACC_EMU__
    int big[8];
    check(cudaMemcpy(big, d, sizeof big, cudaMemcpyDeviceToHost) != cudaSuccess, "cudaMemcpy past the end of an allocation fails");
    cudaGetLastError();
#endif
    cudaFree(d);
}

/* ---- persistent kernels' primitives (cu_persist.h) ---- */
/* a ring of 3 slots in shared memory: warp 1's lane 0 copies n chunks of 64 bytes (bulk copies
 * on the slot's full barrier, after its empty barrier's phase), warp 0 sums each chunk's words
 * and releases the slot. skip: warp 0 reads chunk 1 without waiting for it (a bug the emulator's
 * poisoned destination shows) */
__global__ void k_ring(const unsigned *src, int n, unsigned *out, int skip) {
    extern __shared__ uint4 smr[];
    uint64_t *full = (uint64_t *)smr, *empty = full + 3;
    unsigned *slot = (unsigned *)(smr + 4); /* [3][16] */
    if (threadIdx.x == 0) {
        for (int i = 0; i < 3; i++) { cu_mb_init(&full[i], 1); cu_mb_init(&empty[i], 1); }
        cu_mb_fence_init();
    }
    __syncthreads();
    if (threadIdx.x >= 32) {
        if (threadIdx.x == 32)
            for (int c = 0; c < n; c++) {
                cu_mb_wait(&empty[c % 3], ((c / 3) & 1) ^ 1);
                cu_mb_copy(&full[c % 3], slot + 16 * (c % 3), src + 16 * c, 64);
            }
        return;
    }
    for (int c = 0; c < n; c++) {
        if (!(skip && c == 1)) cu_mb_wait(&full[c % 3], (c / 3) & 1);
        unsigned v = threadIdx.x < 16 ? slot[16 * (c % 3) + threadIdx.x] : 0;
        for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (threadIdx.x == 0) { out[c] = v; cu_mb_arrive(&empty[c % 3]); }
        __syncwarp();
    }
}
static bool ring_ok(int skip) {
    const int n = 11;
    unsigned h[16 * n], *src, *out, got[n];
    for (int i = 0; i < 16 * n; i++) h[i] = (unsigned)(i * 7 + 3);
    cudaMalloc(&src, sizeof h);
    cudaMalloc(&out, sizeof got);
    cudaMemcpy(src, h, sizeof h, cudaMemcpyHostToDevice);
    k_ring<<<1, 64, 4 * 16 + 3 * 64>>>(src, n, out, skip);
    cudaMemcpy(got, out, sizeof got, cudaMemcpyDeviceToHost);
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int c = 0; c < n; c++) {
        unsigned e = 0;
        for (int i = 0; i < 16; i++) e += h[16 * c + i];
        ok = ok && got[c] == e;
    }
    cudaFree(src);
    cudaFree(out);
    return ok;
}
/* warps 0 and 1 meet at named barrier 1 (64 threads) while warp 2 goes its own way */
__global__ void k_named(int *out) {
    __shared__ int s[64];
    if (threadIdx.x < 64) {
        s[threadIdx.x] = (int)threadIdx.x * 3;
        cu_bar_named(1, 64);
        out[threadIdx.x] = s[63 - threadIdx.x];
    } else
        out[threadIdx.x] = -1;
}
/* every block of a cooperative launch writes its round's value, raises the flag, waits until all
 * blocks have, and sums what the others wrote (read past L1) */
__global__ void k_grid(int *vals, int *flag, int *sums, int rounds) {
    for (int r = 0; r < rounds; r++) {
        if (threadIdx.x == 0) vals[r * gridDim.x + blockIdx.x] = (int)(blockIdx.x + 1) * (r + 1);
        __syncthreads();
        if (threadIdx.x == 0) {
            cu_flag_add(flag, 1);
            cu_flag_wait_ge(flag, (int)gridDim.x * (r + 1));
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int t = 0;
            for (unsigned b = 0; b < gridDim.x; b++) t += __ldcg(vals + r * gridDim.x + b);
            sums[r * gridDim.x + blockIdx.x] = t;
        }
    }
}
/* each block's static shared array holds its own values across a grid flag that every block
 * waits at (the emulator interleaves the blocks there) */
__global__ void k_grid_shared(int *flag, int *out) {
    __shared__ int sh[64];
    sh[threadIdx.x] = (int)(blockIdx.x * 1000 + threadIdx.x);
    __syncthreads();
    if (threadIdx.x == 0) {
        cu_flag_add(flag, 1);
        cu_flag_wait_ge(flag, (int)gridDim.x);
    }
    __syncthreads();
    out[blockIdx.x * 64 + threadIdx.x] = sh[63 - threadIdx.x];
}
static void launch_grid(int nb, int *vals, int *flag, int *sums, int rounds, bool coop) {
#ifdef __CUDACC_EMU__
    if (coop) cu_go(k_grid, dim3(nb), dim3(64)).coop()(vals, flag, sums, rounds);
    else k_grid<<<nb, 64>>>(vals, flag, sums, rounds);
#else
    void *args[] = { &vals, &flag, &sums, &rounds };
    if (coop) cudaLaunchCooperativeKernel((const void *)k_grid, dim3(nb), dim3(64), args, 0, 0);
    else k_grid<<<nb, 64>>>(vals, flag, sums, rounds);
#endif
}
static void test_persist(void) {
    check(ring_ok(0), "mbarriers: a 3-slot ring of bulk copies, 11 chunks through it");
#ifdef __CUDACC_EMU__
    check(!ring_ok(1), "mbarriers: a chunk read before its barrier's wait reads the emulator's poison");
#endif
    int *d, h[96];
    cudaMalloc(&d, sizeof h);
    k_named<<<1, 96>>>(d);
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    bool ok = cudaGetLastError() == cudaSuccess;
    for (int t = 0; t < 96; t++) ok = ok && h[t] == (t < 64 ? (63 - t) * 3 : -1);
    check(ok, "named barrier: two warps of three");
    cudaFree(d);
    const int nb = 5, rounds = 3;
    int *vals, *flag, *sums, hs[nb * rounds];
    cudaMalloc(&vals, nb * rounds * sizeof(int));
    cudaMalloc(&flag, sizeof(int));
    cudaMalloc(&sums, sizeof hs);
    cudaMemset(flag, 0, sizeof(int));
    launch_grid(nb, vals, flag, sums, rounds, true);
    cudaMemcpy(hs, sums, sizeof hs, cudaMemcpyDeviceToHost);
    ok = cudaGetLastError() == cudaSuccess;
    for (int r = 0; r < rounds; r++)
        for (int b = 0; b < nb; b++) ok = ok && hs[r * nb + b] == (r + 1) * nb * (nb + 1) / 2;
    check(ok, "cooperative launch: 5 blocks meet at a grid flag three times");
    int *out, ho[4 * 64];
    cudaMalloc(&out, sizeof ho);
    cudaMemset(flag, 0, sizeof(int));
#ifdef __CUDACC_EMU__
    cu_go(k_grid_shared, dim3(4), dim3(64)).coop()(flag, out);
#else
    void *a2[] = { &flag, &out };
    cudaLaunchCooperativeKernel((const void *)k_grid_shared, dim3(4), dim3(64), a2, 0, 0);
#endif
    cudaMemcpy(ho, out, sizeof ho, cudaMemcpyDeviceToHost);
    ok = cudaGetLastError() == cudaSuccess;
    for (int b = 0; b < 4; b++)
        for (int t = 0; t < 64; t++) ok = ok && ho[b * 64 + t] == b * 1000 + 63 - t;
    check(ok, "cooperative launch: each block's static shared array its own across a grid flag");
    cudaFree(out);
    cudaFree(vals);
    cudaFree(flag);
    cudaFree(sums);
}

#ifdef __CUDACC_EMU__
/* ---- the emulator's fault checks, each in a child process that must abort with a message ---- */
__global__ void k_divergent(float *out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v += __shfl_xor_sync(0xffffffffu, v, 1);
    else __syncthreads();
    out[threadIdx.x] = v;
}
__global__ void k_absent(float *out) {
    if (threadIdx.x >= 30) return;
    out[threadIdx.x] = __shfl_sync(0xffffffffu, (float)threadIdx.x, 31);
}
__global__ void k_deref(const float *p, float *out) { out[threadIdx.x] = p[threadIdx.x]; }
__global__ void k_overrun(float *out, int n) {
    extern __shared__ float buf[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) buf[i] = (float)i;
    __syncthreads();
    out[threadIdx.x] = buf[threadIdx.x];
}
#ifdef __SANITIZE_ADDRESS__
#define ASAN 1
#else
#define ASAN 0
#endif
/* fn must end the child with a message holding `needle` (`asan_needle` in an ASan build,
 * where ASan reports memory faults itself) */
static void expect_fault(const char *what, const char *needle, const char *asan_needle, void (*fn)(void)) {
    int pfd[2];
    if (pipe(pfd)) { check(false, what); return; }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        fn();
        cudaDeviceSynchronize();
        _exit(0);
    }
    close(pfd[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(pfd[0], buf + n, sizeof buf - 1 - n)) > 0) n += (size_t)r;
    buf[n] = 0;
    close(pfd[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    bool died = WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
    bool ok = died && (ASAN && asan_needle ? strstr(buf, asan_needle) != NULL : strstr(buf, "lily emu: ") && strstr(buf, needle));
    if (!ok) printf("     child stderr: %s\n", buf);
    check(ok, what);
}
static float *dev_out(void) { float *p; cudaMalloc(&p, 1024 * 4); return p; }
static void run_divergent(void) { k_divergent<<<1, 32>>>(dev_out()); }
static void run_absent(void) { k_absent<<<1, 32>>>(dev_out()); }
static void run_host_ptr(void) { static float h[64]; k_deref<<<1, 32>>>(h, dev_out()); }
static void run_overrun(void) { k_overrun<<<1, 64, 4096 * 4>>>(dev_out(), 4096 + 1024); }
/* one element past a buffer lands in its red zone, seen after the launch (ASan: at the write) */
__global__ void k_write_past(float *p, int n) { if (threadIdx.x == 0) p[n] = 1.0f; }
__global__ void k_write_before(float *p) { if (threadIdx.x == 0) p[-1] = 1.0f; }
static void run_write_past(void) {
    float *p;
    cudaMalloc(&p, 100 * 4);
    k_write_past<<<1, 32>>>(p, 100);
}
static void run_write_before(void) {
    float *p;
    cudaMalloc(&p, 100 * 4);
    k_write_before<<<1, 32>>>(p);
}
/* a pointer inside a struct argument is not seen at the launch: the next copy to the host checks */
struct past_args { float *p; };
__global__ void k_write_past_s(past_args a) { if (threadIdx.x == 0) a.p[100 + 37] = 1.0f; }
static void run_write_past_s(void) {
    float *p, h;
    cudaMalloc(&p, 100 * 4);
    k_write_past_s<<<1, 32>>>(past_args{ p });
    cudaMemcpy(&h, p, 4, cudaMemcpyDeviceToHost);
}
/* only an ASan build (make emu-asan) sees these two */
__global__ void k_past_end(const float *p, float *out, int n) { out[threadIdx.x] = p[n + threadIdx.x]; }
__global__ void k_shared_past_end(float *out) {
    __shared__ float s[32];
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}
static void run_past_end(void) {
    float *p;
    cudaMalloc(&p, 100 * 4);
    k_past_end<<<1, 32>>>(p, dev_out(), 100);
}
static void run_shared_past_end(void) { k_shared_past_end<<<1, 64>>>(dev_out()); }
/* 16 KB of static shared memory beside an opt-in of the whole 227 KB for dynamic: the GPU refuses
 * the attribute, so the launch fails there */
__global__ void k_static_optin(float *out) {
    __shared__ float st[4096];
    extern __shared__ float dyn[];
    st[threadIdx.x] = 1.0f;
    dyn[threadIdx.x] = 2.0f;
    __syncthreads();
    out[threadIdx.x] = st[threadIdx.x] + dyn[threadIdx.x];
}
static void run_static_optin(void) {
    cudaFuncSetAttribute(k_static_optin, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 << 10);
    k_static_optin<<<1, 32, 200 << 10>>>(dev_out());
}
/* a 16-byte load from an address that is only 4-aligned (the GPU faults: misaligned address) */
__global__ void k_misaligned(const float *p, float *out) {
    const float4 v = *(const float4 *)(p + 1 + 4 * threadIdx.x);
    out[threadIdx.x] = v.x + v.y + v.z + v.w;
}
static void run_misaligned(void) {
    float *p;
    cudaMalloc(&p, 1024 * 4);
    cudaMemset(p, 0, 1024 * 4);
    k_misaligned<<<1, 32>>>(p, dev_out());
}
static void run_grid_plain(void) {
    int *p;
    cudaMalloc(&p, 64 * sizeof(int));
    cudaMemset(p, 0, 64 * sizeof(int));
    launch_grid(2, p, p + 16, p + 32, 1, false);
}
__global__ void k_mb_uninit(int *out) {
    __shared__ uint64_t bar;
    cu_mb_arrive(&bar);
    out[threadIdx.x] = 1;
}
static void run_mb_uninit(void) { k_mb_uninit<<<1, 32>>>((int *)dev_out()); }
#endif

int main(void) {
    test_shfl();
    test_warp();
    test_block();
    test_wmma();
    test_convert();
    test_errors_graphs_events();
    test_persist();
#ifdef __CUDACC_EMU__
    expect_fault("fault: lanes split between a shuffle and __syncthreads", "never reaches", NULL, run_divergent);
    expect_fault("fault: shuffle reading an exited lane", "did not take part", NULL, run_absent);
    expect_fault("fault: host pointer as a kernel argument", "not in device memory", NULL, run_host_ptr);
    expect_fault("fault: write past the dynamic shared memory", "segmentation fault", "SEGV", run_overrun);
    expect_fault("fault: a kernel writing one past a cudaMalloc buffer", "kernel k_write_past: device memory", "use-after-poison",
                 run_write_past);
    expect_fault("fault: a kernel writing one before a cudaMalloc buffer", "at byte offset -4", "use-after-poison",
                 run_write_before);
    expect_fault("fault: a write past a buffer held in a struct argument, seen at the next copy to the host",
                 "a copy to the host: device memory", "use-after-poison", run_write_past_s);
    expect_fault("fault: a block waiting for another's flag in a launch that is not cooperative", "cannot wait for another", NULL,
                 run_grid_plain);
    expect_fault("fault: an mbarrier arrived on before its init", "before mbarrier.init", NULL, run_mb_uninit);
    expect_fault("fault: static shared memory beside a dynamic opt-in of the whole 227 KB", "cudaFuncSetAttribute fails", NULL,
                 run_static_optin);
    if (ASAN) {
        expect_fault("ASan: a kernel reading past a cudaMalloc buffer", NULL, "use-after-poison", run_past_end); /* (its red zone) */
        expect_fault("ASan: a kernel writing past a static shared array", NULL, "global-buffer-overflow", run_shared_past_end);
        expect_fault("UBSan: a kernel's 16-byte load from a 4-aligned address", NULL, "misaligned address", run_misaligned);
    }
#endif
    printf("%d passed, %d failed\n", n_pass, n_fail);
    return n_fail != 0;
}
