/**
 * `lakefront/router` and `lakefront/contract` as a library user imports them (by package name,
 * through the package's exports map).
 */
import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, it } from 'node:test';
import * as contract from 'lakefront/contract';
import { IDEMPOTENT_HEADER, IDEMPOTENT_PROCEDURES, LatencyWindow, Membership, Router, isIdempotentPath, isRetryable } from 'lakefront/router';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';

describe('contract', () => {
  it('names the idempotent procedures and the opt-in header', () => {
    assert.equal(IDEMPOTENT_HEADER, 'x-lakefront-idempotent');
    assert.deepEqual([...IDEMPOTENT_PROCEDURES].sort(), ['changes.read', 'node.stats', 'query.execute']);
    assert.equal(contract.isRetryable, isRetryable, 're-exported, not copied');
  });

  const paths: [string, boolean][] = [
    ['/rpc/query.execute', true],
    ['/rpc/node.stats?x=1', true],
    ['/rpc/changes.read', true],
    ['/rpc/board.append', false],
    ['/rpc/query.executeX', false],
    ['/query.execute', false],
    ['/rpc/', false],
  ];
  for (const [path, want] of paths) it(`isIdempotentPath(${path}) is ${want}`, () => assert.equal(isIdempotentPath(path), want));

  it('isRetryable honours the header only when it is exactly "1"', () => {
    assert.equal(isRetryable('/rpc/board.append'), false);
    assert.equal(isRetryable('/rpc/board.append', new Headers({ [IDEMPOTENT_HEADER]: '1' })), true);
    assert.equal(isRetryable('/rpc/board.append', new Headers({ [IDEMPOTENT_HEADER]: 'true' })), false);
    assert.equal(isRetryable('/rpc/board.append', { [IDEMPOTENT_HEADER]: '1' }), true);
    assert.equal(isRetryable('/rpc/query.execute', new Headers()), true);
  });
});

describe('Membership', () => {
  let nodes: FakeNode[];
  before(async () => {
    nodes = await startNodes('m-a', 'm-b');
  });
  after(async () => Promise.all(nodes.map((n) => n.stop())));

  it('rejects duplicate ids and bad URLs', () => {
    assert.throws(() => new Membership({ members: [{ id: 'a', url: 'http://x' }, { id: 'a', url: 'http://y' }] }), /duplicate node id "a"/);
    assert.throws(() => new Membership({ members: [{ id: 'a', url: 'ftp://x' }] }), /bad URL/);
    // A base path would be kept by health probes and Router.forward but not by the front door.
    assert.throws(() => new Membership({ members: [{ id: 'a', url: 'http://x:7000/api' }] }), /bad URL "http:\/\/x:7000\/api" for node "a" .*no path/);
    assert.deepEqual(new Membership({ members: [{ id: 'a', url: 'HTTP://X:7000/' }] }).all(), [{ id: 'a', url: 'http://x:7000' }]);
    assert.throws(() => new Membership({ members: [] }), /at least one node/);
  });

  it('probes health, zeroes the weight of a failing member, and restores it', async () => {
    const membership = new Membership({ members: nodes.map((n) => ({ id: n.id, url: n.url })), timeoutMs: 200 });
    nodes[1]!.healthy = false;
    await membership.probeOnce();
    assert.deepEqual(membership.healthyIds(), ['m-a']);
    assert.deepEqual(membership.nodes().map((n) => [n.id, n.weight]), [['m-a', 1], ['m-b', 0]]);
    assert.equal(membership.all().length, 2);
    nodes[1]!.healthy = true;
    await membership.probeOnce();
    assert.deepEqual(membership.healthyIds(), ['m-a', 'm-b']);
  });

  it('counts a member that does not answer within timeoutMs as unhealthy', async () => {
    const membership = new Membership({ members: [{ id: 'ghost', url: 'http://127.0.0.1:9' }], timeoutMs: 100 });
    await membership.probeOnce();
    assert.deepEqual(membership.healthyIds(), []);
  });

  it('quantises capacity into the weight and keeps it apart from health', () => {
    const membership = new Membership({ members: nodes.map((n) => ({ id: n.id, url: n.url })) });
    membership.setCapacity('m-a', 1.7);
    assert.equal(membership.nodes()[0]!.weight, 1.5);
    membership.markUnhealthy('m-a');
    assert.equal(membership.nodes()[0]!.weight, 0);
    assert.throws(() => membership.setCapacity('nope', 1), /unknown member/);
  });

  it('markUnhealthy: the next passing probe brings a member back, but not before its hold', async () => {
    const membership = new Membership({ members: nodes.map((n) => ({ id: n.id, url: n.url })) });
    membership.markUnhealthy('m-a');
    membership.markUnhealthy('m-b', 60_000);
    await membership.probeOnce();
    assert.deepEqual(membership.healthyIds(), nodes.filter((n) => n.id !== 'm-b').map((n) => n.id), 'm-a back, m-b held');
    assert.ok(membership.heldUntil('m-b') > performance.now() + 50_000);
    assert.throws(() => membership.markUnhealthy('m-a', -1), /holdMs must be a non-negative number, got -1/);
  });

  it('polls on start() and stops on stop()', async () => {
    const membership = new Membership({ members: [{ id: nodes[0]!.id, url: nodes[0]!.url }], intervalMs: 20 });
    const before = nodes[0]!.healthProbes;
    membership.start();
    await nodes[0]!.nextProbe();
    await nodes[0]!.nextProbe();
    membership.stop();
    assert.ok(nodes[0]!.healthProbes >= before + 2);
  });
});

