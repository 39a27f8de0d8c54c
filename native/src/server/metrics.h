/* `pi2-engine serve`'s GET /metrics: the server's counters, gauges and histograms, and Prometheus'
 * text exposition format (version 0.0.4) they are written in. Every family has its # HELP and # TYPE
 * lines; a histogram has cumulative _bucket{le="..."} lines ending at le="+Inf", then _sum and _count.
 * The registry has a lock of its own: connection threads count their answers while the thread holding
 * the compute slot counts tokens, and a scrape reads all of it at one instant. */
#ifndef PI2_SERVER_METRICS_H
#define PI2_SERVER_METRICS_H

#include <pthread.h>
#include <stdint.h>

#include "buf.h"
#include "sparse.h"

#define PI2_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* ---- the format ---------------------------------------------------------------------------------- */

/* A family's "# HELP name help" (help's backslashes and newlines escaped) and "# TYPE name type". */
void pi2_prom_family(pi2_buf *b, const char *name, const char *type, const char *help);
/* `name="value"` with the value escaped (backslash, double quote, newline), for a sample's labels. */
void pi2_prom_label(pi2_buf *b, const char *name, const char *value);
/* One sample line: name, {labels} when labels is not NULL or "", the value. Floats are written so that
 * they read back the same (NaN and infinities as Prometheus spells them). */
void pi2_prom_sample(pi2_buf *b, const char *name, const char *labels, double v);
void pi2_prom_sample_u64(pi2_buf *b, const char *name, const char *labels, uint64_t v);

/* A histogram of fixed upper bounds le[0..n) (increasing; +Inf is implied). counts are per bucket,
 * not cumulative: the writer sums them. */
#define PI2_PROM_MAX_BUCKETS 16
typedef struct {
    const double *le;
    int n;
    uint64_t counts[PI2_PROM_MAX_BUCKETS + 1]; /* counts[n]: above the last bound */
    uint64_t count;
    double sum;
} pi2_histogram;

void pi2_hist_init(pi2_histogram *h, const double *le, int n);
void pi2_hist_observe(pi2_histogram *h, double v);
/* The whole family: HELP, TYPE, the buckets, _sum, _count. */
void pi2_prom_histogram(pi2_buf *b, const char *name, const char *help, const pi2_histogram *h);

/* ---- serve's registry ---------------------------------------------------------------------------- */

/* The routes a request is counted under ("other": an unknown path, or a request not read whole). */
typedef enum { PI2_EP_CHAT, PI2_EP_COMPLETIONS, PI2_EP_MODELS, PI2_EP_HEALTH, PI2_EP_METRICS, PI2_EP_OTHER, PI2_EP_N } pi2_endpoint;
const char *pi2_endpoint_name(pi2_endpoint e);
/* The route of a request path. */
pi2_endpoint pi2_endpoint_of(const char *path);

typedef enum { PI2_REJECT_QUEUE_FULL, PI2_REJECT_CONNECTIONS, PI2_REJECT_N } pi2_reject_reason;

typedef struct {
    uint64_t requests[PI2_EP_N][6]; /* [route][status / 100]; [0]: the client left before any answer */
    uint64_t rejected[PI2_REJECT_N];
    uint64_t cancelled_waiting, cancelled_running, timed_out;
    uint64_t prompt_tokens, prompt_tokens_cached, generated_tokens;
    pi2_histogram ttft, tbt, queue_wait;
    int sparse; /* the sparse engine runs: st is its counters as of the last token */
    pi2_sparse_stats st;
} pi2_metrics_counts;

typedef struct {
    pthread_mutex_t mu;
    pi2_metrics_counts c;
} pi2_metrics;

/* What the server knows only at the scrape. */
typedef struct {
    int in_flight, computing, waiting, max_queue;
    uint64_t peak_rss, rss, process_read_bytes;
} pi2_metrics_now;

void pi2_metrics_init(pi2_metrics *m);
void pi2_metrics_destroy(pi2_metrics *m);
/* A request answered with status (0: none, the client left first). */
void pi2_metrics_request(pi2_metrics *m, pi2_endpoint e, int status);
void pi2_metrics_rejected(pi2_metrics *m, pi2_reject_reason why);
/* A client that went away: while it waited for the compute slot, or while its request computed. */
void pi2_metrics_cancelled(pi2_metrics *m, int while_waiting);
/* A request took the compute slot after waiting queue_s. */
void pi2_metrics_queued(pi2_metrics *m, double queue_s);
/* A token sampled: tbt_s since the request's previous one (< 0 for its first). st: the sparse engine's
 * counters now (NULL under the dense policy). */
void pi2_metrics_token(pi2_metrics *m, double tbt_s, const pi2_sparse_stats *st);
/* A request's turn ended as its usage says: prompt tokens (cached of them reused from the KV cache),
 * its time to first token (< 0: none was sampled), whether --request-timeout ended it. */
void pi2_metrics_turn(pi2_metrics *m, int prompt, int cached, double ttft_s, int timed_out);
/* The sparse engine's counters now, outside a turn (after the model load). */
void pi2_metrics_sparse(pi2_metrics *m, const pi2_sparse_stats *st);
/* Every family, as GET /metrics answers. */
void pi2_metrics_write(pi2_metrics *m, const pi2_metrics_now *now, pi2_buf *out);

#endif
