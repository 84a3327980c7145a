#define _GNU_SOURCE
/* Fuzzes the Anthropic Messages translation (body -> OpenAI chat body): whatever it
 * returns must be valid JSON that the chat validator answers without crashing, and
 * refusals carry a 400 with a message; the stream converter is fed the translated
 * messages as if they were generated deltas. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../src/server/anthropic.c"
#include "../src/server/anthropic_out.c"
#include "../src/server/request.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    srv_error e = { 0 };
    char *out = srv_anth_to_openai((const char *)data + 1, size - 1, data[0] & 1, &e);
    if (!out) {
        if (e.http != 400 || !e.message[0]) abort();
        char *js = srv_anth_error_json(&e);
        if (!js) abort();
        free(js);
        return 0;
    }
    json_t *o = json_loads(out, 0, NULL);
    if (!json_is_object(o)) abort();
    srv_request r;
    if (srv_request_parse(out, strlen(out), SRV_CHAT, &r, &e) == 0) srv_request_free(&r);
    /* the translated assistant messages as stream deltas */
    srv_anth_stream a = { .model = "m" };
    char *buf = NULL;
    size_t len = 0, cap = 0;
    size_t i;
    json_t *m;
    json_array_foreach(json_object_get(o, "messages"), i, m) {
        json_t *d = json_deep_copy(m);
        json_object_del(d, "role");
        srv_anth_stream_feed(&a, json_pack("{s:[{s:o,s:n}]}", "choices", "delta", d, "finish_reason"), &buf, &len, &cap);
    }
    srv_anth_stream_feed(&a, json_pack("{s:[{s:{},s:s}]}", "choices", "delta", "finish_reason", "stop"), &buf, &len, &cap);
    srv_anth_stream_feed(&a, json_pack("{s:[],s:{s:i,s:i}}", "choices", "usage", "prompt_tokens", 3, "completion_tokens", 1),
                         &buf, &len, &cap);
    if (!buf || !strstr(buf, "event: message_stop\n")) abort();
    free(buf);
    srv_anth_stream_free(&a);
    json_decref(o);
    free(out);
    return 0;
}
