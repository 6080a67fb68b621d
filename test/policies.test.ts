/**
 * The routing policies of seed 002, driven through the one Policy interface with fake cluster
 * views: no network, so every property can be checked exactly or statistically.
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { BoltzmannPolicy } from '../src/policies/boltzmann.js';
import { HybridPolicy } from '../src/policies/hybrid.js';
import { RoundRobinPolicy } from '../src/policies/round-robin.js';
import { placeClient, type ClusterView, type Policy } from '../src/policies/types.js';
import { DEFAULT_POLICY_SETTINGS } from '../src/server/supervisor.js';
import { OP_READ, OP_UNSUPPORTED, OP_WRITE } from '../src/server/protocol.js';
import { hasDotSegment } from '../src/contract.js';
import { RouteMatcher, mayRespell, plainSpelling } from '../src/server/route-match.js';
import { OperationClassifier } from '../src/server/operations.js';
import { ETCD_OPERATIONS } from '../src/config/presets.js';

function view(weights: number[], leader = -1): ClusterView {
  return { ids: weights.map((_, i) => `n${i}`), weights: Float64Array.from(weights), flags: new Int32Array(weights.length), leader };
}

function pick(policy: Policy, op: number, size = 8): number[] {
  const out = new Int32Array(size);
  const n = policy.pick('', op, out);
  return Array.from(out.subarray(0, n));
}

function primaries(policy: Policy, op: number, times: number): Map<number, number> {
  const counts = new Map<number, number>();
  for (let i = 0; i < times; i++) {
    const p = pick(policy, op)[0]!;
    counts.set(p, (counts.get(p) ?? 0) + 1);
  }
  return counts;
}

describe('round_robin', () => {
  it('rotates every operation over the routable members, the rest as failover order', () => {
    const p = new RoundRobinPolicy();
    p.update(view([1, 0, 1, 1]));
    assert.deepEqual(pick(p, OP_WRITE), [0, 2, 3]);
    assert.deepEqual(pick(p, OP_READ), [2, 3, 0]);
    assert.deepEqual(pick(p, OP_WRITE), [3, 0, 2]);
    assert.deepEqual(pick(p, OP_READ), [0, 2, 3]);
  });

  it('has no candidate when nothing is routable', () => {
    const p = new RoundRobinPolicy();
    p.update(view([0, 0]));
    assert.deepEqual(pick(p, OP_READ), []);
  });
});

describe('boltzmann', () => {
  it('explores unmeasured members evenly', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1]));
    for (let i = 0; i < 3; i++) assert.ok(Math.abs(p.share(i) - 1 / 3) < 1e-9);
  });

  it('prefers the lower latency EWMA by exp(-gap / temperature)', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1]));
    for (let i = 0; i < 20; i++) {
      p.observe(0, 2, true);
      p.observe(1, 3, true);
      p.observe(2, 6, true);
    }
    // gaps of 1 ms and 4 ms at temperature 1 ms
    const z = 1 + Math.exp(-1) + Math.exp(-4);
    assert.ok(Math.abs(p.share(0) - 1 / z) < 1e-6);
    assert.ok(Math.abs(p.share(1) - Math.exp(-1) / z) < 1e-6);
    const counts = primaries(p, OP_READ, 20_000);
    assert.ok(Math.abs(counts.get(0)! / 20_000 - 1 / z) < 0.02, `node 0 drawn ${counts.get(0)}`);
    assert.deepEqual(pick(p, OP_READ).length, 3, 'every member stays a failover candidate');
  });

  it('inflates the estimate on errors', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1]));
    for (let i = 0; i < 10; i++) {
      p.observe(0, 1, true);
      p.observe(1, 1, true);
    }
    p.observe(1, 1, false);
    assert.ok(p.share(1) < 0.01, `one error already makes it much less likely: ${p.share(1)}`);
  });

  it('starts a member afresh when it comes back from being down (its failures had left it near zero)', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1]));
    for (let i = 0; i < 10; i++) for (const n of [0, 1]) p.observe(n, 1, true);
    for (let i = 0; i < 5; i++) p.observe(2, 1, false);
    assert.ok(p.share(2) < 1e-12);
    p.update(view([1, 1, 0]));
    p.update(view([1, 1, 1]));
    assert.ok(Math.abs(p.share(2) - 1 / 3) < 1e-9, `explored as an unmeasured member: ${p.share(2)}`);
  });

  it('leaves a member near-zero probability after more than three consecutive failures', () => {
    // A hot temperature, so that only the failure rule (not the inflated EWMA) can explain it.
    const p = new BoltzmannPolicy({ ...DEFAULT_POLICY_SETTINGS, temperatureMs: 10_000 });
    p.update(view([1, 1]));
    for (let i = 0; i < 3; i++) p.observe(1, 1, false);
    assert.ok(p.share(1) > 0.4, `three failures: still explored (${p.share(1)})`);
    p.observe(1, 1, false);
    assert.ok(p.share(1) < 1e-5, `four in a row: ${p.share(1)}`);
    p.observe(1, 1, true);
    assert.ok(p.share(1) > 0.4, `a success lifts it again (${p.share(1)})`);
  });
});

/** A hybrid policy over three members, member 0 the leader, after ten reads each: 1 and 1.2 ms, and `slowMs` for member 2. */
function withOutlier(slowMs: number): HybridPolicy {
  const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
  p.update(view([1, 1, 1], 0));
  for (let i = 0; i < 10; i++) {
    p.observe(0, 1, true, OP_READ);
    p.observe(1, 1.2, true, OP_READ);
    p.observe(2, slowMs, true, OP_READ);
  }
  return p;
}

