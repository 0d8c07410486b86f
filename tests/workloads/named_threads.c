/* Two named threads, each spinning in a function of its own, while the
 * main thread spins in main_spin. usage: named_threads MS */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

volatile uint64_t sink;
static uint64_t spin_ms = 400;

static uint64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#define SPIN(name)                                            \
    __attribute__((noinline)) void name(uint64_t ms) {        \
        uint64_t end = now_ms() + ms;                         \
        while (now_ms() < end) {                              \
            for (int i = 0; i < 100000; i++) sink += i;       \
        }                                                     \
    }

SPIN(alpha_spin)
SPIN(beta_spin)
SPIN(main_spin)

static void *alpha(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "alpha");
    alpha_spin(spin_ms);
    return 0;
}

static void *beta(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "beta");
    beta_spin(spin_ms);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1) spin_ms = strtoull(argv[1], 0, 10);
    pthread_t a, b;
    if (pthread_create(&a, 0, alpha, 0) || pthread_create(&b, 0, beta, 0)) return 1;
    main_spin(spin_ms);
    pthread_join(a, 0);
    pthread_join(b, 0);
    return 0;
}
