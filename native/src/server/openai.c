/* OpenAI's request and response JSON (openai.h), on the bounded tree reader of json_doc.c. */
#include "openai.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "http.h"
#include "json_doc.h"

static const char *const tmpl_names[] = {"none", "chatml", "llama2", "llama3"};

const char *pi2_chat_template_name(pi2_chat_template t) { return tmpl_names[t]; }

int pi2_chat_template_parse(const char *name, pi2_chat_template *t) {
    for (int i = 1; i < 4; i++)
        if (!strcmp(name, tmpl_names[i])) {
            *t = (pi2_chat_template)i;
            return 0;
        }
    pi2_set_error("--chat-template: expected chatml, llama2 or llama3, got '%s'", name);
    return -1;
}

/* A Jinja template's kind by the markers it writes, as llama.cpp recognises templates it knows. */
static pi2_chat_template template_kind(const char *src) {
    if (strstr(src, "<|im_start|>")) return PI2_TMPL_CHATML;
    if (strstr(src, "<|start_header_id|>")) return PI2_TMPL_LLAMA3;
    if (strstr(src, "[INST]")) return PI2_TMPL_LLAMA2;
    return PI2_TMPL_NONE;
}

pi2_chat_template pi2_chat_template_from_metadata(const char *meta, size_t len) {
    pi2_chat_template t = PI2_TMPL_NONE;
    if (!meta || !len) return t;
    pi2_jd *d = pi2_jd_parse("metadata", meta, len);
    const pi2_jd *ct = pi2_jd_get(d, "chat_template");
    const pi2_jd *kind = pi2_jd_get(ct, "kind"), *src = pi2_jd_get(ct, "template");
    if (kind && kind->kind == PI2_JD_STRING) pi2_chat_template_parse(kind->str, &t);
    else if (src && src->kind == PI2_JD_STRING) t = template_kind(src->str);
    else if (ct && ct->kind == PI2_JD_STRING) t = template_kind(ct->str);
    pi2_jd_free(d);
    return t;
}

/* ---- requests ---------------------------------------------------------------------------------- */

static int bad(const char *fmt, const char *a) {
    pi2_set_error(fmt, a);
    return 400;
}

/* An integer in [lo, hi] (JSON numbers without a fraction or exponent). */
static int as_int(const pi2_jd *v, const char *key, long long lo, long long hi, long long *out) {
    if (v->kind != PI2_JD_NUMBER || strpbrk(v->str, ".eE")) return bad("'%s' must be an integer", key);
    if (v->len > 19 || v->num < (double)lo || v->num > (double)hi) {
        pi2_set_error("'%s' must be between %lld and %lld", key, lo, hi);
        return 400;
    }
    *out = strtoll(v->str, NULL, 10);
    return 0;
}

static int as_float(const pi2_jd *v, const char *key, double lo, double hi, float *out) {
    if (v->kind != PI2_JD_NUMBER) return bad("'%s' must be a number", key);
    if (!(v->num >= lo && v->num <= hi)) {
        pi2_set_error("'%s' must be between %g and %g", key, lo, hi);
        return 400;
    }
    *out = (float)v->num;
    return 0;
}

static int as_bool(const pi2_jd *v, const char *key, int *out) {
    if (v->kind != PI2_JD_TRUE && v->kind != PI2_JD_FALSE) return bad("'%s' must be true or false", key);
    *out = v->kind == PI2_JD_TRUE;
    return 0;
}

