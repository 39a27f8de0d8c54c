#include "events.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

int pi2_events_open(pi2_events *ev, const char *path) {
    ev->f = NULL;
    if (!path) return 0;
    ev->f = fopen(path, "w");
    if (!ev->f) {
        pi2_set_error("cannot write events file %s", path);
        return -1;
    }
    return 0;
}

void pi2_events_close(pi2_events *ev) {
    if (ev->f) fclose(ev->f);
    ev->f = NULL;
}

void pi2_events_emit(pi2_events *ev, const char *fmt, ...) {
    if (!ev->f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(ev->f, fmt, ap);
    va_end(ap);
    fputc('\n', ev->f);
    fflush(ev->f);
}

double pi2_seconds(uint64_t ns) { return (double)ns / 1e9; }

uint64_t pi2_io_read_bytes(void) {
    FILE *f = fopen("/proc/self/io", "r");
    if (!f) return 0;
    char line[128];
    uint64_t v = 0;
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "read_bytes:", 11) == 0) v = strtoull(line + 11, NULL, 10);
    fclose(f);
    return v;
}

void pi2_json_string(char *out, size_t n, const char *s) {
    size_t o = 0;
    if (n < 3) {
        if (n) out[0] = 0;
        return;
    }
    out[o++] = '"';
    for (; *s && o + 8 < n; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[o++] = '\\';
            out[o++] = (char)ch;
        } else if (ch < 0x20) {
            o += (size_t)snprintf(out + o, n - o, "\\u%04x", ch);
        } else {
            out[o++] = (char)ch;
        }
    }
    out[o++] = '"';
    out[o] = 0;
}
