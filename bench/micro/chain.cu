/* What a persistent decode kernel could reach on this GPU: a synthetic token of the 35B-A3B's
 * weight shapes run as one kernel, its stages separated by grid barriers instead of launches.
 *
 * Why: decode runs ~1.74 ms a token against a ~0.44 ms byte floor (bench/RESULTS.md sessions
 * 18-25). Each of a layer's 6-7 launches reaches 0.6-1.3 TB/s: a chain of dependent loads
 * (its wait, its input staged from L2, its weights) with the DRAM idle in between, and bytes
 * requested early (prefetch, bulk copies) delayed the L2 hits of whoever was on the chain.
 * Before rebuilding decode as one persistent kernel this measures two questions on the real
 * GPU: what a grid barrier plus a staged input costs a stage, and whether a producer warp a
 * block that streams the block's weights for all coming stages into a ring in shared memory
 * (cp.async.bulk behind mbarriers, at most K copies in flight) keeps the DRAM busy while the
 * consumers sit on the chain, or slows the chain as the earlier forms did.
 *
 * A token: 40 layers of six stages (rows x columns: the in-projection 12352 x 2048, a
 * stand-in for the delta rule's state traffic 8192 x 1024, the out-projection 2048 x 4096,
 * router and shared gate|up 1280 x 2048, eight experts' gate|up 8192 x 2048, their down with
 * the shared one 2048 x 4608), then the lm_head 248320 x 2048; 1.88 GB of 4.5-bit weights, as
 * the model's. Weights are 4-bit codes with a bf16 scale and bias a group of 64 (the MLX
 * layout's bytes); a stage stages its input from the last stage's output (RMS-normed, three
 * bytes a value, as k_mvdp does) and computes rows by dp4a (three a word of codes and a level, as
 * k_mvdp), a block's rows in chunks of <= 16 KB.
 * The expert stages' copies wait for the router stage (their rows depend on its choice).
 *
 * Modes: direct (the consumers load their chunks from global memory after the barrier, as
 * today's kernels do after their wait), ring S K (the producer warp, S slots, K in flight),
 * launches (the direct form's stage a launch, 241 a token in a CUDA graph with programmatic
 * edges, as today's decode: what grid flags save over kernel boundaries).
 * Checks: every mode's lm_head rows for the first token equal the direct mode's bit for bit,
 * and the first stage matches a host computation.
 *
 * Build and run on the device: nvcc -O3 -arch=sm_90a -Isrc -o /tmp/chain bench/micro/chain.cu && /tmp/chain;
 * arguments: [tokens [rows divisor [blocks]]] (the divisor shrinks every stage: the chain's cost
 * without the bytes). The CPU emulator runs it too (make emu-micro, tests/it_cuda_emu.sh: a few
 * blocks, rows / 64), for its checks. */
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include "cuda/cu_persist.h"

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

constexpr int NW = 8;               /* consumer warps */
constexpr int NT = NW * 32 + 32;    /* + the producer warp */
constexpr int SLOT = 16384;         /* bytes a ring slot (a chunk's rows) */
constexpr int MAXS = 12;            /* ring slots at most */
constexpr int MAXC = 4608;          /* input columns at most */
constexpr int PER_LAYER = 6, ROUTER = 3;

/* a stage: rows, columns, rows a chunk, the stage whose end its copies wait for (-1: none),
 * the byte offset of its weights, the float offset of its outputs */
struct Stage {
    int R, C, nr, dep;
    size_t w, y;
};

__device__ __forceinline__ int dp4a(uint32_t a, uint32_t b, int c) {
#ifdef __CUDACC_EMU__
    for (int i = 0; i < 4; i++) c += (int)(uint8_t)(a >> 8 * i) * (int)(int8_t)(b >> 8 * i);
    return c;
#else
    return __dp4a((int)a, (int)b, c);
#endif
}
__device__ __forceinline__ void bar_c() { cu_bar_named(1, NW * 32); } /* the consumer warps only */

