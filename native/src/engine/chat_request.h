/* One request of `pi2-engine chat`: a single-line JSON object read from stdin,
 *   {"prompt": "<text appended to the context>", "n_predict": 64, "ignore_eos": false, "reset": false}
 * Only these keys are accepted (an unknown one is an error, so a typo never goes unnoticed); "prompt"
 * is required, the rest default to the command line's -n / --ignore-eos and to no reset. */
#ifndef PI2_CHAT_REQUEST_H
#define PI2_CHAT_REQUEST_H

#include <stddef.h>

typedef struct {
    char *prompt;      /* UTF-8, NUL-terminated, owned (free with pi2_chat_request_free) */
    size_t prompt_len; /* bytes, without the terminator */
    int n_predict;     /* -1: not given */
    int ignore_eos;    /* -1: not given, else 0/1 */
    int reset;         /* 1: forget the KV cache before this prompt (a new conversation) */
} pi2_chat_request;

/* Parse one line (len bytes, trailing newline allowed). 0 on success; -1 with pi2_set_error naming
 * the problem and its byte offset. The request is zeroed first and left empty on failure. */
int pi2_chat_request_parse(const char *line, size_t len, pi2_chat_request *req);
void pi2_chat_request_free(pi2_chat_request *req);

#endif
