/* firn record -- CMD: a parent that forks a child which executes a second
 * program, each spinning in a function of its own for a short while.
 * usage: fork_exec MS SECOND_PROGRAM   (exits 3 once the child is done;
 * a child that failed makes it exit 1) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

volatile uint64_t sink;

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

SPIN(parent_spin)
SPIN(child_spin)

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fork_exec MS SECOND_PROGRAM\n");
        return 2;
    }
    uint64_t ms = strtoull(argv[1], 0, 10);
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    if (child == 0) {
        child_spin(ms);
        execl(argv[2], argv[2], argv[1], (char *)0);
        perror("execl");
        _exit(1);
    }
    parent_spin(ms);
    int status = 0;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "the child failed\n");
        return 1;
    }
    return 3;
}