/* a block's rows of stage s: [r0, r1) */
__device__ __forceinline__ void rows_of(const Stage &st, int &r0, int &r1) {
    r0 = (int)((long long)st.R * blockIdx.x / gridDim.x);
    r1 = (int)((long long)st.R * (blockIdx.x + 1) / gridDim.x);
}

/* a stage's staged input */
struct SmemIn {
    uint4 xq[3 * 2 * MAXC / 32];        /* [3 levels][2][C/32]: uint4 k4's 32 inputs' bytes of a level, lo/hi nibble order */
    float sx[MAXC / 64], xs[MAXC / 64]; /* a group's input scale and sum */
    float red[NW];
};
struct Smem {
    uint64_t full[MAXS], empty[MAXS];
    SmemIn in;
    alignas(16) unsigned char ring[MAXS][SLOT];
};

/* rows [i0 .. i0 + n) of stage s from p (codes [n][C/2], then scales [n][C/64] as bf16 scale:bias) */
template <bool GLOBAL>
__device__ __forceinline__ void rows_compute(const SmemIn &sm, const unsigned char *p, int n, int C, float *y, int warp, int lane) {
    const int nk4 = C / 32;
    for (int i = warp; i < n; i += NW) {
        const uint4 *cw = (const uint4 *)(p + (size_t)i * (C / 2));
        const uint32_t *sb = (const uint32_t *)(p + (size_t)n * (C / 2) + (size_t)i * (C / 16));
        float acc = 0.f;
        for (int k4 = lane; k4 < nk4; k4 += 32) {
            uint4 w;
            uint32_t g2;
            if (GLOBAL) { w = __ldg(cw + k4); g2 = __ldg(sb + k4 / 2); }
            else { w = cw[k4]; g2 = sb[k4 / 2]; }
            const uint32_t c[8] = { w.x & 0x0f0f0f0fu, (w.x >> 4) & 0x0f0f0f0fu, w.y & 0x0f0f0f0fu, (w.y >> 4) & 0x0f0f0f0fu,
                                    w.z & 0x0f0f0f0fu, (w.z >> 4) & 0x0f0f0f0fu, w.w & 0x0f0f0f0fu, (w.w >> 4) & 0x0f0f0f0fu };
            int d[3];
#pragma unroll
            for (int l = 0; l < 3; l++) { /* the input's three bytes, as k_mvdp's exact form */
                const uint4 a = sm.xq[(2 * l) * nk4 + k4], b = sm.xq[(2 * l + 1) * nk4 + k4];
                int e = 0;
                e = dp4a(c[0], a.x, e); e = dp4a(c[1], a.y, e); e = dp4a(c[2], a.z, e); e = dp4a(c[3], a.w, e);
                e = dp4a(c[4], b.x, e); e = dp4a(c[5], b.y, e); e = dp4a(c[6], b.z, e); e = dp4a(c[7], b.w, e);
                d[l] = e;
            }
            const float dd = fmaf((float)d[0], 65536.f, fmaf((float)d[1], 256.f, (float)d[2]));
            const float sc = __uint_as_float(g2 & 0xffff0000u), bi = __uint_as_float(g2 << 16);
            /* a group is two k4: its bias times the group's sum counted once */
            acc = fmaf(dd * sc, sm.sx[k4 / 2], acc);
            if (!(k4 & 1)) acc = fmaf(bi, sm.xs[k4 / 2], acc);
        }
        for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(~0u, acc, o);
        if (!lane) y[i] = acc;
    }
}

/* the stage's input: xin[0 .. C) (indices wrapped to the previous stage's rows) RMS-normed
 * and turned into integers a group of 64 as k_mvdp does (its largest |x| at 127 * 2^16, split
 * into three signed bytes), in the order the dp4a above reads */
__device__ void stage_input(SmemIn &sm, const float *xin, int Rin, int C, int tid) {
    const int warp = tid / 32, lane = tid % 32, nk4 = C / 32;
    constexpr int IT = (MAXC / 8 + NW * 32 - 1) / (NW * 32); /* a thread's words at most: unrolled, so v stays in registers */
    float ss = 0.f;
    float v[IT][8];
#pragma unroll
    for (int it = 0; it < IT; it++) { /* a thread's 8 consecutive inputs: word j of a row */
        const int j = tid + it * NW * 32;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            v[it][e] = j < C / 8 ? __ldcg(xin + (8 * j + e) % Rin) : 0.f;
            ss += v[it][e] * v[it][e];
        }
    }
    for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(~0u, ss, o);
    if (!lane) sm.red[warp] = ss;
    bar_c();
    ss = 0.f;
    for (int w = 0; w < NW; w++) ss += sm.red[w];
    const float rn = rsqrtf(ss / C + 1e-6f);
