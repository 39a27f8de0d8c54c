#include <stdint.h>
#include <string.h>

#include "check.h"
#include "common.h"

int main(void) {
    uint64_t v = 0;
    CHECK(pi2_parse_size("-b", "4096", &v) == 0 && v == 4096);
    CHECK(pi2_parse_size("-b", "512K", &v) == 0 && v == 512ull * 1024);
    CHECK(pi2_parse_size("-b", "2G", &v) == 0 && v == 2ull << 30);
    CHECK(pi2_parse_size("-b", "1.5g", &v) == 0 && v == 3ull << 29);
    CHECK(pi2_parse_size("-b", "3MiB", &v) == 0 && v == 3ull << 20);
    CHECK(pi2_parse_size("-b", "1536mib", &v) == 0 && v == 1536ull << 20);
    /* a B after the unit letter is decimal (a spec sheet's GB), iB and the bare letter binary */
    CHECK(pi2_parse_size("-b", "1536mb", &v) == 0 && v == 1536000000ull);
    CHECK(pi2_parse_size("-b", "19GB", &v) == 0 && v == 19000000000ull);
    CHECK(pi2_parse_size("-b", "19GiB", &v) == 0 && v == 19ull << 30);
    CHECK(pi2_parse_size("-b", "19G", &v) == 0 && v == 19ull << 30);
    CHECK(pi2_parse_size("-b", "1.5kB", &v) == 0 && v == 1500);
    CHECK(pi2_parse_size("-b", "2TB", &v) == 0 && v == 2000000000000ull);
    CHECK(pi2_parse_size("-b", "4096B", &v) == 0 && v == 4096);
    CHECK(pi2_parse_size("-b", "0.5K", &v) == 0 && v == 512);
    CHECK(pi2_parse_size("-b", "1024T", &v) == 0 && v == 1ull << 50); /* the upper bound itself */
    CHECK(pi2_parse_size("-b", "1125899906842624", &v) == 0 && v == 1ull << 50);
    /* what strtod let through, and everything else that is not a size */
    const char *bad[] = {"", "2X", "-1G", "+1G", "1e3", "0x1p30", "0x10", " 2G", "2G ", "2 G", "inf", "nan", "1.5",
                         ".5G", "5.G", "1.1234567G", "2Gi", "2iB", "2GBB", "0", "0.0000001K", "1,5G", "2K\n"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        v = 77;
        const int rc = pi2_parse_size("--memory-budget", bad[k], &v);
        CHECK(rc == -1 && v == 77);
        if (rc != -1) fprintf(stderr, "accepted bad size '%s' as %llu\n", bad[k], (unsigned long long)v);
        CHECK(strstr(pi2_last_error(), "--memory-budget: expected a size") == pi2_last_error());
    }
    CHECK(pi2_parse_size("-b", NULL, &v) == -1);
    const char *huge[] = {"99999999999999T", "1025T", "1125899906842625", "18446744073709551616", "99999999999999999999999"};
    for (size_t k = 0; k < sizeof huge / sizeof huge[0]; k++) {
        CHECK(pi2_parse_size("--memory-budget", huge[k], &v) == -1);
        CHECK(strstr(pi2_last_error(), "larger than the most") != NULL);
    }
    /* context added around the previous error keeps the reason (it was formatted into itself) */
    pi2_set_error("bad blob: offset %d beyond the end", 12);
    pi2_set_error("%s: tokenizer section: %s", "m.pi2", pi2_last_error());
    CHECK(strcmp(pi2_last_error(), "m.pi2: tokenizer section: bad blob: offset 12 beyond the end") == 0);
    /* whatever an error quotes from its input, it stays one line */
    pi2_set_error("plan %s: version %s is not supported", "p.json", "\nA\tB\x7f\r");
    CHECK(strcmp(pi2_last_error(), "plan p.json: version ?A?B?? is not supported") == 0);
    pi2_set_error("%s: tokenizer section: %s", "m.pi2", "bad blob: offset 12 beyond the end");
    pi2_set_error("%s, again: %s", pi2_last_error(), pi2_last_error());
    CHECK(strncmp(pi2_last_error(), "m.pi2: tokenizer section: bad blob: offset 12 beyond the end, again: m.pi2:", 75) == 0);
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
