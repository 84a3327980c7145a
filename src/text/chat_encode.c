/* Rendered prompt -> token ids, with the request's own text kept plain; the template of a
 * checkpoint folder. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text/chat.h"
#include "util/util.h"

lily_code chat_encode(const tok_tokenizer *tok, const char *text, const chat_span *plain, int n_plain,
                      const char *const *suffix, const int *suffix_plain, int n_suffix, int32_t **ids, int *n,
                      lily_status *st) {
    tok_part *parts = malloc(sizeof *parts * (size_t)(2 * n_plain + 1 + n_suffix));
    if (!parts) return lily_err(st, LILY_ENOMEM, "out of memory");
    int np = 0;
    size_t at = 0, len = strlen(text);
    for (int i = 0; i < n_plain; i++) {
        LILY_ASSERT(plain[i].off >= at && plain[i].off + plain[i].len <= len);
        if (plain[i].off > at) parts[np++] = (tok_part){ text + at, plain[i].off - at, 1 };
        parts[np++] = (tok_part){ text + plain[i].off, plain[i].len, 0 };
        at = plain[i].off + plain[i].len;
    }
    if (at < len) parts[np++] = (tok_part){ text + at, len - at, 1 };
    for (int i = 0; i < n_suffix; i++) parts[np++] = (tok_part){ suffix[i], strlen(suffix[i]), !suffix_plain[i] };
    lily_code rc = tok_encode_parts(tok, parts, np, ids, n, st);
    free(parts);
    return rc;
}

chat_template_kind chat_template_for_dir(const char *dir) {
    /* chat_template.jinja, else the chat_template inside tokenizer_config.json; a
     * checkpoint with neither (a synthetic one) gets the default, Qwen3.6 */
    char path[4096];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    char *txt = lily_read_file(path, NULL, NULL);
    if (!txt) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        json_t *cfg = json_load_file(path, 0, NULL);
        json_t *ct = json_object_get(cfg, "chat_template");
        if (json_is_string(ct)) txt = strdup(json_string_value(ct));
        else if (json_is_array(ct)) txt = json_dumps(ct, 0); /* named templates: detection reads substrings */
        json_decref(cfg);
    }
    chat_template_kind k = chat_template_detect(txt);
    free(txt);
    return k;
}
