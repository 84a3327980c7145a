/* safetensors header parsing on arbitrary bytes: errors, never crashes or reads past the buffer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "loader/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a private copy, so ASan catches any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    st_tensor *t = NULL;
    int n = 0;
    lily_status st;
    if (st_parse(buf, size, "fuzz", 0, &t, &n, &st) == LILY_OK)
        for (int i = 0; i < n; i++) {
            const uint8_t *p = t[i].data;
            volatile uint8_t x = 0;
            if (t[i].nbytes) x = p[0] ^ p[t[i].nbytes - 1];
            (void)x;
        }
    for (int i = 0; i < n; i++) free(t[i].name);
    free(t);
    free(buf);
    return 0;
}
