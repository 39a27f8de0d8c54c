#include "events.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "safe_write.h"

int pi2_events_open(pi2_events *ev, const char *path) {
    memset(ev, 0, sizeof *ev);
    if (!path) return 0;
    ev->path = path;
    return (ev->f = pi2_open_stream(path, "--events")) ? 0 : -1;
}

int pi2_events_close(pi2_events *ev) {
    FILE *f = ev->f;
    ev->f = NULL;
    if (!f) return 0;
    if (!ev->err) return pi2_close_stream(f, ev->path, "--events"); /* checks the last flush and fsync */
    fclose(f);
    return pi2_events_check(ev); /* an earlier write failed: that is the error */
}

int pi2_events_check(pi2_events *ev) {
    if (ev->f && !ev->err && ferror(ev->f)) ev->err = errno ? errno : EIO;
    if (!ev->err) return 0;
    pi2_set_error("--events %s: write failed: %s", ev->path, strerror(ev->err));
    return -1;
}

int pi2_events_line(pi2_events *ev, const char *line, int urgent) {
    if (!ev->f) return 0;
    if (ev->err) return pi2_events_check(ev); /* the run is failing: write nothing more */
    errno = 0;
    fputs(line, ev->f);
    fputc('\n', ev->f);
    const uint64_t now = pi2_now_ns();
    if (urgent || now - ev->flushed_ns >= (uint64_t)PI2_EVENTS_FLUSH_MS * 1000000) {
        if (fflush(ev->f) != 0 && !ev->err) ev->err = errno ? errno : EIO;
        ev->flushed_ns = now;
    }
    return pi2_events_check(ev);
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
