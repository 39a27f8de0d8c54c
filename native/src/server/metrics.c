/* GET /metrics (metrics.h): Prometheus' text format, and serve's registry written in it. */
#include "metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the format ---------------------------------------------------------------------------------- */

/* The shortest of %.15g..%.17g that reads back as v: 0.005 stays "0.005", not 0.0050000000000000001. */
static void fmt_double(char *out, size_t n, double v) {
    if (isnan(v)) {
        snprintf(out, n, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(out, n, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    for (int p = 15; p <= 17; p++) {
        snprintf(out, n, "%.*g", p, v);
        if (strtod(out, NULL) == v) return;
    }
}

/* s with backslash and newline escaped, and (in label values) the double quote too. */
static void escaped(pi2_buf *b, const char *s, int quote) {
    for (; *s; s++) {
        if (*s == '\\') pi2_buf_puts(b, "\\\\");
        else if (*s == '\n') pi2_buf_puts(b, "\\n");
        else if (*s == '"' && quote) pi2_buf_puts(b, "\\\"");
        else pi2_buf_add(b, s, 1);
    }
}

void pi2_prom_family(pi2_buf *b, const char *name, const char *type, const char *help) {
    pi2_buf_printf(b, "# HELP %s ", name);
    escaped(b, help, 0);
    pi2_buf_printf(b, "\n# TYPE %s %s\n", name, type);
}

void pi2_prom_label(pi2_buf *b, const char *name, const char *value) {
    pi2_buf_printf(b, "%s=\"", name);
    escaped(b, value, 1);
    pi2_buf_puts(b, "\"");
}

static void sample_name(pi2_buf *b, const char *name, const char *labels) {
    pi2_buf_puts(b, name);
    if (labels && *labels) pi2_buf_printf(b, "{%s}", labels);
}

void pi2_prom_sample(pi2_buf *b, const char *name, const char *labels, double v) {
    char num[40];
    fmt_double(num, sizeof num, v);
    sample_name(b, name, labels);
    pi2_buf_printf(b, " %s\n", num);
}

void pi2_prom_sample_u64(pi2_buf *b, const char *name, const char *labels, uint64_t v) {
    sample_name(b, name, labels);
    pi2_buf_printf(b, " %llu\n", (unsigned long long)v);
}

void pi2_hist_init(pi2_histogram *h, const double *le, int n) {
    memset(h, 0, sizeof *h);
    h->le = le;
    h->n = n < PI2_PROM_MAX_BUCKETS ? n : PI2_PROM_MAX_BUCKETS;
}

void pi2_hist_observe(pi2_histogram *h, double v) {
    int i = 0;
    while (i < h->n && !(v <= h->le[i])) i++; /* NaN falls through to +Inf */
    h->counts[i]++;
    h->count++;
    h->sum += v;
}

void pi2_prom_histogram(pi2_buf *b, const char *name, const char *help, const pi2_histogram *h) {
    pi2_prom_family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        char le[40];
        if (i < h->n) fmt_double(le, sizeof le, h->le[i]);
        else snprintf(le, sizeof le, "+Inf");
        cum += h->counts[i];
        pi2_buf_printf(b, "%s_bucket{le=\"%s\"} %llu\n", name, le, (unsigned long long)cum);
    }
    char sum[40];
    fmt_double(sum, sizeof sum, h->sum);
    pi2_buf_printf(b, "%s_sum %s\n%s_count %llu\n", name, sum, name, (unsigned long long)h->count);
}

/* ---- serve's registry ---------------------------------------------------------------------------- */

/* Fixed bounds (s). Time to first token on a phone runs from tens of ms (a short prompt, cached prefix)
 * to tens of seconds (a long prompt under a tight budget); a token's time from a few ms (a small model
 * from cache) to a second (every neuron from storage). */
static const double TTFT_LE[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};
static const double TBT_LE[] = {0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1, 2.5};
static const double QUEUE_LE[] = {0.001, 0.01, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};
#define N_OF(a) (int)(sizeof(a) / sizeof(a)[0])

static const char *const EP_NAMES[PI2_EP_N] = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health",
                                               "/metrics", "other"};

const char *pi2_endpoint_name(pi2_endpoint e) { return e < PI2_EP_N ? EP_NAMES[e] : "other"; }

pi2_endpoint pi2_endpoint_of(const char *path) {
    for (int e = 0; e < PI2_EP_OTHER; e++)
        if (!strcmp(path, EP_NAMES[e])) return (pi2_endpoint)e;
    return PI2_EP_OTHER;
}

void pi2_metrics_init(pi2_metrics *m) {
    memset(&m->c, 0, sizeof m->c);
    pthread_mutex_init(&m->mu, NULL);
    pi2_hist_init(&m->c.ttft, TTFT_LE, N_OF(TTFT_LE));
    pi2_hist_init(&m->c.tbt, TBT_LE, N_OF(TBT_LE));
    pi2_hist_init(&m->c.queue_wait, QUEUE_LE, N_OF(QUEUE_LE));
}

void pi2_metrics_destroy(pi2_metrics *m) { pthread_mutex_destroy(&m->mu); }

void pi2_metrics_request(pi2_metrics *m, pi2_endpoint e, int status) {
    const int cls = status >= 100 && status < 600 ? status / 100 : 0;
    pthread_mutex_lock(&m->mu);
    m->c.requests[e < PI2_EP_N ? e : PI2_EP_OTHER][cls]++;
    pthread_mutex_unlock(&m->mu);
}

void pi2_metrics_rejected(pi2_metrics *m, pi2_reject_reason why) {
    pthread_mutex_lock(&m->mu);
    m->c.rejected[why]++;
    pthread_mutex_unlock(&m->mu);
}

void pi2_metrics_cancelled(pi2_metrics *m, int while_waiting) {
    pthread_mutex_lock(&m->mu);
    if (while_waiting) m->c.cancelled_waiting++;
    else m->c.cancelled_running++;
    pthread_mutex_unlock(&m->mu);
}

void pi2_metrics_queued(pi2_metrics *m, double queue_s) {
    pthread_mutex_lock(&m->mu);
    pi2_hist_observe(&m->c.queue_wait, queue_s);
    pthread_mutex_unlock(&m->mu);
}

void pi2_metrics_token(pi2_metrics *m, double tbt_s, const pi2_sparse_stats *st) {
    pthread_mutex_lock(&m->mu);
    m->c.generated_tokens++;
    if (tbt_s >= 0) pi2_hist_observe(&m->c.tbt, tbt_s);
    if (st) m->c.st = *st, m->c.sparse = 1;
    pthread_mutex_unlock(&m->mu);
}

void pi2_metrics_turn(pi2_metrics *m, int prompt, int cached, double ttft_s, int timed_out) {
    pthread_mutex_lock(&m->mu);
    m->c.prompt_tokens += (uint64_t)prompt;
    m->c.prompt_tokens_cached += (uint64_t)cached;
    if (ttft_s >= 0) pi2_hist_observe(&m->c.ttft, ttft_s);
    m->c.timed_out += timed_out != 0;
    pthread_mutex_unlock(&m->mu);
}

void pi2_metrics_sparse(pi2_metrics *m, const pi2_sparse_stats *st) {
    pthread_mutex_lock(&m->mu);
    m->c.st = *st;
    m->c.sparse = 1;
    pthread_mutex_unlock(&m->mu);
}

static void counter(pi2_buf *b, const char *name, const char *help, uint64_t v) {
    pi2_prom_family(b, name, "counter", help);
    pi2_prom_sample_u64(b, name, NULL, v);
}

static void gauge(pi2_buf *b, const char *name, const char *help, double v) {
    pi2_prom_family(b, name, "gauge", help);
    pi2_prom_sample(b, name, NULL, v);
}

void pi2_metrics_write(pi2_metrics *src, const pi2_metrics_now *now, pi2_buf *b) {
    /* a copy taken at one instant, so the families agree with each other; written outside the lock */
    pthread_mutex_lock(&src->mu);
    const pi2_metrics_counts m = src->c;
    pthread_mutex_unlock(&src->mu);
    static const char *const cls[6] = {"none", "1xx", "2xx", "3xx", "4xx", "5xx"};

    pi2_prom_family(b, "pi2_requests_total", "counter",
                    "Requests answered, by route and status class (code \"none\": the client left before any answer).");
    for (int e = 0; e < PI2_EP_N; e++)
        for (int c = 0; c < 6; c++) {
            if (!m.requests[e][c]) continue; /* absent series read as zero */
            pi2_buf labels = {0};
            pi2_prom_label(&labels, "endpoint", EP_NAMES[e]);
            pi2_buf_puts(&labels, ",");
            pi2_prom_label(&labels, "code", cls[c]);
            pi2_prom_sample_u64(b, "pi2_requests_total", labels.p, m.requests[e][c]);
            b->oom |= labels.oom;
            pi2_buf_free(&labels);
        }
    pi2_prom_family(b, "pi2_requests_rejected_total", "counter",
                    "Requests answered 503 at once: the compute slot's queue was full, or too many connections.");
    pi2_prom_sample_u64(b, "pi2_requests_rejected_total", "reason=\"queue_full\"", m.rejected[PI2_REJECT_QUEUE_FULL]);
    pi2_prom_sample_u64(b, "pi2_requests_rejected_total", "reason=\"too_many_connections\"",
                        m.rejected[PI2_REJECT_CONNECTIONS]);
    pi2_prom_family(b, "pi2_requests_cancelled_total", "counter",
                    "Requests whose client disconnected (or stopped reading): while waiting for the compute slot, "
                    "or while generating (ended at the next token).");
    pi2_prom_sample_u64(b, "pi2_requests_cancelled_total", "stage=\"waiting\"", m.cancelled_waiting);
    pi2_prom_sample_u64(b, "pi2_requests_cancelled_total", "stage=\"generating\"", m.cancelled_running);
    counter(b, "pi2_requests_timed_out_total", "Requests ended by --request-timeout.", m.timed_out);
    counter(b, "pi2_prompt_tokens_total", "Prompt tokens of answered completions (usage.prompt_tokens).", m.prompt_tokens);
    counter(b, "pi2_prompt_tokens_cached_total", "Prompt tokens reused from the KV cache, not prefilled (n_cached).",
            m.prompt_tokens_cached);
    counter(b, "pi2_generated_tokens_total", "Tokens sampled (usage.completion_tokens).", m.generated_tokens);
    pi2_prom_histogram(b, "pi2_time_to_first_token_seconds",
                       "From taking the compute slot to the first token sampled (the engine's clock).", &m.ttft);
    pi2_prom_histogram(b, "pi2_time_between_tokens_seconds", "Between a request's consecutive tokens sampled.", &m.tbt);
    pi2_prom_histogram(b, "pi2_queue_wait_seconds", "Waiting for the compute slot.", &m.queue_wait);

    gauge(b, "pi2_requests_in_flight", "Connections being served (this scrape's included).", now->in_flight);
    gauge(b, "pi2_requests_computing", "Requests holding the compute slot (0 or 1).", now->computing);
    gauge(b, "pi2_queue_length", "Requests waiting for the compute slot.", now->waiting);
    gauge(b, "pi2_queue_capacity", "The most that may wait (--max-queue).", now->max_queue);
    gauge(b, "pi2_peak_rss_bytes", "The process's peak resident set (VmHWM).", (double)now->peak_rss);
    gauge(b, "pi2_rss_bytes", "The process's resident set now (VmRSS).", (double)now->rss);
    counter(b, "pi2_process_read_bytes_total", "Bytes the process read from storage (/proc/self/io read_bytes).",
            now->process_read_bytes);
    if (!m.sparse) return; /* the dense policy: no neuron cache, no neuron store */
    const pi2_sparse_stats *st = &m.st;
    const uint64_t hits = st->hits_hot + st->hits_cold, lookups = hits + st->misses_hot + st->misses_cold;
    pi2_prom_family(b, "pi2_sparse_cache_lookups_total", "counter",
                    "The sparse engine's neuron cache lookups, by region (hot, cold) and result (hit, miss).");
    pi2_prom_sample_u64(b, "pi2_sparse_cache_lookups_total", "region=\"hot\",result=\"hit\"", st->hits_hot);
    pi2_prom_sample_u64(b, "pi2_sparse_cache_lookups_total", "region=\"cold\",result=\"hit\"", st->hits_cold);
    pi2_prom_sample_u64(b, "pi2_sparse_cache_lookups_total", "region=\"hot\",result=\"miss\"", st->misses_hot);
    pi2_prom_sample_u64(b, "pi2_sparse_cache_lookups_total", "region=\"cold\",result=\"miss\"", st->misses_cold);
    gauge(b, "pi2_sparse_cache_hit_rate", "Neuron cache hits / lookups since the server started (the summary's hit_rate).",
          lookups ? (double)hits / (double)lookups : 0.0);
    counter(b, "pi2_sparse_storage_bytes_read_total", "Bytes the neuron store read from storage (storage_bytes_read).",
            st->bytes_read);
    counter(b, "pi2_sparse_storage_reads_total", "Reads the neuron store issued (storage_reads).", st->reads);
    pi2_prom_family(b, "pi2_sparse_io_wait_seconds_total", "counter", "Time compute waited on neuron reads (io_wait_s).");
    pi2_prom_sample(b, "pi2_sparse_io_wait_seconds_total", NULL, st->io_wait_ns / 1e9);
}