#pragma unroll
    for (int it = 0; it < IT; it++) {
        const int j = tid + it * NW * 32;
        if (j >= C / 8) break; /* whole warps: C / 8 is a multiple of 32 */
        float am = 0.f, sum = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) { v[it][e] *= rn; am = fmaxf(am, fabsf(v[it][e])); sum += v[it][e]; }
        for (int o = 1; o < 8; o <<= 1) { am = fmaxf(am, __shfl_xor_sync(~0u, am, o)); sum += __shfl_xor_sync(~0u, sum, o); }
        const float sx = am > 0.f ? am / 8323072.f : 1.f;
        uint32_t lo[3] = { 0, 0, 0 }, hi[3] = { 0, 0, 0 };
#pragma unroll
        for (int e = 0; e < 8; e++) {
            int X = __float2int_rn(v[it][e] / sx);
            const int l = ((X + 128) & 255) - 128;
            X = (X - l) >> 8;
            const int m = ((X + 128) & 255) - 128;
            const int h = (X - m) >> 8;
            const int b[3] = { h, m, l };
#pragma unroll
            for (int q = 0; q < 3; q++) {
                if (e & 1) hi[q] |= (uint32_t)(uint8_t)(int8_t)b[q] << (8 * (e / 2));
                else lo[q] |= (uint32_t)(uint8_t)(int8_t)b[q] << (8 * (e / 2));
            }
        }
        const int k4 = j / 4, w = j % 4;
#pragma unroll
        for (int q = 0; q < 3; q++) {
            uint32_t *o = (uint32_t *)&sm.xq[(2 * q + w / 2) * nk4 + k4];
            o[(w % 2) * 2] = lo[q];
            o[(w % 2) * 2 + 1] = hi[q];
        }
        if (!(j & 7)) { sm.sx[j / 8] = sx; sm.xs[j / 8] = sum; }
    }
    bar_c();
}

/* stage s's input staged: the token's input x0 for the run's first stage, else the previous
 * stage's outputs (a token's first stage reads the last layer's down) */
__device__ void stage_in(SmemIn &sm, const Stage *st, int s, bool first, int nst, const float *Y, const float *x0, int tid) {
    if (first) stage_input(sm, x0, 2048, st[s].C, tid);
    else {
        const Stage &p = st[s ? s - 1 : nst - 2];
        stage_input(sm, Y + p.y, p.R, st[s].C, tid);
    }
}

/* mode 0: direct; mode 1: ring of S slots, K copies in flight. cnt[t * nst + s]: blocks done with
 * stage s of token t. tm: block 0's clock at each stage's barrier (T * nst + 1) */
