/* Spends about half its time in a signal handler that interrupted
 * main > level_one > spin_loop: the handler's samples unwind through the
 * kernel's signal frame (glibc's __restore_rt) into the interrupted code.
 * Built without frame pointers by the unwinding tests. */
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/time.h>

volatile uint64_t sink;

__attribute__((noinline)) void handler_burn(void) {
    for (int i = 0; i < 2000000; i++) sink = sink * 6364136223846793005ULL + 1;
}

__attribute__((noinline)) void on_alarm(int sig) {
    (void)sig;
    handler_burn();
    sink += 1;
}

__attribute__((noinline)) void spin_loop(void) {
    for (;;) sink += 1;
}

__attribute__((noinline)) void level_one(void) {
    spin_loop();
    sink += 1;
}

int main(void) {
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_handler = on_alarm;
    sigaction(SIGALRM, &action, 0);
    struct itimerval every = {{0, 4000}, {0, 4000}};
    setitimer(ITIMER_REAL, &every, 0);
    level_one();
    return 0;
}
