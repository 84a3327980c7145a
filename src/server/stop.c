/* Stop strings across token boundaries: the filter holds back the longest tail of the
 * generated text that is a prefix of some stop string, so a stop string split over
 * several tokens is still found and never reaches the client. Generation stops at the
 * first stop string to be completed. The held tail starts
 * where a stop string would start, so releasing text before it never splits a UTF-8
 * character of valid input. */
#include <stdlib.h>
#include <string.h>
#include "server/server.h"

void srv_stop_init(srv_stop *f, char *const *stops, int n) {
    memset(f, 0, sizeof *f);
    for (int i = 0; i < n && f->n < SRV_MAX_STOP; i++) {
        size_t l = strlen(stops[i]);
        if (!l) continue;
        f->s[f->n] = strdup(stops[i]);
        if (!f->s[f->n]) continue;
        f->len[f->n++] = l;
    }
}

void srv_stop_free(srv_stop *f) {
    for (int i = 0; i < f->n; i++) free(f->s[i]);
    free(f->held);
    memset(f, 0, sizeof *f);
}

static int put(char **out, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 64;
        while (c < *len + n + 1) c *= 2;
        char *b = realloc(*out, c);
        if (!b) return -1;
        *out = b;
        *cap = c;
    }
    if (n) memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = 0;
    return 0;
}

int srv_stop_feed(srv_stop *f, const char *text, size_t len, char **out, size_t *out_len, size_t *out_cap) {
    if (f->stopped) return 1;
    if (!f->n) return put(out, out_len, out_cap, text, len) ? -1 : 0;
    if (put(&f->held, &f->n_held, &f->cap, text, len)) return -1;
    const char *h = f->held;
    size_t n = f->n_held;
    /* The match that completes first wins, as if the text arrived byte by byte (so the
     * result does not depend on how it was split); at the same end, the longest. */
    size_t best = (size_t)-1, best_end = (size_t)-1;
    int best_i = -1;
    for (int i = 0; i < f->n; i++) {
        if (f->len[i] > n) continue;
        for (size_t p = 0; p + f->len[i] <= n && p + f->len[i] <= best_end; p++)
            if (h[p] == f->s[i][0] && !memcmp(h + p, f->s[i], f->len[i])) {
                if (p + f->len[i] < best_end || p < best) { best = p; best_end = p + f->len[i]; best_i = i; }
                break;
            }
    }
    if (best != (size_t)-1) {
        int rc = put(out, out_len, out_cap, h, best);
        f->n_held = 0;
        f->stopped = 1;
        f->which = best_i;
        return rc ? -1 : 1;
    }
    /* hold the longest tail that is a proper prefix of a stop string */
    size_t keep = 0;
    for (int i = 0; i < f->n; i++) {
        size_t m = f->len[i] - 1 < n ? f->len[i] - 1 : n;
        for (size_t k = m; k > keep; k--)
            if (!memcmp(h + n - k, f->s[i], k)) { keep = k; break; }
    }
    if (put(out, out_len, out_cap, h, n - keep)) return -1;
    memmove(f->held, h + n - keep, keep);
    f->n_held = keep;
    return 0;
}

int srv_stop_flush(srv_stop *f, char **out, size_t *out_len, size_t *out_cap) {
    if (f->stopped || !f->n_held) return 0;
    int rc = put(out, out_len, out_cap, f->held, f->n_held);
    f->n_held = 0;
    return rc;
}
