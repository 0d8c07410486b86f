/* JIT-like code for the hostile-files scenario of `cargo xtask soak`: spins
 * in anonymous executable memory, where firn looks for /tmp/perf-PID.map. */
#include <string.h>
#include <sys/mman.h>

int main(void) {
    static const unsigned char spin[] = {0xeb, 0xfe}; /* jmp . */
    void *code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED)
        return 1;
    memcpy(code, spin, sizeof spin);
    ((void (*)(void))code)();
    return 0;
}
