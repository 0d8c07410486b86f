"""A Python function calling into a C extension: compress_loop calls
zlib.compress on 64 KiB at a time. zlib releases the GIL while it
compresses, and a second thread (spin_python, pure Python) takes it
meanwhile: a profiler that finds a thread's Python stack through the GIL
holder would miss compress_loop, or name spin_python instead.

    main thread:   <module> > compress_loop > zlib.compress (native)
    second thread: spin_python_main > spin_python

usage: extension.py SECONDS   (SECONDS 0: until killed)

Prints `ready` once both threads run.
"""

import random
import sys
import threading
import time
import zlib


def spin_python():
    total = 0
    for i in range(5000):
        total = (total * 7 + i) % 65521
    return total


def spin_python_main():
    started.release()
    while time.monotonic() < deadline:
        spin_python()


def compress_loop(data):
    while time.monotonic() < deadline:
        zlib.compress(data, 6)  # call:compress


# Hand the GIL over sooner than the default 5 ms, so that compress_loop
# gets it back soon after each call and spends its time compressing.
sys.setswitchinterval(0.0005)
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
# Compressible but not trivially: deflate does real work on every block.
generator = random.Random(12)
words = [bytes(generator.choice(b"abcdefgh") for _ in range(6)) for _ in range(400)]
data = b" ".join(generator.choice(words) for _ in range(10000))[: 64 * 1024]
started = threading.Semaphore(0)
threading.Thread(target=spin_python_main, daemon=True).start()
started.acquire()
print("ready", flush=True)
compress_loop(data)
