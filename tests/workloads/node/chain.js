// The chain the Node tests look for: main -> settle -> reconcile ->
// accumulate, busy in accumulate, then a class method (Ledger.post) and a
// closure (tally) called from it. Run with an argument of seconds (0: until
// killed). `%NeverOptimizeFunction` is not used: the tests run it with
// `--max-opt=0` (interpreted and baseline code) and by default, where
// TurboFan would inline the short callers; `--no-turbo-inlining` keeps each
// function a frame of its own. Each level works after its call, so none
// becomes a tail call.
"use strict";

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

function main() {
  const seconds = Number(process.argv[2] || 0);
  const mode = process.argv[3] || "chain";
  const deadline = seconds > 0 ? Date.now() + seconds * 1000 : Infinity;
  const tally = makeTally(new Ledger());
  let seed = 1;
  while (Date.now() < deadline) {
    if (mode === "chain") {
      seed = settle(seed) + 1; // line: main
    } else {
      seed = tally(seed) + 1;
    }
    sink ^= seed;
  }
}

main();
