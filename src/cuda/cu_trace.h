/* The decode timeline, for a measuring build only (make CUDA=1 TRACE=1 BUILD=build/trace, see
 * tests/cuda/trace_table.py): every kernel's CU_PDL becomes a scope whose thread (0, 0, 0) notes,
 * from the GPU's global nanosecond timer, when its block started, when its wait on the
 * predecessor returned and when it left the kernel (the scope's end: every return path), with
 * the launch's %gridid and the kernel's source site. Nsight Compute runs kernels one at a time
 * with the graph's overlap gone; this sees the step as the graph runs it (PDL, the second
 * stream's prefetches), which is what decides where a token's time goes.
 *
 * Without -rdc each translation unit has its own copy of the device pointer, so every unit
 * that includes this registers a setter at load (cu_trace_register) and cu_trace_enable calls
 * them all. */
#ifndef LILY_CU_TRACE_H
#define LILY_CU_TRACE_H
#include <cuda_runtime.h>

typedef struct {
    unsigned long long grid;       /* %gridid: one per launch, rising with launch order */
    unsigned long long t0, t1, t2; /* ns: block start, wait returned, block end (thread 0's) */
    unsigned site;                 /* fnv(basename of the file) << 16 | line of CU_PDL */
    unsigned block, sm;
    unsigned mk[3]; /* ns after t1 of the kernel's CU_MARK(0..2) points (0: none), thread (0, 0, 0)'s */
    unsigned pad;
} cu_trace_rec;
static_assert(sizeof(cu_trace_rec) == 64, "tests/cuda/trace_table.py's REC reads 64-byte records");
typedef struct {
    unsigned n, cap; /* records written (may pass cap: the rest were dropped) */
    cu_trace_rec *r; /* [cap] */
} cu_trace_buf;

/* host: every unit's setter of its copy of the pointer (buf a device address, or NULL) */
int cu_trace_register(int (*set)(cu_trace_buf *));
int cu_trace_enable(cu_trace_buf *buf);

static __device__ cu_trace_buf *cu_trace_dev;
static int cu_trace_set_here(cu_trace_buf *p) { return cudaMemcpyToSymbol(cu_trace_dev, &p, sizeof p) == cudaSuccess; }
static const int cu_trace_reg __attribute__((unused)) = cu_trace_register(cu_trace_set_here);

/* FNV-1a over the part of the path after its last '/' */
constexpr unsigned cu_trace_fnv(const char *s, unsigned h = 2166136261u) {
    return *s == 0 ? h : *s == '/' ? cu_trace_fnv(s + 1, 2166136261u) : cu_trace_fnv(s + 1, (h ^ (unsigned char)*s) * 16777619u);
}

__device__ __forceinline__ unsigned long long cu_trace_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

struct cu_trace_scope {
    unsigned long long t0, t1;
    unsigned site, mk[3];
    __device__ __forceinline__ void mark(int i) { mk[i] = (unsigned)(cu_trace_now() - t1); }
    __device__ __forceinline__ explicit cu_trace_scope(unsigned s) : site(s), mk{ 0u, 0u, 0u } {
        t0 = cu_trace_now();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
        t1 = cu_trace_now();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    }
    __device__ __forceinline__ ~cu_trace_scope() {
        cu_trace_buf *b = cu_trace_dev;
        if (b && threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) {
            const unsigned long long t2 = cu_trace_now();
            const unsigned i = atomicAdd(&b->n, 1u);
            if (i < b->cap) {
                cu_trace_rec r;
                asm volatile("mov.u64 %0, %%gridid;" : "=l"(r.grid));
                unsigned sm;
                asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
                r.t0 = t0; r.t1 = t1; r.t2 = t2; r.site = site;
                r.block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
                r.sm = sm; r.pad = 0;
                r.mk[0] = mk[0]; r.mk[1] = mk[1]; r.mk[2] = mk[2];
                b->r[i] = r;
            }
        }
    }
};
/* a point inside a kernel (after its CU_PDL, same scope): when thread (0, 0, 0) passed it */
#define CU_TRACE_MARK(i) cu_trace_here_.mark(i)
#define CU_TRACE_PDL() \
    constexpr unsigned cu_trace_site_ = (cu_trace_fnv(__FILE__) << 16) | (__LINE__ & 0xffff); \
    cu_trace_scope cu_trace_here_(cu_trace_site_)
#endif
