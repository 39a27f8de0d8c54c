#include <stdint.h>
#include <string.h>

#include "check.h"
#include "common.h"

int main(void) {
    uint64_t v = 0;
    CHECK(pi2_parse_size("4096", &v) == 0 && v == 4096);
    CHECK(pi2_parse_size("512K", &v) == 0 && v == 512ull * 1024);
    CHECK(pi2_parse_size("2G", &v) == 0 && v == 2ull << 30);
    CHECK(pi2_parse_size("1.5g", &v) == 0 && v == 3ull << 29);
    CHECK(pi2_parse_size("3MiB", &v) == 0 && v == 3ull << 20);
    CHECK(pi2_parse_size("", &v) == -1);
    CHECK(pi2_parse_size("2X", &v) == -1);
    CHECK(pi2_parse_size("-1G", &v) == -1);
    CHECK(strstr(pi2_last_error(), "bad size") != NULL);
    int i = 0;
    float f = 0;
    CHECK(pi2_parse_int_arg("-n", "16", 0, 100, &i) == 0 && i == 16);
    CHECK(pi2_parse_int_arg("-n", "101", 0, 100, &i) == -1 && strstr(pi2_last_error(), "-n needs an integer"));
    CHECK(pi2_parse_int_arg("-n", "1x", 0, 100, &i) == -1);
    CHECK(pi2_parse_int_arg("-n", "", 0, 100, &i) == -1);
    CHECK(pi2_parse_int_arg("-n", NULL, 0, 100, &i) == -1);
    CHECK(pi2_parse_float_arg("--top-p", "0.5", &f) == 0 && f == 0.5f);
    CHECK(pi2_parse_float_arg("--top-p", "nan", &f) == -1 && strstr(pi2_last_error(), "--top-p needs a number"));
    CHECK(pi2_parse_float_arg("--top-p", NULL, &f) == -1);
    uint64_t t0 = pi2_now_ns(), t1 = pi2_now_ns();
    CHECK(t1 >= t0);
    CHECK(pi2_peak_rss_bytes() > 0);
    return pi2_test_summary("test_common");
}
