/* CPU emulation of the CUDA language and runtime for lily's kernels (make emu).
 *
 * The .cu sources are compiled as C++ after tests/cuda/emu/cu2cpp.py has rewritten kernel
 * launches and __shared__ declarations; everything else is this header. A launch runs the
 * grid at once, one block after another; the threads of a block are cooperative fibers on
 * the calling OS thread (emu_runtime.cpp), switched only at __syncthreads, __syncwarp and
 * the warp shuffles, so block and warp barriers have their real meaning and code that
 * depends on lockstep execution without them fails here. Device memory is host memory;
 * streams run synchronously; graphs replay recorded launches with captured arguments (a
 * capture takes in the streams that fork from it by an event, and checks they join back).
 *
 * Faults the emulator detects (a barrier some threads never reach, a shuffle naming an
 * absent lane, shared memory past its size, a host pointer passed to a kernel) print a
 * message naming the kernel, block and thread and abort. Launch configuration errors set
 * the error cudaGetLastError returns, as on the GPU. */
#ifndef LILY_EMU_CUDA_RUNTIME_H
#define LILY_EMU_CUDA_RUNTIME_H
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <functional>
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>

#define __CUDACC_EMU__ 1

/* ---- vector types ---- */
struct uint3 { unsigned x, y, z; };
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return uint3{ x, y, z }; }
};
struct __attribute__((aligned(8))) float2 { float x, y; };
struct __attribute__((aligned(16))) float4 { float x, y, z, w; };
struct __attribute__((aligned(8))) uint2 { unsigned x, y; };
struct __attribute__((aligned(16))) uint4 { unsigned x, y, z, w; };
struct __attribute__((aligned(8))) int2 { int x, y; };
struct __attribute__((aligned(16))) int4 { int x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{ x, y }; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{ x, y, z, w }; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{ x, y }; }
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{ x, y, z, w }; }
static inline int2 make_int2(int x, int y) { return int2{ x, y }; }
static inline int4 make_int4(int x, int y, int z, int w) { return int4{ x, y, z, w }; }

/* ---- runtime types ---- */
enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevicePointer = 17,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorInvalidDeviceFunction = 98,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchOutOfResources = 701,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnjoined = 904,
    cudaErrorStreamCaptureIsolation = 905,
    cudaErrorStreamCaptureImplicit = 906,
    cudaErrorStreamCaptureWrongThread = 908,
};
typedef cudaError_t cudaError;
enum cudaMemcpyKind { cudaMemcpyHostToHost = 0, cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2,
                      cudaMemcpyDeviceToDevice = 3, cudaMemcpyDefault = 4 };
enum cudaStreamCaptureMode { cudaStreamCaptureModeGlobal = 0, cudaStreamCaptureModeThreadLocal = 1,
                             cudaStreamCaptureModeRelaxed = 2 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaFuncAttributePreferredSharedMemoryCarveout = 9,
                         cudaFuncAttributeNonPortableClusterSizeAllowed = 14 };
enum cudaLimit { cudaLimitStackSize = 0, cudaLimitPrintfFifoSize = 1, cudaLimitMallocHeapSize = 2 };
#define cudaStreamDefault 0x0
#define cudaStreamNonBlocking 0x1
#define cudaEventDefault 0x0
#define cudaEventBlockingSync 0x1
#define cudaEventDisableTiming 0x2
#define cudaHostAllocDefault 0x0
#define cudaHostAllocPortable 0x1
#define cudaHostAllocMapped 0x2
#define cudaHostAllocWriteCombined 0x4

struct emu_stream;
struct emu_event;
struct emu_graph;
typedef emu_stream *cudaStream_t;
typedef emu_event *cudaEvent_t;
typedef emu_graph *cudaGraph_t;
typedef emu_graph *cudaGraphExec_t;

struct cudaDeviceProp {
    char name[256];
    size_t totalGlobalMem, sharedMemPerBlock, sharedMemPerBlockOptin, sharedMemPerMultiprocessor;
    int regsPerBlock, warpSize, maxThreadsPerBlock, maxThreadsDim[3], maxGridSize[3];
    int clockRate, major, minor, multiProcessorCount, maxThreadsPerMultiProcessor;
    int memoryClockRate, memoryBusWidth, l2CacheSize, canMapHostMemory, unifiedAddressing;
};
struct cudaFuncAttributes {
    size_t sharedSizeBytes, constSizeBytes, localSizeBytes;
    int maxThreadsPerBlock, numRegs, ptxVersion, binaryVersion, maxDynamicSharedSizeBytes;
};

