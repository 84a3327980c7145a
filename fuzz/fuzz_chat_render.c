/* Chat renderer on arbitrary bytes: whatever JSON arrives, rendering with each template
 * either succeeds with a prompt or fails with a message; never a crash or a leak. */
#include <stdlib.h>
#include <string.h>
#include "text/chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    json_t *req = json_loadb((const char *)data, size, JSON_PRESERVE_ORDER, NULL);
    if (!req) return 0;
    for (int k = 0; k < 3; k++) {
        char *out = NULL;
        lily_status st = { 0 };
        lily_code rc = chat_render(req, (chat_template_kind)k, &out, &st);
        if (rc == LILY_OK ? out == NULL : (out != NULL || !st.msg[0])) abort();
        free(out);
        (void)chat_think_open(req, (chat_template_kind)k);
    }
    json_decref(req);
    return 0;
}
