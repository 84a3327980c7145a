/* Primitives for persistent kernels: blocks that stay resident across a token's stages and
 * wait for each other through flags in global memory instead of kernel boundaries, and a
 * producer warp that streams a block's coming weights into a ring in shared memory.
 *
 * mbarriers (sm_90): cu_mb_init (one thread, then cu_mb_fence_init and a block barrier before
 * any other thread uses it); a phase completes when `count` arrivals came and every byte that
 * cu_mb_copy announced has landed; cu_mb_wait(b, p) returns once the phase of parity p has
 * completed (a fresh barrier's "previous" phase, parity 1, counts as completed, which lets a
 * producer's first wait on an empty slot pass). cu_mb_copy: one bulk copy global -> shared of n
 * bytes (n and both addresses multiples of 16) that arrives on the barrier.
 *
 * Grid flags: cu_flag_add (release: the block's writes before it, ordered by a block barrier,
 * are visible to whoever acquires the flag) and cu_flag_wait_ge (acquire). Data a flag
 * guards must be read with loads that bypass L1 (__ldcg): an SM's L1 is not coherent.
 *
 * The CPU emulator (tests/cuda/emu) runs these with its own records (emu::mb_*, emu::spin),
 * and a cooperative launch's blocks interleaved (cu_go(...).coop()). */
#ifndef LILY_CU_PERSIST_H
#define LILY_CU_PERSIST_H
#include <stdint.h>

#ifdef __CUDACC_EMU__
__device__ __forceinline__ void cu_mb_init(uint64_t *b, unsigned count) { emu::mb_init(b, count); }
__device__ __forceinline__ void cu_mb_fence_init(void) {}
__device__ __forceinline__ void cu_mb_arrive(uint64_t *b) { emu::mb_arrive(b, 0); }
__device__ __forceinline__ void cu_mb_copy(uint64_t *b, void *dst, const void *src, unsigned n) {
    emu::mb_arrive(b, n);
    emu::bulk_g2s(dst, src, n, b);
}
__device__ __forceinline__ void cu_mb_wait(uint64_t *b, unsigned parity) {
    while (!emu::mb_test(b, parity)) emu::spin();
}
__device__ __forceinline__ void cu_bar_named(int id, int n) { emu::bar_named(id, n); }
__device__ __forceinline__ void cu_flag_add(int *p, int v) { *p += v; }
__device__ __forceinline__ void cu_flag_wait_ge(const int *p, int v) {
    while (*(const volatile int *)p < v) emu::spin();
}
__device__ __forceinline__ unsigned long long cu_gtime(void) { return emu::clock_ns(); }
#else
__device__ __forceinline__ uint32_t cu_smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cu_mb_init(uint64_t *b, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(cu_smem_addr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void cu_mb_fence_init(void) { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void cu_mb_arrive(uint64_t *b) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(cu_smem_addr(b)) : "memory");
}
__device__ __forceinline__ void cu_mb_copy(uint64_t *b, void *dst, const void *src, unsigned n) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(cu_smem_addr(b)), "r"(n) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(cu_smem_addr(dst)),
                 "l"(src), "r"(n), "r"(cu_smem_addr(b))
                 : "memory");
}
__device__ __forceinline__ void cu_mb_wait(uint64_t *b, unsigned parity) {
    uint32_t ok;
    do {
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(ok)
                     : "r"(cu_smem_addr(b)), "r"(parity)
                     : "memory");
    } while (!ok);
}
__device__ __forceinline__ void cu_bar_named(int id, int n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void cu_flag_add(int *p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ void cu_flag_wait_ge(const int *p, int v) {
    int x;
    for (;;) {
        asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(x) : "l"(p) : "memory");
        if (x >= v) break;
    }
}
__device__ __forceinline__ unsigned long long cu_gtime(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
#endif

#endif
