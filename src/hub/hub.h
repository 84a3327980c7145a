/* hub: downloading model repositories from the Hugging Face hub (or a mirror).
 *
 * Contract
 * - The file list comes from GET {endpoint}/api/models/{repo}/revision/{rev}?blobs=true
 *   (`siblings`: rfilename, size, lfs.sha256); files from
 *   {endpoint}/{repo}/resolve/{rev}/{path}, redirects followed (http/https only); the
 *   Authorization header (HF_TOKEN) goes only to the endpoint's own host.
 * - A file is downloaded to `path.partial`, resumed from that file's size with a range
 *   request, and renamed to its final name only after its size (and, for LFS files, its
 *   sha256) matched the listing. A file under its final name is therefore always whole.
 * - Transient failures (5xx, 429, connection errors, stalls) are retried with
 *   exponential backoff; 401/403/404 and checksum mismatches are not.
 * - Before downloading, the free space of the target file system is checked against
 *   what is still missing.
 * - Repository paths from the listing are untrusted: absolute paths, `..`, empty or
 *   `.`-only components and backslashes are refused.
 * - Nothing here prints; progress goes through the caller's callback.
 */
#ifndef LILY_HUB_H
#define LILY_HUB_H
#include <stddef.h>
#include <stdint.h>
#include "lily.h"

typedef struct {
    char *path;          /* repository-relative path (rfilename) */
    uint64_t size;       /* bytes; has_size = 0 when the listing did not say */
    int has_size;
    int is_lfs;
    char sha256[65];     /* LFS files: lowercase hex; "" otherwise */
    char blob_id[65];    /* git blob id when given */
} hub_file;

typedef struct {
    char *repo_id;       /* "id" field, may be NULL */
    char sha[65];        /* commit the revision resolved to, "" when absent */
    hub_file *files;
    int n_files;
} hub_listing;

/* Parses the hub API's model-info JSON. Untrusted input: any malformed or hostile
 * listing gives LILY_EFORMAT with a message, never a crash. */
lily_code hub_listing_parse(const char *json, size_t len, hub_listing *out, lily_status *st);
void hub_listing_free(hub_listing *l);

/* Is `p` a safe relative path to create under a folder? */
int hub_path_safe(const char *p);
/* Is `id` shaped like a repo id ("org/name" or "name", [A-Za-z0-9._-])? */
int hub_repo_id_valid(const char *id);

typedef struct {
    const char *file;             /* file in progress (repo path) */
    int files_done, files_total;
    uint64_t bytes_done, bytes_total; /* over the files still to fetch in this run */
    double elapsed;
    int attempt;                  /* 1 on the first try of this file */
    const char *note;             /* "retrying in 2 s: ..." or NULL */
} hub_progress;

typedef struct {
    const char *endpoint;   /* NULL: $HF_ENDPOINT or https://huggingface.co */
    const char *token;      /* NULL: $HF_TOKEN (may be unset) */
    const char *revision;   /* NULL: "main" */
    const char *dir;        /* NULL: hub_cache_dir(repo) */
    int max_retries;        /* 0: 6 */
    int retry_base_ms;      /* 0: 1000 (doubles each retry) */
    int stall_seconds;      /* 0: 60: a transfer below 1 byte/s this long is retried */
    void (*progress)(void *user, const hub_progress *p);
    void *progress_user;
} hub_opts;

void hub_opts_default(hub_opts *o);

/* The default folder for a repo: $LILY_HOME/models/{org}--{name} (LILY_HOME defaults
 * to ~/.cache/lily). */
lily_code hub_cache_dir(const char *repo_id, const char *suffix, char *out, size_t n,
                        lily_status *st);

/* Downloads every file of the repository at the revision into the folder (created as
 * needed); files already complete are kept. `out_dir` (may be NULL) receives the folder. */
lily_code hub_pull(const char *repo_id, const hub_opts *o, char *out_dir, size_t n,
                   lily_status *st);

/* For the server's --model-path: a local folder is returned as is; a repo id is pulled
 * into the cache and, when its config.json has no `quantization` (the bf16 release),
 * converted once to 4-bit MLX layout beside it ({org}--{name}-mlx4); the folder to
 * load is written to out_dir. */
lily_code hub_resolve_model(const char *path_or_id, char *out_dir, size_t n, lily_status *st);
/* The same with download options and progress. */
lily_code hub_resolve_model_ex(const char *path_or_id, const hub_opts *o, char *out_dir,
                               size_t n, lily_status *st);

#endif
