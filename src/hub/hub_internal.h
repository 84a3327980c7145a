/* Pieces shared by the hub's files: one HTTP transfer (fetch.c) and content hashes (hash.c). */
#ifndef LILY_HUB_INTERNAL_H
#define LILY_HUB_INTERNAL_H
#include "hub/hub.h"
#include <curl/curl.h>

typedef struct {
    const char *url;
    const char *token;      /* bearer token for the first host, or NULL */
    const char *what;       /* for messages: "listing of org/name", "model.safetensors" */
    int stall_seconds;
} hub_req;

/* A running digest: sha256 of the content (LFS files) or git's blob sha1
 * (sha1 of "blob <size>\0" + content, what the listing's blobId is for plain files). */
typedef struct hub_hash hub_hash;
hub_hash *hub_hash_new(int git_blob, uint64_t size);
void hub_hash_reset(hub_hash *h);
void hub_hash_update(hub_hash *h, const void *p, size_t n);
void hub_hash_hex(hub_hash *h, char out[65]); /* finishes; lowercase hex */
void hub_hash_free(hub_hash *h);
/* Feeds the first `n` bytes of an open file. */
lily_code hub_hash_file(hub_hash *h, int fd, uint64_t n, lily_status *st);

/* GET into memory (at most `limit` bytes). `*transient` says whether a retry may help. */
lily_code hub_http_get(const hub_req *r, size_t limit, char **body, size_t *len, int *transient,
                       lily_status *st);

/* Returns nonzero to cancel. */
typedef int (*hub_xfer_progress_fn)(void *user, uint64_t offset);

/* Downloads r->url into fd from byte *offset on (a range request when > 0; a server that
 * ignores it restarts the file at 0), feeding h; *offset is updated to the file size. */
lily_code hub_http_download(const hub_req *r, int fd, uint64_t *offset, hub_hash *h,
                            hub_xfer_progress_fn progress, void *user, int *transient,
                            lily_status *st);

#endif