__global__ void __launch_bounds__(NT, 1) k_chain(const Stage *st, const unsigned char *W, float *Y, const float *x0, int *cnt, int nst,
                                                 int T, int mode, int S, int K, unsigned long long *tm) {
    extern __shared__ uint4 smraw[];
    Smem &sm = *(Smem *)smraw;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int G = gridDim.x;
    if (tid == 0) {
        for (int i = 0; i < MAXS; i++) { cu_mb_init(&sm.full[i], 1); cu_mb_init(&sm.empty[i], NW); }
        cu_mb_fence_init();
    }
    __syncthreads();
    if (warp == NW) { /* the producer */
        if (mode != 1 || lane) return;
        int n = 0;
        for (int t = 0; t < T; t++)
            for (int s = 0; s < nst; s++) {
                const Stage c = st[s];
                if (c.dep >= 0) cu_flag_wait_ge(cnt + t * nst + c.dep, G);
                int r0, r1;
                rows_of(c, r0, r1);
                const size_t rb = (size_t)c.C * 9 / 16;
                for (int r = r0; r < r1; r += c.nr, n++) {
                    const int nr = min(c.nr, r1 - r), slot = n % S;
                    cu_mb_wait(&sm.empty[slot], ((n / S) & 1) ^ 1); /* a fresh slot's "previous" phase has parity 1 */
                    if (n >= K) cu_mb_wait(&sm.full[(n - K) % S], ((n - K) / S) & 1);
                    cu_mb_copy(&sm.full[slot], sm.ring[slot], W + c.w + (size_t)r * rb, (unsigned)(nr * rb));
                }
            }
        return;
    }
    int n = 0;
    for (int t = 0; t < T; t++)
        for (int s = 0; s < nst; s++) {
            const int g = t * nst + s;
            const Stage c = st[s];
            if (tid == 0) {
                if (g > 0) cu_flag_wait_ge(cnt + g - 1, G);
                if (blockIdx.x == 0) tm[g] = cu_gtime();
            }
            bar_c();
            stage_in(sm.in, st, s, g == 0, nst, Y, x0, tid);
            int r0, r1;
            rows_of(c, r0, r1);
            const size_t rb = (size_t)c.C * 9 / 16;
            float *y = Y + c.y;
            for (int r = r0; r < r1; r += c.nr, n++) {
                const int nr = min(c.nr, r1 - r);
                if (mode == 1) {
                    const int slot = n % S;
                    cu_mb_wait(&sm.full[slot], (n / S) & 1);
                    rows_compute<false>(sm.in, sm.ring[slot], nr, c.C, y + r, warp, lane);
                    __syncwarp();
                    if (!lane) cu_mb_arrive(&sm.empty[slot]);
                } else
                    rows_compute<true>(sm.in, W + c.w + (size_t)r * rb, nr, c.C, y + r, warp, lane);
            }
            bar_c(); /* the block's outputs written before its flag */
            if (tid == 0) cu_flag_add(cnt + g, 1);
        }
    if (tid == 0 && blockIdx.x == 0) {
        cu_flag_wait_ge(cnt + T * nst - 1, G);
        tm[T * nst] = cu_gtime();
    }
}

/* mode 2: stage s alone, a launch a stage as today's decode (a CUDA graph with programmatic
 * edges: the next stage's blocks start while this one runs, two blocks an SM fit, and wait in
 * griddepcontrol.wait), its weights loaded after the wait as the direct form's. first: the
 * token's input is x0 */
__global__ void __launch_bounds__(NW * 32, 2) k_stage(const Stage *st, const unsigned char *W, float *Y, const float *x0, int s, int first,
                                                      int nst) {
    extern __shared__ uint4 smraw[];
    SmemIn &sm = *(SmemIn *)smraw;
#ifndef __CUDACC_EMU__
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const Stage c = st[s];
    stage_in(sm, st, s, first, nst, Y, x0, tid);
    int r0, r1;
    rows_of(c, r0, r1);
    const size_t rb = (size_t)c.C * 9 / 16;
    for (int r = r0; r < r1; r += c.nr) rows_compute<true>(sm, W + c.w + (size_t)r * rb, min(c.nr, r1 - r), c.C, Y + c.y + r, warp, lane);
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (uint32_t)rng; }

struct Run { const Stage *st; const unsigned char *W; float *Y; const float *x0; int *cnt; int nst, T; unsigned long long *tm; int G; size_t smb; };
static void launch(const Run &r, int nst, int T, int mode, int S, int K) {
#ifdef __CUDACC_EMU__
    cu_go(k_chain, dim3(r.G), dim3(NT), r.smb).coop()(r.st, r.W, r.Y, r.x0, r.cnt, nst, T, mode, S, K, r.tm);
    CK(cudaGetLastError());
#else
    const Stage *st = r.st;
    const unsigned char *W = r.W;
    float *Y = r.Y;
    const float *x0 = r.x0;
    int *cnt = r.cnt;
    unsigned long long *tm = r.tm;
    void *args[] = { &st, &W, &Y, &x0, &cnt, &nst, &T, &mode, &S, &K, &tm };
    CK(cudaLaunchCooperativeKernel((const void *)k_chain, dim3(r.G), dim3(NT), args, r.smb, 0));
#endif
}

