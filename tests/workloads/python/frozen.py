"""A short-lived Python process for firn's tests: it spends SECONDS of its
own CPU time (0.2 by default) in

    <module> > spin > posixpath.join

and exits. `posixpath` is one of the modules the interpreter freezes into
itself: in 3.11 and 3.12 `join`'s code object is a static object in the
interpreter's data, at the same place in every process of that file.

usage: frozen.py [SECONDS]
"""

import posixpath
import sys
import time


def spin(until):
    while time.thread_time() < until:
        for _ in range(200):
            posixpath.join("a", "b", "c")  # call:join


spin(time.thread_time() + (float(sys.argv[1]) if len(sys.argv) > 1 else 0.2))
