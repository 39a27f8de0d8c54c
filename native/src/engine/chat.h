/* `pi2-engine chat`: a multi-turn session that keeps the KV cache between turns.
 *
 * The model loads once. Each stdin line is one JSON request (chat_request.h): its prompt text is
 * tokenized and appended to the context (only the new tokens are prefilled), then up to n_predict
 * tokens are generated (stopping at end-of-generation unless ignore_eos). The generated text streams
 * to stdout as tokens come; a turn ends with one record line on stdout:
 *     "\x1e" + the turn's JSON record + "\n"
 * (0x1e, ASCII record separator, is therefore never part of the streamed text: such bytes are
 * dropped there; the token ids in the events keep them). The same record, per-token events and a
 * start/summary pair go to --events FILE (event_schema.h's builders: the records `generate` writes).
 * A request that fails (bad JSON, context full) gives a record with "stop": "error" and an "error"
 * message, and the session goes on; end of input ends it with exit code 0. */
#ifndef PI2_CHAT_H
#define PI2_CHAT_H

/* argv[1] is "chat"; options start at argv[2]. Returns the process exit code. */
int pi2_chat_main(int argc, char **argv);

#endif
