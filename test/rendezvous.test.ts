import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { RendezvousRanker, uniformBefore } from '../src/hashing/rendezvous.js';
import { SeededUnits, batchedUnits, nodeSeed } from '../src/hashing/xxh.js';
import { WEIGHT_LEVELS, quantiseWeight, rank, score, type NodeInfo } from '../src/router/index.js';
import { referenceXxh64 } from './fixtures/xxh64.js';

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);
function referenceScore(node: NodeInfo, board: string): number {
  const seed = referenceXxh64(utf8(node.id), 0n);
  const h = referenceXxh64(utf8(board), seed);
  const u = (Number(h >> 12n) + 0.5) / 2 ** 52;
  return -node.weight / Math.log(u);
}

const node = (id: string, weight = 1): NodeInfo => ({ id, url: `http://${id}.invalid`, weight });
const boards = (count: number, prefix = 'board-'): string[] => Array.from({ length: count }, (_, i) => `${prefix}${i}`);

describe('score', () => {
  it('matches an independent XXH64 implementation of the documented inputs', () => {
    const nodes = [node('node-a'), node('node-b', 2), node('ünïcødé-node', 0.5), node('n'.repeat(40), 1.5)];
    // Short, exactly-32, long and multi-byte boards exercise every branch of XXH64.
    const inputs = ['b', 'board-1', 'x'.repeat(32), 'long-board-id-'.repeat(5), 'ボード-7'];
    for (const n of nodes) {
      for (const b of inputs) assert.equal(score(n, b), referenceScore(n, b), `${n.id} / ${b}`);
    }
  });

  it('scores weight <= 0 as -Infinity', () => {
    assert.equal(score(node('a', 0), 'b'), -Infinity);
    assert.equal(score(node('a', -1), 'b'), -Infinity);
  });
});

describe('quantiseWeight', () => {
  const cases: [number, number][] = [
    [-3, 0], [0, 0], [Number.NaN, 0], [0.01, 0.25], [0.25, 0.25], [0.37, 0.25], [0.375, 0.5], [0.6, 0.5],
    [0.8, 1], [1, 1], [1.2, 1], [1.25, 1.5], [1.6, 1.5], [1.8, 2], [2, 2], [7, 2],
  ];
  for (const [raw, want] of cases) {
    it(`snaps ${raw} to ${want}`, () => assert.equal(quantiseWeight(raw), want));
  }
  it('only ever returns 0 or a level', () => {
    for (let raw = -1; raw < 4; raw += 0.013) {
      const q = quantiseWeight(raw);
      assert.ok(q === 0 || WEIGHT_LEVELS.includes(q), `${raw} -> ${q}`);
    }
  });
});

