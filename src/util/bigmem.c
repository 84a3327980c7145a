/* Large host blocks (a parked conversation's recurrent state: ~63 MB a copy for the 35B-A3B)
 * that are written once, right after allocation, by a device copy or memcpy.
 *
 * Why not malloc: a fresh block is mapped but not backed, so its first write takes a page
 * fault every 4 KB, and the kernel zeroes each page. On the GPU machine a 126 MB park into
 * fresh malloc memory took 82-122 ms, the same copy into memory already touched 8 ms, and into
 * a mapping advised for transparent huge pages 35-44 ms (bench/RESULTS.md session 36). The
 * server parks on its scheduler thread, so every stream waits that long. So: fresh blocks are
 * mapped with MADV_HUGEPAGE, and up to BIG_KEEP freed blocks are kept, already backed, for the
 * next block of the same size, 512 MB of them at most (a model's state blocks all have one
 * size, and a parked conversation is usually dropped, by eviction or restore, about when
 * another is parked).
 * Under AddressSanitizer everything is plain malloc, so the fuzzers keep their bounds checks. */
#include "util/util.h"
#include <pthread.h>
#include <stdlib.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define BIG_PLAIN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BIG_PLAIN 1
#endif
#endif
#if !defined(BIG_PLAIN) && !(defined(__linux__) && defined(MADV_HUGEPAGE))
#define BIG_PLAIN 1
#endif

#define BIG_MIN (1u << 20) /* smaller blocks: malloc's own pools serve them well */
#define BIG_KEEP 4
#define BIG_KEEP_BYTES ((size_t)512 << 20) /* what the kept blocks may hold in all (a long conversation's
                                            * attention rows are blocks of their own size, rarely reused) */
#define BIG_HEAD 64        /* the block's length (0: from malloc), before the caller's bytes (malloc's alignment kept) */

#ifndef BIG_PLAIN
static pthread_mutex_t big_mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *base; size_t len; } big_kept[BIG_KEEP]; /* [big_n], oldest first */
static int big_n;
#endif

void *lily_big_alloc(size_t n) {
#ifdef BIG_PLAIN
    return malloc(n ? n : 1);
#else
    if (n + BIG_HEAD < BIG_MIN) {
        char *p = malloc(n + BIG_HEAD);
        if (!p) return NULL;
        *(size_t *)p = 0; /* 0: from malloc */
        return p + BIG_HEAD;
    }
    size_t len = n + BIG_HEAD;
    void *base = NULL;
    pthread_mutex_lock(&big_mu);
    for (int i = big_n - 1; i >= 0 && !base; i--)
        if (big_kept[i].len == len) {
            base = big_kept[i].base;
            for (int k = i; k + 1 < big_n; k++) big_kept[k] = big_kept[k + 1];
            big_n--;
        }
    pthread_mutex_unlock(&big_mu);
    if (!base) {
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED) return NULL;
        madvise(base, len, MADV_HUGEPAGE); /* advice only: a kernel without THP ignores it */
    }
    *(size_t *)base = len;
    return (char *)base + BIG_HEAD;
#endif
}

void lily_big_free(void *p) {
    if (!p) return;
#ifdef BIG_PLAIN
    free(p);
#else
    char *base = (char *)p - BIG_HEAD;
    size_t len = *(size_t *)base;
    if (!len) { free(base); return; }
    if (len > BIG_KEEP_BYTES) { munmap(base, len); return; }
    void *drop[BIG_KEEP];
    size_t dl[BIG_KEEP];
    int nd = 0;
    pthread_mutex_lock(&big_mu);
    size_t kept = len;
    for (int i = 0; i < big_n; i++) kept += big_kept[i].len;
    while (big_n && (big_n == BIG_KEEP || kept > BIG_KEEP_BYTES)) { /* the oldest go */
        drop[nd] = big_kept[0].base;
        dl[nd++] = big_kept[0].len;
        kept -= big_kept[0].len;
        for (int k = 0; k + 1 < big_n; k++) big_kept[k] = big_kept[k + 1];
        big_n--;
    }
    big_kept[big_n].base = base;
    big_kept[big_n].len = len;
    big_n++;
    pthread_mutex_unlock(&big_mu);
    for (int i = 0; i < nd; i++) munmap(drop[i], dl[i]);
#endif
}
