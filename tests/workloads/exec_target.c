/* The program fork_exec's child executes: spins in target_spin.
 * usage: exec_target MS */
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

volatile uint64_t sink;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

__attribute__((noinline)) void target_spin(uint64_t ms) {
    uint64_t end = now_ms() + ms;
    while (now_ms() < end) {
        for (int i = 0; i < 100000; i++) sink += i;
    }
}

int main(int argc, char **argv) {
    target_spin(argc > 1 ? strtoull(argv[1], 0, 10) : 300);
    return 0;
}
