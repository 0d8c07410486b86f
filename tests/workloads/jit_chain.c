/* The chain workload (chain.c) with a second thread spinning in code it
 * generated itself (anonymous executable memory, as a JIT has), so that a
 * profiler looks for this process's /tmp/perf-PID.map. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "chain.c"

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

/* Started before chain.c's main, which stays the outermost frame. */
__attribute__((constructor)) static void start_jit_thread(void) {
    pthread_t thread;
    pthread_create(&thread, 0, jit_thread, 0);
}
