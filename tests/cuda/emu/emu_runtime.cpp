/* The CPU emulator's runtime (see cuda_runtime.h): fibers and the block scheduler, warp
 * exchange, shared memory, device memory bookkeeping, streams, events and graphs.
 *
 * One launch runs on the calling OS thread (all API calls hold one process-wide lock, so
 * launches from several threads take turns). A block's threads are fibers with their own
 * stacks, allocated once and reused; the scheduler runs warp after warp, each lane until
 * it blocks at a warp operation (released when every live lane of the warp arrived) or at
 * __syncthreads (released when every live thread of the block arrived). Exited threads
 * count as arrived, as on sm_70 and later. A plain launch runs its blocks one after another;
 * a cooperative one all of them, interleaved round by round, so that they can wait for each
 * other (grid flags, mbarriers and named barriers: the persistent kernels' primitives). */
#include "cuda_runtime.h"
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
/* Built with -fsanitize=address (make emu-asan): tell ASan about every stack switch, so
 * kernels' out-of-bounds accesses to device buffers (heap) and static shared arrays are
 * reported with the kernel's stack. */
#define EMU_ASAN 1
extern "C" {
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size);
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old);
void __asan_unpoison_memory_region(void const volatile *addr, size_t size);
void __asan_poison_memory_region(void const volatile *addr, size_t size);
}
#endif

uint3 threadIdx, blockIdx;
dim3 blockDim, gridDim;

