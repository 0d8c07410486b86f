/* The chain of chain.c with a function inlined into the leaf, for the
 * symbolization tests: main > level_one > level_two > level_three >
 * burn_leaf > mix_step, mix_step always inlined. Built -O2 -g (with or
 * without frame pointers), the samples must show mix_step as an inline
 * frame of burn_leaf, and file:line for every frame. The tests find lines by the `line:` markers, and mix_step's
 * body between its `begin:`/`end:` markers. */
#include <stdint.h>
#include <stdlib.h>

volatile uint64_t sink;

/* Loops itself, so nearly all of burn_leaf's time is in its inlined code:
 * a sample there shows the inline frame. */
static inline __attribute__((always_inline)) uint64_t mix_step(uint64_t x, uint64_t i) {
    /* begin:mix_step */
    for (int round = 0; round < 32; round++) {
        x ^= x >> 31;
        x *= 0x7fb5d329728ea185ULL;
        x ^= x >> 27;
        x *= 0x81dadef4bc2dd44dULL;
        x ^= x >> 33;
    }
    return x + i;
    /* end:mix_step */
}

__attribute__((noinline)) uint64_t burn_leaf(uint64_t rounds) {
    uint64_t x = rounds;
    for (uint64_t i = 0; i < rounds; i++) {
        x = mix_step(x, i); /* line:burn_leaf */
    }
    return x;
}

__attribute__((noinline)) uint64_t level_three(uint64_t rounds) {
    uint64_t r = burn_leaf(rounds); /* line:level_three */
    sink = r;
    return r + 3;
}

__attribute__((noinline)) uint64_t level_two(uint64_t rounds) {
    uint64_t r = level_three(rounds); /* line:level_two */
    sink = r;
    return r + 2;
}

__attribute__((noinline)) uint64_t level_one(uint64_t rounds) {
    uint64_t r = level_two(rounds); /* line:level_one */
    sink = r;
    return r + 1;
}

int main(int argc, char **argv) {
    uint64_t rounds = argc > 1 ? strtoull(argv[1], 0, 10) : 1000000;
    for (;;) {
        sink = level_one(rounds); /* line:main */
    }
    return 0;
}
