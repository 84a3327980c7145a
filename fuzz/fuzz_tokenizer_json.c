/* Fuzzes tokenizer.json parsing; whatever loads must also encode and decode safely. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tok_tokenizer *t = NULL;
    lily_status st;
    if (tok_load_json((const char *)data, size, &t, &st) != LILY_OK) {
        if (!memchr(st.msg, 0, sizeof st.msg) || !st.msg[0]) abort(); /* errors must say something */
        return 0;
    }
    static const char text[] = "Hello <|im_start|>world's 12 naïve \xF0\x9F\xA6\x99 \xC3 \n\n  end";
    for (int special = 0; special < 2; special++) {
        int32_t *ids; int n;
        if (tok_encode(t, text, sizeof text - 1, special, &ids, &n, &st) == LILY_OK) {
            char *out; size_t len;
            for (int i = 0; i < n; i++)
                if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) abort();
            if (tok_decode(t, ids, n, special, &out, &len) == LILY_OK) free(out);
            free(ids);
        }
    }
    size_t pl;
    for (int32_t id = -1; id < 300 && id <= tok_vocab_size(t); id++) {
        tok_piece(t, id, &pl);
        tok_is_special(t, id);
    }
    tok_id(t, "<|im_end|>");
    tok_free(t);
    return 0;
}
