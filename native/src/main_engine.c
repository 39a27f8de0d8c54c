/* pi2-engine: the command-line front of the engine. Subcommands arrive with the engine issues. */
#include <stdio.h>
#include <string.h>

#include "common.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: pi2-engine COMMAND [OPTIONS]\n"
            "commands:\n"
            "  generate   generate text from a .pi2 model (not built yet)\n"
            "  --version  print the engine version\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("pi2-engine %s\n", PI2_VERSION);
        return 0;
    }
    if (!strcmp(argv[1], "generate")) {
        fprintf(stderr, "pi2-engine: generate: not built yet\n");
        return 2;
    }
    fprintf(stderr, "pi2-engine: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
