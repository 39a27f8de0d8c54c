/* The events' contract (--events FILE, JSONL; events.h writes the lines): one table of every event
 * kind's fields (name, JSON type, which commands emit it, when, one line of meaning) and one builder
 * per kind that writes a record by walking that table, for generate and chat alike. `pi2-engine
 * capabilities --json` prints the same table, the host's parser reads it (pi2cli/engines/pi2/events.py)
 * and docs/ENGINE.md's event section is checked against it, so a field is added in one place: a row
 * here (and the record member it reads). */
#ifndef PI2_EVENT_SCHEMA_H
#define PI2_EVENT_SCHEMA_H

#include <stddef.h>
#include <stdint.h>

#include "events.h"

/* How a row's value is written from its record; PI2_EV_SPARSE rows are written by the sparse engine
 * (sparse/sparse_stats.c builds that part of token, named and summary) and only listed here. */
typedef enum {
    PI2_EV_INT,    /* int */
    PI2_EV_U64,    /* uint64_t */
    PI2_EV_TIME,   /* double, a monotonic-clock time in s (%.9f) */
    PI2_EV_SEC,    /* double, a duration in s (%.6f) */
    PI2_EV_RATE,   /* double, tokens/s (%.3f) */
    PI2_EV_STR,    /* const char *, JSON-escaped; a NULL value leaves a conditional row out */
    PI2_EV_IDS,    /* const int32_t * and, in the next member, its int count: a JSON array */
    PI2_EV_OBJ,    /* const char *, a JSON object's text as its producer built it; NULL leaves the row out */
    PI2_EV_SPARSE, /* written by the sparse engine */
} pi2_ev_how;

typedef struct {
    const char *event, *name;
    pi2_ev_how how;
    size_t off;       /* the value's offset in the kind's record struct (not for PI2_EV_SPARSE) */
    const char *type; /* JSON type: integer, number, string, boolean, array, object */
    unsigned cmds;    /* pi2_command bits: which commands emit it */
    const char *when; /* NULL: always; else the condition ("sparse": a sparse policy; a flag; "error") */
    const char *help;
} pi2_event_field;

/* The table, ending with a {NULL} entry, grouped by kind in pi2_event_kinds order. */
extern const pi2_event_field pi2_event_fields[];
extern const char *const pi2_event_kinds[]; /* NULL-terminated */

/* The records the builders write. cmd: the pi2_command bit of the command writing it. */
typedef struct {
    double t, load_s;
    const char *mode, *engine, *kernels; /* kernels (and x4_*): set by pi2_event_start */
    int threads, n_ctx, n_batch, n_prompt, x4_prefetch, x4_streams;
    const int32_t *prompt_ids;
    int n_prompt_ids; /* follows prompt_ids (PI2_EV_IDS) */
} pi2_start_record;

typedef struct {
    double t, cpu_s;
    int turn, i, id;
} pi2_token_record;

typedef struct {
    int turn, n_prompt, n_cached, n_gen, n_past;
    double t0, ttft_s, prefill_s, prefill_tps, decode_s, decode_tps, cpu_s;
    const char *stop, *error; /* error: a failed turn's reason (stop "error"), else NULL */
    uint64_t peak_rss_bytes;
} pi2_turn_record;

typedef struct {
    double t;
    int turns, threads;
    uint64_t peak_rss_bytes, bytes_read, model_bytes, anon_huge_bytes;
    const char *decode_profile;  /* session_profile.c's object; NULL when no token was decoded */
    const char *prefill_profile; /* the same per prompt token; NULL when no prompt was processed */
} pi2_summary_record;

/* The JSON object of a `kind` record (its table rows for `cmd`, then `sparse`: the sparse engine's
 * ", \"k\": v" part or NULL), malloc'd; NULL + error when out of memory. */
char *pi2_event_json(const char *kind, unsigned cmd, const void *record, const char *sparse);

/* Each writes its kind's line to the events file (nothing when events are off); 0, or -1 + error when
 * a write failed. pi2_event_turn also returns the line in *json (malloc'd) when json is not NULL:
 * chat repeats it on stdout as the turn's record. */
int pi2_event_start(pi2_events *ev, unsigned cmd, const pi2_start_record *r);
int pi2_event_token(pi2_events *ev, unsigned cmd, const pi2_token_record *r, const char *sparse);
int pi2_event_turn(pi2_events *ev, unsigned cmd, const pi2_turn_record *r, char **json);
int pi2_event_summary(pi2_events *ev, unsigned cmd, const pi2_summary_record *r, const char *sparse);

/* `"events": {...}` of capabilities --json: every kind's rows (no leading comma). */
void pi2_event_schema_json(FILE *out);

#endif
