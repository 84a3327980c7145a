#define _GNU_SOURCE
/* Fuzzes the Responses translation (body -> OpenAI chat body, previous_response_id looked up
 * in a real store): a result must be a JSON object the chat validator answers without
 * crashing, a refusal a 400 (or 500 out of memory) with a message; the translated messages are then fed to the
 * stream converter as if generated, the response object is built and stored, and the body
 * doubles as a GET/DELETE path. The first byte picks the options. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "../src/server/anthropic_out.c"
#include "../src/server/request.c"
#include "../src/server/response.c"
#include "../src/server/responses.c"
#include "../src/server/responses_out.c"
#include "../src/server/responses_store.c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static srv_resp_store *st;
    if (!st) { /* one known previous response: "resp_x" */
        st = srv_resp_store_new(8, 1 << 16);
        json_t *r = json_loads("{\"id\":\"resp_x\",\"output\":[{\"type\":\"reasoning\",\"content\":[{\"type\":\"reasoning_text\",\"text\":\"r\"}]},"
                               "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"a\"}]},"
                               "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{}\"}]}", 0, NULL);
        json_t *in = json_loads("[{\"role\":\"user\",\"content\":\"q\"}]", 0, NULL);
        srv_resp_store_put(st, "resp_x", r, in);
        json_decref(r);
        json_decref(in);
    }
    srv_error e = { 0 };
    srv_resp_ctx *c = NULL;
    char *out = srv_resp_to_openai((const char *)data + 1, size - 1, data[0] & 1 ? st : NULL, "m", &c, &e);
    if (!out) {
        if ((e.http != 400 && e.http != 500) || !e.message[0] || c) abort();
        srv_resp_fix_param(&e);
        char *js = srv_error_json(&e);
        if (!js) abort();
        free(js);
        return 0;
    }
    json_t *o = json_loads(out, 0, NULL);
    if (!json_is_object(o) || !c || !json_is_array(c->input)) abort();
    srv_request r;
    if (srv_request_parse(out, strlen(out), SRV_CHAT, &r, &e) == 0) srv_request_free(&r);
    /* the translated assistant messages as stream deltas, then the plain object */
    srv_resp_stream s = { .ctx = c, .incomplete = data[0] & 2 };
    char *buf = NULL;
    size_t len = 0, cap = 0, i;
    json_t *m, *last = NULL;
    json_array_foreach(json_object_get(o, "messages"), i, m) {
        if (strcmp(json_string_value(json_object_get(m, "role")) ?: "", "assistant")) continue;
        last = m;
        json_t *d = json_deep_copy(m);
        json_object_del(d, "role");
        srv_resp_stream_feed(&s, json_pack("{s:[{s:o,s:n}]}", "choices", "delta", d, "finish_reason"), &buf, &len, &cap);
    }
    srv_resp_stream_feed(&s, json_pack("{s:[{s:{},s:s}]}", "choices", "delta", "finish_reason", "stop"), &buf, &len, &cap);
    srv_resp_stream_feed(&s, json_pack("{s:[],s:{s:i,s:i}}", "choices", "usage", "prompt_tokens", 3, "completion_tokens", 1),
                         &buf, &len, &cap);
    if (!buf || (!strstr(buf, "event: response.completed\n") && !strstr(buf, "event: response.incomplete\n"))) abort();
    free(buf);
    c->store = data[0] & 4;
    c->st = st;
    json_t *chat = json_pack("{s:s,s:[{s:O,s:s}],s:{s:i,s:i}}", "model", "m", "choices", "message",
                             last ? last : json_object_get(o, "messages"), "finish_reason", "stop", "usage", "prompt_tokens", 3,
                             "completion_tokens", 1);
    json_t *resp = srv_resp_object(c, chat, data[0] & 2);
    if (!resp) abort();
    char *body = NULL;
    srv_resp_lookup(st, c->id, data[0] & 8 ? 1 : 0, &body);
    free(body);
    char path[64];
    snprintf(path, sizeof path, "%.*s", (int)(size - 1 < 63 ? size - 1 : 63), (const char *)data + 1);
    if (!memchr(path, 0, strlen(path)) && srv_resp_lookup(st, path, data[0] & 16 ? 1 : 0, &body) && !body) abort();
    free(body);
    json_decref(resp);
    json_decref(chat);
    srv_resp_stream_free(&s);
    json_decref(o);
    free(out);
    return 0;
}
