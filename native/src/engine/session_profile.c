#include "session_profile.h"

#include <stdio.h>
#include <string.h>

void pi2_prof_take(pi2_prof_snap *s, const pi2_ctx *ctx, const pi2_sparse *sparse, const pi2_pool *pool) {
    memset(s, 0, sizeof *s);
    pi2_ctx_prof(ctx, &s->fwd);
    pi2_sparse_snapshot(sparse, &s->sp);
    pi2_pool_counters_get(pool, &s->pool);
}

void pi2_prof_add(pi2_decode_profile *p, const pi2_prof_snap *a, const pi2_prof_snap *b, uint64_t tokens) {
    p->tokens += tokens;
#define D(f) p->sum.f += b->f - a->f
    D(fwd.passes), D(fwd.attention_ns), D(fwd.ffn_ns), D(fwd.output_ns), D(fwd.prefetch_ns);
    D(sp.ffn_ns), D(sp.io_wait_ns), D(sp.predict_ns), D(sp.wave_ns), D(sp.down_ns), D(sp.waves);
    D(pool.jobs), D(pool.worker_sleeps), D(pool.caller_sleeps), D(pool.skipped);
#undef D
}

void pi2_prof_json(const pi2_decode_profile *p, int sparse, char *buf, size_t n) {
    if (n) buf[0] = 0;
    if (!p->tokens) return;
    const double t = (double)p->tokens, ms = 1e6 * t;
    const pi2_prof_snap *s = &p->sum;
    int o = snprintf(buf, n,
                     "{\"tokens\": %llu, \"attention_ms\": %.4f, \"ffn_ms\": %.4f, "
                     "\"output_ms\": %.4f, \"prefetch_ms\": %.4f, \"pool_jobs\": %.2f, \"worker_sleeps\": %.2f, "
                     "\"caller_sleeps\": %.2f, \"skipped_joins\": %.2f",
                     (unsigned long long)p->tokens, s->fwd.attention_ns / ms, s->fwd.ffn_ns / ms, s->fwd.output_ns / ms,
                     s->fwd.prefetch_ns / ms, s->pool.jobs / t, s->pool.worker_sleeps / t, s->pool.caller_sleeps / t,
                     s->pool.skipped / t);
    if (o < 0 || (size_t)o >= n) return;
    if (sparse) {
        const uint64_t parts = s->sp.predict_ns + s->sp.wave_ns + s->sp.down_ns;
        const int q = snprintf(buf + o, n - (size_t)o,
                               ", \"ffn_predict_ms\": %.4f, \"ffn_wave_ms\": %.4f, \"ffn_down_ms\": %.4f, "
                               "\"ffn_serial_ms\": %.4f, \"io_wait_ms\": %.4f, \"waves\": %.2f",
                               s->sp.predict_ns / ms, s->sp.wave_ns / ms, s->sp.down_ns / ms,
                               s->sp.ffn_ns > parts ? (s->sp.ffn_ns - parts) / ms : 0.0, s->sp.io_wait_ns / ms,
                               s->sp.waves / t);
        if (q < 0 || (size_t)(o += q) >= n) return;
    }
    snprintf(buf + o, n - (size_t)o, "}");
}