describe('hybrid', () => {
  it('sends every write to the leader, with the others as fallback order', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 1));
    for (let i = 0; i < 10; i++) {
      const c = pick(p, OP_WRITE);
      assert.equal(c[0], 1);
      assert.deepEqual([...c].sort(), [0, 1, 2]);
    }
  });

  it('spreads reads over the whole read pool', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 1));
    const counts = primaries(p, OP_READ, 300);
    assert.deepEqual([...counts.values()], [100, 100, 100]);
  });

  it('falls back to round robin for writes with no leader, or once the leader is unreachable', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], -1));
    assert.deepEqual([...primaries(p, OP_WRITE, 30).values()], [10, 10, 10]);
    p.update(view([1, 1, 1], 2));
    assert.equal(pick(p, OP_WRITE)[0], 2);
    p.leaderUnreachable(2);
    assert.equal(primaries(p, OP_WRITE, 30).size, 3, 'round robin until the next publication');
    p.update(view([1, 1, 1], 0));
    assert.equal(pick(p, OP_WRITE)[0], 0);
  });

  it('ejects a read outlier (EWMA above rho x median), keeps a probe share, and takes it back', () => {
    const p = withOutlier(9);
    assert.equal(p.ejectedNow(2), true);
    assert.equal(p.ejectedNow(0), false);
    const counts = primaries(p, OP_READ, 40_000);
    const share = (counts.get(2) ?? 0) / 40_000;
    assert.ok(share > 0.002 && share < 0.01, `probe share ${share}`);
    // Writes still go to the leader whatever the read pool says.
    assert.equal(pick(p, OP_WRITE)[0], 0);
    // The outlier recovers: its EWMA falls back under the limit, and it rejoins.
    for (let i = 0; i < 20; i++) p.observe(2, 1.1, true, OP_READ);
    assert.equal(p.ejectedNow(2), false);
    assert.ok(Math.abs((primaries(p, OP_READ, 3_000).get(2) ?? 0) - 1_000) <= 1);
  });

  it('judges a member anew when it comes back from being down (its failed reads do not keep it out)', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 0));
    for (let i = 0; i < 10; i++) {
      p.observe(0, 1, true, OP_READ);
      p.observe(1, 1, true, OP_READ);
      p.observe(2, 0, false, OP_READ); // refused: counted as at least 100 ms, doubling
    }
    assert.equal(p.ejectedNow(2), true);
    p.update(view([1, 1, 0], 0)); // marked down
    p.update(view([1, 1, 1], 0)); // back, healthy
    assert.equal(p.ejectedNow(2), false);
    assert.ok(Math.abs((primaries(p, OP_READ, 3_000).get(2) ?? 0) - 1_000) <= 1, 'a full share of reads at once');
    // A member that stayed routable keeps its record.
    for (let i = 0; i < 10; i++) {
      p.observe(1, 50, true, OP_READ);
      p.observe(2, 1, true, OP_READ);
    }
    p.update(view([1, 1, 1], 2));
    assert.equal(p.ejectedNow(1), true, 'a leader change is no reason to forget an outlier');
  });

  it('lets an ejected member back only well under the limit (hysteresis)', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 0));
    const feed = (slow: number): void => {
      for (let i = 0; i < 30; i++) {
        p.observe(0, 1, true, OP_READ);
        p.observe(1, 1, true, OP_READ);
        p.observe(2, slow, true, OP_READ);
      }
    };
    feed(1.8);
    assert.equal(p.ejectedNow(2), false, '1.8x the median is not an outlier');
    feed(2.5);
    assert.equal(p.ejectedNow(2), true, '2.5x is');
    feed(1.8);
    assert.equal(p.ejectedNow(2), true, 'once out, 1.8x (above 0.75 x 2) keeps it out');
    feed(1.4);
    assert.equal(p.ejectedNow(2), false, 'under 1.5x it rejoins');
  });

  it('lets an ejected member back only on a read of its own, not because the others slowed down', () => {
    const p = withOutlier(8);
    assert.equal(p.ejectedNow(2), true);
    // The others turn slow (a busy moment): the median moves to where 8 ms is well under the
    // rejoin line (about 0.75 x 2 x 12 = 18 ms), but member 2 has answered nothing new.
    for (let i = 0; i < 10; i++) {
      p.observe(0, 12, true, OP_READ);
      p.observe(1, 12, true, OP_READ);
    }
    assert.equal(p.ejectedNow(2), true, 'no read of its own: still out');
    // Its next read (a probe) finds it under the line: it rejoins.
    p.observe(2, 8, true, OP_READ);
    assert.equal(p.ejectedNow(2), false);
  });

  it('ignores write latencies when judging the read pool', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 0));
    for (let i = 0; i < 10; i++) {
      for (const n of [0, 1, 2]) p.observe(n, 1, true, OP_READ);
      p.observe(0, 50, true, OP_WRITE);
    }
    assert.equal(p.ejectedNow(0), false);
  });

  it('never judges on too few samples', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 0));
    for (let i = 0; i < 4; i++) {
      p.observe(0, 1, true, OP_READ);
      p.observe(1, 1, true, OP_READ);
      p.observe(2, 100, true, OP_READ);
    }
    assert.equal(p.ejectedNow(2), false);
  });
});

