/**
 * The consistent-hash ring (seed 003): placement as documented, balance, minimal movement on
 * membership and weight changes, and the `ring` policy end to end through the front door.
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { HashRing, TOKENS_PER_WEIGHT, tokenCount } from '../src/hashing/ring.js';
import { nodeSeed, unitHash } from '../src/hashing/xxh.js';
import { parseCommand } from '../src/config/config.js';
import { ConfigError } from '../src/errors.js';
import { FrontDoor, type FrontDoorConfig } from '../src/server/supervisor.js';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';
import { ranking, rpc } from './fixtures/http.js';
import { referenceXxh64 } from './fixtures/xxh64.js';

const utf8 = (s: string): Uint8Array => new TextEncoder().encode(s);
const unit = (h: bigint): number => (Number(h >> 12n) + 0.5) / 2 ** 52;

/** The README's construction, straight: every token, sorted, walked from the key. */
function referencePreference(ids: string[], weights: number[], key: string): string[] {
  const tokens: { at: number; id: string }[] = [];
  ids.forEach((id, n) => {
    const seed = referenceXxh64(utf8(id), 0n);
    const count = weights[n]! > 0 ? Math.max(1, Math.round(128 * weights[n]!)) : 0;
    for (let i = 0; i < count; i++) tokens.push({ at: unit(referenceXxh64(utf8(String(i)), seed)), id });
  });
  tokens.sort((a, b) => a.at - b.at || (a.id < b.id ? -1 : 1));
  const at = unit(referenceXxh64(utf8(key), 0n));
  const start = tokens.findIndex((t) => t.at >= at);
  const out: string[] = [];
  for (let step = 0; step < tokens.length; step++) {
    const { id } = tokens[((start < 0 ? 0 : start) + step) % tokens.length]!;
    if (!out.includes(id)) out.push(id);
  }
  return out;
}

function preference(ring: HashRing, ids: readonly string[], key: string, limit?: number): string[] {
  const out = new Int32Array(ids.length);
  const n = ring.preferenceInto(key, out, limit);
  return Array.from(out.subarray(0, n), (i) => ids[i]!);
}

const IDS = ['node-a', 'node-b', 'node-c'];
const KEYS = Array.from({ length: 6_000 }, (_, i) => `board-${i}`);

function homes(ids: string[], weights: number[]): Map<string, string> {
  const ring = new HashRing(ids, weights);
  return new Map(KEYS.map((k) => [k, preference(ring, ids, k, 1)[0]!]));
}

