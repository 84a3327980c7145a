/* The hub API's model listing is untrusted network input: any bytes must parse or be
 * refused with a message, and every accepted file path must be safe to create. */
#include "hub/hub.h"
#include "util/util.h"
#include <stdint.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    hub_listing l;
    lily_status st = { 0 };
    if (hub_listing_parse((const char *)data, size, &l, &st) == LILY_OK) {
        for (int i = 0; i < l.n_files; i++) {
            LILY_ASSERT(hub_path_safe(l.files[i].path));
            LILY_ASSERT(!l.files[i].is_lfs || strlen(l.files[i].sha256) == 64);
            LILY_ASSERT(i == 0 || strcmp(l.files[i - 1].path, l.files[i].path) < 0);
        }
        hub_listing_free(&l);
    } else {
        LILY_ASSERT(st.msg[0] && l.files == NULL);
    }
    return 0;
}