namespace {

std::recursive_mutex mu;
#define LOCK std::lock_guard<std::recursive_mutex> lock_(mu)
cudaError_t last_err = cudaSuccess;
cudaError_t fail(cudaError_t e) {
    if (e != cudaSuccess) last_err = e;
    return e;
}

/* ---- device memory: host memory, with a registry so copies and kernel arguments can be
 * checked against what was allocated ---- */
enum { M_DEV, M_HOST, M_MAPPED };
struct alloc_t { size_t n; int kind; };
std::map<uintptr_t, alloc_t> allocs;
size_t dev_bytes;
const size_t EMU_TOTAL = 140ull << 30; /* the emulated device's memory */

/* Device allocations carry red zones, RZ_LEAD bytes before and RZ_TAIL after, filled with RZ_BYTE:
 * a kernel that writes just outside its buffer (a scatter past the last slot) would otherwise
 * corrupt the host heap, and the test would die in malloc far from the cause. The zones of a
 * launch's pointer arguments are checked after it, and every allocation's at synchronizations,
 * copies to the host and frees (a pointer held in a struct argument is not seen at launch). */
const size_t RZ_LEAD = 256, RZ_TAIL = 4096;
/* the tail zone of an n-byte allocation: as large as the buffer up to 1 MB (a scatter past the end
 * of a slot buffer runs as far as the buffer is long: the sort mutant's passed 4 KB at some seeds) */
size_t rz_tail(size_t n) { return n < RZ_TAIL ? RZ_TAIL : n > (1u << 20) ? (1u << 20) : (n + 15) & ~(size_t)15; }
const unsigned char RZ_BYTE = 0xa5;
const unsigned char *rz_pattern(void) {
    static unsigned char pat[RZ_TAIL];
    static bool init;
    if (!init) { memset(pat, RZ_BYTE, sizeof pat); init = true; }
    return pat;
}
/* The first red-zone byte of allocation (base, a) that was written, as an offset from base
 * (negative: before it), or 0 when both zones are intact. */
long rz_damage(uintptr_t base, const alloc_t &a) {
#ifdef EMU_ASAN
    (void)base, (void)a;
    return 0; /* the zones are poisoned: ASan reports any access to them, with the kernel's stack */
#endif
    const unsigned char *p = (const unsigned char *)base, *pat = rz_pattern();
    if (memcmp(p - RZ_LEAD, pat, RZ_LEAD))
        for (size_t i = 0; i < RZ_LEAD; i++)
            if (p[(long)i - (long)RZ_LEAD] != RZ_BYTE) return (long)i - (long)RZ_LEAD;
    const size_t tail = rz_tail(a.n);
    for (size_t o = 0; o < tail; o += RZ_TAIL) {
        const size_t m = tail - o < RZ_TAIL ? tail - o : RZ_TAIL;
        if (memcmp(p + a.n + o, pat, m))
            for (size_t i = o; i < o + m; i++)
                if (p[a.n + i] != RZ_BYTE) return (long)(a.n + i);
    }
    return 0;
}
[[noreturn]] void rz_fault(const char *when, uintptr_t base, const alloc_t &a, long at) {
    fprintf(stderr, "lily emu: %s: device memory at %p (%zu bytes) was written outside it, at byte offset %ld\n", when,
            (void *)base, a.n, at);
    abort();
}
void rz_check(const char *when, uintptr_t base, const alloc_t &a) {
    const long at = rz_damage(base, a);
    if (at) rz_fault(when, base, a, at);
}
void rz_check_all(const char *when) {
    for (auto &kv : allocs)
        if (kv.second.kind == M_DEV) rz_check(when, kv.first, kv.second);
}

/* The allocation holding [p, p + n) (n = 0: p may be its end), or allocs.end(). */
std::map<uintptr_t, alloc_t>::iterator find_alloc_it(const void *p, size_t n) {
    uintptr_t a = (uintptr_t)p;
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return allocs.end();
    --it;
    if (a - it->first + n > it->second.n) return allocs.end();
    if (n == 0 && a - it->first > it->second.n) return allocs.end();
    return it;
}
const alloc_t *find_alloc(const void *p, size_t n) {
    auto it = find_alloc_it(p, n);
    return it == allocs.end() ? NULL : &it->second;
}
bool dev_ok(const void *p, size_t n) {
    const alloc_t *a = find_alloc(p, n);
    return a && (a->kind == M_DEV || a->kind == M_MAPPED);
}

/* ---- fibers ---- */
#if defined(__x86_64__)
extern "C" void emu_ctx_switch(void **save, void *to);
extern "C" void emu_ctx_start(void);
/* Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
 * stores the stack pointer in *save and resumes the context whose stack pointer is `to`.
 * A fresh context starts in emu_ctx_start, which calls r13(r12). */
asm(R"(
    .text
    .globl emu_ctx_switch
    .type emu_ctx_switch, @function
emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_ctx_switch, .-emu_ctx_switch
    .globl emu_ctx_start
    .type emu_ctx_start, @function
emu_ctx_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size emu_ctx_start, .-emu_ctx_start
)");
struct ctx_t { void *sp; };
void ctx_init(ctx_t *c, char *stack, size_t size, void (*fn)(void *), void *arg) {
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    void **sp = (void **)(top - 80);
    unsigned mx;
    unsigned short cw;
    __asm__ volatile("stmxcsr %0" : "=m"(mx));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    memcpy((char *)sp, &mx, 4);
    memcpy((char *)sp + 4, &cw, 2);
    sp[1] = NULL;               /* r15 */
    sp[2] = NULL;               /* r14 */
    sp[3] = (void *)fn;         /* r13 */
    sp[4] = arg;                /* r12 */
    sp[5] = NULL;               /* rbx */
    sp[6] = NULL;               /* rbp */
    sp[7] = (void *)emu_ctx_start; /* return address: emu_ctx_start runs with rsp = top - 16 */
    c->sp = sp;
}
void ctx_switch(ctx_t *from, ctx_t *to) { emu_ctx_switch(&from->sp, to->sp); }
#else
#include <ucontext.h>
struct ctx_t { ucontext_t uc; };
void ctx_init(ctx_t *c, char *stack, size_t size, void (*fn)(void *), void *arg) {
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = stack;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL;
    makecontext(&c->uc, (void (*)(void))fn, 1, arg); /* pointer through one int argument: 64-bit ABIs pass it whole */
}
void ctx_switch(ctx_t *from, ctx_t *to) { swapcontext(&from->uc, &to->uc); }
#endif

/* F_SPIN: yielded in a wait loop (emu::spin), runnable again at the scheduler's next round;
 * F_WAIT_BAR: at a named barrier (emu::bar_named) */
enum { F_RUN, F_WAIT_WARP, F_WAIT_BLOCK, F_DONE, F_SPIN, F_WAIT_BAR };
struct fiber_t {
    ctx_t ctx;
    int state, lane, warp;
    int blk, bar_id;           /* its block among those running now; the named barrier it waits at */
    uint3 bidx;                /* blockIdx */
    unsigned long long serial; /* its block's number among all blocks run (mma_reuse's key) */
    char *dyn;                 /* its block's dynamic shared memory */
    unsigned nx;   /* warp exchanges done */
    unsigned nmma; /* mma_sync calls done */
    uint3 tid;
    struct cp_t { void *dst; const void *src; size_t n; unsigned group; };
    std::vector<cp_t> cp; /* cp.async copies not yet waited for */
    unsigned ncommit;     /* cp.async groups committed */
    unsigned long long carr; /* barrier.cluster arrivals made */
    char *stack;
    void *fake; /* ASan's fake stack while switched out */
    bool clean; /* its last run on this stack returned from the kernel body (ASan: only the top is poisoned) */
};
/* the last MMA_KEEP products of a warp, by call number */
const int MMA_KEEP = 64;
const size_t MMA_IN = 4096, MMA_OUT = 2048;
struct mma_entry {
    unsigned long long block;
    unsigned seq;
    size_t nin, nout;
    char in[MMA_IN], out[MMA_OUT];
};
struct warp_t {
    mma_entry *mma; /* MMA_KEEP entries, allocated at the first mma_sync */
    int live, arrived;
    unsigned exist; /* lanes present in the block */
    uint64_t slot[2][32];
    unsigned stamp[2][32];
    uint64_t blob[2][32][WARP_ALL_MAX / 8]; /* warp_all's deposits, double-buffered as slot */
};

const size_t STACK = 256 << 10; /* per fiber: kernels keep arrays in "registers" */
/* ASan: a kernel body that returned has unpoisoned its own frames (each function clears its redzones
 * on return), so what a finished fiber leaves poisoned is fiber_main's frame and the switch's, at the
 * stack's top. Unpoisoning the whole stack for every fiber of every block was a memset of 32 KB of
 * shadow a thread a block: a fifth of an ASan run of the batched decode loop's test. */
const size_t STACK_TOP = 32 << 10;
size_t page;
char *stacks;
int n_stacks;
std::vector<fiber_t> fib;
std::vector<warp_t> warps;
ctx_t sched;
int cur = -1, n_done;
/* the blocks running now: one, or a cooperative launch's all */
const int NBAR = 16;
struct blk_t { int bar_n[NBAR], bar_need[NBAR]; };
std::vector<blk_t> blks;
bool progressed; /* a fiber did more than spin since the scheduler's round began */
bool coop_running;
/* a cluster launch's running cluster: its blocks' dynamic shared memory by rank (empty: none), and
 * the barrier.cluster arrivals of all its threads */
std::vector<char *> cl_dyn;
unsigned long long cl_arrivals;
struct bulk_t { void *dst; const void *src; size_t n; };
struct mbar_t {
    unsigned count, pending;
    unsigned phase;
    long long tx;
    std::vector<bulk_t> q; /* bulk copies issued, landing at the next operation on the barrier */
};
std::map<const void *, mbar_t> mbars;
/* A cooperative launch's static __shared__ arrays (one C++ static each): the arrays hold the
 * resident block's contents, every other block's wait in its store (the arrays' bytes in the
 * order they were first declared), swapped when the scheduler switches to a fiber of another
 * block. */
std::vector<std::pair<void *, size_t>> coop_arrays;
std::vector<std::vector<char>> coop_store;
int coop_resident = -1;
void coop_swap(int to) {
    if (to == coop_resident) return;
    if (coop_resident >= 0) {
        size_t o = 0;
        for (auto &a : coop_arrays) { memcpy(coop_store[(size_t)coop_resident].data() + o, a.first, a.second); o += a.second; }
    }
    size_t o = 0;
    for (auto &a : coop_arrays) { memcpy(a.first, coop_store[(size_t)to].data() + o, a.second); o += a.second; }
    coop_resident = to;
}
#ifdef EMU_ASAN
const void *sched_bottom;
size_t sched_size;
#endif
const std::function<void()> *cur_body;

/* what runs now, for fault messages */
const char *cur_kernel;
bool in_kernel;

/* shared memory of the running block */
char *dyn_base;    /* dynamic: ends at a guard page */
size_t dyn_size, dyn_cap;
char *dyn_region;
std::vector<void *> shared_seen;
size_t shared_static, smem_limit;
int smem_attr = -1; /* the running kernel's cudaFuncAttributeMaxDynamicSharedMemorySize (-1: never set) */
unsigned long long n_launches, n_threads, n_blocks, n_mma, n_mma_reused, n_l2_prefetch_bytes;
std::map<std::string, unsigned long long> kernel_launches; /* by name, for LILY_EMU_STATS=kernels */

[[noreturn]] void fault(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "lily emu: kernel %s, block (%u,%u,%u)", cur_kernel ? cur_kernel : "?", blockIdx.x, blockIdx.y, blockIdx.z);
    if (cur >= 0) fprintf(stderr, ", thread (%u,%u,%u)", threadIdx.x, threadIdx.y, threadIdx.z);
    fprintf(stderr, ": ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

void on_segv(int sig, siginfo_t *si, void *) {
    if (in_kernel) {
        char msg[512];
        int n = snprintf(msg, sizeof msg,
                         "lily emu: kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s at address %p (a fiber stack overflow, "
                         "dynamic shared memory overrun, or a bad pointer)\n",
                         cur_kernel, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x, threadIdx.y, threadIdx.z,
                         sig == SIGSEGV ? "segmentation fault" : "bus error", si->si_addr);
        if (n > 0) { ssize_t w = write(2, msg, (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1); (void)w; }
    }
    signal(sig, SIG_DFL);
}

void install_segv(void) {
#ifdef EMU_ASAN
    return; /* ASan's own handler reports faults */
#endif
    static thread_local bool alt;
    static bool handler;
    if (!alt) { /* the handler needs its own stack when a fiber's stack overflowed */
        stack_t ss;
        ss.ss_size = 64 << 10;
        ss.ss_sp = malloc(ss.ss_size);
        ss.ss_flags = 0;
        if (ss.ss_sp) sigaltstack(&ss, NULL);
        alt = true;
    }
    if (!handler) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_segv;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        handler = true;
    }
}

void ensure_stacks(int n) {
    if (n <= n_stacks) return;
    if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
    if (stacks) munmap(stacks, (size_t)n_stacks * (STACK + page));
    size_t per = STACK + page;
    stacks = (char *)mmap(NULL, (size_t)n * per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks == MAP_FAILED) { perror("lily emu: fiber stacks"); abort(); }
    for (int i = 0; i < n; i++) mprotect(stacks + (size_t)i * per, page, PROT_NONE); /* guard below each stack */
    n_stacks = n;
    fib.resize((size_t)n);
    for (fiber_t &f : fib) f.clean = false; /* new stacks: unpoisoned whole before their first run */
}

void ensure_dyn(size_t n) {
    if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
    size_t need = (n + page - 1) / page * page;
    if (need <= dyn_cap && dyn_region) return;
    if (dyn_region) munmap(dyn_region, dyn_cap + page);
    dyn_region = (char *)mmap(NULL, need + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (dyn_region == MAP_FAILED) { perror("lily emu: shared memory"); abort(); }
    mprotect(dyn_region + need, page, PROT_NONE); /* reading past the dynamic shared memory faults */
    dyn_cap = need;
}

void yield(void) {
    int me = cur;
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(&fib[me].fake, sched_bottom, sched_size);
    ctx_switch(&fib[me].ctx, &sched);
    __sanitizer_finish_switch_fiber(fib[me].fake, &sched_bottom, &sched_size);
#else
    ctx_switch(&fib[me].ctx, &sched);
#endif
}

void fiber_main(void *) {
#ifdef EMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &sched_bottom, &sched_size);
#endif
    (*cur_body)();
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    f.state = F_DONE;
    f.clean = true;
    n_done++;
    w.live--;
    if (w.arrived && w.arrived == w.live) { /* the lanes left were waiting only for this one */
        int lo = f.warp * 32;
        for (int l = 0; l < 32; l++)
            if ((w.exist >> l & 1) && fib[lo + l].state == F_WAIT_WARP) fib[lo + l].state = F_RUN;
        w.arrived = 0;
    }
#ifdef EMU_ASAN
    __sanitizer_start_switch_fiber(NULL, sched_bottom, sched_size); /* this fiber's stack is done */
#endif
    ctx_switch(&f.ctx, &sched);
    abort(); /* never resumed */
}

void warp_arrive(unsigned mask) {
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    if (mask & ~w.exist) fault("warp operation with mask %08x names lanes absent from the block (present %08x)", mask, w.exist);
    f.state = F_WAIT_WARP;
    if (++w.arrived == w.live) {
        int lo = f.warp * 32;
        for (int l = 0; l < 32; l++)
            if ((w.exist >> l & 1) && fib[lo + l].state == F_WAIT_WARP) fib[lo + l].state = F_RUN;
        w.arrived = 0;
        return; /* the last lane goes on without a switch */
    }
    yield();
}

void switch_to(int i) {
    if (coop_running) coop_swap(fib[i].blk);
    cur = i;
    threadIdx = fib[i].tid;
    blockIdx = fib[i].bidx;
    dyn_base = fib[i].dyn;
#ifdef EMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, fib[i].stack, STACK);
    ctx_switch(&sched, &fib[i].ctx);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    ctx_switch(&sched, &fib[i].ctx);
#endif
    cur = -1;
    if (fib[i].state != F_SPIN) progressed = true;
}

/* LILY_EMU_ORDER: the order blocks, warps and lanes run in: forward (default), reverse, or
 * random (LILY_EMU_SEED); correct kernels give the same results in every order. */
int order = -1;
uint64_t order_rng = 1;
unsigned next_rand(void) {
    order_rng ^= order_rng << 13;
    order_rng ^= order_rng >> 7;
    order_rng ^= order_rng << 17;
    return (unsigned)(order_rng >> 11);
}
void read_order(void) {
    if (order >= 0) return;
    const char *o = getenv("LILY_EMU_ORDER"), *sd = getenv("LILY_EMU_SEED");
    order = o && !strcmp(o, "reverse") ? 1 : o && !strcmp(o, "random") ? 2 : 0;
    if (sd) order_rng = strtoull(sd, NULL, 10) * 0x9e3779b97f4a7c15ull + 1;
}
template <class T> void make_perm(T *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = (T)(order == 1 ? n - 1 - i : i);
    if (order == 2)
        for (size_t i = n; i > 1; i--) {
            size_t j = next_rand() % i;
            T t = p[i - 1];
            p[i - 1] = p[j];
            p[j] = t;
        }
}

/* Runs nb blocks' threads to their end: one block (a plain launch runs its blocks one after
 * another) or every block of a cooperative launch, interleaved, so that blocks can wait for each
 * other. bids: the blocks' indices; dyn: block b's dynamic shared memory at dyn[b]. A block's
 * fibers are fib[b * nt ..], its warps warps[b * nw ..] (nb > 1 needs nt a multiple of 32, so that
 * a warp's lanes are fib[32 * warp ..]). */
void run_blocks(int nt, const std::vector<uint3> &bids, const std::vector<char *> &dyn) {
    unsigned bx = blockDim.x, by = blockDim.y;
    const int nb = (int)bids.size(), nw = (nt + 31) / 32;
    blks.assign((size_t)nb, blk_t{});
    mbars.clear();
    coop_arrays.clear();
    coop_store.assign(coop_running ? (size_t)nb : 0, std::vector<char>());
    coop_resident = -1;
    for (int b = 0; b < nb; b++)
        for (int t = 0; t < nt; t++) {
            const int i = b * nt + t;
            fiber_t &f = fib[i];
            const bool clean = f.clean && f.state == F_DONE;
            f.clean = false;
            f.state = F_RUN;
            f.lane = t % 32;
            f.warp = b * nw + t / 32;
            f.blk = b;
            f.bidx = bids[b];
            f.serial = n_blocks + (unsigned long long)b;
            f.dyn = dyn[b];
            f.nx = 0;
            f.nmma = 0;
            f.cp.clear();
            f.ncommit = 0;
            f.carr = 0;
            f.tid = uint3{ (unsigned)t % bx, ((unsigned)t / bx) % by, (unsigned)t / (bx * by) };
            f.stack = stacks + (size_t)i * (STACK + page) + page;
#ifdef EMU_ASAN
            /* frames of the fiber that ran here before: the top only after a finished body */
            if (clean) __asan_unpoison_memory_region(f.stack + STACK - STACK_TOP, STACK_TOP);
            else __asan_unpoison_memory_region(f.stack, STACK);
#else
            (void)clean;
#endif
            ctx_init(&f.ctx, f.stack, STACK, fiber_main, NULL);
        }
    for (int b = 0; b < nb; b++)
        for (int w = 0; w < nw; w++) {
            warp_t &W = warps[(size_t)b * nw + w];
            int n = nt - 32 * w < 32 ? nt - 32 * w : 32;
            W.live = n;
            W.arrived = 0;
            W.exist = n == 32 ? 0xffffffffu : (1u << n) - 1;
            memset(W.stamp, 0xff, sizeof W.stamp);
        }
    n_done = 0;
    cl_arrivals = 0;
    shared_seen.clear();
    shared_static = 0;
    for (int b = 0; b < nb; b++)
        if (dyn_size) memset(dyn[b], 0xff, dyn_size); /* uninitialised shared memory reads as NaN / -1 */
    int wperm[32], lperm[32];
    make_perm(wperm, nw);
    make_perm(lperm, 32);
    std::vector<int> bperm((size_t)nb);
    make_perm(bperm.data(), (size_t)nb);
    int idle = 0;
    for (;;) {
        progressed = false;
        for (int kb = 0; kb < nb; kb++) {
            const int b = bperm[kb], f0 = b * nt, f1 = f0 + nt;
            for (int k = 0; k < nw; k++) {
                int w = wperm[k];
                int lo = f0 + 32 * w, hi = lo + 32 < f1 ? lo + 32 : f1;
                bool any;
                do {
                    any = false;
                    for (int j = 0; j < 32; j++) {
                        int i = lo + lperm[j];
                        if (i < hi && fib[i].state == F_RUN) { switch_to(i); any = true; }
                    }
                } while (any);
                if (warps[(size_t)b * nw + w].arrived) { /* some lanes wait at a warp operation: fine while the others spin or wait at a named barrier */
                    int a = -1, c = -1;
                    for (int i = lo; i < hi; i++) {
                        if (fib[i].state == F_WAIT_WARP && a < 0) a = i;
                        if (fib[i].state == F_WAIT_BLOCK && c < 0) c = i;
                    }
                    if (c >= 0) {
                        cur = a;
                        threadIdx = fib[a].tid;
                        blockIdx = fib[a].bidx;
                        fault("waits at a warp operation (shuffle/__syncwarp/ballot) that lane %d of its warp never reaches: it waits at "
                              "__syncthreads",
                              (c - f0) % 32);
                    }
                }
            }
            /* __syncthreads: released when every thread of the block not yet exited is at it */
            bool all = true, some = false;
            for (int i = f0; i < f1 && all; i++) {
                if (fib[i].state == F_WAIT_BLOCK) some = true;
                else if (fib[i].state != F_DONE) all = false;
            }
            if (all && some) {
                for (int i = f0; i < f1; i++)
                    if (fib[i].state == F_WAIT_BLOCK) fib[i].state = F_RUN;
                progressed = true;
            }
        }
        if (n_done == nb * nt) break;
        bool spinning = false;
        for (int i = 0; i < nb * nt; i++)
            if (fib[i].state == F_SPIN) { fib[i].state = F_RUN; spinning = true; }
        if (progressed) { idle = 0; continue; }
        /* a round in which no thread did more than spin: none will (the spinning ones saw the same
         * memory twice); a few rounds, for waits that complete a barrier as they test it */
        if (!spinning || ++idle >= 4) {
            int i = 0;
            while (fib[i].state == F_DONE) i++;
            cur = i;
            threadIdx = fib[i].tid;
            blockIdx = fib[i].bidx;
            fault("deadlock: every thread left waits (%s)%s",
                  spinning ? "a spin loop on a flag or mbarrier that no thread will complete" : "at barriers that cannot complete",
                  nb == 1 && (size_t)gridDim.x * gridDim.y * gridDim.z > 1
                      ? "; in a launch that is not cooperative, blocks run one after another, so a block cannot wait for another"
                      : "");
        }
    }
    blks.clear();
    mbars.clear();
}

void run_grid(const char *name, const emu::launch_cfg &c, const std::function<void()> &body) {
    install_segv();
    int nt = (int)(c.block.x * c.block.y * c.block.z);
    ensure_stacks(nt < 32 ? 32 : nt);
    if ((int)warps.size() < (nt + 31) / 32) warps.resize((size_t)(nt + 31) / 32);
    ensure_dyn(c.smem);
    dyn_size = c.smem;
    dyn_base = dyn_region + dyn_cap - ((c.smem + 15) & ~(size_t)15);
    gridDim = c.grid;
    blockDim = c.block;
    cur_body = &body;
    cur_kernel = name;
    in_kernel = true;
    n_launches++;
    kernel_launches[name]++;
    read_order();
    size_t nb = (size_t)c.grid.x * c.grid.y * c.grid.z;
    auto bid = [&](size_t b) { return uint3{ (unsigned)(b % c.grid.x), (unsigned)(b / c.grid.x % c.grid.y), (unsigned)(b / c.grid.x / c.grid.y) }; };
    if ((c.coop && nb > 1) || c.cluster > 1) {
        /* blocks that run at once: a cooperative launch's all, or each cluster's (rank r: x % gn, the
         * clusters tiling x), the groups one after another */
        const size_t gn = c.coop ? nb : c.cluster;
        if (!c.coop && (c.grid.x % gn || gn > 16)) fault("a cluster of %zu blocks in a grid of %u along x (a divisor of it, at most 16)", gn, c.grid.x);
        if (nt % 32) fault("a %s launch of %d threads a block (the emulator needs whole warps)", c.coop ? "cooperative" : "cluster", nt);
        /* every block's dynamic shared memory, each ending at a guard page */
        const size_t per = (c.smem + page - 1) / page * page + page;
        char *region = (char *)mmap(NULL, gn * per, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (region == MAP_FAILED) { perror("lily emu: shared memory"); abort(); }
        std::vector<char *> dyn(gn);
        for (size_t r = 0; r < gn; r++) {
            mprotect(region + (r + 1) * per - page, page, PROT_NONE);
            dyn[r] = region + (r + 1) * per - page - ((c.smem + 15) & ~(size_t)15);
        }
        ensure_stacks((int)(gn * nt));
        if (warps.size() < gn * (size_t)(nt / 32)) warps.resize(gn * (size_t)(nt / 32));
        const size_t ngr = nb / gn;
        std::vector<size_t> gperm(ngr);
        make_perm(gperm.data(), ngr);
        for (size_t k = 0; k < ngr; k++) {
            std::vector<uint3> bids(gn);
            for (size_t r = 0; r < gn; r++) bids[r] = bid(gperm[k] * gn + r);
            coop_running = true;
            if (!c.coop) cl_dyn = dyn;
            run_blocks(nt, bids, dyn);
            cl_dyn.clear();
            coop_running = false;
        }
        n_blocks += nb;
        n_threads += (unsigned long long)nt * nb;
        munmap(region, gn * per);
    } else {
        std::vector<size_t> bperm;
        if (order) {
            bperm.resize(nb);
            make_perm(bperm.data(), nb);
        }
        for (size_t k = 0; k < nb; k++) {
            size_t b = order ? bperm[k] : k;
            run_blocks(nt, std::vector<uint3>{ bid(b) }, std::vector<char *>{ dyn_base }); /* (a fiber's switch sets blockIdx) */
            n_blocks++;
            n_threads += (unsigned long long)nt;
        }
    }
    in_kernel = false;
    cur_body = NULL;
}

/* ---- streams, events, graphs ---- */
} // namespace

/* A capture: the stream that began it (origin) owns it; another stream joins it by waiting on an
 * event recorded into it (a fork), and must be waited on by a stream of the capture again before it
 * ends (the join), as with CUDA. Ops go in host-call order, a valid order of the captured graph. */
struct emu_stream;
struct emu_graph {
    std::vector<std::function<void()>> ops;
    bool invalidated = false;
    std::vector<emu_stream *> forked; /* streams that joined the capture */
};
struct emu_stream {
    unsigned flags;
    emu_graph *capture; /* non-NULL while capturing (its own or, forked, the origin's) */
    unsigned long long nops; /* ops enqueued so far (which an event's record saw) */
    bool forked;             /* capture is another stream's */
    unsigned long long joined_at; /* forked: nops when the capture last waited on it */
};
struct emu_event {
    unsigned flags;
    double t;
    bool recorded;
    emu_graph *cap;       /* recorded into this capture (NULL: outside any) */
    emu_stream *from;     /* where, and after how many of its ops */
    unsigned long long nops;
};

namespace {
std::map<const void *, int> func_smem_max; /* cudaFuncAttributeMaxDynamicSharedMemorySize */
std::map<const void *, int> func_nonportable; /* cudaFuncAttributeNonPortableClusterSizeAllowed */
const size_t SMEM_DEFAULT = 48 << 10, SMEM_OPTIN = 227 << 10;

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
bool capturing(cudaStream_t s) { return s && s->capture; }
/* runs op now, or records it into the stream's capture */
void enqueue(cudaStream_t s, std::function<void()> op) {
    if (s) s->nops++;
    if (capturing(s)) s->capture->ops.push_back(std::move(op));
    else op();
}
struct stats_t {
    ~stats_t() {
        const char *v = getenv("LILY_EMU_STATS");
        if (v)
            fprintf(stderr, "lily emu: %llu launches, %llu blocks, %llu threads, %llu mma_sync (%llu reused), %llu bytes of L2 prefetch\n",
                    n_launches, n_blocks, n_threads, n_mma, n_mma_reused, n_l2_prefetch_bytes);
        if (v && !strcmp(v, "kernels")) /* a test can check which kernels a run took */
            for (auto &kv : kernel_launches) fprintf(stderr, "lily emu: kernel %s: %llu launches\n", kv.first.c_str(), kv.second);
    }
} stats;
} // namespace

namespace emu {
static bool read_tf32_off(void) {
    const char *e = getenv("LILY_EMU_TF32");
    return e && !strcmp(e, "fp32");
}
const bool tf32_off = read_tf32_off();
int lane_id(void) { return cur >= 0 ? fib[cur].lane : 0; }
void cp_async(void *dst, const void *src, size_t n) {
    if (cur < 0) { memcpy(dst, src, n); return; }
    fib[cur].cp.push_back(fiber_t::cp_t{ dst, src, n, fib[cur].ncommit });
}
void cp_commit(void) {
    if (cur >= 0) fib[cur].ncommit++;
}
void cp_wait(int n) {
    if (cur < 0) return;
    fiber_t &f = fib[cur];
    size_t k = 0;
    for (size_t i = 0; i < f.cp.size(); i++) {
        const fiber_t::cp_t &c = f.cp[i];
        if (c.group + (unsigned)n < f.ncommit) memcpy(c.dst, c.src, c.n);
        else f.cp[k++] = c;
    }
    f.cp.resize(k);
}

static mbar_t &mb_get(void *bar) {
    auto it = mbars.find(bar);
    if (it == mbars.end()) fault("mbarrier %p used before mbarrier.init in this block", bar);
    return it->second;
}
static void mb_complete(mbar_t &m) {
    if (m.pending || m.tx) return;
    m.phase ^= 1;
    m.pending = m.count;
    progressed = true;
}
/* the barrier's bulk copies land (on the GPU they land on their own: by the next operation on
 * the barrier at the latest, here) */
static void mb_land(mbar_t &m) {
    if (m.q.empty()) return;
    for (const bulk_t &c : m.q) {
        memcpy(c.dst, c.src, c.n);
        m.tx -= (long long)c.n;
    }
    m.q.clear();
    mb_complete(m);
}
void mb_init(void *bar, unsigned count) {
    if (cur < 0) fault("mbarrier.init outside a kernel");
    if (!count || count >= (1u << 20)) fault("mbarrier.init with count %u", count);
    mbars[bar] = mbar_t{ count, count, 0, 0, {} };
}
void mb_arrive(void *bar, unsigned tx) {
    mbar_t &m = mb_get(bar);
    mb_land(m);
    if (!m.pending) fault("mbarrier %p: more arrivals than its count (%u) in one phase", bar, m.count);
    m.tx += tx;
    m.pending--;
    mb_complete(m);
}
void bulk_g2s(void *dst, const void *src, size_t n, void *bar) {
    if (!n || n % 16 || (uintptr_t)dst % 16 || (uintptr_t)src % 16) fault("bulk copy of %zu bytes from %p to %p: size and addresses must be multiples of 16", n, src, dst);
    if (!dev_ok(src, n)) fault("bulk copy from %p (%zu bytes): not device memory", src, n);
    mbar_t &m = mb_get(bar);
    memset(dst, 0xff, n);
    m.q.push_back(bulk_t{ dst, src, n });
}
void l2_prefetch(const void *src, size_t n) {
    if (!n || n % 16 || (uintptr_t)src % 16) fault("bulk L2 prefetch of %zu bytes from %p: size and address must be multiples of 16", n, src);
    if (!dev_ok(src, n)) fault("bulk L2 prefetch of [%p, +%zu): not device memory", src, n);
    n_l2_prefetch_bytes += n;
}
bool mb_test(void *bar, unsigned parity) {
    mbar_t &m = mb_get(bar);
    mb_land(m);
    return (m.phase & 1) != (parity & 1);
}
void bar_named(int id, int n) {
    if (cur < 0) fault("bar.sync outside a kernel");
    fiber_t &f = fib[cur];
    if (id < 0 || id >= NBAR || n <= 0 || n % 32 || n > (int)(blockDim.x * blockDim.y * blockDim.z))
        fault("bar.sync %d, %d: barrier 0-15, a thread count that is a multiple of 32 and at most the block's", id, n);
    blk_t &B = blks[(size_t)f.blk];
    if (!B.bar_n[id]) B.bar_need[id] = n;
    else if (B.bar_need[id] != n) fault("bar.sync %d: threads arrive with counts %d and %d", id, B.bar_need[id], n);
    if (++B.bar_n[id] == n) {
        const int nt = (int)(blockDim.x * blockDim.y * blockDim.z), f0 = f.blk * nt;
        for (int i = f0; i < f0 + nt; i++)
            if (fib[i].state == F_WAIT_BAR && fib[i].bar_id == id) fib[i].state = F_RUN;
        B.bar_n[id] = 0;
        return; /* the last thread goes on */
    }
    f.state = F_WAIT_BAR;
    f.bar_id = id;
    yield();
}
int cluster_rank(void) { return cur >= 0 && !cl_dyn.empty() ? fib[cur].blk : 0; }
void cluster_arrive(void) {
    if (cur < 0) fault("barrier.cluster outside a kernel");
    fib[cur].carr++;
    cl_arrivals++;
    progressed = true;
}
void cluster_wait(void) {
    if (cur < 0) fault("barrier.cluster outside a kernel");
    const unsigned long long n = (unsigned long long)blks.size() * blockDim.x * blockDim.y * blockDim.z;
    if (!fib[cur].carr) fault("barrier.cluster.wait before the thread's arrive");
    while (cl_arrivals < fib[cur].carr * n) spin();
}
void *cluster_map(const void *p, int rank) {
    if (cur < 0) fault("mapa outside a kernel");
    const char *q = (const char *)p;
    if (!(q >= dyn_base && q < dyn_base + dyn_size)) fault("mapa of %p: not in the block's dynamic shared memory (the emulator maps only that)", p);
    const int n = cl_dyn.empty() ? 1 : (int)cl_dyn.size();
    if (rank < 0 || rank >= n) fault("mapa to rank %d of a cluster of %d blocks", rank, n);
    return cl_dyn.empty() ? (void *)q : (void *)(cl_dyn[(size_t)rank] + (q - dyn_base));
}
void spin(void) {
    if (cur < 0) return;
    fib[cur].state = F_SPIN;
    yield();
}
unsigned long long clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

uint64_t shfl(unsigned mask, uint64_t v, int src) {
    if (cur < 0) fault("warp shuffle outside a kernel");
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    int b = f.nx & 1, me = cur;
    w.slot[b][f.lane] = v;
    w.stamp[b][f.lane] = f.nx;
    warp_arrive(mask);
    fiber_t &g = fib[me];
    uint64_t r = v;
    if (src >= 0) {
        if (src >= 32 || !(w.exist >> src & 1) || w.stamp[b][src] != g.nx)
            fault("shuffle reads lane %d, which did not take part in this exchange", src);
        r = w.slot[b][src];
    }
    g.nx++;
    return r;
}

void warp_all(const void *mine, size_t n, void *all) {
    if (cur < 0) fault("warp exchange outside a kernel");
    if (n > WARP_ALL_MAX) fault("warp exchange of %zu bytes (at most %d)", n, WARP_ALL_MAX);
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    int b = f.nx & 1, me = cur;
    memcpy(w.blob[b][f.lane], mine, n);
    w.stamp[b][f.lane] = f.nx;
    warp_arrive(0xffffffffu);
    fiber_t &g = fib[me];
    for (int l = 0; l < 32; l++) {
        if (!(w.exist >> l & 1) || w.stamp[b][l] != g.nx) fault("warp exchange: lane %d did not take part", l);
        memcpy((char *)all + l * n, w.blob[b][l], n);
    }
    g.nx++;
}

bool mma_reuse(const void *in, size_t nin, void *out, size_t nout) {
    n_mma++;
    if (cur < 0 || nin > MMA_IN || nout > MMA_OUT) return false;
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    if (!w.mma) return false;
    mma_entry &e = w.mma[f.nmma % MMA_KEEP];
    if (e.block != f.serial || e.seq != f.nmma || e.nin != nin || e.nout != nout || memcmp(e.in, in, nin)) return false;
    memcpy(out, e.out, nout);
    f.nmma++;
    n_mma_reused++;
    return true;
}
void mma_keep(const void *in, size_t nin, const void *out, size_t nout) {
    if (cur < 0) return;
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    unsigned seq = f.nmma++;
    if (nin > MMA_IN || nout > MMA_OUT) return;
    if (!w.mma) w.mma = (mma_entry *)calloc(MMA_KEEP, sizeof(mma_entry));
    if (!w.mma) return;
    mma_entry &e = w.mma[seq % MMA_KEEP];
    e.block = f.serial;
    e.seq = seq;
    e.nin = nin;
    e.nout = nout;
    memcpy(e.in, in, nin);
    memcpy(e.out, out, nout);
}

void *dyn_smem(size_t elem) {
    if (!in_kernel) fault("dynamic shared memory outside a kernel");
    if ((uintptr_t)dyn_base % (elem < 16 ? elem : 16)) fault("dynamic shared memory misaligned for its element size %zu", elem);
    return dyn_base;
}

void shared(void *p, size_t n) {
    if (coop_running) { /* registered once a launch: every block's copy starts poisoned */
        for (auto &a : coop_arrays)
            if (a.first == p) return;
        coop_arrays.push_back({ p, n });
        for (auto &st : coop_store) st.resize(st.size() + n, (char)0xff);
    }
    for (void *q : shared_seen)
        if (q == p) return;
    shared_seen.push_back(p);
    shared_static += n;
    if (shared_static + dyn_size > smem_limit)
        fault("%zu bytes of static + %zu of dynamic shared memory exceed the block's %zu", shared_static, dyn_size, smem_limit);
    if (smem_attr >= 0 && shared_static + (size_t)smem_attr > SMEM_OPTIN)
        fault("%zu bytes of static shared memory and a cudaFuncAttributeMaxDynamicSharedMemorySize of %d exceed the %zu a block "
              "can have: on the GPU that cudaFuncSetAttribute fails, and then this launch",
              shared_static, smem_attr, SMEM_OPTIN);
    memset(p, 0xff, n); /* fresh for every block: what another block left is not readable */
}

void submit(const char *name, const void *kernel, const launch_cfg &c, std::shared_ptr<std::function<void()>> body,
            const void *const *ptrs, int nptrs, int max_threads) {
    LOCK;
    unsigned nt = c.block.x * c.block.y * c.block.z;
    /* past 8 blocks a cluster the GPU refuses the launch unless the kernel was opted in */
    if (c.cluster > 8 && !func_nonportable[kernel])
        fault("a cluster of %u blocks without cudaFuncAttributeNonPortableClusterSizeAllowed (the portable most is 8)", c.cluster);
    if (!c.grid.x || !c.grid.y || !c.grid.z || c.grid.y > 65535 || c.grid.z > 65535 || !nt || nt > 1024 || c.block.x > 1024 ||
        c.block.y > 1024 || c.block.z > 64) {
        fail(cudaErrorInvalidConfiguration);
        return;
    }
    if (max_threads > 0 && nt > (unsigned)max_threads) { /* more threads than __launch_bounds__ compiled for */
        fail(cudaErrorLaunchOutOfResources);
        return;
    }
    size_t lim = SMEM_DEFAULT;
    auto it = func_smem_max.find(kernel);
    if (it != func_smem_max.end() && (size_t)it->second > lim) lim = (size_t)it->second;
    if (c.smem > lim) { fail(cudaErrorInvalidValue); return; }
    if (c.stream && c.stream->capture && c.stream->capture->invalidated) { fail(cudaErrorStreamCaptureInvalidated); return; }
    cur_kernel = name;
    std::vector<uintptr_t> args; /* the device allocations the pointer arguments point into */
    for (int i = 0; i < nptrs; i++) {
        if (!ptrs[i]) continue;
        if (!dev_ok(ptrs[i], 0))
            fault("argument %d (pointer %p) is not in device memory (a host pointer, freed, or out of any allocation)", i, ptrs[i]);
        auto a = find_alloc_it(ptrs[i], 0);
        if (a->second.kind == M_DEV) args.push_back(a->first);
    }
    cur_kernel = NULL;
    launch_cfg cc = c;
    /* the dynamic size is bounded by the kernel's attribute (above); static plus dynamic by 48 KB,
     * or by the opt-in maximum once the kernel has raised its attribute past 48 KB */
    size_t slim = lim > SMEM_DEFAULT ? SMEM_OPTIN : SMEM_DEFAULT;
    const int attr = it != func_smem_max.end() ? it->second : -1;
    enqueue(c.stream, [name, cc, body, slim, attr, args]() {
        smem_limit = slim;
        smem_attr = attr;
        run_grid(name, cc, *body);
        for (uintptr_t b : args) {
            auto a = allocs.find(b);
            if (a == allocs.end()) continue; /* (freed before a captured graph ran: the launch check covers it) */
            char when[256];
            snprintf(when, sizeof when, "kernel %s", name);
            rz_check(when, b, a->second);
        }
    });
}
} // namespace emu

void __syncthreads(void) {
    if (cur < 0) fault("__syncthreads outside a kernel");
    fib[cur].state = F_WAIT_BLOCK;
    yield();
}
void __syncwarp(unsigned mask) {
    if (cur < 0) fault("__syncwarp outside a kernel");
    warp_arrive(mask);
}
unsigned __ballot_sync(unsigned mask, int pred) {
    if (cur < 0) fault("__ballot_sync outside a kernel");
    fiber_t &f = fib[cur];
    warp_t &w = warps[f.warp];
    int b = f.nx & 1, me = cur;
    w.slot[b][f.lane] = pred != 0;
    w.stamp[b][f.lane] = f.nx;
    warp_arrive(mask);
    fiber_t &g = fib[me];
    unsigned r = 0;
    for (int l = 0; l < 32; l++)
        if ((mask >> l & 1) && (w.exist >> l & 1) && w.stamp[b][l] == g.nx && w.slot[b][l]) r |= 1u << l;
    g.nx++;
    return r;
}

/* ---- device and errors ---- */
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int dev) {
    if (dev != 0) return fail(cudaErrorInvalidValue);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "lily CPU emulator (sm_90)");
    p->totalGlobalMem = EMU_TOTAL;
    p->sharedMemPerBlock = SMEM_DEFAULT;
    p->sharedMemPerBlockOptin = SMEM_OPTIN;
    p->sharedMemPerMultiprocessor = 228 << 10;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->clockRate = 1980000;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    p->maxThreadsPerMultiProcessor = 2048;
    p->memoryClockRate = 2619000;
    p->memoryBusWidth = 6144;
    p->l2CacheSize = 50 << 20;
    p->canMapHostMemory = 1;
    p->unifiedAddressing = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : fail(cudaErrorInvalidValue); }
cudaError_t cudaGetDevice(int *dev) { *dev = 0; return cudaSuccess; }
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes *a, const void *func) {
    if (!func) return fail(cudaErrorInvalidDeviceFunction);
    memset(a, 0, sizeof *a);
    a->maxThreadsPerBlock = 1024;
    a->maxDynamicSharedSizeBytes = (int)SMEM_DEFAULT;
    a->ptxVersion = a->binaryVersion = 90;
    return cudaSuccess;
}
cudaError_t cudaFuncSetAttribute(const void *func, cudaFuncAttribute attr, int value) {
    LOCK;
    if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (value < 0 || (size_t)value > SMEM_OPTIN) return fail(cudaErrorInvalidValue);
        func_smem_max[func] = value;
    }
    if (attr == cudaFuncAttributeNonPortableClusterSizeAllowed) func_nonportable[func] = value;
    return cudaSuccess;
}
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *func, int block, size_t smem) {
    if (!func || !n || block <= 0 || block > 1024) return fail(cudaErrorInvalidValue);
    int by_threads = 2048 / block, by_smem = smem ? (int)((228u << 10) / (smem + 1024)) : 32;
    *n = by_threads < by_smem ? by_threads : by_smem;
    if (*n > 32) *n = 32;
    return cudaSuccess;
}
cudaError_t cudaDeviceSetLimit(cudaLimit, size_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { LOCK; rz_check_all("cudaDeviceSynchronize"); return cudaSuccess; }
cudaError_t cudaDeviceReset(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) {
    LOCK;
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) { LOCK; return last_err; }
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDeviceFunction: return "cudaErrorInvalidDeviceFunction";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    }
    return "cudaErrorUnknown";
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidDeviceFunction: return "invalid device function";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnjoined: return "capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    }
    return "unknown error";
}

