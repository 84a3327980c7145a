/* The store of finished responses: a FIFO list bounded by count and by the size of the
 * JSON it holds, behind one mutex. Entries are kept as JSON text, so no jansson object is
 * ever shared between threads (their reference counts are not meant for that); readers
 * get freshly parsed copies. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/responses.h"

typedef struct entry {
    struct entry *next;
    char id[64];
    char *response, *input;   /* compact JSON text */
    size_t bytes;
} entry;

struct srv_resp_store {
    pthread_mutex_t mu;
    entry *head, *tail;       /* oldest first */
    int n, max_items;
    size_t bytes, max_bytes;
};

srv_resp_store *srv_resp_store_new(int max_items, size_t max_bytes) {
    srv_resp_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    pthread_mutex_init(&s->mu, NULL);
    s->max_items = max_items > 0 ? max_items : 1;
    s->max_bytes = max_bytes;
    return s;
}

static void entry_free(entry *e) {
    free(e->response);
    free(e->input);
    free(e);
}

void srv_resp_store_free(srv_resp_store *s) {
    if (!s) return;
    for (entry *e = s->head, *n; e; e = n) { n = e->next; entry_free(e); }
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* Unlinks and returns the entry for id (mu held), or NULL. */
static entry *unlink_id(srv_resp_store *s, const char *id) {
    entry *prev = NULL;
    for (entry *e = s->head; e; prev = e, e = e->next) {
        if (strcmp(e->id, id)) continue;
        if (prev) prev->next = e->next;
        else s->head = e->next;
        if (s->tail == e) s->tail = prev;
        s->n--;
        s->bytes -= e->bytes;
        return e;
    }
    return NULL;
}

int srv_resp_store_put(srv_resp_store *s, const char *id, json_t *response, json_t *input) {
    if (!s || !id || strlen(id) >= sizeof ((entry *)0)->id) return -1;
    entry *e = calloc(1, sizeof *e);
    if (!e) return -1;
    snprintf(e->id, sizeof e->id, "%s", id);
    e->response = json_dumps(response, JSON_COMPACT);
    json_t *none = input ? NULL : json_array();
    e->input = json_dumps(input ? input : none, JSON_COMPACT);
    json_decref(none);
    if (!e->response || !e->input) { entry_free(e); return -1; }
    e->bytes = strlen(e->response) + strlen(e->input) + sizeof *e;
    if (e->bytes > s->max_bytes) { entry_free(e); return -1; }
    pthread_mutex_lock(&s->mu);
    entry *old = unlink_id(s, id);
    if (old) entry_free(old);
    while (s->head && (s->n >= s->max_items || s->bytes + e->bytes > s->max_bytes)) {
        entry *x = s->head;
        s->head = x->next;
        if (!s->head) s->tail = NULL;
        s->n--;
        s->bytes -= x->bytes;
        entry_free(x);
    }
    if (s->tail) s->tail->next = e;
    else s->head = e;
    s->tail = e;
    s->n++;
    s->bytes += e->bytes;
    pthread_mutex_unlock(&s->mu);
    return 0;
}

json_t *srv_resp_store_get(srv_resp_store *s, const char *id, json_t **input) {
    if (input) *input = NULL;
    if (!s || !id) return NULL;
    json_t *r = NULL;
    pthread_mutex_lock(&s->mu);
    for (entry *e = s->head; e; e = e->next)
        if (!strcmp(e->id, id)) {
            r = json_loads(e->response, 0, NULL);
            if (r && input && !(*input = json_loads(e->input, 0, NULL))) { json_decref(r); r = NULL; }
            break;
        }
    pthread_mutex_unlock(&s->mu);
    return r;
}

int srv_resp_store_delete(srv_resp_store *s, const char *id) {
    if (!s || !id) return 0;
    pthread_mutex_lock(&s->mu);
    entry *e = unlink_id(s, id);
    pthread_mutex_unlock(&s->mu);
    if (e) entry_free(e);
    return e != NULL;
}

void srv_resp_store_counts(srv_resp_store *s, int *n, size_t *bytes) {
    pthread_mutex_lock(&s->mu);
    *n = s->n;
    *bytes = s->bytes;
    pthread_mutex_unlock(&s->mu);
}

static int not_found(const char *id, char **body) {
    srv_error e;
    srv_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "No response found with id '%.100s'.", id);
    *body = srv_error_json(&e);
    return 404;
}

int srv_resp_lookup(srv_resp_store *s, const char *path, int del, char **body) {
    char id[64];
    const char *slash = strchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : strlen(path);
    snprintf(id, sizeof id, "%.*s", (int)(n < sizeof id ? n : sizeof id - 1), path);
    int items = slash && !strcmp(slash, "/input_items");
    if ((slash && !items && strcmp(slash, "/")) || !n || n >= sizeof id || (items && del)) {
        srv_error e;
        srv_error_set(&e, 404, "invalid_request_error", NULL, "not_found", "no route %s /v1/responses/%.100s",
                      del ? "DELETE" : "GET", path);
        *body = srv_error_json(&e);
        return 404;
    }
    if (del) {
        if (!srv_resp_store_delete(s, id)) return not_found(id, body);
        json_t *o = json_pack("{s:s,s:s,s:b}", "id", id, "object", "response", "deleted", 1);
        *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        return 200;
    }
    json_t *in = NULL, *r = srv_resp_store_get(s, id, items ? &in : NULL);
    if (!r) return not_found(id, body);
    if (items) { /* newest first, as OpenAI lists them */
        json_t *data = json_array();
        for (size_t i = json_array_size(in); i-- > 0;) json_array_append(data, json_array_get(in, i));
        json_decref(r);
        r = json_pack("{s:s,s:o,s:b}", "object", "list", "data", data, "has_more", 0);
        json_t *first = json_array_get(data, 0), *last = json_array_get(data, json_array_size(data) - 1);
        json_object_set_new(r, "first_id", json_is_string(json_object_get(first, "id")) ? json_incref(json_object_get(first, "id")) : json_null());
        json_object_set_new(r, "last_id", json_is_string(json_object_get(last, "id")) ? json_incref(json_object_get(last, "id")) : json_null());
        json_decref(in);
    }
    *body = r ? json_dumps(r, JSON_COMPACT) : NULL;
    json_decref(r);
    return 200;
}
