// The chain main > levelOne > levelTwo > levelThree > burnLeaf in
// JavaScript, for the captured samples the unwinder's tests replay
// (fixtures/README.md). Run it with
// `node --perf-basic-prof --no-turbo-inlining node_chain.js [ROUNDS]`: with
// few rounds of burnLeaf per call (1000 by default), every level is called
// often enough for V8 to compile it to machine code of its own (no
// inlining), named in /tmp/perf-PID.map. Each level works after its call so
// none becomes a tail call.
"use strict";

let sink = 0;

function burnLeaf(rounds) {
  let x = rounds;
  for (let i = 0; i < rounds; i++) {
    x = (x * 31 + i) % 1000003;
  }
  return x;
}

function levelThree(rounds) {
  const r = burnLeaf(rounds);
  sink ^= r;
  return r + 3;
}

function levelTwo(rounds) {
  const r = levelThree(rounds);
  sink ^= r;
  return r + 2;
}

function levelOne(rounds) {
  const r = levelTwo(rounds);
  sink ^= r;
  return r + 1;
}

function main() {
  const rounds = Number(process.argv[2] || 1000);
  for (;;) {
    sink ^= levelOne(rounds);
  }
}

main();
