"""A Python stack deeper than firn keeps: recurse calls itself 300 deep,
then calls crunch over and over at the bottom.

    <module> > recurse x 300 > crunch

usage: recursion.py SECONDS   (SECONDS 0: until killed)

Prints `ready` once at the bottom.
"""

import sys
import time

DEPTH = 300


def crunch(rounds):
    total = 0  # begin:crunch
    for i in range(rounds):
        total = (total * 31 + i) % 1000003
    return total  # end:crunch


def recurse(depth):
    if depth > 0:
        return recurse(depth - 1)  # call:recurse
    print("ready", flush=True)
    while time.monotonic() < deadline:  # loop:bottom
        crunch(20000)  # call:crunch
    return 0


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
# The default limit (1000) would do; this leaves room for the interpreter's
# own frames on any version.
sys.setrecursionlimit(DEPTH + 1000)
recurse(DEPTH)
