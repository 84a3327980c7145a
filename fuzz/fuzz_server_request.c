#define _GNU_SOURCE
/* Fuzzes the request validation (JSON body -> srv_request) for both endpoints, and the
 * stop-string filter on whatever stop strings a body carries. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../src/server/request.c"
#include "../src/server/stop.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    srv_kind kind = data[0] & 1 ? SRV_COMPLETION : SRV_CHAT;
    srv_request r;
    srv_error e;
    if (srv_request_parse((const char *)data + 1, size - 1, kind, &r, &e) == 0) {
        if (r.n_stop > SRV_MAX_STOP) abort();
        srv_stop f;
        srv_stop_init(&f, r.stop, r.n_stop);
        char *out = NULL;
        size_t n = 0, cap = 0;
        /* the body itself as generated text, in uneven pieces */
        for (size_t p = 1, step = 1; p < size; p += step, step = step % 7 + 1)
            if (srv_stop_feed(&f, (const char *)data + p, p + step <= size ? step : size - p, &out, &n, &cap) == 1) break;
        srv_stop_flush(&f, &out, &n, &cap);
        for (int i = 0; i < f.n; i++)
            if (out && memmem(out, n, f.s[i], f.len[i])) abort(); /* a stop string leaked */
        free(out);
        srv_stop_free(&f);
        srv_request_free(&r);
    } else {
        if (e.http < 400 || e.http > 599 || !e.message[0]) abort();
        char *js = srv_error_json(&e);
        if (!js) abort();
        free(js);
    }
    return 0;
}
