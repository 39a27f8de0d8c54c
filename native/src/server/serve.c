/* `pi2-engine serve` (serve.h): the listening socket, a thread per connection (bounded), the one
 * compute slot and its queue, and a request's run on the session with its text streamed. */
#include "serve.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "common.h"
#include "events.h"
#include "forward.h"
#include "http.h"
#include "kernels.h"
#include "metrics.h"
#include "openai.h"
#include "session.h"
#include "sse.h"

#define MAX_HEAD (16u << 10)
#define MAX_BODY (1u << 20)
#define EXTRA_CONNS 8 /* connections beyond the queue's: /health, /v1/models, requests being read */

typedef struct {
    pi2_options o;
    pi2_session s;
    const char *model_name;
    pi2_chat_template tmpl;
    pi2_http_limits lim;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int busy, waiting, conns, max_conns;
    /* the ids of the KV cache's first positions: the last request's prompt, then its answer as sampled
     * (a token sampled but not run, the answer's last, is listed and capped away by the cache's n_past) */
    int32_t *cached;
    int n_cached, cap_cached;
    long long next_id;
    pi2_metrics metrics; /* GET /metrics (metrics.h): its own lock */
} server;

static server S = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
static volatile sig_atomic_t stopping;

static void on_signal(int sig) { stopping = sig; }

/* The route of the request this connection's thread serves (PI2_EP_OTHER until its path is read), so
 * whichever function writes the answer counts it under its route and status. */
static _Thread_local pi2_endpoint route = PI2_EP_OTHER;

/* Count an answer before writing it: a client that has read it and asks /metrics at once sees it. */
static void answering(int status) { pi2_metrics_request(&S.metrics, route, status); }

/* ---- socket I/O with deadlines ----------------------------------------------------------------- */

/* All of p[0..n), each wait for room at most timeout_ms (a client that stops reading is gone). */
static int send_all(int fd, const char *p, size_t n, int timeout_ms) {
    while (n) {
        const ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            p += w, n -= (size_t)w;
            continue;
        }
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
            struct pollfd pf = {fd, POLLOUT, 0};
            if (poll(&pf, 1, timeout_ms) <= 0 || (pf.revents & (POLLERR | POLLHUP))) return -1;
            continue;
        }
        return -1;
    }
    return 0;
}

static int send_buf(int fd, const pi2_buf *b) { return b->oom ? -1 : send_all(fd, b->p, b->len, S.o.read_timeout_s * 1000); }

static void send_error(int fd, int status, const char *message, const char *extra_headers) {
    answering(status);
    pi2_buf out = {0};
    pi2_oai_error_response(&out, status, message, extra_headers);
    send_buf(fd, &out);
    pi2_buf_free(&out);
}

/* Whether the client has closed its side (or the connection broke): a streaming client that went away
 * or a waiting one that gave up. Bytes it sent beyond its request are left unread. */
static int client_gone(int fd) {
    struct pollfd pf = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLRDHUP | POLLHUP | POLLERR)) return 1;
    char c;
    return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static int ms_left(uint64_t deadline) {
    const uint64_t now = pi2_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now) / 1000000 + 1);
}

/* Read the request head and body into in. 0 when complete; else the error status already answered (or
 * -1: the client left). A slow client (slow-loris) gets 408 at the deadline. */
