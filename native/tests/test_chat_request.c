/* The chat request parser: the accepted keys, escapes to UTF-8, and clear errors for bad lines. */
#include <string.h>

#include "chat_request.h"
#include "common.h"
#include "check.h"

static int parse(const char *line, pi2_chat_request *r) { return pi2_chat_request_parse(line, strlen(line), r); }

static int fails_with(const char *line, const char *needle) {
    pi2_chat_request r;
    int rc = parse(line, &r);
    return rc == -1 && r.prompt == NULL && strstr(pi2_last_error(), needle) != NULL;
}

int main(void) {
    pi2_chat_request r;
    CHECK(parse("{\"prompt\": \"hi\\n\\\"x\\\"\", \"n_predict\": 12, \"ignore_eos\": true, \"reset\": false}\n", &r) == 0);
    CHECK(r.prompt && !strcmp(r.prompt, "hi\n\"x\"") && r.prompt_len == 6);
    CHECK(r.n_predict == 12 && r.ignore_eos == 1 && r.reset == 0);
    pi2_chat_request_free(&r);

    CHECK(parse("{\"prompt\":\"a\"}", &r) == 0);
    CHECK(r.n_predict == -1 && r.ignore_eos == -1 && r.reset == 0);
    pi2_chat_request_free(&r);

    /* \u escapes: BMP and a surrogate pair become UTF-8. */
    CHECK(parse("{\"prompt\": \"\\u00e9\\u20ac\\ud83d\\ude00/\\/\"}", &r) == 0);
    CHECK(r.prompt && !strcmp(r.prompt, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80//"));
    pi2_chat_request_free(&r);

    /* Raw UTF-8 passes through unchanged. */
    CHECK(parse("{\"prompt\": \"caf\xc3\xa9\", \"reset\": true}", &r) == 0);
    CHECK(r.prompt && !strcmp(r.prompt, "caf\xc3\xa9") && r.reset == 1);
    pi2_chat_request_free(&r);

    CHECK(fails_with("{\"prompt\": \"x\", \"n_predict\": -1}", "non-negative integer"));
    CHECK(fails_with("{\"prompt\": \"x\", \"n_predict\": 1.5}", "non-negative integer"));
    CHECK(fails_with("{\"prompt\": \"x\", \"n_predict\": 99999999}", "too large"));
    CHECK(fails_with("{\"prompt\": \"x\", \"temperature\": 1}", "unknown key"));
    CHECK(fails_with("{\"n_predict\": 3}", "\"prompt\" is missing"));
    CHECK(fails_with("{\"prompt\": \"x\"} trailing", "unexpected text"));
    CHECK(fails_with("{\"prompt\": \"x", "unterminated string"));
    CHECK(fails_with("{\"prompt\": \"\\ud83d\"}", "surrogate"));
    CHECK(fails_with("{\"prompt\": \"\\u0000\"}", "not allowed"));
    CHECK(fails_with("{\"prompt\": \"\\q\"}", "unknown escape"));
    CHECK(fails_with("{\"prompt\": \"a\tb\"}", "control byte"));
    CHECK(fails_with("{\"prompt\": \"a\", \"prompt\": \"b\"}", "given twice"));
    CHECK(fails_with("{\"prompt\": \"x\", \"reset\": 1}", "true or false"));
    CHECK(fails_with("[\"prompt\"]", "expected '{'"));
    CHECK(fails_with("", "expected '{'"));
    return pi2_test_summary("test_chat_request");
}
