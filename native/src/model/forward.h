/* The forward pass of llama-family and Mixtral-style models over a batch of tokens: RMSNorm,
 * attention with RoPE and a KV cache (F16, as llama.cpp keeps it), the FFN (SwiGLU, ReLU or dReLU;
 * gate/up rows read straight from the neuron bundles, down from the dense copy or via axpy over the
 * bundles' down columns), MoE routing, and the output logits. Matrix work runs on a thread pool. */
#ifndef PI2_FORWARD_H
#define PI2_FORWARD_H

#include <stddef.h>
#include <stdint.h>

#include "ffn_backend.h"
#include "model.h"
#include "norm.h"
#include "threadpool.h"

typedef struct pi2_ctx pi2_ctx;

/* n_ctx: KV cache positions; n_batch: most tokens per pi2_forward call; dense_ffn: allocate the batch
 * buffers of the dense FFN (0 when a sparse FFN will be attached: pi2_ctx_set_ffn). NULL + error on
 * failure. */
pi2_ctx *pi2_ctx_create(const pi2_model *m, int n_ctx, int n_batch, int dense_ffn, pi2_pool *pool);
void pi2_ctx_free(pi2_ctx *c);

/* Run tokens[0..n) (n <= n_batch) at the next positions. Afterwards pi2_ctx_logits() holds the
 * last token's logits; when logits_all is given it receives n x n_vocab logits (one row per token).
 * -1 with an error when a token id is out of range or the context is full. */
int pi2_forward(pi2_ctx *c, const int32_t *tokens, int n, float *logits_all);

const float *pi2_ctx_logits(const pi2_ctx *c);
int pi2_ctx_n_past(const pi2_ctx *c);
int pi2_ctx_n_ctx(const pi2_ctx *c);
int pi2_ctx_n_batch(const pi2_ctx *c);
/* Bytes the context allocated (KV cache and scratch), touched or not: the budget's fixed part. */
size_t pi2_ctx_bytes(const pi2_ctx *c);
size_t pi2_ctx_kv_bytes(const pi2_ctx *c); /* of which the KV cache */
/* What pi2_ctx_create would allocate for a model of header h (nth: compute threads), without one;
 * *kv_bytes (if given): of which the KV cache. */
size_t pi2_ctx_bytes_for(const pi2_header *h, int n_ctx, int n_batch, int nth, int dense_ffn, size_t *kv_bytes);
/* Compute FFN blocks through a backend (the sparse engine: pi2_sparse_backend) instead of densely; NULL
 * detaches. The backend must outlive its use by this context. */
void pi2_ctx_set_ffn(pi2_ctx *c, const pi2_ffn_backend *b);
/* Where the forward passes' time went since the context was created (wall time on the calling thread;
 * per token: take differences). The phases are the serial order of a pass, so they add up to it. */
typedef struct {
    uint64_t passes;
    uint64_t attention_ns; /* norms, Q/K/V, RoPE, attention, its output and the residual */
    uint64_t ffn_ns;       /* the FFN norm, the FFN (dense here, or the attached backend) and the residual */
    uint64_t output_ns;    /* the output norm and head, and the embedding row */
    uint64_t prefetch_ns;  /* the backend's layer_begin (its reads started before attention) */
} pi2_fwd_prof;
void pi2_ctx_prof(const pi2_ctx *c, pi2_fwd_prof *p);

/* Forget the cache (a new conversation). */
void pi2_ctx_reset(pi2_ctx *c);
/* Keep the cache's first n_past positions only (0 <= n_past <= what it holds): a request that resends
 * a conversation's start reuses them, and the next pass writes over the rest. */
void pi2_ctx_truncate(pi2_ctx *c, int n_past);

#endif