static int read_request(int fd, pi2_buf *in, pi2_http_request *req) {
    const uint64_t deadline = pi2_now_ns() + (uint64_t)S.o.read_timeout_s * 1000000000ull;
    int head = 0, continued = 0;
    for (;;) {
        if (!head) {
            const int rc = pi2_http_parse_head(in->p ? in->p : "", in->len, &S.lim, req);
            if (rc < 0) {
                send_error(fd, -rc, pi2_last_error(), NULL);
                return -rc;
            }
            if (rc == 1) {
                head = 1;
                const int post = !strcmp(req->method, "POST");
                if (post && req->content_length < 0) {
                    send_error(fd, 411, "a POST needs a Content-Length", NULL);
                    return 411;
                }
                if (req->content_length < 0) req->content_length = 0;
                if (req->expect_continue && !continued && in->len < req->head_len + (size_t)req->content_length) {
                    static const char go[] = "HTTP/1.1 100 Continue\r\n\r\n";
                    continued = 1;
                    if (send_all(fd, go, sizeof go - 1, 1000)) return -1;
                }
            }
        }
        if (head && in->len >= req->head_len + (size_t)req->content_length) return 0;
        const int left = ms_left(deadline);
        struct pollfd pf = {fd, POLLIN, 0};
        const int pr = left ? poll(&pf, 1, left) : 0;
        if (pr < 0 && errno == EINTR) continue;
        if (pr <= 0) {
            char msg[96];
            snprintf(msg, sizeof msg, "the request did not arrive within %d s", S.o.read_timeout_s);
            send_error(fd, 408, msg, NULL);
            return 408;
        }
        char chunk[4096];
        const size_t room = MAX_HEAD + MAX_BODY - in->len;
        const ssize_t r = recv(fd, chunk, room < sizeof chunk ? room : sizeof chunk, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            return -1; /* closed before a whole request: nobody to answer */
        }
        pi2_buf_add(in, chunk, (size_t)r);
        if (in->oom) {
            send_error(fd, 500, "out of memory", NULL);
            return 500;
        }
    }
}

/* ---- one generation ---------------------------------------------------------------------------- */

/* The request that holds the compute slot, for emit (the session's callback has no user pointer). */
typedef struct {
    int fd, stream, gone, stopped, timed_out;
    const pi2_oai_request *rq;
    pi2_oai_reply reply;
    pi2_buf text;       /* everything generated so far (cut at a stop string) */
    size_t sent;        /* bytes of text already streamed */
    int n_tok, n_prompt;
    uint64_t t0, t_first, t_last;
    uint64_t t_sampled; /* the last token sampled, emitted or not (its time between tokens) */
} gen;

static gen *G;

/* The chunk's pi2_timings: the engine's monotonic clock, not the client's. */
static void chunk_timings(char *out, size_t n, const gen *g) {
    const double ttft = g->t_first ? (g->t_first - g->t0) / 1e6 : 0;
    const double dec = g->n_tok > 1 && g->t_last > g->t_first ? (g->n_tok - 1) / ((g->t_last - g->t_first) / 1e9) : 0;
    snprintf(out, n, "{\"t_ns\": %llu, \"n_gen\": %d, \"ttft_ms\": %.3f, \"prefill_tps\": %.3f, \"decode_tps\": %.3f}",
             (unsigned long long)g->t_last, g->n_tok, ttft, ttft > 0 ? g->n_prompt / (ttft / 1e3) : 0, dec);
}

/* A chunk with text[sent..upto); `token`: a sampled token's chunk, sent even without text (held back, or
 * a token with none) so that every token's t_ns reaches the client. */
static void stream_text(gen *g, size_t upto, int first, int token) {
    if (g->gone || (upto <= g->sent && !first && !token)) return;
    if (upto < g->sent) upto = g->sent; /* never re-sent, never a negative length */
    char timings[256];
    chunk_timings(timings, sizeof timings, g);
    pi2_buf json = {0}, ev = {0};
    pi2_oai_object(&json, &g->reply, first ? PI2_OAI_FIRST_CHUNK : PI2_OAI_CHUNK, g->text.p ? g->text.p + g->sent : "",
                   upto - g->sent, NULL, NULL, first ? NULL : timings);
    pi2_sse_event(&ev, json.p, json.len);
    if (send_buf(g->fd, &ev)) g->gone = 1;
    g->sent = upto;
    pi2_buf_free(&json);
    pi2_buf_free(&ev);
}

/* Where text[from..len) first matches a stop string, or (size_t)-1. */
static size_t find_stop(const gen *g, size_t from) {
    size_t best = (size_t)-1;
    for (int i = 0; i < g->rq->n_stop; i++) {
        const size_t sl = strlen(g->rq->stop[i]);
        for (size_t p = from; p + sl <= g->text.len && p < best; p++)
            if (!memcmp(g->text.p + p, g->rq->stop[i], sl)) best = p;
    }
    return best;
}

/* Bytes at the end of text that may be the start of a stop string: held back until the next token says. */
static size_t stop_prefix_tail(const gen *g) {
    size_t hold = 0;
    for (int i = 0; i < g->rq->n_stop; i++) {
        const size_t sl = strlen(g->rq->stop[i]);
        for (size_t k = sl - 1; k > hold; k--)
            if (k <= g->text.len && !memcmp(g->text.p + g->text.len - k, g->rq->stop[i], k)) {
                hold = k;
                break;
            }
    }
    return hold;
}

