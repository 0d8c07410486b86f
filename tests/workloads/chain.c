/* A known call chain for firn's tests: main > level_one > level_two >
 * level_three > burn_leaf, with the leaf spinning. Each level does work after
 * its call so the compiler cannot turn it into a tail call. */
#include <stdint.h>
#include <stdlib.h>

volatile uint64_t sink;

__attribute__((noinline)) uint64_t burn_leaf(uint64_t rounds) {
    uint64_t x = rounds;
    for (uint64_t i = 0; i < rounds; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    return x;
}

__attribute__((noinline)) uint64_t level_three(uint64_t rounds) {
    uint64_t r = burn_leaf(rounds);
    sink = r;
    return r + 3;
}

__attribute__((noinline)) uint64_t level_two(uint64_t rounds) {
    uint64_t r = level_three(rounds);
    sink = r;
    return r + 2;
}

__attribute__((noinline)) uint64_t level_one(uint64_t rounds) {
    uint64_t r = level_two(rounds);
    sink = r;
    return r + 1;
}

int main(int argc, char **argv) {
    uint64_t rounds = argc > 1 ? strtoull(argv[1], 0, 10) : 1000000;
    for (;;) {
        sink = level_one(rounds);
    }
    return 0;
}
