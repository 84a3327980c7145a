/* What parking a conversation costs on the host: 126 MB (the 35B-A3B's recurrent state and one
 * snapshot) copied from the device into host memory, the ways a park could get that memory.
 * Why: a slot swap in lily-server parked a short conversation for ~95 ms (bench/RESULTS.md session
 * 36), far more than the bytes at PCIe speed. Run: nvcc -O2 -arch=sm_90a -o /tmp/park_copy
 * bench/micro/park_copy.cu && /tmp/park_copy (three rounds; the first pays one-time costs). */
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sys/mman.h>
#include <chrono>
#include <cuda_runtime.h>
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
int main() {
    const size_t B = 126u << 20;
    void *d; cudaMalloc(&d, B); cudaMemset(d, 1, B); cudaDeviceSynchronize();
    cudaStream_t s; cudaStreamCreate(&s);
    for (int rep = 0; rep < 3; rep++) {
        double t = now();
        char *h = (char *)malloc(B);
        cudaMemcpyAsync(h, d, B, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
        double t1 = now(); free(h);
        char *h2 = (char *)mmap(NULL, B, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        madvise(h2, B, MADV_HUGEPAGE);
        double t2a = now();
        cudaMemcpyAsync(h2, d, B, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
        double t2 = now(); munmap(h2, B);
        double t3a = now();
        char *h3 = (char *)mmap(NULL, B, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        cudaMemcpyAsync(h3, d, B, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
        double t3 = now(); munmap(h3, B);
        // pinned staging 8 MB x2, then memcpy into fresh malloc
        static char *st[2]; static cudaEvent_t ev[2];
        if (!st[0]) { for (int i = 0; i < 2; i++) { cudaMallocHost(&st[i], 8 << 20); cudaEventCreate(&ev[i]); } }
        double t4a = now();
        char *h4 = (char *)malloc(B);
        const size_t C = 8 << 20; int nc = (int)((B + C - 1) / C);
        for (int c = 0; c <= nc; c++) {
            if (c < nc) { size_t off = (size_t)c * C, n = B - off < C ? B - off : C; cudaMemcpyAsync(st[c & 1], (char *)d + off, n, cudaMemcpyDeviceToHost, s); cudaEventRecord(ev[c & 1], s); }
            if (c > 0) { int p = c - 1; size_t off = (size_t)p * C, n = B - off < C ? B - off : C; cudaEventSynchronize(ev[p & 1]); memcpy(h4 + off, st[p & 1], n); }
        }
        double t4 = now(); free(h4);
        // the same staging into a reused (already faulted) buffer
        static char *h5; if (!h5) { h5 = (char *)malloc(B); memset(h5, 0, B); }
        double t5a = now();
        cudaMemcpyAsync(h5, d, B, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
        double t5 = now();
        printf("126 MB D2H: malloc %.1f ms, mmap+HUGEPAGE %.1f, MAP_POPULATE %.1f, pinned staging+memcpy %.1f, pageable prefaulted %.1f\n",
               (t1 - t) * 1e3, (t2 - t2a) * 1e3, (t3 - t3a) * 1e3, (t4 - t4a) * 1e3, (t5 - t5a) * 1e3);
    }
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r"); char b[128] = {0}; if (f) { fgets(b, sizeof b, f); fclose(f); }
    printf("THP: %s", b);
    return 0;
}