/* The session's emit: a token's text. */
static void emit(const char *piece, int n) {
    gen *g = G;
    const uint64_t now = pi2_now_ns();
    if (!g->t_first) g->t_first = now;
    g->t_last = now;
    g->n_tok++;
    pi2_buf_add(&g->text, piece, (size_t)n);
    const size_t at = find_stop(g, g->sent);
    if (at != (size_t)-1) {
        g->text.len = at;
        g->stopped = 1;
    }
    if (g->stream) {
        size_t safe = g->text.len;
        if (!g->stopped) {
            safe -= stop_prefix_tail(g);
            safe -= pi2_utf8_incomplete_tail(g->text.p, safe);
        }
        stream_text(g, safe, 0, 1);
    }
    if (!g->gone && client_gone(g->fd)) g->gone = 1;
    if (now - g->t0 > (uint64_t)S.o.request_timeout_s * 1000000000ull) g->timed_out = 1;
    if (g->stopped || g->gone || g->timed_out || stopping || g->text.oom) S.s.stop_turn = 1;
}

/* The session's on_sample: every token sampled (an end-of-generation one and one without text included),
 * for the token counter, the time-between-tokens histogram, and the sparse engine's counters as of now
 * (the compute thread is between passes: they hold still). */
static void on_sample(uint64_t now, int32_t id) {
    gen *g = G;
    /* the answer joins the prompt cache, as llama-server keeps it: a conversation that resends it with
     * its next message prefills only that message. No room (out of memory): the prompt alone stays. */
    if (S.n_cached < S.cap_cached) S.cached[S.n_cached++] = id;
    pi2_sparse_stats st;
    if (S.s.sparse) pi2_sparse_get_stats(S.s.sparse, &st);
    pi2_metrics_token(&S.metrics, g->t_sampled ? (now - g->t_sampled) / 1e9 : -1, S.s.sparse ? &st : NULL);
    g->t_sampled = now;
}

/* Prompt ids common with what the cache holds: that many positions are kept (at least one token is
 * always run, for its logits). */
static int reuse_prefix(const int32_t *ids, int n) {
    int k = 0;
    while (k < S.n_cached && k < n && S.cached[k] == ids[k]) k++;
    if (k >= n) k = n - 1;
    if (k > pi2_ctx_n_past(S.s.ctx)) k = pi2_ctx_n_past(S.s.ctx);
    return k;
}

