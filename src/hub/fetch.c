/* One HTTP transfer with libcurl: a JSON GET into memory, or a file download that
 * resumes `X.partial`, hashes as it writes, and reports progress. Retries live in pull.c. */
#include "hub/hub_internal.h"
#include "util/util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct {
    /* response bookkeeping, reset at every status line (redirects have their own) */
    long status;
    int64_t range_start;        /* from Content-Range, -1 when absent */
    char err_msg[200];          /* X-Error-Message */
    /* body sink: either memory or a file */
    char *mem; size_t mem_len, mem_cap, mem_limit;
    int fd; uint64_t offset;    /* bytes in the file so far */
    int resumed;                /* a range was requested */
    hub_hash *hash;
    int write_errno;            /* set when writing the file failed */
    int bad_range;              /* 206 for another offset than asked */
    char errbody[256]; size_t errbody_len;
    hub_xfer_progress_fn progress; void *progress_user;
} xfer;

static size_t on_header(char *buf, size_t sz, size_t n, void *user) {
    xfer *x = user;
    size_t len = sz * n;
    if (len >= 5 && !strncasecmp(buf, "HTTP/", 5)) {
        const char *sp = memchr(buf, ' ', len);
        x->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        x->range_start = -1;
        x->err_msg[0] = 0;
    } else if (len > 14 && !strncasecmp(buf, "Content-Range:", 14)) {
        char tmp[128];
        size_t m = len - 14 < sizeof tmp - 1 ? len - 14 : sizeof tmp - 1;
        memcpy(tmp, buf + 14, m); tmp[m] = 0;
        const char *b = strstr(tmp, "bytes");
        if (b) x->range_start = strtoll(b + 5, NULL, 10);
    } else if (len > 16 && !strncasecmp(buf, "X-Error-Message:", 16)) {
        size_t m = len - 16;
        if (m > sizeof x->err_msg - 1) m = sizeof x->err_msg - 1;
        memcpy(x->err_msg, buf + 16, m); x->err_msg[m] = 0;
        char *e = x->err_msg + strlen(x->err_msg);
        while (e > x->err_msg && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ')) *--e = 0;
        memmove(x->err_msg, x->err_msg + strspn(x->err_msg, " "), strlen(x->err_msg) + 1);
    }
    return len;
}

static int write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) { if (errno == EINTR) continue; return errno; }
        p += w; n -= (size_t)w;
    }
    return 0;
}

static size_t on_body(char *buf, size_t sz, size_t n, void *user) {
    xfer *x = user;
    size_t len = sz * n;
    if (x->status < 200 || x->status >= 300) {   /* error page: keep a little for the message */
        size_t m = sizeof x->errbody - 1 - x->errbody_len;
        if (m > len) m = len;
        memcpy(x->errbody + x->errbody_len, buf, m);
        x->errbody_len += m; x->errbody[x->errbody_len] = 0;
        return len;
    }
    if (x->fd < 0) {
        if (x->mem_len + len > x->mem_limit) return 0;
        if (x->mem_len + len + 1 > x->mem_cap) {
            size_t cap = (x->mem_len + len + 1) * 2;
            char *m = realloc(x->mem, cap);
            if (!m) return 0;
            x->mem = m; x->mem_cap = cap;
        }
        memcpy(x->mem + x->mem_len, buf, len);
        x->mem_len += len; x->mem[x->mem_len] = 0;
        return len;
    }
    if (x->resumed) {
        x->resumed = 0;
        if (x->status == 200) {
            /* The server ignored the range: start the file over. */
            if (ftruncate(x->fd, 0) != 0 || lseek(x->fd, 0, SEEK_SET) != 0) { x->write_errno = errno; return 0; }
            x->offset = 0;
            hub_hash_reset(x->hash);
        } else if (x->range_start != (int64_t)x->offset) {
            x->bad_range = 1;
            return 0;
        }
    }
    int e = write_all(x->fd, buf, len);
    if (e) { x->write_errno = e; return 0; }
    hub_hash_update(x->hash, buf, len);
    x->offset += len;
    return len;
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal; (void)dlnow; (void)ultotal; (void)ulnow;
    xfer *x = user;
    if (x->progress && x->fd >= 0) return x->progress(x->progress_user, x->offset);
    return 0;
}

static CURL *make_handle(const hub_req *r, xfer *x) {
    CURL *c = curl_easy_init();
    if (!c) return NULL;
    curl_easy_setopt(c, CURLOPT_URL, r->url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_USERAGENT, "lily/1 (+libcurl)");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, (long)(r->stall_seconds > 0 ? r->stall_seconds : 60));
    if (r->token && *r->token) {
        /* curl's own bearer auth: sent to the first host only, never after a
         * redirect to another host, port or scheme (the hub's CDN). */
        curl_easy_setopt(c, CURLOPT_HTTPAUTH, CURLAUTH_BEARER);
        curl_easy_setopt(c, CURLOPT_XOAUTH2_BEARER, r->token);
        curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L);
    }
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(c, CURLOPT_XFERINFODATA, x);
    return c;
}