cudaError_t cudaGetDeviceCount(int *n);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev);
cudaError_t cudaSetDevice(int dev);
cudaError_t cudaGetDevice(int *dev);
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *func);
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value);
template <class... P> cudaError_t cudaFuncSetAttribute(void (*func)(P...), cudaFuncAttribute attr, int value) {
    return cudaFuncSetAttribute((const void *)func, attr, value);
}
/* Blocks a multiprocessor holds at once: by threads (2,048) and shared memory (228 KB) alone */
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *func, int block, size_t smem);
template <class... P>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, void (*func)(P...), int block, size_t smem) {
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, (const void *)func, block, smem);
}
cudaError_t cudaDeviceSetLimit(cudaLimit l, size_t v);
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaDeviceReset(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e);
const char *cudaGetErrorName(cudaError_t e);

cudaError_t cudaMalloc(void **p, size_t n);
template <class T> cudaError_t cudaMalloc(T **p, size_t n) { return cudaMalloc((void **)p, n); }
cudaError_t cudaFree(void *p);
cudaError_t cudaMallocHost(void **p, size_t n);
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags);
cudaError_t cudaFreeHost(void *p);
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags);
cudaError_t cudaMemGetInfo(size_t *free_, size_t *total);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s = 0);
cudaError_t cudaMemset(void *p, int v, size_t n);
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s = 0);

cudaError_t cudaStreamCreate(cudaStream_t *s);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode);
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags = 0);
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e);
cudaError_t cudaGraphDestroy(cudaGraph_t g);

cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s = 0);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b);
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags = 0);

/* ---- the device language ---- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __constant__ static
#define __grid_constant__
/* cu2cpp.py rewrites every __shared__ declaration; this keeps stray uses compiling */
#define __shared__ static

/* The running fiber's coordinates: the scheduler stores them before it switches to a fiber. */
extern uint3 threadIdx, blockIdx;
extern dim3 blockDim, gridDim;
static const int warpSize = 32;

void __syncthreads(void);
void __syncwarp(unsigned mask = 0xffffffffu);
static inline void __threadfence(void) {}
static inline void __threadfence_block(void) {}
static inline void __threadfence_system(void) {}

