/* The one JSON object `pi2-engine chat` reads per line (see chat_request.h), on the strict flat-object
 * reader of json_flat.c: this file only knows the four keys and their types. */
#include "chat_request.h"

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "json_flat.h"

#define WHAT "chat request"

static int as_bool(const char *key, pi2_json_kind kind, int *out) {
    if (kind != PI2_JSON_TRUE && kind != PI2_JSON_FALSE) {
        pi2_set_error(WHAT ": \"%s\" must be true or false", key);
        return -1;
    }
    *out = kind == PI2_JSON_TRUE;
    return 0;
}

static int as_count(const char *key, pi2_json_kind kind, const char *v, int *out) {
    if (kind != PI2_JSON_NUMBER || !*v || strspn(v, "0123456789") != strlen(v)) {
        pi2_set_error(WHAT ": \"%s\" must be a non-negative integer", key);
        return -1;
    }
    if (strlen(v) > 7 || atol(v) > (1 << 20)) {
        pi2_set_error(WHAT ": \"%s\" is too large (at most %d)", key, 1 << 20);
        return -1;
    }
    *out = atoi(v);
    return 0;
}

static int member(void *user, const char *key, pi2_json_kind kind, const char *v, size_t len) {
    pi2_chat_request *req = user;
    if (!strcmp(key, "prompt")) {
        if (req->prompt) { pi2_set_error(WHAT ": \"prompt\" given twice"); return -1; }
        if (kind != PI2_JSON_STRING) { pi2_set_error(WHAT ": \"prompt\" must be a string"); return -1; }
        if (!(req->prompt = malloc(len + 1))) { pi2_set_error(WHAT ": out of memory"); return -1; }
        memcpy(req->prompt, v, len + 1);
        req->prompt_len = len;
        return 0;
    }
    if (!strcmp(key, "n_predict")) return as_count(key, kind, v, &req->n_predict);
    if (!strcmp(key, "ignore_eos")) return as_bool(key, kind, &req->ignore_eos);
    if (!strcmp(key, "reset")) return as_bool(key, kind, &req->reset);
    pi2_set_error(WHAT ": unknown key \"%.40s\" (prompt, n_predict, ignore_eos, reset)", key);
    return -1;
}

int pi2_chat_request_parse(const char *line, size_t len, pi2_chat_request *req) {
    memset(req, 0, sizeof *req);
    req->n_predict = -1;
    req->ignore_eos = -1;
    if (pi2_json_flat_parse(WHAT, line, len, member, req) != 0) goto fail;
    if (!req->prompt) { pi2_set_error(WHAT ": \"prompt\" is missing"); goto fail; }
    return 0;
fail:
    pi2_chat_request_free(req);
    return -1;
}

void pi2_chat_request_free(pi2_chat_request *req) {
    free(req->prompt);
    req->prompt = NULL;
    req->prompt_len = 0;
}
