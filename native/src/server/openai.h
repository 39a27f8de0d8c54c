/* The OpenAI API's JSON, both ways, for `pi2-engine serve`: a /v1/chat/completions or /v1/completions
 * body -> a request the engine runs (the prompt rendered with the chat template, sampling settings,
 * stop strings), and the engine's text and timings -> completion objects, stream chunks and errors in
 * OpenAI's shapes. Strict: an unknown field, a wrong type, a value the engine cannot honour (n > 1,
 * penalties) is a 400 naming it, never silently ignored. */
#ifndef PI2_SERVER_OPENAI_H
#define PI2_SERVER_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

/* Chat templates the engine renders itself (it has no Jinja): the model's template is recognised by
 * its markers (openai.c), or named with serve's --chat-template. */
typedef enum { PI2_TMPL_NONE, PI2_TMPL_CHATML, PI2_TMPL_LLAMA2, PI2_TMPL_LLAMA3 } pi2_chat_template;

const char *pi2_chat_template_name(pi2_chat_template t);
/* --chat-template NAME: 0, or -1 + error. */
int pi2_chat_template_parse(const char *name, pi2_chat_template *t);
/* The kind of the template a .pi2's metadata keeps ("chat_template": {"kind": NAME} or
 * {"template": JINJA, ...}, as `pi2 convert --sparsify cats` writes it); NONE when it has none or one
 * of no kind the engine renders. */
pi2_chat_template pi2_chat_template_from_metadata(const char *meta, size_t len);

#define PI2_OAI_MAX_STOP 4
#define PI2_OAI_MAX_STOP_LEN 64

typedef struct {
    int chat;            /* /v1/chat/completions (else /v1/completions) */
    int stream;
    int ignore_eos;      /* llama-server's extension: generate past end-of-generation (benches) */
    pi2_buf prompt;      /* the text the engine tokenizes (a chat rendered with the template) */
    int max_tokens;      /* -1: not given */
    float temperature, top_p;
    uint64_t seed;
    char stop[PI2_OAI_MAX_STOP][PI2_OAI_MAX_STOP_LEN + 1];
    int n_stop;
} pi2_oai_request;

/* Parse body[0..len) for the endpoint (chat or not). 0, or an HTTP status (400) with the reason in
 * pi2_set_error. max_tokens over max_tokens_cap is refused, not cut. Free with pi2_oai_free either way. */
int pi2_oai_parse(const char *body, size_t len, int chat, pi2_chat_template t, int max_tokens_cap, pi2_oai_request *r);
void pi2_oai_free(pi2_oai_request *r);

/* What every object of one reply shares. */
typedef struct {
    char id[48];
    long long created;
    const char *model;
    int chat;
} pi2_oai_reply;

typedef enum { PI2_OAI_FIRST_CHUNK, PI2_OAI_CHUNK, PI2_OAI_LAST_CHUNK, PI2_OAI_WHOLE } pi2_oai_part;

/* One object of the reply: a stream chunk (the first names the role) or the whole completion.
 * finish: NULL while streaming; usage_json/timings_json: JSON objects or NULL (left out). */
void pi2_oai_object(pi2_buf *out, const pi2_oai_reply *r, pi2_oai_part part, const char *text, size_t n,
                    const char *finish, const char *usage_json, const char *timings_json);
/* A whole JSON response with OpenAI's error body {"error": {"message", "type", "param", "code"}}. */
void pi2_oai_error_response(pi2_buf *out, int status, const char *message, const char *extra_headers);
/* A whole JSON response with body json. */
void pi2_oai_json_response(pi2_buf *out, int status, const char *json, size_t n);

#endif
