/* `pi2-engine size`: the sparse engine's sizing of a model under a budget, without running it: the
 * budget and how it was chosen, the fixed region and its parts, the neuron cache and its split, and
 * the smallest budget that works. With -m the model is opened as a run opens it and the engine
 * measures itself (sparse_size.h: pi2_sparse_measure); with --facts FILE.json (the JSON of `info
 * --json`, or a registry shape with the same keys) the fixed region is estimated from the header facts
 * and the same sizing runs on it. docs/ENGINE.md. */
#ifndef PI2_SIZE_CMD_H
#define PI2_SIZE_CMD_H

#include "session_options.h"

/* The process exit code: 0, or 1 with the engine's one-line error (and the JSON with "error"). */
int pi2_size_main(const pi2_options *o);

#endif