describe('rank', () => {
  it('selects each node in proportion to its weight (chi-square, 40,000 boards)', () => {
    const nodes = [node('a', 1), node('b', 2), node('c', 0.5), node('d', 1.5), node('e', 0.25)];
    const total = nodes.reduce((s, n) => s + n.weight, 0);
    const counts = new Map<string, number>();
    const all = boards(40_000);
    for (const b of all) {
      const head = rank(nodes, b)[0]!.id;
      counts.set(head, (counts.get(head) ?? 0) + 1);
    }
    let chi = 0;
    for (const n of nodes) {
      const expected = (all.length * n.weight) / total;
      const got = counts.get(n.id) ?? 0;
      chi += (got - expected) ** 2 / expected;
    }
    // 4 degrees of freedom: P(chi2 > 18.47) = 0.001. The hash is fixed, so this cannot flake.
    assert.ok(chi < 18.47, `chi-square ${chi.toFixed(2)} with counts ${JSON.stringify([...counts])}`);
  });

  it('moves only the boards native to a departed node, spread over the survivors', () => {
    const nodes = ['a', 'b', 'c', 'd', 'e'].map((id) => node(id));
    const survivors = nodes.filter((n) => n.id !== 'c');
    const moved = new Map<string, number>();
    let native = 0;
    for (const b of boards(20_000)) {
      const before = rank(nodes, b)[0]!.id;
      const after = rank(survivors, b)[0]!.id;
      if (before !== 'c') {
        assert.equal(after, before, `board ${b} moved although its node stayed`);
      } else {
        native++;
        moved.set(after, (moved.get(after) ?? 0) + 1);
        // It lands on its own runner-up: the order every router already agreed on.
        assert.equal(after, rank(nodes, b)[1]!.id);
      }
    }
    assert.ok(native > 3000, `expected about a fifth of the boards native to c, got ${native}`);
    assert.equal(moved.size, 4, 'every survivor takes some of the departed node\'s boards');
    for (const [id, count] of moved) {
      assert.ok(count > native / 4 / 1.5 && count < (native / 4) * 1.5, `${id} took ${count} of ${native}`);
    }
  });

  it('weight 0 removes a node without changing anyone else\'s order', () => {
    const full = ['a', 'b', 'c', 'd'].map((id) => node(id));
    const zeroed = full.map((n) => (n.id === 'b' ? node('b', 0) : n));
    for (const b of boards(2_000)) {
      const withoutB = rank(full, b).filter((n) => n.id !== 'b').map((n) => n.id);
      assert.deepEqual(rank(zeroed, b).map((n) => n.id), withoutB);
    }
  });

  it('returns every eligible node exactly once, best first', () => {
    const nodes = [node('a'), node('b', 0), node('c', 2), node('d', 0.5)];
    for (const b of boards(500)) {
      const ranking = rank(nodes, b);
      assert.deepEqual(ranking.map((n) => n.id).sort(), ['a', 'c', 'd']);
      for (let i = 1; i < ranking.length; i++) assert.ok(score(ranking[i - 1]!, b) >= score(ranking[i]!, b));
    }
  });

  it('breaks score ties by id', () => {
    // Infinite weights score +Infinity for every board: only the tie-break can order them.
    const tied = [node('c', Infinity), node('a', Infinity), node('b', Infinity), node('z', 1)];
    for (const b of boards(50)) assert.deepEqual(rank(tied, b).map((n) => n.id), ['a', 'b', 'c', 'z']);
  });
});

describe('SeededUnits (every node\'s u for a board, in one wasm call)', () => {
  it('runs batched here: xxhash-wasm\'s own module loaded and agreed with h64', () => {
    assert.equal(batchedUnits, true);
  });

  for (const batched of [true, false]) {
    it(`gives the documented u for every seed, against the independent XXH64 (${batched ? 'one wasm call' : 'the unitHash fallback'})`, () => {
      const ids = ['node-a', 'node-b', 'ünïcødé-node', 'n'.repeat(40)];
      const units = new SeededUnits(ids.map((id) => nodeSeed(id)), batched);
      // ASCII, multi-byte, empty, exactly 32 bytes, and long enough to grow the wasm memory
      // (64 KiB) several times over.
      const inputs = [...boards(200), 'ボード-7', 'ü', '', 'x'.repeat(32), 'y'.repeat(100_000), 'é'.repeat(40_000), 'b'];
      for (const b of inputs) {
        const got = Array.from(units.of(b));
        const want = ids.map((id) => (Number(referenceXxh64(utf8(b), referenceXxh64(utf8(id), 0n)) >> 12n) + 0.5) / 2 ** 52);
        assert.deepEqual(got, want, b.slice(0, 20));
      }
    });
  }

  it('keeps rankers apart: each holds its own seeds', () => {
    const first = new SeededUnits([nodeSeed('a'), nodeSeed('b')]);
    const second = new SeededUnits([nodeSeed('c')]);
    const a = Array.from(first.of('board-1'));
    second.of('board-1');
    assert.deepEqual(Array.from(first.of('board-1')), a);
    assert.notEqual(second.of('board-1')[0], a[0]);
  });
});