namespace emu {
/* Warp exchange: every lane of the warp deposits v and gets the value lane `src` deposited
 * (its own when src < 0). All live lanes of the warp must take part. */
uint64_t shfl(unsigned mask, uint64_t v, int src);
/* Every lane of the (whole) warp gives n <= WARP_ALL_MAX bytes and gets all 32 lanes' gifts,
 * all[lane * n ...]: one exchange where a register-level warp operation (mma.sync, whose
 * operands are spread over the lanes) would take many shuffles. */
#define WARP_ALL_MAX 32
void warp_all(const void *mine, size_t n, void *all);
int lane_id(void);
/* cp.async for the calling thread: copies queue until cp_wait(n) leaves at most n of the
 * thread's committed groups pending; then the older ones are done, in issue order. Copies
 * still queued when a block ends are dropped (a kernel must not rely on them). */
void cp_async(void *dst, const void *src, size_t n);
void cp_commit(void);
void cp_wait(int n);
/* Persistent kernels (src/cuda/cu_persist.h). mbarriers are the runtime's records, keyed by
 * address and reset by mb_init (a block's are dropped when it ends): mb_arrive counts one
 * arrival and tx more bytes expected; a phase completes when every arrival came and every
 * expected byte landed. A bulk copy poisons its destination when issued and lands at the next
 * operation on its barrier (the first wait's test, or the next arrival), so reading before the
 * wait, or a slot overwritten while still read, gives wrong results. bar_named: bar.sync id, n (n threads of the block). spin: the fiber
 * yields and runs again once every other fiber had its turn; a launch whose fibers all spin or
 * wait without progress faults (a flag no thread will set, or a block waiting for another in a
 * launch that is not cooperative, where blocks run one after another). */
void mb_init(void *bar, unsigned count);
/* Thread block clusters (no src/cuda kernel uses them since decode's cluster forms were removed):
 * a cluster launch runs each cluster's blocks interleaved, as a cooperative launch does the grid (a
 * plain launch's block is a cluster of one). cluster_arrive / cluster_wait: barrier.cluster's two halves over every thread of the
 * cluster (a wait returns once all have arrived as often as the waiter has). cluster_map: the
 * address of p, in the calling block's dynamic shared memory (the only kind mapped here), in
 * block `rank` of its cluster. */
int cluster_rank(void);
void cluster_arrive(void);
void cluster_wait(void);
void *cluster_map(const void *p, int rank);
void mb_arrive(void *bar, unsigned tx);
void bulk_g2s(void *dst, const void *src, size_t n, void *bar);
/* cp.async.bulk.prefetch.L2: nothing to fetch here; the range must be 16-byte units of device memory */
void l2_prefetch(const void *src, size_t n);
bool mb_test(void *bar, unsigned parity);
void bar_named(int id, int n);
void spin(void);
unsigned long long clock_ns(void);
template <class T> static inline T shfl_t(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
    uint64_t b = 0;
    memcpy(&b, &v, sizeof v);
    b = shfl(mask, b, src);
    T r;
    memcpy(&r, &b, sizeof r);
    return r;
}
} // namespace emu
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    int lane = emu::lane_id();
    return emu::shfl_t(mask, v, (lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = emu::lane_id();
    return emu::shfl_t(mask, v, (lane & (width - 1)) >= (int)d ? lane - (int)d : -1);
}
template <class T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    int lane = emu::lane_id();
    return emu::shfl_t(mask, v, (lane & (width - 1)) + (int)d < width ? lane + (int)d : -1);
}
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    int lane = emu::lane_id(), src = lane ^ m;
    return emu::shfl_t(mask, v, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : -1);
}
/* redux.sync's unsigned max and min over the whole warp */
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
    for (int o = 16; o; o >>= 1) { const unsigned w = __shfl_xor_sync(mask, v, o); v = w > v ? w : v; }
    return v;
}
static inline unsigned __reduce_min_sync(unsigned mask, unsigned v) {
    for (int o = 16; o; o >>= 1) { const unsigned w = __shfl_xor_sync(mask, v, o); v = w < v ? w : v; }
    return v;
}
unsigned __ballot_sync(unsigned mask, int pred);
static inline int __all_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) == __ballot_sync(mask, 1); }
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }

template <class T> static inline T __ldg(const T *p) { return *p; }

/* Atomics: the fibers of a launch share one OS thread and switch only at barriers, so a
 * plain read-modify-write is atomic. */
template <class T> static inline T atomicAdd(T *p, T v) { T o = *p; *p = o + v; return o; }
template <class T> static inline T __ldcg(const T *p) { return *p; }
template <class T> static inline T atomicSub(T *p, T v) { T o = *p; *p = o - v; return o; }
template <class T> static inline T atomicMax(T *p, T v) { T o = *p; if (v > o) *p = v; return o; }
template <class T> static inline T atomicMin(T *p, T v) { T o = *p; if (v < o) *p = v; return o; }
template <class T> static inline T atomicExch(T *p, T v) { T o = *p; *p = v; return o; }
template <class T> static inline T atomicCAS(T *p, T c, T v) { T o = *p; if (o == c) *p = v; return o; }
template <class T> static inline T atomicOr(T *p, T v) { T o = *p; *p = o | v; return o; }
template <class T> static inline T atomicAnd(T *p, T v) { T o = *p; *p = o & v; return o; }

