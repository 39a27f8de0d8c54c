/* The sparse engine's counters and what it reports of them: token and summary event fields, the
 * stderr line (docs/SPARSE.md lists the fields). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "neuron_cache.h"
#include "parmat.h"
#include "sparse_internal.h"
#include "sparse_predict.h"

/* ---- stats ------------------------------------------------------------------------------------ */

void pi2_sparse_get_stats(const pi2_sparse *s, pi2_sparse_stats *st) {
    *st = s->st;
    pi2_io_stats io;
    pi2_io_stats_get(s->io, &io);
    st->bytes_read = io.bytes;
    st->reads = io.reads;
    st->io_wait_ns = io.wait_ns;
}

void pi2_sparse_snapshot(const pi2_sparse *s, pi2_sparse_stats *st) {
    if (s) pi2_sparse_get_stats(s, st);
}

void pi2_sparse_named_json(const pi2_sparse *s, FILE *f) {
    if (!s || !f) return;
    fprintf(f, "{\"event\": \"named\", \"decode_steps\": %llu, \"rank_bins\": %d, \"by_rank\": [",
            (unsigned long long)s->named.steps, PI2_RANK_BINS);
    for (int i = 0; i < PI2_RANK_BINS; i++) fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)s->named.by_rank[i]);
    fprintf(f, "], \"by_block\": [");
    for (int i = 0; i < s->n_blocks; i++) fprintf(f, "%s%llu", i ? ", " : "", (unsigned long long)s->named.by_block[i]);
    fprintf(f, "]}\n");
}

void pi2_sparse_summary_json(const pi2_sparse *s, const pi2_sparse_config *cfg, char *buf, size_t n) {
    size_t o = 0;
#define OUT(...) o += (size_t)snprintf(buf + o, o < n ? n - o : 0, __VA_ARGS__)
    OUT(", \"policy\": \"%s\", \"predictor\": \"%s\", \"memory_budget_bytes\": %llu, \"memory_budget_source\": \"%s\"",
        pi2_policy_name(cfg->policy), cfg->oracle ? "oracle" : "model",
        (unsigned long long)(s ? s->cfg.memory_budget : cfg->memory_budget),
        s ? s->budget_source : cfg->memory_budget ? "given" : "none: mmap, the page cache decides");
    if (!s) {
        OUT(", \"io_method\": \"mmap\", \"o_direct\": false");
        return;
    }
    pi2_sparse_stats st;
    pi2_sparse_get_stats(s, &st);
    const pi2_ncache_config *cc = pi2_ncache_cfg(s->cache);
    const uint64_t lookups = st.hits_hot + st.hits_cold + st.misses_hot + st.misses_cold;
    const double io_s = st.io_wait_ns / 1e9, ffn_s = st.ffn_ns / 1e9;
    const double compute_s = ffn_s > io_s ? ffn_s - io_s : 0;
    OUT(", \"io_method\": \"%s\", \"o_direct\": %s, \"storage_bytes_read\": %llu, \"storage_reads\": %llu, "
        "\"cache_bytes\": %llu, \"hot_bytes\": %llu, \"cold_bytes\": %llu, \"fixed_bytes\": %llu, "
        "\"hot_neurons_per_block\": %d, \"cluster\": %d, \"two_phase\": %s, \"pipeline\": %s, \"lookahead\": %s, "
        "\"lookahead_reads\": %llu, "
        "\"hits_hot\": %llu, \"hits_cold\": %llu, \"misses_hot\": %llu, \"misses_cold\": %llu, \"hit_rate\": %.6f, "
        "\"io_wait_s\": %.6f, \"ffn_s\": %.6f, \"compute_s\": %.6f, \"io_share\": %.6f, \"active_fraction\": %.6f, "
        "\"preload_s\": %.6f, \"preload_bytes\": %llu, \"bytes_read_after_load\": %llu, "
        "\"dense_batch_blocks\": %llu, \"streamed_blocks\": %llu, \"probe_rand_reads_per_s\": %.0f, "
        "\"probe_gate_reads_per_s\": %.0f, \"probe_rest_reads_per_s\": %.0f, \"probe_seq_bytes_per_s\": %.0f, "
        "\"two_phase_source\": \"%s\", \"admit_rank\": %d, \"warmed_bundles\": %llu, \"stream_cached_bundles\": %llu, "
        "\"skipped_misses\": %llu",
        pi2_io_method_name(pi2_io_method_used(s->io)), pi2_io_is_direct(s->io) ? "true" : "false",
        (unsigned long long)st.bytes_read, (unsigned long long)st.reads, (unsigned long long)pi2_ncache_bytes(s->cache),
        (unsigned long long)(cc->hot_slots * cc->cluster * cc->stride), (unsigned long long)(cc->cold_slots * cc->cold_bytes),
        (unsigned long long)s->fixed_bytes, cc->hot_neurons, cc->cluster, s->two_phase ? "true" : "false",
        s->pipeline ? "true" : "false", s->lookahead ? "true" : "false", (unsigned long long)st.lookahead_reads,
        (unsigned long long)st.hits_hot, (unsigned long long)st.hits_cold,
        (unsigned long long)st.misses_hot, (unsigned long long)st.misses_cold,
        lookups ? (double)(st.hits_hot + st.hits_cold) / lookups : 0.0, io_s, ffn_s, compute_s,
        io_s + compute_s > 0 ? io_s / (io_s + compute_s) : 0.0,
        st.neurons_visited ? (double)st.neurons_computed / st.neurons_visited : 0.0, s->preload_ns / 1e9,
        (unsigned long long)s->preload_bytes, (unsigned long long)(st.bytes_read - s->preload_bytes),
        (unsigned long long)s->batch.dense_blocks, (unsigned long long)s->batch.streamed_blocks, s->batch.rand_reads_per_s,
        s->batch.probe_gate_reads_per_s, s->batch.probe_rest_reads_per_s, s->batch.seq_bytes_per_s,
        cfg->two_phase ? "flag" : s->batch.rand_reads_per_s > 0 ? "storage probe" : "default", s->admit_limit,
        (unsigned long long)s->batch.warmed_bundles, (unsigned long long)s->batch.cached_bundles,
        (unsigned long long)s->check.skipped_misses);
    /* decode's reads issued from a thread of their own (sparse_submit.c), and how many */
    OUT(", \"io_submitter\": %s, \"submitter_reads\": %llu", s->sub.started ? "true" : "false",
        (unsigned long long)s->sub.reads);
    if (s->cap_on) /* --read-cap: the limit asked for, and the misses it left unread (within skipped_misses) */
        OUT(", \"read_cap\": %d, \"capped_misses\": %llu", cfg->read_cap, (unsigned long long)s->cap.capped);
    if (cfg->pred_threshold > 0) OUT(", \"pred_threshold\": %.6f", cfg->pred_threshold);
    if (cfg->check_predictor) {
        const uint64_t tp = st.pred_tp, fp = st.pred_fp, fn = st.pred_fn;
        /* sparsity: the share of (token, neuron) pairs whose output is truly zero */
        OUT(", \"sparsity\": %.6f, \"predictor_recall\": %.6f, \"predictor_precision\": %.6f, \"predictor_layers\": [",
            st.neurons_visited ? 1.0 - (double)(tp + fn) / st.neurons_visited : 0.0,
            tp + fn ? (double)tp / (tp + fn) : 1.0, tp + fp ? (double)tp / (tp + fp) : 1.0);
        for (uint32_t l = 0; l < s->m->h.n_layer; l++) {
            uint64_t a = s->check.layer_tp[l], f = s->check.layer_fp[l], m = s->check.layer_fn[l], seen = s->check.layer_seen[l];
            OUT("%s{\"layer\": %u, \"sparsity\": %.6f, \"recall\": %.6f, \"precision\": %.6f}", l ? ", " : "", l,
                seen ? 1.0 - (double)(a + m) / seen : 0.0, a + m ? (double)a / (a + m) : 1.0,
                a + f ? (double)a / (a + f) : 1.0);
        }
        OUT("]");
        /* what was computed, not only predicted: truly active neurons --miss-threshold left unread */
        OUT(", \"skipped_active\": %llu, \"effective_recall\": %.6f", (unsigned long long)s->check.skipped_active,
            tp + fn ? (double)(tp - s->check.skipped_active) / (tp + fn) : 1.0);
    }
#undef OUT
}