static void run(int fd, const pi2_oai_request *rq, uint64_t t_queued) {
    pi2_session *s = &S.s;
    gen g = {.fd = fd, .stream = rq->stream, .rq = rq, .t0 = pi2_now_ns()};
    g.reply.chat = rq->chat;
    g.reply.model = S.model_name;
    g.reply.created = (long long)time(NULL);
    snprintf(g.reply.id, sizeof g.reply.id, "%s-%lld", rq->chat ? "chatcmpl" : "cmpl", ++S.next_id);
    const int n = pi2_session_tokenize(s, rq->prompt.p, rq->prompt.len, s->desc.add_bos, 0);
    if (n <= 0) {
        send_error(fd, n < 0 ? 500 : 400, n < 0 ? pi2_last_error() : "the prompt tokenizes to nothing", NULL);
        return;
    }
    if (n >= s->n_ctx) {
        char msg[160];
        snprintf(msg, sizeof msg, "the prompt is %d tokens; this server's context holds %d (serve --ctx)", n, s->n_ctx);
        send_error(fd, 400, msg, NULL);
        return;
    }
    int max_tokens = rq->max_tokens >= 0 ? rq->max_tokens : S.o.max_tokens;
    if (max_tokens > s->n_ctx - n) max_tokens = s->n_ctx - n; /* what the context has room for: "length" */
    const int k = reuse_prefix(s->ids, n);
    int32_t *keep = realloc(S.cached, sizeof(int32_t) * (size_t)(n + max_tokens));
    if (!keep) {
        send_error(fd, 500, "out of memory", NULL);
        return;
    }
    S.cached = keep;
    memcpy(S.cached, s->ids, sizeof(int32_t) * (size_t)n);
    S.n_cached = S.cap_cached = 0; /* valid again once the prefill below has run */
    pi2_ctx_truncate(s->ctx, k);
    memmove(s->ids, s->ids + k, sizeof(int32_t) * (size_t)(n - k));
    s->sampler.temperature = rq->temperature;
    s->sampler.top_p = rq->top_p;
    s->sampler.state = rq->seed;
    g.n_prompt = n - k;
    if (g.stream) {
        pi2_buf head = {0};
        pi2_sse_head(&head);
        answering(200);
        if (send_buf(fd, &head)) g.gone = 1;
        pi2_buf_free(&head);
        stream_text(&g, 0, 1, 0);
    }
    pi2_turn_record r = {.stop = "length"};
    G = &g;
    int rc = 0;
    const int runs = max_tokens > 0 && !g.gone;
    /* the prompt is in the cache once prefilled, and on_sample appends the answer's ids after it */
    S.n_cached = runs ? n : k, S.cap_cached = runs ? n + max_tokens : k;
    if (runs) rc = pi2_session_turn(s, n - k, max_tokens, rq->ignore_eos, -1, g.t0, emit, &r);
    G = NULL;
    if (rc != 0 || g.text.oom) {
        pi2_ctx_reset(s->ctx); /* a pass failed part-way: trust nothing cached */
        S.n_cached = 0;
        char msg[600];
        snprintf(msg, sizeof msg, "the engine failed: %s", g.text.oom ? "out of memory" : pi2_last_error());
        if (!g.stream) send_error(fd, 500, msg, NULL);
        else if (!g.gone) {
            pi2_buf ev = {0}, e = {0};
            pi2_buf_puts(&e, "{\"error\": {\"message\": ");
            pi2_buf_json_str(&e, msg, strlen(msg));
            pi2_buf_puts(&e, ", \"type\": \"server_error\", \"param\": null, \"code\": null}}");
            pi2_sse_event(&ev, e.p, e.len);
            send_buf(fd, &ev);
            pi2_buf_free(&ev);
            pi2_buf_free(&e);
        }
        pi2_buf_free(&g.text);
        return;
    }
    pi2_metrics_turn(&S.metrics, n, k, r.n_gen ? r.ttft_s : -1, g.timed_out);
    const char *finish = g.stopped || !strcmp(r.stop, "eog") ? "stop" : "length";
    const uint64_t t_end = pi2_now_ns();
    char usage[160], timings[600];
    snprintf(usage, sizeof usage, "{\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d}", n, r.n_gen, n + r.n_gen);
    snprintf(timings, sizeof timings,
             "{\"t_ns\": %llu, \"n_prompt\": %d, \"n_cached\": %d, \"n_gen\": %d, \"queue_ms\": %.3f, \"ttft_ms\": %.3f, "
             "\"prefill_ms\": %.3f, \"prefill_tps\": %.3f, \"decode_ms\": %.3f, \"decode_tps\": %.3f, \"threads\": %d, "
             "\"kernels\": \"%s\", \"peak_rss_bytes\": %llu, \"timed_out\": %s}",
             (unsigned long long)t_end, n, k, r.n_gen, (g.t0 - t_queued) / 1e6, r.ttft_s * 1e3, r.prefill_s * 1e3,
             r.prefill_tps, r.decode_s * 1e3, r.decode_tps, s->n_threads, pi2_kernel_level_name(pi2_kernels_current()),
             (unsigned long long)pi2_peak_rss_bytes(), g.timed_out ? "true" : "false");
    pi2_buf out = {0}, json = {0};
    if (g.stream) {
        if (!g.gone) {
            stream_text(&g, g.text.len, 0, 0); /* what was held back (an incomplete character at the end) */
            pi2_oai_object(&json, &g.reply, PI2_OAI_LAST_CHUNK, NULL, 0, finish, usage, timings);
            pi2_sse_event(&out, json.p, json.len);
            pi2_sse_done(&out);
            send_buf(fd, &out);
        }
    } else {
        pi2_oai_object(&json, &g.reply, PI2_OAI_WHOLE, g.text.p, g.text.len, finish, usage, timings);
        pi2_oai_json_response(&out, 200, json.p ? json.p : "{}", json.len);
        answering(200);
        send_buf(fd, &out);
    }
    if (g.gone) {
        pi2_metrics_cancelled(&S.metrics, 0);
        fprintf(stderr, "pi2-engine serve: %s: the client left after %d tokens: cancelled\n", g.reply.id, r.n_gen);
    }
    pi2_buf_free(&out);
    pi2_buf_free(&json);
    pi2_buf_free(&g.text);
}

