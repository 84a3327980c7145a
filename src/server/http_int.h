/* Internals shared by http.c and stream.c (the SSE half of the HTTP layer). */
#ifndef LILY_SERVER_HTTP_INT_H
#define LILY_SERVER_HTTP_INT_H
#include <microhttpd.h>
#include "server/server.h"

struct srv_http {
    srv_http_opts o;
    char model_name[128];
    int fd;
    struct MHD_Daemon *d;
    srv_sched *sched;
    const tok_tokenizer *tok;
    srv_metrics *m;
    lily_model_info info;
    long started;
    struct srv_resp_store *resp_store; /* stored /v1/responses answers */
};

/* 1 when the peer has closed or reset the connection (non-blocking peek). */
int srv_peer_closed(int fd);
/* Seconds an idle connection is kept; streams send a comment line when they would be
 * silent for SRV_SSE_PING seconds (a queued request waiting for a slot), which keeps
 * proxies and MHD's timer from closing them. */
#define SRV_IDLE_TIMEOUT 300
#define SRV_SSE_PING 10.0
/* Waits (j->mu held) until ready(j, arg) (0), the client leaves (-1), or max_s > 0
 * seconds pass (1). */
int srv_wait_job(srv_job *j, int fd, int (*ready)(srv_job *, void *), void *arg, double max_s);
/* Queues a 200 text/event-stream response that relays job j (takes its own reference);
 * anthropic: as Anthropic Messages events instead of chat.completion.chunk objects. */
enum MHD_Result srv_stream_start(srv_http *h, struct MHD_Connection *c, int fd, const char *route,
                                 const srv_request *r, srv_job *j, int anthropic);
/* The same for /v1/responses: Responses events (ctx owned, freed even on failure). */
struct srv_resp_ctx;
enum MHD_Result srv_stream_start_resp(srv_http *h, struct MHD_Connection *c, int fd, const char *route,
                                      const srv_request *r, srv_job *j, struct srv_resp_ctx *ctx);
#endif
