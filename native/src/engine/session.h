/* A session: what lives from the model load to the end of the run, for every front end that runs the
 * model on text (generate, chat) and for `size`, which opens one as they do to measure it. Opening
 * is two steps, because generate sizes its context from the prompt's tokens:
 *   pi2_session_load   the model as the policy reads it (pi2_model_load_for) and its tokenizer
 *   pi2_session_start  thread pool, context (KV cache), sparse engine, sampler, events
 * The options are session_options.h's. */
#ifndef PI2_SESSION_H
#define PI2_SESSION_H

#include <stdint.h>

#include "event_schema.h"
#include "events.h"
#include "forward.h"
#include "model.h"
#include "sampler.h"
#include "session_options.h"
#include "sparse.h"
#include "sparse_size.h"
#include "threadpool.h"
#include "session_profile.h"
#include "tokenizer.h"
#include "vocab_blob.h"

typedef struct {
    pi2_model m;
    int model_loaded;
    pi2_vocab_desc desc;
    pi2_tokenizer *tok;
    pi2_pool *pool;
    pi2_ctx *ctx;
    pi2_sparse *sparse; /* NULL under --policy dense */
    pi2_sampler sampler;
    pi2_events ev;
    int n_threads, n_ctx, n_batch;
    uint64_t t_load0;   /* when loading began (the start event's load_s) */
    int32_t *ids;       /* the turn's tokens */
    int ids_cap;
    int has_pending;    /* chat: the last generated token is not in the KV cache yet */
    int32_t pending;
    pi2_decode_profile prof; /* decode's passes, for the summary's "decode_profile" (session_profile.h) */
    pi2_decode_profile prefill_prof; /* the prompts' passes, per prompt token: "prefill_profile" */
    int stop_turn;      /* set by emit to end the turn after this token (serve: a stop string, a client gone) */
    /* when set, called as each token is sampled, emitted or not (serve's metrics and its prompt cache) */
    void (*on_sample)(uint64_t t_ns, int32_t id);
} pi2_session;

/* Whether a session loads the model's tokenizer: no (eval: token ids only), yes (a model without one is
 * an error), or when it has one (size: the process a run would have). */
typedef enum { PI2_TOKENIZER_NONE, PI2_TOKENIZER_NEEDED, PI2_TOKENIZER_IF_ANY } pi2_tokenizer_use;

/* pi2_model_load as the policy reads the model (a choice the session makes from its options, so it lives
 * here, above model/ and sparse/): sparse policies never touch the neuron region (no checksum pass over
 * it, no packed copy); dense packs gate/up rows unless no_pack or a budget is set. The attention and
 * output weights are repacked (pi2_model_repack) unless cfg->no_repack, or the policy is dense under a
 * budget (which pages every weight from the file, as llama.cpp with mmap). */
int pi2_model_load_for(pi2_model *m, const char *path, int verify_neurons, int no_pack, const pi2_sparse_config *cfg);

/* The model and (as `use` says) its tokenizer. s is zeroed first; close it whatever this returns. 0 or
 * -1 + error. */
int pi2_session_load(pi2_session *s, const pi2_options *o, pi2_tokenizer_use use);
/* The most tokens per forward pass when none is asked for: a batch's scratch grows with its tokens
 * (~10 bytes per FFN neuron and ~4 per activation each): under a budget 64 keeps it a small share, and
 * prefill batches still stream a block per 64 tokens. */
int pi2_session_max_batch(const pi2_options *o);
/* The KV cache's positions when none is asked for: the model's, at most 4096 (chat, size). */
int pi2_session_default_ctx(const pi2_model *m);
/* Pool, context of n_ctx positions and n_batch tokens, then the sparse engine, sampler and events.
 * With `measure`, the sparse engine only sizes itself into it (pi2_sparse_measure, and `shape` what it
 * measured) and nothing after it starts. 0 or -1 + error. */
int pi2_session_start(pi2_session *s, const pi2_options *o, int n_ctx, int n_batch, pi2_sparse_shape *shape,
                      pi2_sparse_sizing *measure);
void pi2_session_close(pi2_session *s);



/* One turn: prefill s->ids[0..n_new) in batches, then sample up to n_predict tokens (stopping at an
 * end-of-generation token unless ignore_eos), each with a token event of turn turn_index
 * (event_schema.h) and its text handed to emit (n 0 for a token without text; every token but an
 * end-of-generation one that ends the turn is handed over). The last token sampled is not run: it stays in s->pending for
 * the next turn's prefill. emit may set s->stop_turn to end the turn after its token (r->stop "stop"; that
 * token is not run, as at end-of-generation). t0: when the turn began (its TTFT counts from there). r: the
 * turn's record, every field of the turn event filled here (generate, chat and serve take it as it is),
 * so a new field of that event is a row in event_schema.c, a member of pi2_turn_record and one line
 * here. 0, or -1 with an error from the forward pass. */
int pi2_session_turn(pi2_session *s, int n_new, int n_predict, int ignore_eos, int turn_index, uint64_t t0,
                     void (*emit)(const char *piece, int n), pi2_turn_record *r);

/* Tokenize text into s->ids[off..): the count (0 when it tokenizes to nothing), or -1 + error. */
int pi2_session_tokenize(pi2_session *s, const char *text, size_t len, int add_bos, int off);
/* s->ids holds at least n ids. 0 or -1 + error. */
int pi2_session_reserve(pi2_session *s, int n);

#endif