describe('Router (in process, over fetch)', () => {
  let nodes: FakeNode[];
  let router: Router;
  before(async () => {
    nodes = await startNodes('r-a', 'r-b', 'r-c');
    // A hedge delay a first request's connection makes in time even on a loaded machine (at 40 ms
    // the unhedged read of the first test was once hedged while another test run shared the cores).
    router = new Router({ membership: new Membership({ members: nodes.map((n) => ({ id: n.id, url: n.url })) }), hedgeDelayMs: 250 });
  });
  after(async () => Promise.all(nodes.map((n) => n.stop())));
  const node = (id: string): FakeNode => nodes.find((n) => n.id === id)!;

  it('forwards to the native node and reports who served', async () => {
    const [native] = router.route('lib-board');
    const result = await router.forward('lib-board', '/rpc/query.execute', '{"a":1}', undefined, 'Bearer lib');
    assert.equal(result.status, 200);
    assert.equal(result.servedBy, native!.id);
    assert.equal(result.hedged, false);
    assert.deepEqual(result.attempted, [native!.id]);
    assert.ok(result.latencyMs > 0);
    const got = node(native!.id).received.at(-1)!;
    assert.equal(got.headers.authorization, 'Bearer lib');
    assert.equal(got.headers['x-lakefront-board'], 'lib-board');
    assert.equal(got.body, '{"a":1}');
  });

  it('hedges a slow read and counts it', async () => {
    const [primary, second] = router.route('lib-hedge');
    node(primary!.id).behaviour = { kind: 'answer', delayMs: 3_000 };
    const counters = router.counters;
    const before = { ...counters };
    const result = await router.forward('lib-hedge', '/rpc/query.execute', '{}');
    node(primary!.id).behaviour = { kind: 'answer' };
    assert.equal(result.servedBy, second!.id);
    assert.equal(result.hedged, true);
    assert.deepEqual(result.attempted, [primary!.id, second!.id]);
    // Running totals (seed 001): the object taken before the call has moved on with it.
    assert.equal(router.counters, counters);
    assert.equal(counters.requests - before.requests, 1);
    assert.equal(counters.hedges - before.hedges, 1);
    assert.equal(counters.hedgeWins - before.hedgeWins, 1);
    assert.throws(() => ((counters as { requests: number }).requests = 0), TypeError);
  });

  it('gives a bare write one attempt and says the outcome is unknown when it fails', async () => {
    const [primary] = router.route('lib-write');
    node(primary!.id).behaviour = { kind: 'reset' };
    const hitsBefore = nodes.map((n) => n.hits());
    const result = await router.forward('lib-write', '/rpc/board.append', '{}');
    node(primary!.id).behaviour = { kind: 'answer' };
    assert.equal(result.status, 502);
    assert.equal(result.servedBy, '');
    assert.match(result.body, /LF_ERR_OUTCOME_UNKNOWN/);
    assert.deepEqual(result.attempted, [primary!.id]);
    assert.equal(nodes.reduce((s, n, i) => s + n.hits() - hitsBefore[i]!, 0), 1);
  });

  it('says a bare write whose node refused the connection was not sent', async () => {
    const [down] = await startNodes('r-down');
    const router2 = new Router({ membership: new Membership({ members: [{ id: down!.id, url: down!.url }] }) });
    await down!.stop();
    const result = await router2.forward('lib-refused', '/rpc/board.append', '{}');
    assert.equal(result.status, 503);
    assert.match(result.body, /LF_ERR_NOT_SENT/);
    assert.deepEqual(result.attempted, ['r-down']);
  });

  it('says a bare write whose node name did not resolve was not sent (503), and sends it nowhere else', async () => {
    // `.invalid` never resolves (RFC 6761): the lookup fails before any connection is made.
    const [live] = await startNodes('r-live');
    try {
      const members = [{ id: 'r-gone', url: 'http://gone.invalid:8080' }, { id: live!.id, url: live!.url }];
      const router2 = new Router({ membership: new Membership({ members }) });
      let board = '';
      for (let i = 0; board === ''; i++) if (router2.route(`lib-gone-${i}`)[0]!.id === 'r-gone') board = `lib-gone-${i}`;
      const result = await router2.forward(board, '/rpc/board.append', '{}');
      // Before: 502 LF_ERR_OUTCOME_UNKNOWN, though nothing could have been sent.
      assert.equal(result.status, 503, result.body);
      assert.match(result.body, /LF_ERR_NOT_SENT/);
      assert.deepEqual(result.attempted, ['r-gone']);
      assert.equal(live!.hits(), 0);
      // A read is failed over to the next node as for any failure.
      const read = await router2.forward(board, '/rpc/query.execute', '{}');
      assert.equal(read.status, 200, read.body);
      assert.equal(read.servedBy, live!.id);
    } finally {
      await live!.stop();
    }
  });

  it('fails a retryable write over when told it is retryable', async () => {
    const [primary, second] = router.route('lib-keyed');
    node(primary!.id).behaviour = { kind: 'reset' };
    const before = router.counters.failovers;
    const result = await router.forward('lib-keyed', '/rpc/board.append', '{}', true);
    node(primary!.id).behaviour = { kind: 'answer' };
    assert.equal(result.status, 200);
    assert.equal(result.servedBy, second!.id);
    assert.equal(router.counters.failovers - before, 1);
  });

  it('with hedgeBudgetPercent 100 hedges every slow read of a burst at its trigger (no budget, as seed 001)', async () => {
    const unbudgeted = new Router({ membership: router.membership, hedgeDelayMs: 40, hedgeBudgetPercent: 100 });
    const [primary, second] = unbudgeted.route('lib-burst');
    node(primary!.id).behaviour = { kind: 'answer', delayMs: 3_000 };
    try {
      const results = await Promise.all(Array.from({ length: 16 }, () => unbudgeted.forward('lib-burst', '/rpc/query.execute', '{}')));
      assert.deepEqual(
        results.map((r) => [r.hedged, r.servedBy]),
        results.map(() => [true, second!.id]),
      );
      // Every one hedged and answered by the hedge, none left to the stalled node (a 100% budget
      // left 6 of 16 so).
      assert.equal(unbudgeted.counters.hedges, 16);
    } finally {
      node(primary!.id).behaviour = { kind: 'answer' };
    }
  });

  it('records latency samples per node for the hedge trigger', async () => {
    const [native] = router.route('lib-latency');
    const before = router.latency.count(native!.id);
    for (let i = 0; i < 8; i++) await router.forward('lib-latency', '/rpc/query.execute', '{}');
    assert.equal(router.latency.count(native!.id), Math.min(128, before + 8));
    assert.ok(router.latency.percentile(native!.id, 95)! > 0);
  });
});