/* Wait for the compute slot (a bounded queue), run, give it back. */
static void generate(int fd, const pi2_oai_request *rq) {
    const uint64_t t_queued = pi2_now_ns();
    pthread_mutex_lock(&S.mu);
    if (S.busy && S.waiting >= S.o.max_queue) {
        pthread_mutex_unlock(&S.mu);
        char msg[120];
        snprintf(msg, sizeof msg, "the server is busy: 1 request computing and %d waiting (serve --max-queue)", S.o.max_queue);
        pi2_metrics_rejected(&S.metrics, PI2_REJECT_QUEUE_FULL);
        send_error(fd, 503, msg, "Retry-After: 1\r\n");
        return;
    }
    S.waiting++;
    while (S.busy) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 200000000;
        if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
        pthread_cond_timedwait(&S.cv, &S.mu, &ts);
        const int gone = S.busy && client_gone(fd);
        if (gone || (S.busy && stopping)) { /* it gave up waiting: leave the queue */
            S.waiting--;
            pthread_mutex_unlock(&S.mu);
            if (gone) {
                pi2_metrics_cancelled(&S.metrics, 1);
                pi2_metrics_request(&S.metrics, route, 0); /* no answer: the client left first */
            }
            return;
        }
    }
    S.waiting--;
    S.busy = 1;
    pthread_mutex_unlock(&S.mu);
    pi2_metrics_queued(&S.metrics, (pi2_now_ns() - t_queued) / 1e9);
    run(fd, rq, t_queued);
    pthread_mutex_lock(&S.mu);
    S.busy = 0;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
}

/* ---- dispatch ---------------------------------------------------------------------------------- */

/* Equal strings in time that does not depend on where they differ. */
static int same_secret(const char *a, const char *b) {
    const size_t na = strlen(a), nb = strlen(b);
    unsigned char d = na != nb;
    for (size_t i = 0; i < na; i++) d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return !d;
}

/* A scrape: the registry, and what is known only now (the queue, memory, the process's reads). */
static void write_metrics(pi2_buf *body) {
    pi2_metrics_now now = {.max_queue = S.o.max_queue, .peak_rss = pi2_peak_rss_bytes(), .rss = pi2_rss_bytes(),
                           .process_read_bytes = pi2_io_read_bytes()};
    pthread_mutex_lock(&S.mu);
    now.in_flight = S.conns, now.computing = S.busy, now.waiting = S.waiting;
    pthread_mutex_unlock(&S.mu);
    pi2_metrics_write(&S.metrics, &now, body);
}

