/* How much a launch pays for instructions not yet in the SM's caches.
 *
 * Why: decode's launches take 2-3.5 us from their wait to a staged input of a few KB
 * (bench/RESULTS.md sessions 21-22), far more than an L2 round trip. One candidate is the
 * code itself: each launch's first pass through its instructions on an SM. This times a
 * straight-line body of N FFMA (16 bytes of SASS each) on every SM, first after other kernels
 * whose code fills the caches (cold) and then again at once (warm), with and without a
 * memory-streaming kernel on a second stream (misses then queue behind its loads in L2).
 *
 * Build and run on the device: nvcc -O3 -arch=sm_90a -o /tmp/icache bench/micro/icache.cu && /tmp/icache */
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

__device__ __forceinline__ unsigned long long gtime() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

#define STEP8(c) asm volatile("fma.rn.f32 %0,%0,%8,%9;\n fma.rn.f32 %1,%1,%8,%9;\n fma.rn.f32 %2,%2,%8,%9;\n fma.rn.f32 %3,%3,%8,%9;\n" \
                              "fma.rn.f32 %4,%4,%8,%9;\n fma.rn.f32 %5,%5,%8,%9;\n fma.rn.f32 %6,%6,%8,%9;\n fma.rn.f32 %7,%7,%8,%9;\n" \
                              : "+f"(a0), "+f"(a1), "+f"(a2), "+f"(a3), "+f"(a4), "+f"(a5), "+f"(a6), "+f"(a7) : "f"(m), "f"(c));
#define X4(s) s s s s
#define X16(s) X4(X4(s))
#define X64(s) X16(X4(s))

/* N64 blocks of 64 x 8 FFMA: 8 KB of SASS each */
template <int N64, int ID>
__global__ void k_body(float m, float *out, unsigned long long *tm) {
    float a0 = threadIdx.x, a1 = a0 + 1, a2 = a0 + 2, a3 = a0 + 3, a4 = a0 + 4, a5 = a0 + 5, a6 = a0 + 6, a7 = a0 + 7;
    __syncthreads();
    const unsigned long long t0 = gtime();
#pragma unroll
    for (int i = 0; i < N64; i++) { X64(STEP8((float)ID + 0.5f)) }
    __syncthreads();
    const unsigned long long t1 = gtime();
    if (threadIdx.x == 0) { tm[2 * blockIdx.x] = t0; tm[2 * blockIdx.x + 1] = t1; }
    if (a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 == 1234.5f) out[threadIdx.x] = a0;
}

/* streams n uint4 from src: the memory system busy as in decode's launches; EF: the loads
 * marked L2::evict_first, as weights read once a token could be */
template <int EF>
__global__ void k_stream(const uint4 *src, size_t n, uint4 *dst) {
    uint4 acc = make_uint4(0, 0, 0, 0);
    unsigned long long pol;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint4 v;
        if (EF)
            asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(src + i), "l"(pol));
        else
            v = __ldg(src + i);
        acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
    }
    if (acc.x == 0x12345678u) dst[threadIdx.x] = acc;
}

static double med_us(std::vector<unsigned long long> &h, int nb) {
    std::vector<double> d(nb);
    for (int i = 0; i < nb; i++) d[i] = (h[2 * i + 1] - h[2 * i]) / 1000.0;
    std::sort(d.begin(), d.end());
    return d[nb / 2];
}

int main() {
    int nsm = 0;
    CK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0));
    float *out;
    unsigned long long *tm;
    CK(cudaMalloc(&out, 4096));
    CK(cudaMalloc(&tm, 16 * nsm));
    const size_t nbytes = (size_t)4 << 30;
    uint4 *src;
    CK(cudaMalloc(&src, nbytes));
    CK(cudaMemset(src, 1, nbytes));
    cudaStream_t s1, s2;
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    std::vector<unsigned long long> h(2 * nsm);
    /* the fillers: 4 x 64 KB of other code */
    auto fill = [&]() {
        k_body<8, 11><<<nsm, 128, 0, s1>>>(1.0f, out, tm);
        k_body<8, 12><<<nsm, 128, 0, s1>>>(1.0f, out, tm);
        k_body<8, 13><<<nsm, 128, 0, s1>>>(1.0f, out, tm);
        k_body<8, 14><<<nsm, 128, 0, s1>>>(1.0f, out, tm);
    };
    /* prep: 0 other kernels' code only (the body's lines still in L2), 1 then 512 MB streamed
     * through L2 by plain loads (the body's lines evicted), 2 the same by evict_first loads.
     * load: a 4 GB stream on half the SMs beside the timed launch. */
    const char *pname[3] = { "sm-cold", "l2-cold", "l2-ef" };
    for (int load = 0; load < 2; load++)
        for (int prep = 0; prep < 3; prep++) {
            printf("load %d %-8s:", load, pname[prep]);
#define RUN(N, TAG)                                                                               \
    {                                                                                             \
        std::vector<double> c, w;                                                                 \
        for (int rep = 0; rep < 5; rep++) {                                                       \
            fill();                                                                               \
            if (prep == 1) k_stream<0><<<4 * nsm, 512, 0, s1>>>(src, (512u << 20) / 16, (uint4 *)out); \
            if (prep == 2) k_stream<1><<<4 * nsm, 512, 0, s1>>>(src, (512u << 20) / 16, (uint4 *)out); \
            CK(cudaStreamSynchronize(s1));                                                        \
            if (load) k_stream<0><<<nsm / 2, 512, 0, s2>>>(src, nbytes / 16, (uint4 *)out);      \
            k_body<N, 1><<<nsm, 128, 0, s1>>>(1.0f, out, tm);                                     \
            CK(cudaMemcpyAsync(h.data(), tm, 16 * nsm, cudaMemcpyDeviceToHost, s1));              \
            CK(cudaStreamSynchronize(s1)); c.push_back(med_us(h, nsm));                           \
            k_body<N, 1><<<nsm, 128, 0, s1>>>(1.0f, out, tm);                                     \
            CK(cudaMemcpyAsync(h.data(), tm, 16 * nsm, cudaMemcpyDeviceToHost, s1));              \
            CK(cudaStreamSynchronize(s1)); w.push_back(med_us(h, nsm));                           \
            CK(cudaStreamSynchronize(s2));                                                        \
        }                                                                                         \
        std::sort(c.begin(), c.end()); std::sort(w.begin(), w.end());                             \
        printf("  %s cold %.2f warm %.2f us;", TAG, c[2], w[2]);                                   \
    }
            RUN(1, "8KB")
            RUN(2, "16KB")
            RUN(4, "32KB")
            RUN(8, "64KB")
            printf("\n");
        }
    CK(cudaDeviceSynchronize());
    return 0;
}
