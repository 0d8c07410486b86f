/* Off-CPU workload.
 *
 * `offcpu waits CYCLES`: each cycle (about a second) the worker thread
 * sleeps 300 ms in nanosleep (sleep_wait), waits about 200 ms on a pipe a
 * feeder thread fills (pipe_wait), waits about 200 ms on a mutex a holder
 * thread keeps (lock_wait, a futex), and burns 300 ms of CPU (burn). It
 * prints how long each wait really took, in total, in nanoseconds.
 *
 * `offcpu pingpong SECONDS [PAUSE_US]`: two threads bounce a byte over two
 * pipes as fast as they can (or the first spins PAUSE_US before each
 * bounce, to set the rate); together they print the time they were blocked (wall
 * time minus CPU time minus time runnable on a run queue, from
 * /proc/thread-self/schedstat) and the reads they made. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static int feed_request[2], feed_data[2], hold_request[2], hold_ready[2];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
volatile uint64_t sink;

static void *feeder(void *arg) {
    char byte;
    (void)arg;
    while (read(feed_request[0], &byte, 1) == 1) {
        sleep_ms(200);
        if (write(feed_data[1], &byte, 1) != 1) break;
    }
    return 0;
}

static void *holder(void *arg) {
    char byte;
    (void)arg;
    while (read(hold_request[0], &byte, 1) == 1) {
        pthread_mutex_lock(&lock);
        if (write(hold_ready[1], &byte, 1) != 1) break;
        sleep_ms(200);
        pthread_mutex_unlock(&lock);
    }
    return 0;
}

__attribute__((noinline)) void sleep_wait(void) {
    struct timespec ts = {0, 300000000L};
    nanosleep(&ts, 0);
}

__attribute__((noinline)) void pipe_wait(void) {
    char byte;
    if (read(feed_data[0], &byte, 1) != 1) exit(1);
}

__attribute__((noinline)) void lock_wait(void) {
    pthread_mutex_lock(&lock);
    pthread_mutex_unlock(&lock);
}

__attribute__((noinline)) void burn(void) {
    uint64_t end = clock_ns(CLOCK_MONOTONIC) + 300000000ull;
    while (clock_ns(CLOCK_MONOTONIC) < end) {
        for (int i = 0; i < 10000; i++) sink += i;
    }
}

static int waits(int cycles) {
    pthread_t threads[2];
    char byte = 1;
    uint64_t sleep_ns = 0, pipe_ns = 0, lock_ns = 0;
    if (pipe(feed_request) || pipe(feed_data) || pipe(hold_request) || pipe(hold_ready)) return 1;
    pthread_create(&threads[0], 0, feeder, 0);
    pthread_create(&threads[1], 0, holder, 0);
    pthread_setname_np(threads[0], "feeder");
    pthread_setname_np(threads[1], "holder");
    for (int cycle = 0; cycle < cycles; cycle++) {
        uint64_t start = clock_ns(CLOCK_MONOTONIC);
        sleep_wait();
        sleep_ns += clock_ns(CLOCK_MONOTONIC) - start;

        if (write(feed_request[1], &byte, 1) != 1) return 1;
        start = clock_ns(CLOCK_MONOTONIC);
        pipe_wait();
        pipe_ns += clock_ns(CLOCK_MONOTONIC) - start;

        if (write(hold_request[1], &byte, 1) != 1) return 1;
        if (read(hold_ready[0], &byte, 1) != 1) return 1;
        start = clock_ns(CLOCK_MONOTONIC);
        lock_wait();
        lock_ns += clock_ns(CLOCK_MONOTONIC) - start;

        burn();
    }
    printf("sleep_wait %llu\npipe_wait %llu\nlock_wait %llu\n", (unsigned long long)sleep_ns,
           (unsigned long long)pipe_ns, (unsigned long long)lock_ns);
    fflush(stdout);
    return 0;
}

static int ping[2], pong[2];
static uint64_t pingpong_end, pause_ns;

struct bouncer {
    int in, out, first;
    uint64_t off_cpu_ns, trips;
};

/* The calling thread's time waiting on a run queue (runnable, not
 * running), from the scheduler's statistics. */
static uint64_t run_delay_ns(void) {
    unsigned long long cpu = 0, delay = 0;
    FILE *file = fopen("/proc/thread-self/schedstat", "r");
    if (!file) return 0;
    if (fscanf(file, "%llu %llu", &cpu, &delay) != 2) delay = 0;
    fclose(file);
    return delay;
}

__attribute__((noinline)) void bounce(struct bouncer *b) {
    char byte = 0;
    uint64_t delay = run_delay_ns();
    uint64_t wall = clock_ns(CLOCK_MONOTONIC), cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    if (b->first && write(b->out, &byte, 1) != 1) return;
    for (;;) {
        if (read(b->in, &byte, 1) != 1) break;
        b->trips++;
        if (byte == 1 || clock_ns(CLOCK_MONOTONIC) >= pingpong_end) {
            byte = 1;
            if (write(b->out, &byte, 1) != 1) {
            }
            break;
        }
        if (b->first && pause_ns) {
            /* Spun, not slept: the pause adds no wait of its own. */
            uint64_t until = clock_ns(CLOCK_MONOTONIC) + pause_ns;
            while (clock_ns(CLOCK_MONOTONIC) < until) {
            }
        }
        if (write(b->out, &byte, 1) != 1) break;
    }
    cpu = clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu;
    wall = clock_ns(CLOCK_MONOTONIC) - wall;
    /* Blocked: neither running nor runnable. */
    b->off_cpu_ns = wall - cpu - (run_delay_ns() - delay);
}

static void *bouncer_thread(void *arg) {
    bounce(arg);
    return 0;
}

static int pingpong(int seconds) {
    pthread_t threads[2];
    struct bouncer b[2] = {{0}, {0}};
    if (pipe(ping) || pipe(pong)) return 1;
    pingpong_end = clock_ns(CLOCK_MONOTONIC) + (uint64_t)seconds * 1000000000ull;
    b[0].in = pong[0], b[0].out = ping[1], b[0].first = 1;
    b[1].in = ping[0], b[1].out = pong[1];
    pthread_create(&threads[0], 0, bouncer_thread, &b[0]);
    pthread_create(&threads[1], 0, bouncer_thread, &b[1]);
    pthread_join(threads[0], 0);
    pthread_join(threads[1], 0);
    printf("off_cpu_ns %llu\ntrips %llu\n", (unsigned long long)(b[0].off_cpu_ns + b[1].off_cpu_ns),
           (unsigned long long)(b[0].trips + b[1].trips));
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "waits") == 0) return waits(atoi(argv[2]));
    if ((argc == 3 || argc == 4) && strcmp(argv[1], "pingpong") == 0) {
        if (argc == 4) pause_ns = strtoull(argv[3], 0, 10) * 1000;
        return pingpong(atoi(argv[2]));
    }
    fprintf(stderr, "usage: offcpu waits CYCLES | offcpu pingpong SECONDS [PAUSE_US]\n");
    return 2;
}