/* ---- memory ---- */
cudaError_t cudaMalloc(void **p, size_t n) {
    LOCK;
    *p = NULL;
    if (dev_bytes + n > EMU_TOTAL) return fail(cudaErrorMemoryAllocation);
    void *r = NULL;
    if (posix_memalign(&r, 256, RZ_LEAD + n + rz_tail(n))) return fail(cudaErrorMemoryAllocation);
    unsigned char *q = (unsigned char *)r + RZ_LEAD;
    memset(r, RZ_BYTE, RZ_LEAD);
    memset(q, 0xff, n); /* device memory starts as garbage: NaN floats, -1 ints */
    memset(q + n, RZ_BYTE, rz_tail(n));
#ifdef EMU_ASAN
    __asan_poison_memory_region(r, RZ_LEAD);
    __asan_poison_memory_region(q + n, rz_tail(n));
#endif
    allocs[(uintptr_t)q] = alloc_t{ n, M_DEV };
    dev_bytes += n;
    *p = q;
    return cudaSuccess;
}
static cudaError_t free_kind(void *p, int kind) {
    LOCK;
    if (!p) return cudaSuccess;
    auto it = allocs.find((uintptr_t)p);
    if (it == allocs.end() || (kind == M_DEV) != (it->second.kind == M_DEV)) return fail(cudaErrorInvalidValue);
    if (kind == M_DEV) {
        rz_check("cudaFree", it->first, it->second);
        dev_bytes -= it->second.n;
#ifdef EMU_ASAN
        __asan_unpoison_memory_region((char *)p - RZ_LEAD, RZ_LEAD + it->second.n + rz_tail(it->second.n));
#endif
    }
    allocs.erase(it);
    free(kind == M_DEV ? (char *)p - RZ_LEAD : p);
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) { return free_kind(p, M_DEV); }
cudaError_t cudaMallocHost(void **p, size_t n) { return cudaHostAlloc(p, n, 0); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    LOCK;
    *p = NULL;
    void *q = NULL;
    if (posix_memalign(&q, 256, n ? n : 1)) return fail(cudaErrorMemoryAllocation);
    allocs[(uintptr_t)q] = alloc_t{ n, (flags & cudaHostAllocMapped) ? M_MAPPED : M_HOST };
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) { return free_kind(p, M_HOST); }
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned) {
    LOCK;
    const alloc_t *a = find_alloc(h, 1);
    if (!a || a->kind != M_MAPPED) return fail(cudaErrorInvalidValue);
    *d = h; /* one address space */
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *fr, size_t *total) {
    LOCK;
    *fr = EMU_TOTAL - dev_bytes;
    *total = EMU_TOTAL;
    return cudaSuccess;
}
static cudaError_t check_copy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    if (!n) return cudaSuccess;
    bool dd = k == cudaMemcpyHostToDevice || k == cudaMemcpyDeviceToDevice, sd = k == cudaMemcpyDeviceToHost || k == cudaMemcpyDeviceToDevice;
    if (k > cudaMemcpyDefault) return cudaErrorInvalidMemcpyDirection;
    if ((dd && !dev_ok(dst, n)) || (sd && !dev_ok(src, n))) return cudaErrorInvalidValue;
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    LOCK;
    cudaError_t e = check_copy(dst, src, n, k);
    if (e) {
        fprintf(stderr, "lily emu: cudaMemcpy of %zu bytes %p -> %p (kind %d) outside device memory\n", n, src, dst, (int)k);
        return fail(e);
    }
    if (n) enqueue(s, [dst, src, n, k]() {
        if (k == cudaMemcpyDeviceToHost || k == cudaMemcpyDefault) rz_check_all("a copy to the host");
        memmove(dst, src, n);
    });
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) { return cudaMemcpyAsync(dst, src, n, k, 0); }
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    LOCK;
    if (n && !dev_ok(p, n)) {
        fprintf(stderr, "lily emu: cudaMemset of %zu bytes at %p outside device memory\n", n, p);
        return fail(cudaErrorInvalidValue);
    }
    if (n) enqueue(s, [p, v, n]() { memset(p, v, n); });
    return cudaSuccess;
}
cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, 0); }