describe('policies after a member comes back (reads it answered late, failures that go on)', () => {
  it('hybrid: reads sent before a member went out, answered after it came back, do not eject it again', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1], 0));
    for (let i = 0; i < 10; i++) for (const n of [0, 1, 2]) p.observe(n, 1, true, OP_READ, performance.now() - 1);
    const frozenAt = performance.now() - 3_000; // SIGSTOP: its reads hang
    p.update(view([1, 1, 0], 0)); // its health probe fails
    p.update(view([1, 1, 1], 0)); // SIGCONT: its probe passes, then the hung reads are answered
    for (let i = 0; i < 20; i++) p.observe(2, 3_000, true, OP_READ, frozenAt);
    assert.equal(p.ejectedNow(2), false, 'reads begun before it came back are not held against it');
    assert.ok(Math.abs((primaries(p, OP_READ, 3_000).get(2) ?? 0) - 1_000) <= 1, 'a full share of reads');
    // Reads begun after it came back still count.
    const backAt = performance.now();
    for (let i = 0; i < 20; i++) {
      for (const n of [0, 1]) p.observe(n, 1, true, OP_READ, backAt);
      p.observe(2, 9, true, OP_READ, backAt);
    }
    assert.equal(p.ejectedNow(2), true);
  });

  it('boltzmann: reads sent before a member went out, answered after it came back, do not starve it', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1]));
    for (let i = 0; i < 10; i++) for (const n of [0, 1, 2]) p.observe(n, 1, true, OP_READ, performance.now() - 1);
    const frozenAt = performance.now() - 3_000;
    p.update(view([1, 1, 0]));
    p.update(view([1, 1, 1]));
    for (let i = 0; i < 20; i++) p.observe(2, 3_000, true, OP_READ, frozenAt);
    assert.ok(p.share(2) > 0.2, `explored as an unmeasured member: ${p.share(2)}`);
  });

  it('hybrid: a member that failed its reads for a long time rejoins within a bounded number of good probes', () => {
    const rejoinAfter = (failures: number): number => {
      const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
      p.update(view([1, 1, 1], 0));
      for (let i = 0; i < 10; i++) for (const n of [0, 1, 2]) p.observe(n, 1, true, OP_READ);
      for (let i = 0; i < failures; i++) p.observe(2, 7_000, false, OP_READ); // 503 "request timed out"
      let probes = 0;
      while (p.ejectedNow(2) && probes < 10_000) {
        p.observe(2, 1, true, OP_READ);
        probes++;
      }
      return probes;
    };
    const short = rejoinAfter(10);
    const long = rejoinAfter(5_000);
    assert.ok(long < 10_000, `after 5,000 failed reads it never rejoined (${long} good reads and counting)`);
    assert.ok(long <= short + 5, `rejoining takes ${long} good reads after 5,000 failures, ${short} after 10: the penalty must not compound without bound`);
  });

  it('boltzmann: a healthy member one slow sample behind is still explored (seed 002: "some probability of exploring")', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1]));
    for (let i = 0; i < 10; i++) for (const n of [0, 1, 2]) p.observe(n, 1, true, OP_READ);
    p.observe(2, 60, true, OP_READ); // one slow answer (a GC pause, a cold connection)
    const counts = primaries(p, OP_READ, 100_000);
    assert.ok((counts.get(2) ?? 0) > 100, `member 2 drawn ${counts.get(2) ?? 0} times in 100,000`);
  });
});

