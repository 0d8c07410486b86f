/* Benchmark workload: keeps every CPU busy for a fixed time and reports how
 * much work it got done, so a profiler's cost shows as lost throughput.
 * usage: busy SECONDS [THREADS]   (THREADS defaults to the CPU count) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static atomic_int stop;

__attribute__((noinline)) static uint64_t mix(uint64_t x) {
    for (int i = 0; i < 64; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return x;
}

__attribute__((noinline)) static uint64_t unit_of_work(uint64_t x) {
    return mix(x) ^ mix(x + 1);
}

static void *worker(void *arg) {
    uint64_t *done = arg, x = (uint64_t)(uintptr_t)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        for (int i = 0; i < 1024; i++) x = unit_of_work(x);
        *done += 1024;
    }
    __asm__ volatile("" : : "r"(x));
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: busy SECONDS [THREADS]\n");
        return 2;
    }
    int seconds = atoi(argv[1]);
    long threads = argc > 2 ? atol(argv[2]) : sysconf(_SC_NPROCESSORS_ONLN);
    if (threads < 1 || threads > 1024) threads = 1;
    pthread_t *ids = calloc(threads, sizeof *ids);
    uint64_t *done = calloc(threads, 64); /* one cache line each */
    for (long t = 0; t < threads; t++) pthread_create(&ids[t], 0, worker, &done[t * 8]);
    sleep(seconds);
    atomic_store(&stop, 1);
    uint64_t total = 0;
    for (long t = 0; t < threads; t++) {
        pthread_join(ids[t], 0);
        total += done[t * 8];
    }
    printf("%llu\n", (unsigned long long)total);
    return 0;
}
