/* serve's /metrics text on its own (metrics.h): Prometheus' 0.0.4 format to the byte (escapes, float
 * spelling, cumulative buckets ending at +Inf), and the registry's families and counts. */
#include <math.h>
#include <string.h>

#include "buf.h"
#include "check.h"
#include "metrics.h"

static int has(const pi2_buf *b, const char *s) { return b->p && strstr(b->p, s) != NULL; }

int main(void) {
    pi2_buf b = {0};
    pi2_prom_family(&b, "pi2_x_total", "counter", "a \\ and a\nnewline; \"quotes\" stay");
    pi2_prom_sample_u64(&b, "pi2_x_total", NULL, 18446744073709551615ull);
    pi2_buf lab = {0};
    pi2_prom_label(&lab, "path", "a\"b\\c\nd");
    pi2_prom_sample(&b, "pi2_y", lab.p, 0.005);
    pi2_prom_sample(&b, "pi2_y", "", 0.1 + 0.2); /* 0.30000000000000004: needs 17 digits to read back */
    pi2_prom_sample(&b, "pi2_y", NULL, NAN);
    pi2_prom_sample(&b, "pi2_y", NULL, -INFINITY);
    pi2_prom_sample(&b, "pi2_y", NULL, 1e21);
    CHECK(!b.oom && !strcmp(b.p, "# HELP pi2_x_total a \\\\ and a\\nnewline; \"quotes\" stay\n"
                                 "# TYPE pi2_x_total counter\n"
                                 "pi2_x_total 18446744073709551615\n"
                                 "pi2_y{path=\"a\\\"b\\\\c\\nd\"} 0.005\n"
                                 "pi2_y 0.30000000000000004\n"
                                 "pi2_y NaN\n"
                                 "pi2_y -Inf\n"
                                 "pi2_y 1e+21\n"));
    pi2_buf_free(&b);
    pi2_buf_free(&lab);

    static const double le[] = {0.01, 0.1, 1};
    pi2_histogram h;
    pi2_hist_init(&h, le, 3);
    const double obs[] = {0.01, 0.05, 0.05, 2, 0.1, 0.0};
    for (size_t i = 0; i < sizeof obs / sizeof obs[0]; i++) pi2_hist_observe(&h, obs[i]);
    pi2_prom_histogram(&b, "pi2_t_seconds", "t", &h);
    /* le is "less than or equal": 0.01 and 0.1 land in their own bounds' buckets */
    CHECK(!strcmp(b.p, "# HELP pi2_t_seconds t\n# TYPE pi2_t_seconds histogram\n"
                       "pi2_t_seconds_bucket{le=\"0.01\"} 2\n"
                       "pi2_t_seconds_bucket{le=\"0.1\"} 5\n"
                       "pi2_t_seconds_bucket{le=\"1\"} 5\n"
                       "pi2_t_seconds_bucket{le=\"+Inf\"} 6\n"
                       "pi2_t_seconds_sum 2.21\n"
                       "pi2_t_seconds_count 6\n"));
    pi2_buf_free(&b);

    CHECK(pi2_endpoint_of("/v1/chat/completions") == PI2_EP_CHAT && pi2_endpoint_of("/metrics") == PI2_EP_METRICS);
    CHECK(pi2_endpoint_of("/metrics/") == PI2_EP_OTHER && !strcmp(pi2_endpoint_name(PI2_EP_OTHER), "other"));

    pi2_metrics m;
    pi2_metrics_init(&m);
    pi2_metrics_request(&m, PI2_EP_CHAT, 200);
    pi2_metrics_request(&m, PI2_EP_CHAT, 200);
    pi2_metrics_request(&m, PI2_EP_CHAT, 503);
    pi2_metrics_request(&m, PI2_EP_COMPLETIONS, 0);
    pi2_metrics_rejected(&m, PI2_REJECT_QUEUE_FULL);
    pi2_metrics_cancelled(&m, 1);
    pi2_metrics_queued(&m, 0.5);
    pi2_metrics_token(&m, -1, NULL); /* a request's first token: no gap */
    pi2_metrics_token(&m, 0.02, NULL);
    pi2_metrics_token(&m, 0.03, NULL);
    pi2_metrics_turn(&m, 12, 4, 0.25, 1);
    const pi2_metrics_now now = {.in_flight = 2, .computing = 1, .waiting = 3, .max_queue = 4, .peak_rss = 1 << 20};
    pi2_metrics_write(&m, &now, &b);
    CHECK(has(&b, "\npi2_requests_total{endpoint=\"/v1/chat/completions\",code=\"2xx\"} 2\n"));
    CHECK(has(&b, "\npi2_requests_total{endpoint=\"/v1/chat/completions\",code=\"5xx\"} 1\n"));
    CHECK(has(&b, "\npi2_requests_total{endpoint=\"/v1/completions\",code=\"none\"} 1\n"));
    CHECK(!has(&b, "code=\"4xx\"")); /* series never counted are left out */
    CHECK(has(&b, "\npi2_requests_rejected_total{reason=\"queue_full\"} 1\n"));
    CHECK(has(&b, "\npi2_requests_cancelled_total{stage=\"waiting\"} 1\n"));
    CHECK(has(&b, "\npi2_requests_timed_out_total 1\n") && has(&b, "\npi2_prompt_tokens_total 12\n"));
    CHECK(has(&b, "\npi2_prompt_tokens_cached_total 4\n") && has(&b, "\npi2_generated_tokens_total 3\n"));
    CHECK(has(&b, "\npi2_time_between_tokens_seconds_count 2\n") && has(&b, "\npi2_time_between_tokens_seconds_sum 0.05\n"));
    CHECK(has(&b, "\npi2_time_to_first_token_seconds_count 1\n") && has(&b, "\npi2_queue_wait_seconds_sum 0.5\n"));
    CHECK(has(&b, "\npi2_queue_length 3\n") && has(&b, "\npi2_peak_rss_bytes 1048576\n"));
    CHECK(!has(&b, "pi2_sparse_")); /* no sparse engine: no cache families */
    /* every family's # TYPE follows its # HELP */
    int families = 0;
    for (const char *t = strstr(b.p, "# TYPE "); t; t = strstr(t + 1, "# TYPE ")) {
        const char *name = t + 7;
        const size_t n = strcspn(name, " ");
        char help[80];
        snprintf(help, sizeof help, "# HELP %.*s ", (int)n, name);
        const char *prev = t - 1; /* the line before: its HELP */
        while (prev > b.p && prev[-1] != '\n') prev--;
        CHECK(t > b.p && !strncmp(prev, help, strlen(help)));
        families++;
    }
    CHECK(families == 17); /* requests 4, tokens 3, histograms 3, the queue and memory 7 */
    pi2_buf_free(&b);

    pi2_sparse_stats st = {.hits_hot = 6, .hits_cold = 2, .misses_cold = 2, .bytes_read = 4096, .reads = 3};
    pi2_metrics_token(&m, 0.01, &st);
    pi2_metrics_write(&m, &now, &b);
    CHECK(has(&b, "\npi2_sparse_cache_lookups_total{region=\"hot\",result=\"hit\"} 6\n"));
    CHECK(has(&b, "\npi2_sparse_cache_lookups_total{region=\"cold\",result=\"miss\"} 2\n"));
    CHECK(has(&b, "\npi2_sparse_cache_hit_rate 0.8\n") && has(&b, "\npi2_sparse_storage_bytes_read_total 4096\n"));
    pi2_buf_free(&b);
    pi2_metrics_destroy(&m);
    return pi2_test_summary("test_metrics");
}