/* ---- streams and graphs ---- */
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new emu_stream{ flags, NULL, 0, false, 0 };
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCK;
    if (!s) return fail(cudaErrorInvalidResourceHandle);
    if (!s->forked) delete s->capture;
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    LOCK;
    if (capturing(s)) { s->capture->invalidated = true; return fail(cudaErrorStreamCaptureUnsupported); }
    rz_check_all("cudaStreamSynchronize");
    return cudaSuccess;
}
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode) {
    LOCK;
    if (!s) return fail(cudaErrorStreamCaptureUnsupported); /* the legacy stream cannot capture */
    if (s->capture) return fail(cudaErrorInvalidValue);
    s->capture = new emu_graph;
    s->forked = false;
    return cudaSuccess;
}
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g) {
    LOCK;
    if (!s || !s->capture || s->forked) return fail(cudaErrorInvalidValue);
    emu_graph *c = s->capture;
    s->capture = NULL;
    bool unjoined = false;
    for (emu_stream *f : c->forked) {
        unjoined |= f->joined_at != f->nops; /* work after its last join */
        f->capture = NULL;
        f->forked = false;
    }
    if (unjoined) {
        delete c;
        *g = NULL;
        return fail(cudaErrorStreamCaptureUnjoined);
    }
    if (c->invalidated) {
        delete c;
        *g = NULL;
        return fail(cudaErrorStreamCaptureInvalidated);
    }
    *g = c;
    return cudaSuccess;
}
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long) {
    if (!g) return fail(cudaErrorInvalidValue);
    *e = new emu_graph(*g);
    return cudaSuccess;
}
cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidValue);
    if (capturing(s)) {
        for (auto &op : e->ops) s->capture->ops.push_back(op);
    } else {
        for (auto &op : e->ops) op();
    }
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e) { delete e; return cudaSuccess; }
cudaError_t cudaGraphDestroy(cudaGraph_t g) { delete g; return cudaSuccess; }

