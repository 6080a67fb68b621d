/**
 * Ranking cost: the consistent-hash ring against weighted rendezvous hashing, one thread, no I/O.
 *
 *   node dist/bench/ring.js [--rounds 1000000]
 *
 * Nanoseconds a full ranking (every routable node, best first) for 3 and 64 nodes of weight 1,
 * over 5,000 boards in turn; median of five timed passes after a warm-up pass.
 */
import { parseArgs } from 'node:util';
import { HashRing } from '../src/hashing/ring.js';
import { RendezvousRanker } from '../src/hashing/rendezvous.js';
import { median } from './lib/report.js';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '1000000' } } });
const rounds = Number(values.rounds);
const boards = Array.from({ length: 5_000 }, (_, i) => `board-${i}`);

function time(rank: (board: string, out: Int32Array) => number, size: number, n: number): number {
  const out = new Int32Array(size);
  const passes: number[] = [];
  for (let pass = 0; pass < 6; pass++) {
    const started = process.hrtime.bigint();
    for (let i = 0; i < n; i++) rank(boards[i % boards.length]!, out);
    if (pass > 0) passes.push(Number(process.hrtime.bigint() - started) / n);
  }
  return median(passes);
}

for (const size of [3, 64]) {
  const ids = Array.from({ length: size }, (_, i) => `node-${i}`);
  const weights = new Array<number>(size).fill(1);
  const ring = new HashRing(ids, weights);
  const rendezvous = new RendezvousRanker(ids, weights);
  const n = size > 8 ? Math.ceil(rounds / 5) : rounds;
  const r = time((b, out) => ring.preferenceInto(b, out), size, n);
  const h = time((b, out) => rendezvous.rankInto(b, out), size, n);
  process.stdout.write(`${size} nodes: ring ${r.toFixed(0)} ns, rendezvous ${h.toFixed(0)} ns a full ranking\n`);
}