describe('bad input to the library: refused with a clear error, nothing changed', () => {
  let nodes: FakeNode[];
  before(async () => {
    nodes = await startNodes('v-a');
  });
  after(async () => Promise.all(nodes.map((n) => n.stop())));

  it('Router refuses delays a Node timer cannot take (it would fire after 1 ms), 0 as a timeout, and options of the wrong type', () => {
    const membership = new Membership({ members: [{ id: 'a', url: 'http://127.0.0.1:9' }] });
    assert.throws(() => new Router({ membership, requestTimeoutMs: 2 ** 31 }), /^RangeError: requestTimeoutMs must be a number of milliseconds in \[1, 2147483647\], got 2147483648$/);
    assert.throws(() => new Router({ membership, requestTimeoutMs: 0 }), /requestTimeoutMs must be a number of milliseconds in \[1, /);
    assert.throws(() => new Router({ membership, hedgeDelayMs: 2 ** 31 }), /hedgeDelayMs must be a number of milliseconds in \[0, 2147483647\], got 2147483648/);
    assert.throws(() => new Router({ membership, hedgeDelayMs: Infinity }), /hedgeDelayMs .* got Infinity/);
    assert.throws(() => new Router({ membership, hedgeAfterPercentile: '95' as unknown as number }), /hedgeAfterPercentile must be in \(0, 100\], got 95/);
    assert.throws(() => new Router({} as unknown as { membership: Membership }), /^TypeError: membership must be a Membership$/);
    assert.throws(() => new Router({ membership, fetch: 42 as unknown as typeof fetch }), /^TypeError: fetch must be a function, got number$/);
    assert.equal(new Router({ membership, requestTimeoutMs: 2 ** 31 - 1, hedgeDelayMs: 0 }).requestTimeoutMs, 2 ** 31 - 1);
  });

  it('forward() refuses a path that does not start with "/" (it would name another host) and arguments of the wrong type, counting and sending nothing', async () => {
    const urls: string[] = [];
    const stub = (async (url: string | URL | Request) => {
      urls.push(String(url));
      return new Response('{}');
    }) as typeof fetch;
    const router = new Router({ membership: new Membership({ members: [{ id: 'a', url: 'http://node-a.internal' }], fetch: stub }), fetch: stub });
    const bad: [unknown[], RegExp][] = [
      [['b', '.attacker.example/rpc/query.execute', '{}', undefined, 'Bearer s3cret'], /^TypeError: path must be a string starting with "\/", got "\.attacker\.example\/rpc\/query\.execute"$/],
      [['b', ':8080/rpc/x', '{}'], /path must be a string starting with "\/"/],
      [['b', 42, '{}'], /path must be a string starting with "\/", got number/],
      [[42, '/rpc/x', '{}'], /boardId must be a string, got number/],
      [['b', '/rpc/x', { a: 1 }], /body must be a string, got object/],
      // A header's value passed on as it came ("0") is not a yes: a bare write is never hedged by mistake.
      [['b', '/rpc/board.append', '{}', '0'], /retryable must be a boolean, got string/],
    ];
    for (const [args, want] of bad) {
      const call = (router.forward as (...a: unknown[]) => Promise<unknown>)(...args);
      assert.ok(call instanceof Promise, 'a rejection, not a synchronous throw');
      await assert.rejects(call, want);
    }
    assert.deepEqual(urls, []);
    assert.equal(router.counters.requests, 0);
    const ok = await router.forward('b', '/rpc/query.execute', '{}');
    assert.equal(ok.status, 200);
    assert.deepEqual(urls, ['http://node-a.internal/rpc/query.execute']);
  });

  it('Membership refuses a poll interval or probe deadline a Node timer cannot take, and probes with a fractional deadline', async () => {
    const members = [{ id: nodes[0]!.id, url: nodes[0]!.url }];
    assert.throws(() => new Membership({ members, intervalMs: 5e9 }), /^ConfigError: intervalMs: must be a positive number of milliseconds, at most 2147483647, got 5000000000$/);
    assert.throws(() => new Membership({ members, timeoutMs: 2 ** 31 }), /timeoutMs: must be a positive number of milliseconds, at most 2147483647/);
    // AbortSignal.timeout throws on a fraction: every probe failed, every member went unhealthy.
    const membership = new Membership({ members, timeoutMs: 250.5 });
    nodes[0]!.healthy = true;
    membership.markUnhealthy(nodes[0]!.id);
    await membership.probeOnce();
    assert.deepEqual(membership.healthyIds(), [nodes[0]!.id]);
  });

  it('LatencyWindow takes no Infinity sample (a hedge trigger of Infinity fires after 1 ms)', () => {
    const window = new LatencyWindow();
    for (let i = 0; i < 8; i++) window.record('n', 5);
    window.record('n', Infinity);
    assert.equal(window.count('n'), 8);
    assert.equal(window.percentile('n', 100), 5);
  });
});
