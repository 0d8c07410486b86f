/* The chain main > level_one > level_two > level_three > burn_leaf for the
 * unwinding tests, meant to be built without frame pointers
 * (-O2 -fomit-frame-pointer -g). mix_step is inlined into burn_leaf.
 * level_two's frame is larger than the small stack copy taken for leaf
 * repair, so only a real stack copy unwinds past it.
 *
 * usage: chain_inline [ROUNDS]                   spin in the chain forever
 *        chain_inline ROUNDS SECONDS [THREADS]   benchmark: THREADS threads
 *            (default: one per CPU) run worker > level_one > ... for
 *            SECONDS (a decimal number), then the total number of chain
 *            calls is printed */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

volatile uint64_t sink;
static atomic_int stop;
static uint64_t rounds = 100000;

static inline __attribute__((always_inline)) uint64_t mix_step(uint64_t x) {
    return x * 6364136223846793005ULL + 1442695040888963407ULL;
}

__attribute__((noinline)) uint64_t burn_leaf(uint64_t n) {
    uint64_t x = n;
    for (uint64_t i = 0; i < n; i++) {
        x = mix_step(x);
    }
    return x;
}

/* Each level does work after its call so it cannot become a tail call. */
__attribute__((noinline)) uint64_t level_three(uint64_t n) {
    uint64_t r = burn_leaf(n);
    sink = r;
    return r + 3;
}

__attribute__((noinline)) uint64_t level_two(uint64_t n) {
    volatile unsigned char pad[3000];
    pad[n % sizeof pad] = 1;
    uint64_t r = level_three(n);
    sink = r + pad[(n >> 3) % sizeof pad];
    return r + 2;
}

__attribute__((noinline)) uint64_t level_one(uint64_t n) {
    uint64_t r = level_two(n);
    sink = r;
    return r + 1;
}

__attribute__((noinline)) void *worker(void *arg) {
    uint64_t *done = arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        sink = level_one(rounds);
        *done += 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) rounds = strtoull(argv[1], 0, 10);
    if (argc < 3) {
        for (;;) {
            sink = level_one(rounds);
        }
    }
    double seconds = atof(argv[2]);
    long threads = argc > 3 ? atol(argv[3]) : sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1 || threads > 1024) threads = 1;
    pthread_t *ids = calloc(threads, sizeof *ids);
    uint64_t *done = calloc(threads, 64); /* one cache line each */
    for (long t = 0; t < threads; t++) pthread_create(&ids[t], 0, worker, &done[t * 8]);
    usleep((useconds_t)(seconds * 1e6));
    atomic_store(&stop, 1);
    uint64_t total = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(ids[t], 0);
        total += done[t * 8];
    }
    printf("%llu\n", (unsigned long long)total);
    return 0;
}
