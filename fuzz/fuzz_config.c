/* config.json + generation_config.json parsing on arbitrary text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "loader/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* the input splits at the first NUL into config and generation config */
    char *a = malloc(size + 1);
    if (!a) return 0;
    memcpy(a, data, size);
    a[size] = 0;
    size_t k = strlen(a);
    const char *gen = k < size ? a + k + 1 : NULL;
    lily_config c;
    lily_status st;
    cfg_parse(a, gen, &c, &st);
    free(a);
    return 0;
}
