"""Methods and nested functions, whose qualified names (CPython 3.11+
`co_qualname`) differ from their plain names (`co_name`):

    <module> > Pipeline.run > Pipeline.step > Pipeline.compute
    Pipeline.step > Pipeline.Stage.process > make_kernel.<locals>.kernel

usage: methods.py SECONDS   (SECONDS 0: until killed)

Prints `ready` once it runs.
"""

import sys
import time


def make_kernel(factor):
    def kernel(rounds):
        total = 0
        for i in range(rounds):
            total = (total * factor + i) % 1000003
        return total

    return kernel


class Pipeline:
    class Stage:
        def __init__(self, factor):
            self.kernel = make_kernel(factor)

        def process(self, rounds):
            return self.kernel(rounds)

    def __init__(self):
        self.stage = Pipeline.Stage(37)

    @staticmethod
    def compute(rounds):
        total = 0
        for i in range(rounds):
            total = (total * 31 + i) % 1000003
        return total

    def step(self, rounds):
        return Pipeline.compute(rounds) + self.stage.process(rounds)

    @classmethod
    def run(cls, deadline):
        pipeline = cls()
        while time.monotonic() < deadline:
            pipeline.step(10000)


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
print("ready", flush=True)
Pipeline.run(time.monotonic() + seconds if seconds > 0 else float("inf"))
