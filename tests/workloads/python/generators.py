"""Generators and coroutines doing CPU work, each with a name of its own:

    generator_pipeline > square_numbers > produce_numbers  (generators)
    generator_pipeline > <genexpr>
    worker_alpha > async_stage > async_crunch              (coroutines)
    worker_beta > async_numbers                            (async generator)
    worker_beta > generator_pipeline > ...

both workers run as asyncio tasks on one event loop, awaiting each other's
turns.

usage: generators.py SECONDS   (SECONDS 0: until killed)

Prints `ready` once the event loop runs.
"""

import asyncio
import sys
import time


def produce_numbers(count):
    for i in range(count):
        yield (i * 2654435761) % 1000003


def square_numbers(numbers):
    for number in numbers:
        yield number * number % 1000003


def generator_pipeline():
    squares = sum(square_numbers(produce_numbers(5000)))
    odd = sum(number for number in produce_numbers(5000) if number % 2)
    return squares + odd


async def async_crunch(rounds):
    total = 0
    for i in range(rounds):
        total = (total * 31 + i) % 1000003
    return total


async def async_stage(rounds):
    return await async_crunch(rounds)


async def async_numbers(count):
    for i in range(count):
        if i % 1000 == 0:
            await asyncio.sleep(0)
        yield (i * 40503) % 65521


async def worker_alpha():
    while time.monotonic() < deadline:
        await async_stage(5000)
        await asyncio.sleep(0)


async def worker_beta():
    while time.monotonic() < deadline:
        total = 0
        async for number in async_numbers(5000):
            total += number
        generator_pipeline()
        await asyncio.sleep(0)


async def main():
    print("ready", flush=True)
    await asyncio.gather(worker_alpha(), worker_beta())


seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.0
deadline = time.monotonic() + seconds if seconds > 0 else float("inf")
asyncio.run(main())