void pi2_sparse_token_json(const pi2_sparse *s, const pi2_sparse_stats *a, const pi2_sparse_stats *b, char *buf,
                           size_t n) {
    if (!s) {
        if (n) buf[0] = 0;
        return;
    }
    const double io = (b->io_wait_ns - a->io_wait_ns) / 1e9, ffn = (b->ffn_ns - a->ffn_ns) / 1e9;
    snprintf(buf, n,
             ", \"bytes_read\": %llu, \"reads\": %llu, \"hits\": %llu, \"misses\": %llu, \"io_wait_s\": %.6f, "
             "\"ffn_s\": %.6f, \"compute_s\": %.6f",
             (unsigned long long)(b->bytes_read - a->bytes_read), (unsigned long long)(b->reads - a->reads),
             (unsigned long long)(b->hits_hot + b->hits_cold - a->hits_hot - a->hits_cold),
             (unsigned long long)(b->misses_hot + b->misses_cold - a->misses_hot - a->misses_cold), io, ffn,
             ffn > io ? ffn - io : 0.0);
}

void pi2_sparse_summary_line(const pi2_sparse *s, const pi2_sparse_config *cfg, char *buf, size_t n) {
    char budget[96] = "no budget";
    if (s && strcmp(s->budget_source, "given"))
        snprintf(budget, sizeof budget, "budget %.0f MiB (%s)", s->cfg.memory_budget / 1048576.0, s->budget_source);
    else if (cfg->memory_budget)
        snprintf(budget, sizeof budget, "budget %.0f MiB", cfg->memory_budget / 1048576.0);
    if (!s) {
        snprintf(buf, n, "policy %s, %s (mmap)", pi2_policy_name(cfg->policy), budget);
        return;
    }
    pi2_sparse_stats st;
    pi2_sparse_get_stats(s, &st);
    const uint64_t hits = st.hits_hot + st.hits_cold, lookups = hits + st.misses_hot + st.misses_cold;
    int o = snprintf(buf, n, "policy %s, %s, cache %.0f MiB, read %.1f MiB from storage (%s%s), hit rate %.1f%%",
                     pi2_policy_name(cfg->policy), budget, pi2_ncache_bytes(s->cache) / 1048576.0, st.bytes_read / 1048576.0,
                     pi2_io_method_name(pi2_io_method_used(s->io)), pi2_io_is_direct(s->io) ? ", O_DIRECT" : ", buffered",
                     lookups ? 100.0 * hits / lookups : 0.0);
    if (cfg->check_predictor && o > 0 && (size_t)o < n) {
        const uint64_t tp = st.pred_tp, fp = st.pred_fp, fn = st.pred_fn;
        snprintf(buf + o, n - (size_t)o, ", predictor recall %.3f precision %.3f", tp + fn ? (double)tp / (tp + fn) : 1.0,
                 tp + fp ? (double)tp / (tp + fp) : 1.0);
    }
}