describe('RendezvousRanker (the hot-path form)', () => {
  it('agrees with rank() on every board', () => {
    const nodes = [node('a', 1), node('b', 0), node('c', 2), node('d', 0.5), node('e', 1.5)];
    const ranker = new RendezvousRanker(nodes.map((n) => n.id), nodes.map((n) => n.weight));
    const out = new Int32Array(nodes.length);
    assert.equal(ranker.eligible, 4);
    // ASCII, multi-byte, and longer than the ASCII fast path's 1,024 characters.
    const extra = ['ボード-7', 'ü', `${'x'.repeat(1_024)}`, `${'y'.repeat(1_025)}`, `${'é'.repeat(2_000)}`, 'b', ''];
    for (const b of [...boards(3_000), ...extra]) {
      const count = ranker.rankInto(b, out);
      assert.deepEqual(Array.from(out.subarray(0, count), (i) => nodes[i]!.id), rank(nodes, b).map((n) => n.id));
    }
  });

  it('agrees with rank() when every node has one weight (ranked by unit, no logarithm a node)', () => {
    // Sixteen nodes at one band, with two out (weight 0), ids not in lexical order; each band.
    for (const w of WEIGHT_LEVELS) {
      const nodes = Array.from({ length: 16 }, (_, i) => node(`n-${(i * 7) % 16}-${String.fromCharCode(122 - i)}`, i === 3 || i === 11 ? 0 : w));
      const ranker = new RendezvousRanker(nodes.map((n) => n.id), nodes.map((n) => n.weight));
      const out = new Int32Array(nodes.length);
      for (const b of boards(2_000, `w${w}-`)) {
        const count = ranker.rankInto(b, out);
        assert.deepEqual(Array.from(out.subarray(0, count), (i) => nodes[i]!.id), rank(nodes, b).map((n) => n.id), `weight ${w}, ${b}`);
      }
    }
  });

  it('agrees with rank() at one weight so large or small that the scores tie at Infinity or lose precision', () => {
    // helper-69's reproducers: ids a and b at 1e308 (board b31) and at 5e-324 (board b2).
    for (const w of [1e308, 1e306, 5e-324, 1e-320]) {
      const nodes = [node('a', w), node('b', w), node('c', w)];
      const ranker = new RendezvousRanker(nodes.map((n) => n.id), nodes.map((n) => n.weight));
      const out = new Int32Array(nodes.length);
      for (const b of boards(500, 'b')) {
        const count = ranker.rankInto(b, out);
        assert.deepEqual(Array.from(out.subarray(0, count), (i) => nodes[i]!.id), rank(nodes, b).map((n) => n.id), `weight ${w}, ${b}`);
      }
    }
  });

  it('orders two units of one weight as their scores do, also units too close for the shortcut', () => {
    // The comparator rank() applies: best score first, ties by lexical position.
    const byScore = (pu: number, po: number, u: number, o: number, w: number): boolean => {
      const ps = -w / Math.log(pu);
      const s = -w / Math.log(u);
      return ps > s || (ps === s && po < o);
    };
    let seed = 3;
    const random = (): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) + 0.5) / 2 ** 31;
    const pairs: [number, number][] = [];
    for (let i = 0; i < 20_000; i++) {
      const u = random();
      // Far apart, a relative 1e-9 either side (at the shortcut's edge), a few units in the last
      // place apart (where the scores may round to one value), and equal.
      const nextUp = u + u * Number.EPSILON;
      pairs.push([u, random()], [u, u * (1 + 1.01e-9)], [u, u * (1 - 0.99e-9)], [u, nextUp], [nextUp, u], [u, u]);
    }
    let rounded = 0;
    for (const w of [0.25, 1, 2]) {
      for (const [a, b] of pairs) {
        for (const [po, o] of [[0, 1], [1, 0]] as const) {
          assert.equal(uniformBefore(a, po, b, o, w), byScore(a, po, b, o, w), `w ${w}, ${a} (${po}) against ${b} (${o})`);
        }
        if (a !== b && -w / Math.log(a) === -w / Math.log(b)) rounded++;
      }
    }
    assert.ok(rounded > 0, 'some distinct units round to one score: the case the shortcut must leave to the scores');
  });

  it('breaks ties by lexical id order', () => {
    const ids = ['c', 'a', 'b', 'z'];
    const ranker = new RendezvousRanker(ids, [Infinity, Infinity, Infinity, 1]);
    const out = new Int32Array(ids.length);
    for (const b of boards(50)) {
      const count = ranker.rankInto(b, out);
      assert.deepEqual(Array.from(out.subarray(0, count), (i) => ids[i]), ['a', 'b', 'c', 'z']);
    }
  });
});