/* ---- math: exact host equivalents of the device intrinsics ---- */
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
static inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }
static inline unsigned long long min(unsigned long long a, unsigned long long b) { return a < b ? a : b; }
static inline unsigned long long max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
#ifndef __GLIBC__ /* glibc declares these itself, as aliases of expf etc. */
static inline float __expf(float x) { return expf(x); }
static inline float __logf(float x) { return logf(x); }
static inline float __sinf(float x) { return sinf(x); }
static inline float __cosf(float x) { return cosf(x); }
static inline float __powf(float a, float b) { return powf(a, b); }
#endif
static inline float __fdividef(float a, float b) { return a / b; }
#ifdef __GLIBC__ /* glibc declares __expf but does not export it: the device's ex2.approx of x log2(e) is expf here */
static inline float emu_expf(float x) { return expf(x); }
#define __expf emu_expf
#endif
static inline float __frcp_rn(float x) { return 1.0f / x; }
static inline float __fsqrt_rn(float x) { return sqrtf(x); }
static inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline long long __double_as_longlong(double d) { long long u; memcpy(&u, &d, 8); return u; }
static inline double __longlong_as_double(long long u) { double d; memcpy(&d, &u, 8); return d; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
/* byte i of the result is byte (s >> 4i) & 7 of the 8 bytes y:x */
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
}
static inline int __float_as_int(float f) { int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline int __float2int_rn(float x) { return (int)nearbyintf(x); }
static inline int __float2int_rz(float x) { return (int)x; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }
static inline int __ffs(int x) { return __builtin_ffs(x); }

/* ---- launches (the form cu2cpp.py writes) ---- */
namespace emu {
struct launch_cfg {
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;
    bool coop; /* a cooperative launch: every block resident at once (fibers of all blocks interleaved) */
    unsigned cluster; /* > 1: clusters of that many blocks along x, each cluster's blocks interleaved */
};
static inline launch_cfg cfg(dim3 g, dim3 b, size_t smem = 0, cudaStream_t s = 0) { return launch_cfg{ g, b, smem, s, false, 0 }; }
/* Runs (or, while s is capturing, records) a grid whose every thread calls body(); ptrs
 * lists the kernel's plain pointer arguments, checked to be device-accessible memory;
 * max_threads is the kernel's __launch_bounds__ (0: none). */
void submit(const char *name, const void *kernel, const launch_cfg &c, std::shared_ptr<std::function<void()>> body,
            const void *const *ptrs, int nptrs, int max_threads);
/* Dynamic shared memory of the running block (poisoned at the block's start); elem is the
 * declared element size, for the alignment check. */
void *dyn_smem(size_t elem);
/* Static shared memory: registers an array at its declaration (poisoned once per block). */
void shared(void *p, size_t n);
/* wmma: the running lane's next mma_sync takes `out` from an earlier lane of its warp whose
 * inputs were byte-identical (true), or computes it and offers it with mma_keep. */
bool mma_reuse(const void *in, size_t nin, void *out, size_t nout);
/* LILY_EMU_TF32=fp32: wmma keeps fp32 inputs (no TF32 rounding or truncation) */
extern const bool tf32_off;
void mma_keep(const void *in, size_t nin, const void *out, size_t nout);

template <class T> static inline void collect_ptr(const T &v, const void **out, int &n) {
    if constexpr (std::is_pointer<T>::value) out[n++] = (const void *)v;
    else (void)v;
}
template <class... P> struct launcher {
    const char *name;
    void (*k)(P...);
    launch_cfg c;
    int max_threads;
    void operator()(P... a) const {
        /* arguments are copied now, as a CUDA launch (or graph capture) copies them */
        auto args = std::make_shared<std::tuple<std::decay_t<P>...>>(a...);
        void (*kf)(P...) = k;
        auto body = std::make_shared<std::function<void()>>([kf, args]() { std::apply(kf, *args); });
        const void *ptrs[sizeof...(P) + 1];
        int n = 0;
        (collect_ptr(a, ptrs, n), ...);
        submit(name, (const void *)k, c, body, ptrs, n, max_threads);
    }
    /* cu_go(...).coop()(args): cudaLaunchAttributeCooperative */
    launcher coop() const {
        launcher l = *this;
        l.c.coop = true;
        return l;
    }
    /* cu_go(...).cluster(n)(args): cudaLaunchAttributeClusterDimension (n, 1, 1) */
    launcher cluster(unsigned n) const {
        launcher l = *this;
        l.c.cluster = n;
        return l;
    }
};
template <class... P> static inline launcher<P...> launch(const char *name, void (*k)(P...), launch_cfg c, int max_threads = 0) {
    return launcher<P...>{ name, k, c, max_threads };
}
/* cu_go's form (cu_common.h): the programmatic-launch attribute means nothing here, where a
 * stream runs its launches in order */
template <class... P>
static inline launcher<P...> go(const char *name, void (*k)(P...), int max_threads, dim3 g, dim3 b, size_t smem = 0,
                                cudaStream_t s = 0) {
    return launcher<P...>{ name, k, launch_cfg{ g, b, smem, s, false, 0 }, max_threads };
}
} // namespace emu
#endif
