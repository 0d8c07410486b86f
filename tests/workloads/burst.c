/* A process of a few milliseconds: spins for MS milliseconds and exits.
 * With GAP_MS, a long-lived one instead: spins MS, sleeps GAP_MS, forever.
 * usage: burst MS [GAP_MS] */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile uint64_t sink;

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

__attribute__((noinline)) void burst_spin(uint64_t ms) {
    uint64_t end = now_us() + ms * 1000;
    while (now_us() < end) {
        for (int i = 0; i < 10000; i++) sink += i;
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: burst MS [GAP_MS]\n");
        return 2;
    }
    uint64_t ms = strtoull(argv[1], 0, 10);
    if (argc < 3) {
        burst_spin(ms);
        return 0;
    }
    struct timespec gap = {0, (long)(strtoull(argv[2], 0, 10) % 1000) * 1000000};
    for (;;) {
        burst_spin(ms);
        nanosleep(&gap, 0);
    }
}
