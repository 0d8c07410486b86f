/* The agent bench's deep-stack workload: main > descend x DEPTH > burn, no
 * frame pointers (built -O2 -fomit-frame-pointer -g), each descend frame
 * holding FRAME_BYTES of locals whose address its callee gets, so no call
 * becomes a jump or a loop. Prints the bytes of stack between main's frame
 * and burn's, then spins in burn until SECONDS have passed.
 * usage: deep DEPTH SECONDS */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define FRAME_BYTES 384

static volatile sig_atomic_t stop;
static uintptr_t top;
volatile uint64_t sink;

static void on_alarm(int signal) {
    (void)signal;
    stop = 1;
}

__attribute__((noinline)) static uint64_t burn(volatile unsigned char *parent) {
    unsigned char here;
    printf("stack_bytes=%lu\n", (unsigned long)(top - (uintptr_t)&here));
    fflush(stdout);
    uint64_t x = parent[0];
    while (!stop) {
        for (int i = 0; i < 100000; i++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        sink = x;
    }
    return x;
}

__attribute__((noinline)) static uint64_t descend(int depth, volatile unsigned char *parent) {
    volatile unsigned char frame[FRAME_BYTES];
    frame[0] = (unsigned char)(parent[0] + 1);
    frame[FRAME_BYTES - 1] = (unsigned char)depth;
    uint64_t r = depth <= 1 ? burn(frame) : descend(depth - 1, frame);
    return r + frame[FRAME_BYTES - 1] + frame[0];
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: deep DEPTH SECONDS\n");
        return 2;
    }
    int depth = atoi(argv[1]);
    if (depth < 1 || depth > 100000) depth = 1;
    volatile unsigned char root[1] = {0};
    top = (uintptr_t)root;
    signal(SIGALRM, on_alarm);
    alarm((unsigned)atoi(argv[2]));
    sink = descend(depth, root);
    return 0;
}
