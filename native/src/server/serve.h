/* `pi2-engine serve`: an OpenAI-compatible HTTP server over one model load (docs/ENGINE.md, "serve").
 * The accept loop and dispatch (serve.c) over http.c (request heads), openai.c (the JSON both ways),
 * sse.c (streams). One request computes at a time on the one session (session.h); up to --max-queue
 * more wait, and the next gets 503 with Retry-After. Every connection has --read-timeout seconds to
 * send its request (408 otherwise) and answers close it (no keep-alive). */
#ifndef PI2_SERVER_SERVE_H
#define PI2_SERVER_SERVE_H

/* argv[1] is "serve"; options start at argv[2]. Returns the process exit code (0 after SIGINT/SIGTERM). */
int pi2_serve_main(int argc, char **argv);

#endif