describe('hash ring', () => {
  it('places keys as the README says (an independent XXH64), with every node in each preference list once', () => {
    const ids = [...IDS, 'ノード'];
    const weights = [1, 0.5, 2, 1];
    const ring = new HashRing(ids, weights);
    for (const key of ['', 'board-1', 'ボード', 'x'.repeat(300), ...KEYS.slice(0, 200)]) {
      assert.deepEqual(preference(ring, ids, key), referencePreference(ids, weights, key), key);
    }
    assert.equal(unitHash(nodeSeed('node-a'), '0'), unit(referenceXxh64(utf8('0'), referenceXxh64(utf8('node-a'), 0n))));
  });

  it('gives each node of equal weight about its share of keys (128 tokens each)', () => {
    const counts = new Map<string, number>();
    for (const home of homes(IDS, [1, 1, 1]).values()) counts.set(home, (counts.get(home) ?? 0) + 1);
    for (const id of IDS) {
      const share = counts.get(id)! / KEYS.length;
      assert.ok(share > 0.25 && share < 0.42, `${id}: ${share}`);
    }
  });

  it('moves only the keys of a node that leaves, each to its next preference, and only keys to a node that joins', () => {
    const before = homes(IDS, [1, 1, 1]);
    const ring = new HashRing(IDS, [1, 1, 1]);
    const without = homes(IDS, [1, 0, 1]);
    let moved = 0;
    for (const key of KEYS) {
      if (before.get(key) === 'node-b') {
        moved++;
        assert.equal(without.get(key), preference(ring, IDS, key)[1], key);
      } else assert.equal(without.get(key), before.get(key), key);
    }
    assert.ok(moved > 0);
    const grown = homes([...IDS, 'node-d'], [1, 1, 1, 1]);
    let gained = 0;
    for (const key of KEYS) {
      if (grown.get(key) === before.get(key)) continue;
      assert.equal(grown.get(key), 'node-d', `${key} moved between old nodes`);
      gained++;
    }
    const share = gained / KEYS.length;
    assert.ok(share > 0.15 && share < 0.35, `a fourth node took ${share} of the keys`);
  });

  it("scales a node's tokens with its weight, and a weight change moves keys only to or from that node", () => {
    assert.deepEqual([0, 0.25, 1, 2].map(tokenCount), [0, 32, TOKENS_PER_WEIGHT, 2 * TOKENS_PER_WEIGHT]);
    const before = homes(IDS, [1, 1, 1]);
    const heavier = homes(IDS, [1, 1, 2]);
    let toC = 0;
    for (const key of KEYS) {
      if (heavier.get(key) === before.get(key)) continue;
      assert.equal(heavier.get(key), 'node-c', `${key} moved between the unchanged nodes`);
      toC++;
    }
    const share = [...heavier.values()].filter((h) => h === 'node-c').length / KEYS.length;
    assert.ok(toC > 0 && share > 0.4 && share < 0.6, `weight 2 of 4: ${share}`);
  });

  it('returns at most the limit, and nothing when no node has weight', () => {
    const ring = new HashRing(IDS, [1, 1, 1]);
    assert.equal(preference(ring, IDS, 'k', 2).length, 2);
    assert.deepEqual(preference(new HashRing(IDS, [0, 0, 0]), IDS, 'k'), []);
    assert.deepEqual(preference(new HashRing([], []), [], 'k'), []);
  });
});

describe('ring policy through the front door', () => {
  let nodes: FakeNode[];
  let door: FrontDoor;
  before(async () => {
    nodes = await startNodes(...IDS);
    const command = parseCommand(
      ['--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(','), '--policy', 'ring', '--port', '0', '--host', '127.0.0.1', '--threads', '2', '--health-interval-ms', '60000'],
      {},
    );
    door = await FrontDoor.start((command as { config: FrontDoorConfig }).config);
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  it('ranks and serves each board at its home on the ring, and fails over down its preference list', async () => {
    const ring = new HashRing(IDS, [1, 1, 1]);
    const boards = ['ring-1', 'ring-2', 'ring-3', 'ring-4', 'ring-5', 'ring-6'];
    const served = new Set<string>();
    for (const board of boards) {
      const expected = preference(ring, IDS, board);
      assert.deepEqual(await ranking(door.url, board), expected, board);
      const reply = await rpc(door.url, 'query.execute', board);
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['x-lakefront-served-by'], expected[0], board);
      served.add(expected[0]!);
    }
    assert.ok(served.size > 1, 'the boards are spread');
    const board = boards[0]!;
    const [home, next] = preference(ring, IDS, board);
    const homeNode = nodes.find((n) => n.id === home)!;
    homeNode.behaviour = { kind: 'answer', status: 503 };
    const reply = await rpc(door.url, 'query.execute', board);
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-served-by'], next, 'the next node on the ring');
  });

  it('is refused where it does not apply, naming the value', () => {
    assert.throws(() => parseCommand(['--nodes', 'a=http://127.0.0.1:1', '--policy', 'rings'], {}), (err: Error) => err instanceof ConfigError && /--policy: must be rendezvous or ring, got "rings"/.test(err.message));
    assert.throws(() => parseCommand(['--etcd', 'a=http://127.0.0.1:1', '--policy', 'ring'], {}), (err: Error) => err instanceof ConfigError && /--policy: applies to \/rpc\/\*/.test(err.message));
  });
});