static void handle(int fd) {
    pi2_buf in = {0};
    pi2_http_request req;
    route = PI2_EP_OTHER; /* a request refused before it is whole counts as "other" */
    if (read_request(fd, &in, &req) != 0) goto done;
    const pi2_endpoint ep = route = pi2_endpoint_of(req.path);
    const char *m = req.method;
    const int chat = ep == PI2_EP_CHAT, completion = ep == PI2_EP_COMPLETIONS;
    const int models = ep == PI2_EP_MODELS, health = ep == PI2_EP_HEALTH, metrics = ep == PI2_EP_METRICS;
    if (ep == PI2_EP_OTHER) {
        send_error(fd, 404, "unknown route (GET /health, GET /metrics, GET /v1/models, POST /v1/chat/completions, "
                   "POST /v1/completions)", NULL);
        goto done;
    }
    if (strcmp(m, (chat || completion) ? "POST" : "GET")) {
        send_error(fd, 405, (chat || completion) ? "this route takes POST" : "this route takes GET",
                   (chat || completion) ? "Allow: POST\r\n" : "Allow: GET\r\n");
        goto done;
    }
    /* /health is a liveness probe and says nothing about the traffic; /metrics does (request and token
     * counts), so it needs the key as /v1/ does, as llama-server's does: a scraper sends it as a bearer token */
    if (S.o.api_key && !health) {
        char want[300];
        snprintf(want, sizeof want, "Bearer %s", S.o.api_key);
        if (!same_secret(req.auth, want)) {
            send_error(fd, 401, "missing or wrong API key (Authorization: Bearer KEY)", "WWW-Authenticate: Bearer\r\n");
            goto done;
        }
    }
    pi2_buf out = {0}, body = {0};
    if (health) {
        pthread_mutex_lock(&S.mu);
        pi2_buf_printf(&body, "{\"status\": \"ok\", \"busy\": %d, \"waiting\": %d, \"max_queue\": %d}", S.busy, S.waiting, S.o.max_queue);
        pthread_mutex_unlock(&S.mu);
    } else if (metrics) {
        pi2_buf text = {0};
        write_metrics(&text);
        if (text.oom) send_error(fd, 500, "out of memory", NULL);
        else {
            pi2_buf_printf(&out, "HTTP/1.1 200 OK\r\nContent-Type: " PI2_PROM_CONTENT_TYPE "\r\nContent-Length: %zu\r\n"
                           "Connection: close\r\n\r\n", text.len);
            pi2_buf_add(&out, text.p, text.len);
            answering(200);
            send_buf(fd, &out);
        }
        pi2_buf_free(&text);
    } else if (models) {
        pi2_buf_puts(&body, "{\"object\": \"list\", \"data\": [{\"id\": ");
        pi2_buf_json_str(&body, S.model_name, strlen(S.model_name));
        pi2_buf_printf(&body, ", \"object\": \"model\", \"created\": 0, \"owned_by\": \"pi2\", \"chat_template\": \"%s\", "
                       "\"n_ctx\": %d}]}", pi2_chat_template_name(S.tmpl), S.s.n_ctx);
    } else {
        pi2_oai_request rq;
        const int rc = pi2_oai_parse(in.p + req.head_len, (size_t)req.content_length, chat, S.tmpl, S.o.max_tokens, &rq);
        if (rc) send_error(fd, rc, pi2_last_error(), NULL);
        else generate(fd, &rq);
        pi2_oai_free(&rq);
    }
    if (body.len) {
        pi2_oai_json_response(&out, 200, body.p, body.len);
        answering(200);
        send_buf(fd, &out);
    }
    pi2_buf_free(&out);
    pi2_buf_free(&body);
done:
    pi2_buf_free(&in);
}

/* Close after the answer without losing it: closing a socket with unread bytes (the rest of a body
 * refused with 413, a request cut off with 408) sends a reset, and a reset can arrive before the
 * client has read the answer. So: end our side, and read what still comes for a moment. */
static void lingering_close(int fd) {
    shutdown(fd, SHUT_WR);
    const uint64_t deadline = pi2_now_ns() + 500000000ull;
    char sink[4096];
    for (size_t drained = 0; drained < MAX_BODY;) {
        struct pollfd pf = {fd, POLLIN, 0};
        const int left = ms_left(deadline);
        if (!left || poll(&pf, 1, left) <= 0) break;
        const ssize_t r = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (r <= 0) break;
        drained += (size_t)r;
    }
    close(fd);
}

static void *conn_main(void *arg) {
    const int fd = (int)(intptr_t)arg;
    handle(fd);
    lingering_close(fd);
    pthread_mutex_lock(&S.mu);
    S.conns--;
    pthread_cond_broadcast(&S.cv);
    pthread_mutex_unlock(&S.mu);
    return NULL;
}

/* ---- the accept loop --------------------------------------------------------------------------- */

static int listen_on(const char *host, int port, int *bound_port) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, !strcmp(host, "localhost") ? "127.0.0.1" : host, &a.sin_addr) != 1) {
        pi2_set_error("--host: '%s' is not an IPv4 address (127.0.0.1 serves this device only)", host);
        return -1;
    }
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) {
        pi2_set_error("socket: %s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 64) || getsockname(fd, (struct sockaddr *)&a, &len)) {
        pi2_set_error("listen on %s:%d: %s", host, port, strerror(errno));
        close(fd);
        return -1;
    }
    *bound_port = ntohs(a.sin_port);
    return fd;
}

