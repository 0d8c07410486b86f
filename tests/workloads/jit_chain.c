/* The chain workload with a second thread spinning in code it generated
 * itself (anonymous executable memory, as a JIT has), so that a profiler
 * looks for this process's /tmp/perf-PID.map. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

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

static void *jit_thread(void *unused) {
    (void)unused;
    /* jmp . (spins forever) */
    static const unsigned char spin[] = {0xeb, 0xfe};
    void *code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED) {
        perror("mmap");
        return 0;
    }
    memcpy(code, spin, sizeof spin);
    ((void (*)(void))code)();
    return 0;
}

int main(void) {
    pthread_t thread;
    pthread_create(&thread, 0, jit_thread, 0);
    for (;;) {
        sink = level_one(100000);
    }
    return 0;
}
