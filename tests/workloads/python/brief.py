"""A short-lived Python process for firn's tests: it spends SECONDS of its
own CPU time (0.05 by default) in

    <module> > outer > middle > leaf

and exits. Nothing is imported beyond built-in modules, so that the
interpreter's start-up is all that runs outside that chain.

usage: brief.py [SECONDS]
"""

import sys
import time


def leaf(until):
    total = 0
    while time.thread_time() < until:
        for i in range(200):
            total = (total * 31 + i) % 1000003
    return total


def middle(until):
    return leaf(until)


def outer(until):
    return middle(until)


outer(time.thread_time() + (float(sys.argv[1]) if len(sys.argv) > 1 else 0.05))