static void launch_stage(const Run &r, int s, int first, int nst, cudaStream_t str) {
#ifdef __CUDACC_EMU__
    cu_go(k_stage, dim3(r.G), dim3(NW * 32), sizeof(SmemIn), str)(r.st, r.W, r.Y, r.x0, s, first, nst);
#else
    cudaLaunchConfig_t c = {};
    c.gridDim = dim3(r.G);
    c.blockDim = dim3(NW * 32);
    c.dynamicSmemBytes = sizeof(SmemIn);
    c.stream = str;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at;
    c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k_stage, r.st, r.W, r.Y, r.x0, s, first, nst));
#endif
}
/* mode 2: T tokens as launches, a graph a token (the first token's graph starts from x0) */
static float launch_tokens(const Run &r, int nst, int T) {
    cudaStream_t str;
    CK(cudaStreamCreateWithFlags(&str, cudaStreamNonBlocking));
    cudaGraphExec_t ge[2];
    for (int k = 0; k < 2; k++) {
        cudaGraph_t gr;
        CK(cudaStreamBeginCapture(str, cudaStreamCaptureModeGlobal));
        for (int s = 0; s < nst; s++) launch_stage(r, s, k == 0 && s == 0, nst, str);
        CK(cudaStreamEndCapture(str, &gr));
        CK(cudaGraphInstantiate(&ge[k], gr, 0));
        CK(cudaGraphDestroy(gr));
    }
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaGraphLaunch(ge[0], str)); /* token 0, then T - 1 timed, as the persistent forms' */
    CK(cudaEventRecord(e0, str));
    for (int t = 1; t < T; t++) CK(cudaGraphLaunch(ge[1], str));
    CK(cudaEventRecord(e1, str));
    CK(cudaStreamSynchronize(str));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    for (int k = 0; k < 2; k++) CK(cudaGraphExecDestroy(ge[k]));
    CK(cudaStreamDestroy(str));
    return ms;
}