static int transient_curl(CURLcode cc) {
    switch (cc) {
    case CURLE_COULDNT_RESOLVE_HOST: case CURLE_COULDNT_CONNECT: case CURLE_OPERATION_TIMEDOUT:
    case CURLE_RECV_ERROR: case CURLE_SEND_ERROR: case CURLE_PARTIAL_FILE: case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR: case CURLE_HTTP2: case CURLE_HTTP2_STREAM:
        return 1;
    default:
        return 0;
    }
}

/* Turns the outcome of one transfer into a status; `*transient` says whether a retry may help. */
static lily_code outcome(const hub_req *r, CURL *c, CURLcode cc, xfer *x, const char *errbuf,
                         int *transient, lily_status *st) {
    *transient = 0;
    if (x->write_errno)
        return lily_err(st, LILY_EIO, "writing %s: %s%s", r->what, strerror(x->write_errno),
                        x->write_errno == ENOSPC || x->write_errno == EFBIG ? " (the disk is full or the file size limit was reached; the partial file is kept for resuming)" : "");
    if (x->bad_range) { *transient = 1; return lily_err(st, LILY_EIO, "%s: the server answered a different byte range than asked", r->what); }
    if (cc == CURLE_ABORTED_BY_CALLBACK) return lily_err(st, LILY_ECANCELED, "%s: canceled", r->what);
    if (cc != CURLE_OK) {
        *transient = transient_curl(cc);
        if (cc == CURLE_WRITE_ERROR && x->fd < 0)
            return lily_err(st, LILY_EFORMAT, "%s: response larger than %zu bytes", r->what, x->mem_limit);
        return lily_err(st, LILY_EIO, "%s: %s", r->what, errbuf[0] ? errbuf : curl_easy_strerror(cc));
    }
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    const char *why = x->err_msg[0] ? x->err_msg : "";
    if (code == 401 || code == 403)
        return lily_err(st, LILY_EIO, "%s: HTTP %ld, access denied%s%s (%s)", r->what, code,
                        why[0] ? ": " : "", why,
                        r->token && *r->token ? "is the token valid and the repository's license accepted?"
                                              : "a gated or private repository needs HF_TOKEN");
    if (code == 404)
        return lily_err(st, LILY_EIO, "%s: HTTP 404, not found%s%s (check the repository id, revision and file name)",
                        r->what, why[0] ? ": " : "", why);
    if (code == 416) { *transient = 1; return lily_err(st, LILY_ERANGE, "%s: HTTP 416, range not satisfiable", r->what); }
    if (code >= 500 || code == 429 || code == 408) {
        *transient = 1;
        return lily_err(st, LILY_EIO, "%s: HTTP %ld from the server%s%s", r->what, code, why[0] ? ": " : "", why);
    }
    if (code < 200 || code >= 300)
        return lily_err(st, LILY_EIO, "%s: unexpected HTTP %ld%s%s", r->what, code, why[0] ? ": " : "", why);
    return LILY_OK;
}

lily_code hub_http_get(const hub_req *r, size_t limit, char **body, size_t *len, int *transient,
                       lily_status *st) {
    xfer x = { .fd = -1, .mem_limit = limit, .range_start = -1 };
    char errbuf[CURL_ERROR_SIZE] = "";
    CURL *c = make_handle(r, &x);
    if (!c) return lily_err(st, LILY_ENOMEM, "curl_easy_init failed");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    CURLcode cc = curl_easy_perform(c);
    lily_code rc = outcome(r, c, cc, &x, errbuf, transient, st);
    curl_easy_cleanup(c);
    if (rc != LILY_OK) { free(x.mem); return rc; }
    if (!x.mem) x.mem = calloc(1, 1);
    *body = x.mem; *len = x.mem_len;
    return LILY_OK;
}

lily_code hub_http_download(const hub_req *r, int fd, uint64_t *offset, hub_hash *h,
                            hub_xfer_progress_fn progress, void *user, int *transient,
                            lily_status *st) {
    xfer x = { .fd = fd, .offset = *offset, .hash = h, .range_start = -1,
               .progress = progress, .progress_user = user };
    char errbuf[CURL_ERROR_SIZE] = "", range[48];
    CURL *c = make_handle(r, &x);
    if (!c) return lily_err(st, LILY_ENOMEM, "curl_easy_init failed");
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    if (*offset > 0) {
        snprintf(range, sizeof range, "%llu-", (unsigned long long)*offset);
        curl_easy_setopt(c, CURLOPT_RANGE, range);
        x.resumed = 1;
    }
    if (lseek(fd, (off_t)*offset, SEEK_SET) < 0) {
        curl_easy_cleanup(c);
        return lily_err(st, LILY_EIO, "%s: seek: %s", r->what, strerror(errno));
    }
    CURLcode cc = curl_easy_perform(c);
    lily_code rc = outcome(r, c, cc, &x, errbuf, transient, st);
    curl_easy_cleanup(c);
    *offset = x.offset;
    return rc;
}