describe('dot segments', () => {
  it('finds . and .. segments, percent-encoded or not, and nothing else', () => {
    for (const path of ['/a/..', '/a/../b', '/./a', '/a/%2e%2e/b', '/a/%2E/b', '/a/.%2e', '/..']) assert.equal(hasDotSegment(path), true, path);
    // Between encoded slashes, or backslashes (plain or encoded), which a node may take for '/'.
    for (const path of ['/zk/children/x%2F..%2F..%2Fset', '/a%2f.%2fb', '/a/..%2Fb', '/a\\..\\b', '/a%5C..%5cb', '/a/%2e%2E%5C', '/a\\.']) assert.equal(hasDotSegment(path), true, path);
    // With path parameters, which servlet containers strip (`/reads/..;/write` is `/write` there).
    for (const path of ['/ops/reads/..;/write', '/a/..;x=1/b', '/a/.%3B/b', '/a/..;']) assert.equal(hasDotSegment(path), true, path);
    // Before a fragment, which a node drops before resolving the dots (`/public/..#x` is `/` there).
    for (const path of ['/a/..#x', '/a/.#', '/a/.%2e#', '/a/..;x#y', '/a%2F..#']) assert.equal(hasDotSegment(path), true, path);
    for (const path of ['/rpc/query.execute', '/a.b/c', '/..a/b', '/a/b..', '/a%2Fb', '/%2e%2ex', '/', '/v3/kv/range', '/a%2F..b', '/a\\b.c', '/%41', '/a/b;c', '/a/x..;/b', '/a/b#..', '/a/..x#', '/a#b']) assert.equal(hasDotSegment(path), false, path);
  });
});

describe('route spellings', () => {
  it('reads a path as a normalising node does: unreserved escapes, %2F and %5C decoded, backslashes and doubled slashes made one slash', () => {
    assert.equal(plainSpelling('/%61dmin/x'), '/admin/x');
    assert.equal(plainSpelling('/admin%2Fx'), '/admin/x');
    assert.equal(plainSpelling('/admin%5cx'), '/admin/x');
    assert.equal(plainSpelling('//admin///x'), '/admin/x');
    assert.equal(plainSpelling('/admin\\x'), '/admin/x');
    assert.equal(plainSpelling('/a%20b/%3F%25'), '/a%20b/%3F%25', 'other escapes are kept');
    assert.equal(plainSpelling('/a%2'), '/a%2');
    for (const path of ['/a%2Fb', '//a', '/a\\b']) assert.equal(mayRespell(path), true, path);
    for (const path of ['/rpc/board.append', '/a/b/c', '/']) assert.equal(mayRespell(path), false, path);
  });

  it('matches routes as uWS does: an exact path first, then the longest wildcard prefix', () => {
    const m = new RouteMatcher([
      { pattern: '/*', value: 'all' },
      { pattern: '/a/*', value: 'a' },
      { pattern: '/a/b/*', value: 'ab' },
      { pattern: '/x', value: 'x' },
    ]);
    assert.equal(m.match('/a/q'), 'a');
    assert.equal(m.match('/a/b'), 'a');
    assert.equal(m.match('/a/b/c'), 'ab');
    assert.equal(m.match('/x'), 'x');
    assert.equal(m.match('/x/'), 'all');
    assert.equal(m.match('/a'), 'all');
    assert.equal(new RouteMatcher([{ pattern: '/a/*', value: 1 }]).match('/b'), null);
  });
});