int main(int argc, char **argv) {
    const int T = argc > 1 ? atoi(argv[1]) : 6;   /* tokens a run */
    const int div = argc > 2 ? atoi(argv[2]) : 1; /* rows divided by this: the chain's cost without the bytes */
    cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    const int G = argc > 3 ? atoi(argv[3]) : pr.multiProcessorCount; /* blocks: one an SM */
    if (T < 1 || div < 1 || G < 1 || G > pr.multiProcessorCount) { fprintf(stderr, "usage: chain [tokens [rows divisor [blocks]]]\n"); return 2; }
    static const int shp[PER_LAYER][2] = { { 12352, 2048 }, { 8192, 1024 }, { 2048, 4096 }, { 1280, 2048 }, { 8192, 2048 }, { 2048, 4608 } };
    static const char *nm[PER_LAYER + 1] = { "in-proj", "state", "out-proj", "router+shared", "experts gate|up", "down", "lm_head" };
    std::vector<Stage> hs;
    size_t wb = 0, yb = 0;
    for (int l = 0; l <= 40; l++)
        for (int k = 0; k < (l < 40 ? PER_LAYER : 1); k++) {
            const int r = l < 40 ? shp[k][0] : 248320, c = l < 40 ? shp[k][1] : 2048;
            Stage x;
            x.R = std::max(G, r / div);
            x.C = c;
            x.nr = std::min(16, SLOT / (c * 9 / 16));
            x.dep = l < 40 && k > ROUTER ? l * PER_LAYER + ROUTER : -1;
            x.w = wb;
            x.y = yb;
            hs.push_back(x);
            wb += (size_t)x.R * c * 9 / 16;
            yb += x.R;
        }
    const int nst = (int)hs.size();
    printf("chain: %d blocks, %d stages a token, %.3f GB of weights a token, rows / %d\n", G, nst, wb / 1e9, div);

    /* weights: random codes; scales ~1/sqrt(C) and biases centring the codes, as bf16 */
    std::vector<unsigned char> hw(wb);
    for (size_t i = 0; i < wb; i += 4) { uint32_t v = rnd(); memcpy(&hw[i], &v, 4); }
    for (const Stage &x : hs) {
        const size_t rb = (size_t)x.C * 9 / 16;
        for (int b = 0; b < G; b++) {
            const int r0 = (int)((long long)x.R * b / G), r1 = (int)((long long)x.R * (b + 1) / G);
            for (int r = r0; r < r1; r += x.nr) {
                const int n = std::min(x.nr, r1 - r);
                uint32_t *sb = (uint32_t *)&hw[x.w + (size_t)r * rb + (size_t)n * (x.C / 2)];
                for (int i = 0; i < n * x.C / 64; i++) {
                    float sc = (0.5f + (rnd() % 1000) / 2000.f) / sqrtf((float)x.C), bi = -7.5f * sc;
                    uint32_t us, ub;
                    memcpy(&us, &sc, 4);
                    memcpy(&ub, &bi, 4);
                    sb[i] = (us & 0xffff0000u) | (ub >> 16);
                }
            }
        }
    }
    std::vector<float> hx(2048);
    for (auto &v : hx) v = (float)((int)(rnd() % 2001) - 1000) / 1000.f;
    Run run;
    Stage *dst;
    unsigned char *W;
    float *Y, *x0;
    CK(cudaMalloc(&dst, nst * sizeof(Stage)));
    CK(cudaMalloc(&W, wb));
    CK(cudaMalloc(&Y, yb * sizeof(float)));
    CK(cudaMalloc(&x0, 2048 * sizeof(float)));
    CK(cudaMalloc(&run.cnt, (size_t)T * nst * sizeof(int)));
    CK(cudaMalloc(&run.tm, ((size_t)T * nst + 1) * sizeof(unsigned long long)));
    CK(cudaMemcpy(dst, hs.data(), nst * sizeof(Stage), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(W, hw.data(), wb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(x0, hx.data(), 2048 * sizeof(float), cudaMemcpyHostToDevice));
    run.st = dst;
    run.W = W;
    run.Y = Y;
    run.x0 = x0;
    run.G = G;
    run.smb = sizeof(Smem);
    CK(cudaFuncSetAttribute((const void *)k_chain, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)run.smb));
    static_assert(sizeof(SmemIn) <= 48 * 1024, "k_stage's shared memory without the opt-in");

    std::vector<float> ref; /* the direct mode's lm_head rows of the last token */
    struct Mode { int mode, S, K; };
    const Mode modes[] = { { 0, 1, 1 }, { 1, 12, 12 }, { 1, 12, 6 }, { 1, 12, 3 }, { 1, 12, 2 }, { 1, 6, 6 }, { 1, 4, 4 }, { 2, 1, 1 }, { 0, 1, 1 } };
    int fails = 0;
    for (const Mode &m : modes) {
        CK(cudaMemset(run.cnt, 0, (size_t)T * nst * sizeof(int)));
        CK(cudaMemset(Y, 0, yb * sizeof(float)));
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        float ms = 0;
        if (m.mode == 2) ms = launch_tokens(run, nst, T);
        else {
            CK(cudaEventRecord(e0));
            launch(run, nst, T, m.mode, m.S, m.K);
            CK(cudaEventRecord(e1));
            CK(cudaDeviceSynchronize());
            CK(cudaEventElapsedTime(&ms, e0, e1));
        }
        std::vector<unsigned long long> ht((size_t)T * nst + 1);
        CK(cudaMemcpy(ht.data(), run.tm, ht.size() * sizeof(unsigned long long), cudaMemcpyDeviceToHost));
        std::vector<float> lm(hs[nst - 1].R);
        CK(cudaMemcpy(lm.data(), Y + hs[nst - 1].y, lm.size() * sizeof(float), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (size_t i = 0; i < lm.size(); i++) bad += !std::isfinite(lm[i]);
        if (ref.empty()) ref = lm;
        else
            for (size_t i = 0; i < lm.size(); i++) bad += memcmp(&lm[i], &ref[i], 4) != 0;
        fails += bad != 0;
        static const char *mname[3] = { "direct  ", "ring    ", "launches" };
        printf("%s S=%2d K=%2d: lm_head rows %s (%d differ or not finite); kernel %.2f ms for %d tokens\n", mname[m.mode], m.S, m.K,
               bad ? "DIFFER" : &m == modes ? "taken as the reference" : "equal to the direct mode's", bad, ms, m.mode == 2 ? T - 1 : T);
        if (m.mode == 2 && T > 1) {
            const double tok = ms * 1e3 / (T - 1);
            printf("   %.1f us a token (%.1f tok/s, %.2f TB/s): %d launches a token in a graph, programmatic edges\n", tok, 1e6 / tok, wb / tok / 1e6, nst);
        } else if (T > 1) { /* tokens 1.. (the first pays the kernel's start) */
            const double tok = (double)(ht[(size_t)T * nst] - ht[nst]) / (T - 1) / 1e3;
            double per[PER_LAYER + 1] = { 0 };
            for (int t = 1; t < T; t++)
                for (int s = 0; s < nst; s++)
                    per[s < nst - 1 ? s % PER_LAYER : PER_LAYER] += (double)(ht[(size_t)t * nst + s + 1] - ht[(size_t)t * nst + s]) / 1e3;
            printf("   %.1f us a token (%.1f tok/s, %.2f TB/s); a stage on the chain (us, mean over layers):", tok, 1e6 / tok, wb / tok / 1e6);
            for (int k = 0; k <= PER_LAYER; k++) printf(" %s %.2f;", nm[k], per[k] / (T - 1) / (k < PER_LAYER ? 40 : 1));
            printf("\n");
        }
        CK(cudaEventDestroy(e0));
        CK(cudaEventDestroy(e1));
    }

    /* the first stage against the host: token 0's in-projection rows */
    {
        CK(cudaMemset(run.cnt, 0, (size_t)T * nst * sizeof(int)));
        launch(run, 1, 1, 0, 1, 1);
        CK(cudaDeviceSynchronize());
        const Stage &x = hs[0];
        std::vector<float> y(x.R);
        CK(cudaMemcpy(y.data(), Y, x.R * sizeof(float), cudaMemcpyDeviceToHost));
        double ss = 0;
        for (float v : hx) ss += (double)v * v;
        const float rn = 1.f / sqrtf((float)(ss / 2048) + 1e-6f);
        double worst = 0;
        const size_t rb = (size_t)x.C * 9 / 16;
        for (int b = 0; b < G; b++) {
            const int r0 = (int)((long long)x.R * b / G), r1 = (int)((long long)x.R * (b + 1) / G);
            for (int r = r0; r < r1; r++) {
                const int c0 = r0 + (r - r0) / x.nr * x.nr, n = std::min(x.nr, r1 - c0), i = r - c0;
                const unsigned char *p = &hw[x.w + (size_t)c0 * rb];
                double acc = 0, mag = 0;
                for (int g = 0; g < x.C / 64; g++) {
                    uint32_t sbw;
                    memcpy(&sbw, p + (size_t)n * (x.C / 2) + ((size_t)i * (x.C / 64) + g) * 4, 4);
                    uint32_t us = sbw & 0xffff0000u, ub = sbw << 16;
                    float sc, bi;
                    memcpy(&sc, &us, 4);
                    memcpy(&bi, &ub, 4);
                    for (int e = 0; e < 64; e++) {
                        const int k = g * 64 + e;
                        const int q = (p[(size_t)i * (x.C / 2) + k / 2] >> (4 * (k & 1))) & 15;
                        const double xv = hx[k] * rn, w = sc * q + bi;
                        acc += w * xv;
                        mag += fabs(w * xv);
                    }
                }
                worst = std::max(worst, fabs(acc - y[r]) / (mag + 1e-30));
            }
        }
        const bool ok = worst < 1e-4;
        fails += !ok;
        printf("first stage against the host: worst |err| / sum |w x| = %.2e (%s; < 1e-4)\n", worst, ok ? "ok" : "FAIL");
    }
    printf("chain: %s\n", fails ? "FAILED" : "all checks passed");
    return fails ? 1 : 0;
}
