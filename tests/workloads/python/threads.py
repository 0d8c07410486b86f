"""Threads with chains of their own, so that each thread's samples can be
told apart by their functions:

    thread red:   thread_main_red > spin_red
    thread green: thread_main_green > spin_green
    thread blue:  thread_main_blue > spin_blue
    main thread:  <module> > thread_main_gold > spin_gold

usage: threads.py SECONDS   (SECONDS 0: until killed)

Prints `ready` once every thread runs.
"""

import sys
import threading
import time


def deadline_passed():
    return time.monotonic() >= deadline


def spin_red():
    total = 0
    for i in range(5000):
        total = (total * 7 + i) % 65521
    return total


def thread_main_red():
    started.release()
    while not deadline_passed():
        spin_red()


def spin_green():
    total = 0
    for i in range(5000):
        total = (total * 11 + i) % 65521
    return total


def thread_main_green():
    started.release()
    while not deadline_passed():
        spin_green()


def spin_blue():
    total = 0
    for i in range(5000):
        total = (total * 13 + i) % 65521
    return total


def thread_main_blue():
    started.release()
    while not deadline_passed():
        spin_blue()


def spin_gold():
    total = 0
    for i in range(5000):
        total = (total * 17 + i) % 65521
    return total


def thread_main_gold():
    while not deadline_passed():
        spin_gold()


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
started = threading.Semaphore(0)
workers = [
    threading.Thread(target=body, daemon=True)
    for body in (thread_main_red, thread_main_green, thread_main_blue)
]
for worker in workers:
    worker.start()
for _ in workers:
    started.acquire()
print("ready", flush=True)
thread_main_gold()
