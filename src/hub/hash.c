/* Content digests for verifying downloads (OpenSSL EVP). */
#include "hub/hub_internal.h"
#include "util/util.h"
#include <errno.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct hub_hash {
    EVP_MD_CTX *ctx;
    int git_blob;
    uint64_t size;
};

void hub_hash_reset(hub_hash *h) {
    EVP_DigestInit_ex(h->ctx, h->git_blob ? EVP_sha1() : EVP_sha256(), NULL);
    if (h->git_blob) {
        char pre[40];
        int n = snprintf(pre, sizeof pre, "blob %llu", (unsigned long long)h->size);
        EVP_DigestUpdate(h->ctx, pre, (size_t)n + 1); /* the NUL is part of git's header */
    }
}

hub_hash *hub_hash_new(int git_blob, uint64_t size) {
    hub_hash *h = calloc(1, sizeof *h);
    if (!h) return NULL;
    if (!(h->ctx = EVP_MD_CTX_new())) { free(h); return NULL; }
    h->git_blob = git_blob; h->size = size;
    hub_hash_reset(h);
    return h;
}

void hub_hash_update(hub_hash *h, const void *p, size_t n) { EVP_DigestUpdate(h->ctx, p, n); }

void hub_hash_hex(hub_hash *h, char out[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(h->ctx, md, &n);
    for (unsigned i = 0; i < n && i < 32; i++) sprintf(out + 2 * i, "%02x", md[i]);
    out[2 * (n < 32 ? n : 32)] = 0;
}

void hub_hash_free(hub_hash *h) {
    if (!h) return;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

lily_code hub_hash_file(hub_hash *h, int fd, uint64_t n, lily_status *st) {
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    if (!buf) return lily_err(st, LILY_ENOMEM, "out of memory hashing a file");
    uint64_t off = 0;
    while (off < n) {
        size_t want = n - off < CHUNK ? (size_t)(n - off) : CHUNK;
        ssize_t r = pread(fd, buf, want, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) { free(buf); return lily_err(st, LILY_EIO, "reading back a download: %s", r < 0 ? strerror(errno) : "file shorter than expected"); }
        EVP_DigestUpdate(h->ctx, buf, (size_t)r);
        off += (uint64_t)r;
    }
    free(buf);
    return LILY_OK;
}
