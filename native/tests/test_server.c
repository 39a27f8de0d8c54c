/* serve's pieces on their own: the request-head parser (statuses, incremental arrival), the UTF-8
 * helpers streamed text relies on, the JSON body reader's refusals, and the chat templates. */
#include <string.h>

#include "buf.h"
#include "check.h"
#include "common.h"
#include "http.h"
#include "openai.h"

static const pi2_http_limits lim = {1024, 4096};

static int head(const char *s) {
    pi2_http_request r;
    return pi2_http_parse_head(s, strlen(s), &lim, &r);
}

static int body(const char *json, int chat, pi2_chat_template t, pi2_oai_request *r) {
    return pi2_oai_parse(json, strlen(json), chat, t, 100, r);
}

int main(void) {
    pi2_http_request r;
    const char *get = "GET /v1/models?x=1 HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer k  \r\n\r\nrest";
    CHECK(pi2_http_parse_head(get, strlen(get), &lim, &r) == 1);
    CHECK(!strcmp(r.method, "GET") && !strcmp(r.path, "/v1/models") && !strcmp(r.auth, "Bearer k"));
    CHECK(r.head_len == strlen(get) - 4 && r.content_length == -1 && r.minor == 1);
    /* every prefix of a good head is "read more", never an error */
    for (size_t n = 0; n < r.head_len; n++) CHECK(pi2_http_parse_head(get, n, &lim, &r) == 0);
    CHECK(head("POST /v1/completions HTTP/1.0\r\nContent-Length: 12\r\ncontent-length: 12\r\n\r\n") == 1);
    CHECK(head("GET / HTTP/1.1\nHost: a\n\n") == -400);
    CHECK(head("GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n") == -400);
    CHECK(head("GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n") == -400);
    CHECK(head("GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n") == -400);
    CHECK(head("GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n") == -400);
    CHECK(head("GET / HTTP/1.1\r\nContent-Length: 4097\r\n\r\n") == -413);
    CHECK(head("GET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n") == -501);
    CHECK(head("GET / HTTP/2.0\r\n\r\n") == -505);
    CHECK(head("GET x HTTP/1.1\r\n\r\n") == -400);
    char big[1100];
    memset(big, 'a', sizeof big);
    memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
    CHECK(pi2_http_parse_head(big, sizeof big, &lim, &r) == -431);

    CHECK(pi2_utf8_valid_len((const unsigned char *)"\xc3\xa9", 2) == 2);
    CHECK(pi2_utf8_valid_len((const unsigned char *)"\xc0\x80", 2) == 0);     /* overlong NUL */
    CHECK(pi2_utf8_valid_len((const unsigned char *)"\xed\xa0\x80", 3) == 0); /* a surrogate */
    CHECK(pi2_utf8_incomplete_tail("ab\xe4\xb8", 4) == 2 && pi2_utf8_incomplete_tail("ab\xe4\xb8\x96", 5) == 0);
    pi2_buf b = {0};
    pi2_buf_json_str(&b, "a\"\n\xff", 4);
    CHECK(!strcmp(b.p, "\"a\\\"\\u000a\\ufffd\""));
    pi2_buf_free(&b);

    pi2_oai_request q;
    CHECK(body("{\"prompt\": \"hi\", \"max_tokens\": 5, \"stop\": \"x\", \"seed\": 3, \"n\": 1}", 0, PI2_TMPL_NONE, &q) == 0);
    CHECK(!strcmp(q.prompt.p, "hi") && q.max_tokens == 5 && q.n_stop == 1 && q.seed == 3 && q.temperature == 1.0f);
    pi2_oai_free(&q);
    const char *refused[] = {"{\"prompt\": \"a\\u0000\"}", "{\"prompt\": \"a\", \"max_tokens\": 101}",
                             "{\"prompt\": \"a\", \"max_tokens\": 1.5}", "{\"prompt\": \"a\", \"x\": 1}",
                             "{\"prompt\": \"a\", \"prompt\": \"b\"}", "{\"prompt\": \"\xff\"}", "{\"prompt\": 1}",
                             "{\"prompt\": \"a\", \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\"]}", "[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]",
                             "{\"prompt\": \"a\"} x", "{\"prompt\": \"a\", \"n\": 2}", "{\"prompt\": \"a\", \"top_p\": 0}"};
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        CHECK(body(refused[k], 0, PI2_TMPL_NONE, &q) == 400);
        pi2_oai_free(&q);
    }
    const char *chat = "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", \"content\": "
                       "[{\"type\": \"text\", \"text\": \"U\"}]}, {\"role\": \"assistant\", \"content\": \"A\"}, "
                       "{\"role\": \"user\", \"content\": \"V\"}]}";
    CHECK(body(chat, 1, PI2_TMPL_CHATML, &q) == 0);
    CHECK(!strcmp(q.prompt.p, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA"
                              "<|im_end|>\n<|im_start|>user\nV<|im_end|>\n<|im_start|>assistant\n"));
    pi2_oai_free(&q);
    CHECK(body(chat, 1, PI2_TMPL_LLAMA2, &q) == 0);
    CHECK(!strcmp(q.prompt.p, "[INST] <<SYS>>\nS\n<</SYS>>\n\nU [/INST] A </s><s>[INST] V [/INST]"));
    pi2_oai_free(&q);
    CHECK(body(chat, 1, PI2_TMPL_LLAMA3, &q) == 0);
    CHECK(!strncmp(q.prompt.p, "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>", 52));
    pi2_oai_free(&q);
    CHECK(body(chat, 1, PI2_TMPL_NONE, &q) == 400 && strstr(pi2_last_error(), "--chat-template"));
    pi2_oai_free(&q);
    const char *meta = "{\"chat_template\": {\"template\": \"{% for m in messages %}<|im_start|>{{m.role}}\", \"bos\": \"\"}}";
    CHECK(pi2_chat_template_from_metadata(meta, strlen(meta)) == PI2_TMPL_CHATML);
    const char *kind = "{\"chat_template\": {\"kind\": \"llama3\"}}", *none = "{\"synthetic\": true}";
    CHECK(pi2_chat_template_from_metadata(kind, strlen(kind)) == PI2_TMPL_LLAMA3);
    CHECK(pi2_chat_template_from_metadata(none, strlen(none)) == PI2_TMPL_NONE);
    return pi2_test_summary("test_server");
}
