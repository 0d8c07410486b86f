// Recurses DEPTH frames (argv[1], default 100) of about half a KiB each,
// then spins at the bottom, forever: stacks far deeper than a 16 KiB copy,
// within the kernel's 127 frames. Built without frame pointers.
#include <stdlib.h>

static volatile unsigned long sink;

__attribute__((noinline)) static unsigned long spin_at_bottom(unsigned long x) {
    for (int i = 0; i < 2000000; i++) {
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    }
    return x;
}

__attribute__((noinline)) unsigned long descend(int depth, unsigned long seed) {
    // A frame of realistic size, used after the call so it is no tail call.
    volatile char locals[448];
    locals[0] = (char)seed;
    locals[sizeof locals - 1] = (char)depth;
    unsigned long below = depth == 0 ? spin_at_bottom(seed) : descend(depth - 1, seed + 1);
    return below + locals[0] + locals[sizeof locals - 1];
}

int main(int argc, char **argv) {
    int depth = argc > 1 ? atoi(argv[1]) : 100;
    for (;;) {
        sink = descend(depth, sink);
    }
}