describe('etcd operation classes', () => {
  const c = new OperationClassifier(ETCD_OPERATIONS);
  const cases: [string, number][] = [
    ['/v3/kv/range', OP_READ],
    ['/v3/kv/put', OP_WRITE],
    ['/v3/kv/deleterange', OP_WRITE],
    ['/v3/kv/txn', OP_WRITE],
    ['/v3/kv/compaction', OP_WRITE],
    ['/v3/lease/grant', OP_WRITE],
    ['/v3/lease/keepalive', OP_WRITE],
    ['/v3/maintenance/status', OP_WRITE],
    ['/v3/kv/rangex', OP_WRITE],
  ];
  for (const [path, op] of cases) it(`${path} is a ${op === OP_READ ? 'read' : 'write'}`, () => assert.equal(c.classify(path), op));

  it('classifies a path as the node reads it: percent-encoded letters and digits decoded, other escapes kept', () => {
    // etcd's router decodes them: /v3/%77atch is a watch stream there, held to the request timeout.
    assert.equal(c.classify('/v3/%77atch'), OP_UNSUPPORTED);
    assert.equal(c.classify('/v3/watc%68'), OP_UNSUPPORTED);
    assert.equal(c.classify('/v3/kv/%72%61nge'), OP_READ);
    assert.equal(c.classify('/v3/kv/r%61ng%65'), OP_READ);
    assert.equal(c.classify('/v3/kv/range%2Fx'), OP_WRITE, 'an escaped slash is not decoded (nor is any reserved character)');
    assert.equal(c.classify('/v3/kv/%2'), OP_WRITE);
  });

  it('lets a narrower prefix win over a broader one', () => {
    const k = new OperationClassifier({ reads: ['/a/b/*'], writes: ['/a/*'], otherwise: 'read' });
    assert.equal(k.classify('/a/b/c'), OP_READ);
    assert.equal(k.classify('/a/c'), OP_WRITE);
    assert.equal(k.classify('/z'), OP_READ);
  });
});

describe('placing a ticket holder anew on boltzmann and hybrid (placeClient by turn)', () => {
  /** The sibling a client of turn `turn` whose ticket names node 0 is placed on. */
  function sibling(policy: Policy, turn: number, size: number): number {
    const out = new Int32Array(size);
    const count = policy.pick('', OP_READ, out);
    placeClient(out, count, 0, turn, new Int32Array(size), -1, policy, new Int32Array(1), Int32Array.from({ length: size }, (_, i) => i));
    // Its own node, where still routable, is tried first (pinFirst); the sibling is the first other.
    return Array.from(out.subarray(0, count)).find((n) => n !== 0)!;
  }

  it('boltzmann: the same sibling whether the ticket\'s node is routable but failing or out, and a sibling leaving moves only its own clients', () => {
    const p = new BoltzmannPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1, 1]));
    // Node 0 (the ticket's, fast until it fails) and 1 read in 1 ms, 2 and 3 in about 5: near the
    // 1% line, on one side of it with node 0 counted and on the other without.
    for (const [node, ms] of [[0, 1], [1, 1], [2, 5], [3, 5.3]] as const) for (let i = 0; i < 10; i++) p.observe(node, ms, true);
    const failing = Array.from({ length: 12 }, (_, t) => sibling(p, t, 4));
    p.update(view([0, 1, 1, 1]));
    const out = Array.from({ length: 12 }, (_, t) => sibling(p, t, 4));
    assert.deepEqual(out, failing, 'its node failing or out: the same sibling for each turn');
    // Node 2 slows past the line: only the clients it held move.
    for (let i = 0; i < 10; i++) p.observe(2, 12, true);
    const after = Array.from({ length: 12 }, (_, t) => sibling(p, t, 4));
    assert.ok(!after.includes(2));
    for (let t = 0; t < 12; t++) if (out[t] !== 2) assert.equal(after[t], out[t], `turn ${t} kept its sibling`);
  });

  it('hybrid: the same sibling whether the ticket\'s node is routable but failing or out, never a slow reader', () => {
    const p = new HybridPolicy(DEFAULT_POLICY_SETTINGS);
    p.update(view([1, 1, 1, 1]));
    for (let i = 0; i < 8; i++) p.observe(0, 100, false, OP_READ);
    for (const [node, ms] of [[1, 1], [2, 1.5], [3, 3.5]] as const) for (let i = 0; i < 8; i++) p.observe(node, ms, true, OP_READ);
    const failing = Array.from({ length: 12 }, (_, t) => sibling(p, t, 4));
    p.update(view([0, 1, 1, 1]));
    for (const [node, ms] of [[1, 1], [2, 1.5], [3, 3.5]] as const) for (let i = 0; i < 8; i++) p.observe(node, ms, true, OP_READ);
    const out = Array.from({ length: 12 }, (_, t) => sibling(p, t, 4));
    assert.deepEqual(out, failing);
    assert.ok(!out.includes(3), `node 3 reads slowly (over twice the others' median): ${out.join(' ')}`);
  });
});
