// The chain the Node tests look for: main -> settle -> reconcile ->
// accumulate, busy in accumulate; modes: `chain`, `method` (a closure,
// tally, calling a class method, Ledger.post), `zlib` (compress calling
// zlib.deflateSync), `worker` (the chain, and a worker thread in spin),
// `async` (pump, an async function resumed after each await, calling
// accumulate), `inline` (mix calling blend, which TurboFan inlines into
// it; the tests run it with `--no-use-osr` so that main stays unoptimized
// and mix is not inlined into main in turn),
// `bench` (the chain, its progress on stdout every 100 ms for `cargo xtask
// bench --node`: iterations so far and CLOCK_MONOTONIC in microseconds, the
// clock V8's profiler stamps its samples with; it returns once the file
// FIRN_BENCH_STOP names exists, so that `--cpu-prof` writes its profile).
// Run with arguments seconds (0: until killed) and mode. The tests run it
// with `--max-opt=0` (interpreted and baseline code) and optimized, where
// TurboFan would inline the short callers: `--no-turbo-inlining` keeps each
// function a frame of its own. Each level works after its call, so none
// becomes a tail call.
"use strict";

const fs = require("fs");
const zlib = require("zlib");
const { Worker, isMainThread } = require("worker_threads");

let sink = 0;

function accumulate(seed) {
  let total = seed;
  for (let i = 0; i < 20000; i++) {
    total = (total * 31 + i) % 1000003; // line: accumulate
  }
  return total;
}

function reconcile(seed) {
  let total = 0;
  for (let i = 0; i < 4; i++) {
    total += accumulate(seed + i); // line: reconcile
  }
  sink ^= total;
  return total;
}

function settle(seed) {
  let total = 0;
  for (let i = 0; i < 4; i++) {
    total ^= reconcile(seed * 7 + i); // line: settle
  }
  sink ^= total;
  return total;
}

class Ledger {
  constructor() {
    this.balance = 0;
  }

  post(seed) {
    const r = accumulate(seed); // line: post
    this.balance ^= r;
    return r;
  }
}

function makeTally(ledger) {
  return function tally(seed) {
    const r = ledger.post(seed); // line: tally
    sink ^= r;
    return r;
  };
}

// A JavaScript function calling into C++ in a loop: zlib's deflate runs
// above it.
function compress(data) {
  let length = 0;
  for (let i = 0; i < 8; i++) {
    length += zlib.deflateSync(data, { level: 9 }).length; // line: compress
  }
  return length;
}

// A small function TurboFan inlines into its caller, doing its caller's
// work.
function blend(seed) {
  let total = seed;
  for (let i = 0; i < 64; i++) {
    total = (total * 31 + i) % 1000003; // line: blend
  }
  return total;
}

function mix(seed) {
  let total = 0;
  for (let i = 0; i < 300; i++) {
    total ^= blend(seed + i); // line: mix
  }
  sink ^= total;
  return total;
}

// An async function resumed after each await: from its second round on it
// runs from the microtask queue, main long returned.
async function pump(deadline) {
  let seed = 1;
  while (Date.now() < deadline) {
    await null;
    seed = accumulate(seed) + 1; // line: pump
    sink ^= seed;
  }
}

// A worker thread running the chain of its own.
function spin(seed) {
  let total = seed;
  for (;;) {
    total ^= accumulate(total + 1); // line: spin
  }
}

function main() {
  const seconds = Number(process.argv[2] || 0);
  const mode = process.argv[3] || "chain";
  const deadline = seconds > 0 ? Date.now() + seconds * 1000 : Infinity;
  const tally = makeTally(new Ledger());
  const data = Buffer.alloc(1 << 16, "firn profiles node ");
  if (mode === "worker") {
    new Worker(__filename, { argv: [String(seconds), "spin"] });
  }
  if (mode === "async") {
    pump(deadline);
    return;
  }
  let seed = 1;
  let iterations = 0;
  let reported = 0n;
  const stop = process.env.FIRN_BENCH_STOP;
  while (Date.now() < deadline) {
    if (mode === "bench") {
      iterations++;
      const now = process.hrtime.bigint();
      if (now - reported >= 100000000n) {
        reported = now;
        process.stdout.write(`progress iterations=${iterations} clock_us=${now / 1000n}\n`);
        if (stop && fs.existsSync(stop)) {
          return;
        }
      }
    }
    if (mode === "chain" || mode === "worker" || mode === "bench") {
      seed = settle(seed) + 1; // line: main
    } else if (mode === "inline") {
      seed = mix(seed) + 1;
    } else if (mode === "zlib") {
      seed = compress(data) + 1;
    } else {
      seed = tally(seed) + 1;
    }
    sink ^= seed;
  }
}

if (isMainThread) {
  main();
} else {
  spin(1);
}