static void serve_usage(FILE *out) {
    fprintf(out,
            "usage: pi2-engine serve -m MODEL.pi2 [--host 127.0.0.1] [--port 8080] [--api-key KEY] [OPTIONS]\n"
            "  An OpenAI-compatible HTTP server: GET /health, GET /metrics (Prometheus text), GET /v1/models,\n"
            "  POST /v1/chat/completions and POST /v1/completions (\"stream\": true for server-sent events).\n"
            "  One request computes at a time; --max-queue more wait, the next gets 503. The first stderr line\n"
            "  is 'listening on http://HOST:PORT'.\n"
            "  SIGINT or SIGTERM stops it. docs/ENGINE.md (serve) has the limits and the pi2_timings fields.\n");
    pi2_options_usage_command(out, PI2_CMD_SERVE);
}

static const char *base_name(const char *path) {
    const char *b = strrchr(path, '/');
    return b ? b + 1 : path;
}

int pi2_serve_main(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            serve_usage(stdout);
            return 0;
        }
    if (pi2_options_parse(PI2_CMD_SERVE, argc, argv, &S.o) != 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 2;
    }
    pi2_options *o = &S.o;
    pi2_metrics_init(&S.metrics);
    if (!o->model) {
        fprintf(stderr, "pi2-engine: error: serve needs -m MODEL.pi2\n");
        return 2;
    }
    pi2_chat_template forced = PI2_TMPL_NONE;
    if (o->chat_template && pi2_chat_template_parse(o->chat_template, &forced) != 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 2;
    }
    int port = 0, rc = 1;
    const int lfd = listen_on(o->host, o->port, &port); /* before the load: a taken port costs nothing */
    if (lfd < 0) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (pi2_session_load(&S.s, o, PI2_TOKENIZER_NEEDED) != 0) goto done;
    const int n_ctx = o->n_ctx ? o->n_ctx : pi2_session_default_ctx(&S.s.m);
    int n_batch = o->n_batch ? o->n_batch : pi2_session_max_batch(o);
    if (n_batch > n_ctx) n_batch = n_ctx;
    if (pi2_session_start(&S.s, o, n_ctx, n_batch, NULL, NULL) != 0) goto done;
    S.model_name = base_name(o->model);
    S.tmpl = forced ? forced : pi2_chat_template_from_metadata(S.s.m.file.metadata, S.s.m.file.metadata_len);
    S.lim = (pi2_http_limits){MAX_HEAD, MAX_BODY};
    S.max_conns = o->max_queue + 1 + EXTRA_CONNS;
    S.s.on_sample = on_sample;
    if (S.s.sparse) { /* what loading cost (the cache's warm fill) is in the counters before any request */
        pi2_sparse_stats st;
        pi2_sparse_get_stats(S.s.sparse, &st);
        pi2_metrics_sparse(&S.metrics, &st);
    }
    fprintf(stderr, "pi2-engine serve: listening on http://%s:%d (model %s, chat template %s, context %d, %d threads)\n",
            o->host, port, S.model_name, pi2_chat_template_name(S.tmpl), n_ctx, S.s.n_threads);
    fflush(stderr);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 1u << 20);
    while (!stopping) {
        struct pollfd pf = {lfd, POLLIN, 0};
        if (poll(&pf, 1, 250) <= 0) continue;
        const int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* a streamed token leaves at once */
        pthread_mutex_lock(&S.mu);
        const int full = S.conns >= S.max_conns;
        if (!full) S.conns++;
        pthread_mutex_unlock(&S.mu);
        pthread_t th;
        if (full || pthread_create(&th, &attr, conn_main, (void *)(intptr_t)fd) != 0) {
            pi2_metrics_rejected(&S.metrics, PI2_REJECT_CONNECTIONS);
            if (!full) {
                pthread_mutex_lock(&S.mu);
                S.conns--;
                pthread_mutex_unlock(&S.mu);
            }
            send_error(fd, 503, "too many connections", "Retry-After: 1\r\n");
            close(fd);
        }
    }
    pthread_attr_destroy(&attr);
    close(lfd);
    /* Running requests see `stopping` at their next token; wait for every connection to end. */
    pthread_mutex_lock(&S.mu);
    while (S.conns) pthread_cond_wait(&S.cv, &S.mu);
    pthread_mutex_unlock(&S.mu);
    fprintf(stderr, "pi2-engine serve: stopped (signal %d), peak RSS %.0f MiB\n", (int)stopping, pi2_peak_rss_bytes() / 1048576.0);
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "pi2-engine: error: %s\n", pi2_last_error());
        close(lfd);
    }
    free(S.cached);
    pi2_session_close(&S.s);
    return rc;
}