static int stops(const pi2_jd *v, pi2_oai_request *r) {
    const pi2_jd *one = v->kind == PI2_JD_STRING ? v : NULL;
    if (!one && v->kind != PI2_JD_ARRAY) return bad("'%s' must be a string or an array of strings", "stop");
    if (v->kind == PI2_JD_ARRAY && v->n > PI2_OAI_MAX_STOP) return bad("'%s' takes at most 4 strings", "stop");
    for (const pi2_jd *s = one ? one : v->child; s; s = one ? NULL : s->next) {
        if (s->kind != PI2_JD_STRING) return bad("'%s' must be a string or an array of strings", "stop");
        if (!s->len || s->len > PI2_OAI_MAX_STOP_LEN) return bad("'%s' strings must be 1 to 64 bytes", "stop");
        memcpy(r->stop[r->n_stop], s->str, s->len + 1);
        r->n_stop++;
    }
    return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts (joined). */
static int content(const pi2_jd *c, pi2_buf *out) {
    if (c->kind == PI2_JD_NULL) return 0;
    if (c->kind == PI2_JD_STRING) {
        pi2_buf_add(out, c->str, c->len);
        return 0;
    }
    if (c->kind != PI2_JD_ARRAY) return bad("a message's '%s' must be a string or an array of text parts", "content");
    for (const pi2_jd *p = c->child; p; p = p->next) {
        const pi2_jd *type = pi2_jd_get(p, "type"), *text = pi2_jd_get(p, "text");
        if (!type || type->kind != PI2_JD_STRING || strcmp(type->str, "text") || !text || text->kind != PI2_JD_STRING || p->n != 2)
            return bad("content parts must be {\"type\": \"text\", \"text\": STRING} (this %s serves text only)", "engine");
        pi2_buf_add(out, text->str, text->len);
    }
    return 0;
}

/* The conversation in the template's text, ending where the assistant's answer starts. */
static int render(const pi2_jd *msgs, pi2_chat_template t, pi2_buf *out) {
    if (msgs->kind != PI2_JD_ARRAY || !msgs->n) return bad("'%s' must be a non-empty array", "messages");
    if (t == PI2_TMPL_NONE)
        return bad("this model has no chat template the engine can render (chatml, llama2, llama3): use "
                   "/v1/completions, or start serve with --chat-template %s", "chatml|llama2|llama3");
    pi2_buf sys = {0};
    int first_user = 1, rc = 0;
    for (const pi2_jd *m = msgs->child; m && !rc; m = m->next) {
        if (m->kind != PI2_JD_OBJECT) { rc = bad("each of '%s' must be an object", "messages"); break; }
        const pi2_jd *role = NULL, *c = NULL;
        for (const pi2_jd *f = m->child; f; f = f->next) {
            if (!strcmp(f->key, "role")) role = f;
            else if (!strcmp(f->key, "content")) c = f;
            else if (strcmp(f->key, "name")) { rc = bad("unknown message field '%.40s'", f->key); break; }
        }
        if (rc) break;
        if (!role || role->kind != PI2_JD_STRING) { rc = bad("each message needs a string '%s'", "role"); break; }
        if (!c) { rc = bad("each message needs '%s'", "content"); break; }
        const char *r = role->str;
        const int is_sys = !strcmp(r, "system") || !strcmp(r, "developer");
        if (!is_sys && strcmp(r, "user") && strcmp(r, "assistant")) {
            rc = bad("unknown role '%.40s' (system, developer, user, assistant)", r);
            break;
        }
        const char *shown = is_sys ? "system" : r;
        pi2_buf text = {0};
        rc = content(c, &text);
        if (!rc && t == PI2_TMPL_CHATML) {
            pi2_buf_printf(out, "<|im_start|>%s\n", shown);
            pi2_buf_add(out, text.p ? text.p : "", text.len);
            pi2_buf_puts(out, "<|im_end|>\n");
        } else if (!rc && t == PI2_TMPL_LLAMA3) {
            pi2_buf_printf(out, "<|start_header_id|>%s<|end_header_id|>\n\n", shown);
            pi2_buf_add(out, text.p ? text.p : "", text.len);
            pi2_buf_puts(out, "<|eot_id|>");
        } else if (!rc) { /* llama2: the system text goes into the first [INST] */
            if (is_sys) pi2_buf_add(&sys, text.p ? text.p : "", text.len);
            else if (!strcmp(r, "user")) {
                pi2_buf_puts(out, "[INST] ");
                if (first_user && sys.len) {
                    pi2_buf_puts(out, "<<SYS>>\n");
                    pi2_buf_add(out, sys.p, sys.len);
                    pi2_buf_puts(out, "\n<</SYS>>\n\n");
                }
                first_user = 0;
                pi2_buf_add(out, text.p ? text.p : "", text.len);
                pi2_buf_puts(out, " [/INST]");
            } else {
                pi2_buf_puts(out, " ");
                pi2_buf_add(out, text.p ? text.p : "", text.len);
                pi2_buf_puts(out, " </s><s>");
            }
        }
        pi2_buf_free(&text);
    }
    if (!rc && t == PI2_TMPL_CHATML) pi2_buf_puts(out, "<|im_start|>assistant\n");
    if (!rc && t == PI2_TMPL_LLAMA3) pi2_buf_puts(out, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    pi2_buf_free(&sys);
    return rc;
}

/* Fields OpenAI clients send that the engine honours only at their neutral value. */
static int neutral(const pi2_jd *f) {
    const char *k = f->key;
    if (!strcmp(k, "n")) return f->kind == PI2_JD_NUMBER && f->num == 1;
    if (!strcmp(k, "frequency_penalty") || !strcmp(k, "presence_penalty")) return f->kind == PI2_JD_NUMBER && f->num == 0;
    if (!strcmp(k, "logprobs") || !strcmp(k, "echo")) return f->kind == PI2_JD_FALSE;
    return -1; /* not one of them */
}

int pi2_oai_parse(const char *body, size_t len, int chat, pi2_chat_template t, int max_tokens_cap, pi2_oai_request *r) {
    memset(r, 0, sizeof *r);
    r->chat = chat;
    r->max_tokens = -1;
    r->temperature = 1.0f; /* OpenAI's defaults */
    r->top_p = 1.0f;
    pi2_jd *d = pi2_jd_parse("request body", body, len);
    if (!d) return 400;
    int rc = 0;
    const pi2_jd *input = NULL;
    if (d->kind != PI2_JD_OBJECT) rc = bad("the request body must be a JSON %s", "object");
    for (const pi2_jd *f = d->kind == PI2_JD_OBJECT ? d->child : NULL; f && !rc; f = f->next) {
        const char *k = f->key;
        long long v;
        if (f->kind == PI2_JD_NULL) continue; /* null: not given */
        const int nt = neutral(f);
        if (nt == 1) continue;
        if (nt == 0) rc = bad("'%s' is not supported except at its default (n 1, penalties 0, logprobs and echo false)", k);
        else if (!strcmp(k, "model") || !strcmp(k, "user")) { if (f->kind != PI2_JD_STRING) rc = bad("'%s' must be a string", k); }
        else if (!strcmp(k, "stream")) rc = as_bool(f, k, &r->stream);
        else if (!strcmp(k, "ignore_eos")) rc = as_bool(f, k, &r->ignore_eos);
        else if (!strcmp(k, "stream_options")) {
            const pi2_jd *iu = pi2_jd_get(f, "include_usage");
            int ignored;
            if (f->kind != PI2_JD_OBJECT || f->n != (iu != NULL) || (iu && as_bool(iu, "include_usage", &ignored)))
                rc = bad("'%s' takes only {\"include_usage\": BOOL} (usage is always in the last chunk)", k);
        } else if (!strcmp(k, "max_tokens") || (chat && !strcmp(k, "max_completion_tokens"))) {
            if (!(rc = as_int(f, k, 0, 1ll << 40, &v))) {
                if (v > max_tokens_cap) {
                    pi2_set_error("'%s' %lld is over this server's limit of %d (serve --max-tokens)", k, v, max_tokens_cap);
                    rc = 400;
                } else r->max_tokens = (int)v;
            }
        } else if (!strcmp(k, "temperature")) rc = as_float(f, k, 0, 2, &r->temperature);
        else if (!strcmp(k, "top_p")) {
            if (!(rc = as_float(f, k, 0, 1, &r->top_p)) && r->top_p <= 0) rc = bad("'%s' must be in (0, 1]", k);
        } else if (!strcmp(k, "seed")) {
            if (!(rc = as_int(f, k, 0, 9007199254740991ll, &v))) r->seed = (uint64_t)v;
        } else if (!strcmp(k, "stop")) rc = stops(f, r);
        else if (chat && !strcmp(k, "messages")) input = f;
        else if (!chat && !strcmp(k, "prompt")) {
            input = f;
            if (f->kind == PI2_JD_ARRAY && f->n == 1 && f->child->kind == PI2_JD_STRING) input = f->child;
            if (input->kind != PI2_JD_STRING) rc = bad("'%s' must be a string (or an array of one string)", k);
        } else rc = bad("unknown field '%.40s'", k);
    }
    if (!rc && !input) rc = bad("'%s' is required", chat ? "messages" : "prompt");
    if (!rc && chat) rc = render(input, t, &r->prompt);
    if (!rc && !chat) pi2_buf_add(&r->prompt, input->str, input->len);
    if (!rc && !r->prompt.len) rc = bad("the %s is empty", "prompt");
    if (!rc && r->prompt.oom) {
        pi2_set_error("out of memory");
        rc = 500;
    }
    pi2_jd_free(d);
    return rc;
}

void pi2_oai_free(pi2_oai_request *r) { pi2_buf_free(&r->prompt); }

/* ---- responses --------------------------------------------------------------------------------- */

void pi2_oai_object(pi2_buf *out, const pi2_oai_reply *r, pi2_oai_part part, const char *text, size_t n,
                    const char *finish, const char *usage_json, const char *timings_json) {
    const int whole = part == PI2_OAI_WHOLE;
    const char *object = r->chat ? (whole ? "chat.completion" : "chat.completion.chunk") : "text_completion";
    pi2_buf_printf(out, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %lld, \"model\": ", r->id, object, r->created);
    pi2_buf_json_str(out, r->model, strlen(r->model));
    pi2_buf_puts(out, ", \"choices\": [{\"index\": 0, ");
    if (!r->chat) {
        pi2_buf_puts(out, "\"text\": ");
        pi2_buf_json_str(out, text ? text : "", text ? n : 0);
    } else if (whole) {
        pi2_buf_puts(out, "\"message\": {\"role\": \"assistant\", \"content\": ");
        pi2_buf_json_str(out, text ? text : "", text ? n : 0);
        pi2_buf_puts(out, "}");
    } else {
        pi2_buf_puts(out, "\"delta\": {");
        if (part == PI2_OAI_FIRST_CHUNK) pi2_buf_puts(out, "\"role\": \"assistant\", ");
        if (part != PI2_OAI_LAST_CHUNK || n) {
            pi2_buf_puts(out, "\"content\": ");
            pi2_buf_json_str(out, text ? text : "", text ? n : 0);
        } else if (part == PI2_OAI_FIRST_CHUNK) {
            pi2_buf_puts(out, "\"content\": \"\"");
        }
        pi2_buf_puts(out, "}");
    }
    pi2_buf_puts(out, ", \"logprobs\": null, \"finish_reason\": ");
    if (finish) pi2_buf_printf(out, "\"%s\"}]", finish);
    else pi2_buf_puts(out, "null}]");
    if (usage_json) pi2_buf_printf(out, ", \"usage\": %s", usage_json);
    if (timings_json) pi2_buf_printf(out, ", \"pi2_timings\": %s", timings_json);
    pi2_buf_puts(out, "}");
}

void pi2_oai_json_response(pi2_buf *out, int status, const char *json, size_t n) {
    pi2_buf_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n",
                   status, pi2_http_reason(status), n);
    pi2_buf_add(out, json, n);
}

void pi2_oai_error_response(pi2_buf *out, int status, const char *message, const char *extra_headers) {
    pi2_buf body = {0};
    const char *type = status == 401 ? "authentication_error" : status >= 500 ? "server_error" : "invalid_request_error";
    pi2_buf_puts(&body, "{\"error\": {\"message\": ");
    pi2_buf_json_str(&body, message, strlen(message));
    pi2_buf_printf(&body, ", \"type\": \"%s\", \"param\": null, \"code\": null}}", type);
    pi2_buf_printf(out, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n",
                   status, pi2_http_reason(status), body.len, extra_headers ? extra_headers : "");
    pi2_buf_add(out, body.p ? body.p : "", body.len);
    pi2_buf_free(&body);
}
