/* Exec churn for `cargo xtask soak`: `churn RATE SECONDS PROGRAM [ARG]...`
 * starts PROGRAM RATE times a second (posix_spawn, paced against the clock)
 * for SECONDS, reaps every child, and prints what it achieved:
 * `execs=N seconds=S rate=R`. */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

extern char **environ;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: churn RATE SECONDS PROGRAM [ARG]...\n");
        return 2;
    }
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    double start = now();
    unsigned long execs = 0, failed = 0;
    for (;;) {
        double elapsed = now() - start;
        if (elapsed >= seconds)
            break;
        double due = execs / rate;
        if (due > elapsed) {
            double wait = due - elapsed;
            struct timespec t = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
            nanosleep(&t, 0);
            continue;
        }
        pid_t pid;
        if (posix_spawn(&pid, argv[3], 0, 0, argv + 3, environ) == 0)
            execs++;
        else
            failed++;
        while (waitpid(-1, 0, WNOHANG) > 0) {
        }
    }
    while (wait(0) > 0) {
    }
    double elapsed = now() - start;
    printf("execs=%lu failed=%lu seconds=%.1f rate=%.1f\n", execs, failed, elapsed,
           execs / elapsed);
    return 0;
}