/* ---- events: the work before a record has run by the time it returns ---- */
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    *e = new emu_event{ flags, 0, false, NULL, NULL, 0 };
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    e->cap = capturing(s) ? s->capture : NULL;
    e->from = s;
    e->nops = s ? s->nops : 0;
    if (e->cap) return cudaSuccess; /* a node of the capture, for a fork or a join (no time) */
    e->t = now_ms();
    e->recorded = true;
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return e ? cudaSuccess : fail(cudaErrorInvalidResourceHandle); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    if (!a || !b || (a->flags & cudaEventDisableTiming) || (b->flags & cudaEventDisableTiming)) return fail(cudaErrorInvalidResourceHandle);
    if (!a->recorded || !b->recorded) return fail(cudaErrorInvalidResourceHandle);
    *ms = (float)(b->t - a->t);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned) {
    LOCK;
    if (!e) return fail(cudaErrorInvalidResourceHandle);
    if (!e->cap) return cudaSuccess; /* (streams run in order: the work before the record is done) */
    if (!s) { e->cap->invalidated = true; return fail(cudaErrorStreamCaptureImplicit); }
    if (!s->capture) { /* a fork: s joins the capture */
        s->capture = e->cap;
        s->forked = true;
        s->joined_at = s->nops;
        e->cap->forked.push_back(s);
    } else if (s->capture != e->cap) {
        s->capture->invalidated = true;
        return fail(cudaErrorStreamCaptureIsolation);
    }
    if (e->from && e->from->forked && e->from->capture == e->cap && e->nops == e->from->nops)
        e->from->joined_at = e->nops; /* a join: everything e's stream did so far is waited on */
    return cudaSuccess;
}
