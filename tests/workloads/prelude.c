/* Spins in prelude_spin for the given milliseconds, then executes the
 * program named by its remaining arguments (same pid, new image). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

__attribute__((noinline)) void prelude_spin(uint64_t ms) {
    uint64_t end = now_ms() + ms;
    while (now_ms() < end) {
        for (int i = 0; i < 100000; i++) sink += i;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: prelude MS PROGRAM [ARGS...]\n");
        return 2;
    }
    prelude_spin(strtoull(argv[1], 0, 10));
    execv(argv[2], &argv[2]);
    perror("execv");
    return 1;
}
