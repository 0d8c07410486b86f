"""A known Python call chain for firn's tests and benchmark.

    <module> > stage_a > stage_b > stage_c > crunch

crunch is a pure-Python arithmetic loop, where nearly all the time goes.
The `# call:NAME` and `# begin:`/`# end:` markers let the tests find the
lines each frame must report, whatever else changes in this file.

usage: chain.py SECONDS [ROUNDS]   (SECONDS 0: until killed)

Prints `ready` once it runs, and `iterations=N seconds=S` (since it
started) on SIGUSR1 and when it ends, at the deadline or on SIGTERM: the
benchmark's measure of throughput over a window of its own.
"""

import signal
import sys
import time


def crunch(rounds):
    total = 0  # begin:crunch
    for i in range(rounds):  # loop:crunch
        total = (total * 31 + i) % 1000003  # loop:crunch
    return total  # end:crunch


def stage_c(rounds):
    return crunch(rounds)  # call:crunch


def stage_b(rounds):
    return stage_c(rounds)  # call:stage_c


def stage_a(rounds):
    return stage_b(rounds)  # call:stage_b


def report(signum=None, frame=None):
    print(
        "iterations=%d seconds=%.3f" % (iterations, time.monotonic() - started),
        flush=True,
    )


def stop(signum, frame):
    global running
    running = False


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 20000
running = True
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGUSR1, report)
started = time.monotonic()
deadline = started + seconds if seconds > 0 else float("inf")
iterations = 0
print("ready", flush=True)
while running and time.monotonic() < deadline:
    stage_a(rounds)  # call:stage_a
    iterations += 1
report()
