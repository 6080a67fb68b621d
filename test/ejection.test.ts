/**
 * Passive health (outlier ejection): a node that passes its health probe but fails the requests
 * sent to it (hangs, resets) is ejected from every ranking after `ejectAfter` failed attempts in
 * a row, within the caps, and stays out through probes and reloads for its hold.
 */
import assert from 'node:assert/strict';
import { Buffer } from 'node:buffer';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import { after, afterEach, before, beforeEach, describe, it } from 'node:test';
import { parseCommand } from '../src/config/config.js';
import { Membership } from '../src/membership/membership.js';
import { isUnreachable, nodeFailure } from '../src/server/cluster-runtime.js';
import { route } from '../src/router/index.js';
import { FrontDoor, type EjectionEvent, type FrontDoorConfig } from '../src/server/supervisor.js';
import { doorConfig } from './fixtures/door.js';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';
import { call, ranking, rawExchange, rpc, type Reply } from './fixtures/http.js';

const EJECT_AFTER = 3;

describe('ejecting a node that passes its probe but fails its requests', () => {
  let nodes: FakeNode[];
  let door: FrontDoor;
  let config: FrontDoorConfig;
  before(async () => {
    nodes = await startNodes('ej-a', 'ej-b', 'ej-c');
  });
  beforeEach(async () => {
    for (const n of nodes) n.behaviour = { kind: 'answer' };
    config = doorConfig(nodes, { requestTimeoutMs: 150, hedgeMode: 'off', ejectAfter: EJECT_AFTER }, { ejectMs: 60_000 });
    door = await FrontDoor.start(config);
  });
  afterEach(async () => {
    await door.stop();
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop()));
  });

  /** A board whose native node is `node`. */
  async function boardOf(node: FakeNode): Promise<string> {
    for (let i = 0; ; i++) if ((await ranking(door.url, `ej-board-${i}`))[0] === node.id) return `ej-board-${i}`;
  }
  const write = (board: string) => rpc(door.url, 'board.append', board);
  const stats = async () => (await call(`${door.url}/stats`)).json<{ healthy: string[]; nodes: Record<string, { ejections: number; ejected: boolean }> }>();

  it('ejects it after that many failed attempts in a row, its boards go to the next node, and a passing probe or a reload does not bring it back', async () => {
    const [hanging] = nodes as [FakeNode];
    hanging.behaviour = { kind: 'hang' };
    const board = await boardOf(hanging);
    const verdict = once(door, 'ejection') as Promise<[EjectionEvent]>;
    for (let i = 0; i < EJECT_AFTER; i++) {
      // A bare write: one attempt, on its node, and the caller told its outcome is unknown (502).
      assert.equal((await write(board)).status, 502);
    }
    const [event] = await verdict;
    assert.equal(event.node, hanging.id);
    assert.equal(event.failures, EJECT_AFTER);
    assert.equal(event.code, 'LF_ERR_UPSTREAM_TIMEOUT');
    assert.ok(event.ejected && event.holdMs === 60_000, JSON.stringify(event));
    const hits = hanging.hits();
    assert.equal(hits, EJECT_AFTER);

    const moved = await write(board);
    assert.equal(moved.status, 200, 'the board went to its next node');
    assert.equal(moved.headers['x-lakefront-served-by'], (await ranking(door.url, board))[0]);
    assert.notEqual(moved.headers['x-lakefront-served-by'], hanging.id);
    assert.equal(hanging.hits(), hits, 'not tried again');
    let seen = await stats();
    assert.ok(!seen.healthy.includes(hanging.id));
    assert.deepEqual(seen.nodes[hanging.id], { ...seen.nodes[hanging.id], ejections: 1, ejected: true });

    // Its probe passes (it answers /health): still out.
    await door.memberships[0]!.probeOnce();
    assert.ok(!(await stats()).healthy.includes(hanging.id), 'a passing probe does not end the hold');
    // A reload's new membership keeps the ejection, and its count.
    const old = door;
    door = await door.reload(config);
    await old.drained;
    seen = await stats();
    assert.ok(!seen.healthy.includes(hanging.id), 'still out after a reload');
    assert.equal(seen.nodes[hanging.id]!.ejections, 1);
    assert.equal((await write(board)).headers['x-lakefront-served-by'], moved.headers['x-lakefront-served-by']);
  });

  it('a reload that points an ejected node\'s id at another URL (its replacement) holds the replacement out for nothing: its first probe decides', async () => {
    const [hanging] = nodes as [FakeNode];
    hanging.behaviour = { kind: 'hang' };
    const board = await boardOf(hanging);
    const verdict = once(door, 'ejection') as Promise<[EjectionEvent]>;
    for (let i = 0; i < EJECT_AFTER; i++) assert.equal((await write(board)).status, 502);
    assert.equal((await verdict)[0].ejected, true);
    // The machine is replaced: the same id, another address, by a reload.
    const [replacement] = (await startNodes(hanging.id)) as [FakeNode];
    try {
      const old = door;
      door = await door.reload({ ...config, clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: (n === hanging ? replacement : n).url })) }] });
      await old.drained;
      const seen = await stats();
      assert.ok(seen.healthy.includes(hanging.id), 'the replacement is in: nothing was held against it');
      assert.equal(seen.nodes[hanging.id]!.ejected, false);
      assert.equal(seen.nodes[hanging.id]!.ejections, 1, 'the count, by node id, carries');
      const reply = await write(board);
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['x-lakefront-served-by'], hanging.id);
      assert.equal(replacement.hits(), 1, 'the board went back to its native node, at its new address');
    } finally {
      await door.stop();
      await replacement.stop();
    }
  });

  it('counts only failures in a row: an answer between them starts the count again', async () => {
    const [flaky] = nodes as [FakeNode];
    const board = await boardOf(flaky);
    let ejections = 0;
    door.on('ejection', () => ejections++);
    for (let round = 0; round < 3; round++) {
      flaky.behaviour = { kind: 'hang' };
      for (let i = 0; i < EJECT_AFTER - 1; i++) assert.equal((await write(board)).status, 502);
      flaky.behaviour = { kind: 'answer' };
      const answered = await write(board);
      assert.equal(answered.status, 200);
      assert.equal(answered.headers['x-lakefront-served-by'], flaky.id);
    }
    // Nine failures in all, never three in a row: the node was never reported, and is in.
    assert.equal(ejections, 0);
    const seen = await stats();
    assert.ok(seen.healthy.includes(flaky.id));
    assert.equal(seen.nodes[flaky.id]!.ejections, 0);
  });

  it('an answer that is a 502, 503 or 504 is an answer: it ejects nothing', async () => {
    const [failing] = nodes as [FakeNode];
    failing.behaviour = { kind: 'answer', status: 503 };
    const board = await boardOf(failing);
    let reports = 0;
    door.on('ejection', () => reports++);
    for (let i = 0; i < EJECT_AFTER * 2; i++) assert.equal((await write(board)).status, 503);
    assert.equal(reports, 0);
    assert.ok((await stats()).healthy.includes(failing.id));
  });

  it('ejects at most one node in ten at once (and always one): a second failing node stays in, and says why', async () => {
    const [first, second] = nodes as [FakeNode, FakeNode];
    first.behaviour = { kind: 'hang' };
    second.behaviour = { kind: 'reset' };
    const firstBoard = await boardOf(first);
    const secondBoard = await boardOf(second);
    const ejected = once(door, 'ejection') as Promise<[EjectionEvent]>;
    for (let i = 0; i < EJECT_AFTER; i++) assert.equal((await write(firstBoard)).status, 502);
    assert.equal((await ejected)[0].ejected, true);
    const kept = once(door, 'ejection') as Promise<[EjectionEvent]>;
    for (let i = 0; i < EJECT_AFTER; i++) assert.equal((await write(secondBoard)).status, 502);
    const [event] = await kept;
    assert.equal(event.node, second.id);
    assert.equal(event.code, 'LF_ERR_UPSTREAM_CLOSED');
    assert.deepEqual(event.ejected ? null : event.reason, '1 of 3 members already out by ejection, and at most 10% (at least one) may be at once');
    const seen = await stats();
    assert.ok(seen.healthy.includes(second.id), 'kept in');
    assert.ok(!seen.healthy.includes(first.id));
  });
});

describe('what counts toward ejection, and what does not', () => {
  let nodes: FakeNode[];
  let door: FrontDoor | null = null;
  before(async () => {
    nodes = await startNodes('ejw-a', 'ejw-b', 'ejw-c');
  });
  afterEach(async () => {
    await door?.stop();
    door = null;
    for (const n of nodes) n.behaviour = { kind: 'answer' };
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop()));
  });

  async function start(settings: Partial<FrontDoorConfig['settings']>, threads = 1): Promise<FrontDoor> {
    door = await FrontDoor.start(doorConfig(nodes, { ejectAfter: EJECT_AFTER, ...settings }, { threads, ejectMs: 60_000 }));
    return door;
  }
  async function boardOf(front: FrontDoor, node: FakeNode): Promise<string> {
    for (let i = 0; ; i++) if ((await ranking(front.url, `ejw-${i}`))[0] === node.id) return `ejw-${i}`;
  }
  const ejections = async (front: FrontDoor, id: string) => (await call(`${front.url}/stats`)).json<{ nodes: Record<string, { ejections: number }> }>().nodes[id]!.ejections;

  it('a worker stalled past the request timeout reads the answers that came meanwhile before it judges timeouts', async () => {
    // The answer comes 50 ms in, while the worker is stuck for 600 ms (a long pause): its timeout
    // sweep is overdue when it wakes, but the answer is already in the socket.
    const front = await start({ requestTimeoutMs: 200, hedgeMode: 'off' });
    const board = await boardOf(front, nodes[0]!);
    nodes[0]!.behaviour = { kind: 'answer', delayMs: 50 };
    const replies = [0, 1, 2].map(() => rpc(front.url, 'board.append', board));
    while (nodes[0]!.received.length < 3) await once(nodes[0]!, 'request');
    front.hangWorker(1, 600);
    for (const reply of await Promise.all(replies)) assert.equal(reply.status, 200, reply.text);
    assert.equal(await ejections(front, nodes[0]!.id), 0);
    const counted = (await call(`${front.url}/stats`)).json<{ nodes: Record<string, { failures: number }> }>().nodes[nodes[0]!.id]!;
    assert.equal(counted.failures, 0, 'no attempt failed');
  });

  it('counts failures in a row across worker threads, as one count a node', async () => {
    const front = await start({ requestTimeoutMs: 150, hedgeMode: 'off' }, 4);
    const [hanging] = nodes as [FakeNode];
    hanging.behaviour = { kind: 'hang' };
    const board = await boardOf(front, hanging);
    const verdict = once(front, 'ejection') as Promise<[EjectionEvent]>;
    // A connection each, spread over four threads by the kernel: counted a thread apart, three
    // failures would seldom be three on one thread.
    const replies = await Promise.all(Array.from({ length: EJECT_AFTER }, () => rpc(front.url, 'board.append', board, { fresh: true })));
    assert.deepEqual(replies.map((r) => r.status), Array(EJECT_AFTER).fill(502));
    const [event] = await verdict;
    assert.equal(event.node, hanging.id);
    assert.equal(event.failures, EJECT_AFTER);
    assert.equal(event.ejected, true);
  });

  /**
   * A front door whose first node hangs, with EJECT_AFTER writes to it in flight (a reload then
   * leaves them to drain on the old worker, where they time out).
   */
  async function writesHanging(): Promise<{ config: FrontDoorConfig; old: FrontDoor; hanging: FakeNode; board: string; writes: Promise<Reply>[] }> {
    const config = doorConfig(nodes, { requestTimeoutMs: 1_500, hedgeMode: 'off', ejectAfter: EJECT_AFTER }, { ejectMs: 60_000 });
    const old = (door = await FrontDoor.start(config));
    const [hanging] = nodes as [FakeNode];
    hanging.behaviour = { kind: 'hang' };
    const board = await boardOf(old, hanging);
    const before = hanging.received.length;
    const writes = Array.from({ length: EJECT_AFTER }, () => rpc(old.url, 'board.append', board));
    await hanging.waitForRequests(before + EJECT_AFTER);
    return { config, old, hanging, board, writes };
  }

  it('failures on an old worker still draining after a reload are judged by the configuration serving', async () => {
    const { config, old, hanging, writes } = await writesHanging();
    const serving = (door = await old.reload(config));
    const [event] = (await once(serving, 'ejection')) as [EjectionEvent];
    assert.equal(event.node, hanging.id);
    assert.equal(event.ejected, true);
    assert.deepEqual((await Promise.all(writes)).map((r) => r.status), Array(EJECT_AFTER).fill(502));
    await old.drained;
    assert.equal(await ejections(serving, hanging.id), 1, 'in the serving configuration');
    assert.ok(!(await call(`${serving.url}/health`)).json<{ healthy: string[] }>().healthy.includes(hanging.id));
  });

  it('failures an old worker meets at a node\'s old address are not held against the new one, when a reload moved its id', async () => {
    const { config, old, hanging, board, writes } = await writesHanging();
    // The reload points the hanging node's id at a replacement; the writes time out on the old worker.
    const [replacement] = (await startNodes(hanging.id)) as [FakeNode];
    try {
      const moved = { ...config, clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: (n === hanging ? replacement : n).url })) }] };
      const serving = (door = await old.reload(moved));
      let ejected = 0;
      serving.on('ejection', () => ejected++);
      assert.deepEqual((await Promise.all(writes)).map((r) => r.status), Array(EJECT_AFTER).fill(502));
      // Every message of the old worker has arrived once it has ended.
      await old.drained;
      assert.equal(ejected, 0);
      assert.equal(await ejections(serving, hanging.id), 0);
      assert.ok((await call(`${serving.url}/health`)).json<{ healthy: string[] }>().healthy.includes(hanging.id));
      const reply = await rpc(serving.url, 'board.append', board);
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['x-lakefront-served-by'], hanging.id);
    } finally {
      await door?.stop();
      door = null;
      await replacement.stop();
    }
  });

  it("a hedged read's loser cut off unanswered counts: hedging does not hide a node that hangs", async () => {
    // Every read hedges (at 30 ms, before any sample) and its hedge wins; the loser is cut off
    // 20 ms later. Without counting those, the node would never be ejected.
    const front = await start({ hedgeDelayMs: 30, hedgeBudgetPercent: 100, cancelGraceMs: 20, requestTimeoutMs: 10_000 });
    const [hanging] = nodes as [FakeNode];
    hanging.behaviour = { kind: 'hang' };
    const board = await boardOf(front, hanging);
    const verdict = once(front, 'ejection') as Promise<[EjectionEvent]>;
    for (let i = 0; i < EJECT_AFTER; i++) {
      const reply = await rpc(front.url, 'query.execute', board);
      assert.equal(reply.status, 200);
      assert.notEqual(reply.headers['x-lakefront-served-by'], hanging.id);
    }
    const [event] = await verdict;
    assert.equal(event.node, hanging.id);
    assert.equal(event.code, 'LF_ERR_ATTEMPT_CUT_OFF');
    assert.equal(event.ejected, true);
    // /stats counts them as the node's failures too.
    const counted = (await call(`${front.url}/stats`)).json<{ nodes: Record<string, { failures: number }> }>().nodes[hanging.id]!;
    assert.equal(counted.failures, EJECT_AFTER);
  });

  it('a node back in the rankings after its probe failed (a restart) has its hedge losers run to their answers: its cold, slow reads do not eject it (seed 000)', async () => {
    // As in the test above, every read hedges at 30 ms and a loser would be cut off 20 ms later.
    const front = await start({ hedgeDelayMs: 30, hedgeBudgetPercent: 100, cancelGraceMs: 20, requestTimeoutMs: 10_000 });
    const [cold] = nodes as [FakeNode];
    const board = await boardOf(front, cold);
    // It restarts: its probe fails, then passes again; its caches are cold, every read slow.
    cold.healthy = false;
    await front.memberships[0]!.probeOnce();
    cold.healthy = true;
    await front.memberships[0]!.probeOnce();
    assert.equal((await ranking(front.url, board))[0], cold.id, 'back in the ranking');
    cold.behaviour = { kind: 'answer', delayMs: 150 };
    for (let i = 0; i < EJECT_AFTER + 2; i++) {
      const outcome = Promise.race([once(cold, 'answered').then(() => 'answered'), once(cold, 'abandoned').then(() => 'cut off')]);
      const reply = await rpc(front.url, 'query.execute', board);
      assert.equal(reply.status, 200);
      assert.notEqual(reply.headers['x-lakefront-served-by'], cold.id, 'the hedge won');
      assert.equal(await outcome, 'answered', `read ${i}: the loser ran to its answer`);
    }
    assert.equal(await ejections(front, cold.id), 0);
    assert.ok((await call(`${front.url}/health`)).json<{ healthy: string[] }>().healthy.includes(cold.id));
    // An attempt whose client left is cut off after the grace as ever: nobody waits for it.
    const outcome = Promise.race([once(cold, 'answered').then(() => 'answered'), once(cold, 'abandoned').then(() => 'cut off')]);
    const socket = connect(front.port, '127.0.0.1');
    await once(socket, 'connect');
    socket.write(`GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: ${board}\r\n\r\n`);
    await once(cold, 'request');
    socket.destroy();
    assert.equal(await outcome, 'cut off');
  });

  it('a reload keeps a warming node warming, and a node out at the reload warms when it passes the new front door\'s first probe', async () => {
    const settings = { hedgeDelayMs: 30, hedgeBudgetPercent: 100, cancelGraceMs: 20, requestTimeoutMs: 10_000 };
    const first = await start(settings);
    const [restarted, down] = nodes as [FakeNode, FakeNode];
    // One node restarts before the reload (out, then back: warming); another is out at the reload.
    restarted.healthy = false;
    down.healthy = false;
    await first.memberships[0]!.probeOnce();
    restarted.healthy = true;
    await first.memberships[0]!.probeOnce();
    // The other is back by the time the new front door probes it first (nothing changes there
    // but that return).
    down.healthy = true;
    const next = await first.reload(doorConfig(nodes, { ejectAfter: EJECT_AFTER, ...settings }, { threads: 1, ejectMs: 60_000 }));
    door = next;
    await first.drained;
    for (const cold of [restarted, down]) {
      const board = await boardOf(next, cold);
      assert.equal((await ranking(next.url, board))[0], cold.id);
      cold.behaviour = { kind: 'answer', delayMs: 150 };
      for (let i = 0; i < EJECT_AFTER; i++) {
        const outcome = Promise.race([once(cold, 'answered').then(() => 'answered'), once(cold, 'abandoned').then(() => 'cut off')]);
        const reply = await rpc(next.url, 'query.execute', board);
        assert.notEqual(reply.headers['x-lakefront-served-by'], cold.id, 'the hedge won');
        assert.equal(await outcome, 'answered', `${cold.id}, read ${i}: the loser ran to its answer`);
      }
      cold.behaviour = { kind: 'answer' };
      assert.equal(await ejections(next, cold.id), 0);
    }
  });

  it('a hedge loser whose answer came while the worker was stalled past its grace is answered, not cut off', async () => {
    // One cut-off loser would eject the node.
    const front = await start({ hedgeDelayMs: 30, hedgeBudgetPercent: 100, cancelGraceMs: 200, requestTimeoutMs: 10_000, ejectAfter: 1 });
    const [slow] = nodes as [FakeNode];
    slow.behaviour = { kind: 'answer', delayMs: 300 };
    const board = await boardOf(front, slow);
    const abandoned = slow.abandoned;
    const reply = await rpc(front.url, 'query.execute', board);
    assert.equal(reply.status, 200);
    assert.notEqual(reply.headers['x-lakefront-served-by'], slow.id, 'the hedge won');
    // The loser's grace ends about 200 ms after the hedge won, its answer comes at 300 ms: both
    // while the worker is stuck.
    front.hangWorker(1, 800);
    // Asked during the stall, answered after the worker has read the loser's answer (or cut it off).
    assert.equal(await ejections(front, slow.id), 0);
    assert.equal(slow.abandoned, abandoned, 'its answer was read');
  });

  it('an attempt cut off because its client left is not the node\'s failure: a client hanging up on slow requests ejects nothing', async () => {
    const front = await start({ cancelGraceMs: 20, hedgeMode: 'off' });
    const [slow] = nodes as [FakeNode];
    // Every node slow (were the native one ejected, its boards' requests would go on to the next).
    for (const n of nodes) n.behaviour = { kind: 'answer', delayMs: 2_000 };
    const board = await boardOf(front, slow);
    // The first of the nodes to emit `event`; the others stop listening.
    const any = async (event: string): Promise<unknown> => {
      const done = new AbortController();
      try {
        return await Promise.race(nodes.map((n) => once(n, event, { signal: done.signal })));
      } finally {
        done.abort();
      }
    };
    for (let i = 0; i < EJECT_AFTER * 2; i++) {
      const socket = connect(Number(new URL(front.url).port), '127.0.0.1');
      socket.on('error', () => undefined);
      const received = any('request');
      socket.write(`POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: ${board}\r\ncontent-length: 2\r\n\r\n{}`);
      await received;
      const cut = any('abandoned'); // the front door closes the attempt's connection
      socket.destroy();
      await cut;
    }
    assert.equal(await ejections(front, slow.id), 0);
    assert.ok((await call(`${front.url}/health`)).json<{ healthy: string[] }>().healthy.includes(slow.id));
  });

  it('a node answering bytes that are not HTTP is ejected under the undici client too, and named so (its parser errors carry no code)', async () => {
    const front = await start({ upstreamClient: 'undici', hedgeMode: 'off' });
    const [bad] = nodes as [FakeNode];
    bad.behaviour = { kind: 'garbage' };
    const board = await boardOf(front, bad);
    const verdict = once(front, 'ejection') as Promise<[EjectionEvent]>;
    // A bare write it took gets 502, its reason the malformed answer; reads go on to another node.
    const write = await rpc(front.url, 'board.append', board);
    assert.equal(write.status, 502);
    assert.match(write.text, /LF_ERR_UPSTREAM_BAD_RESPONSE/);
    for (let i = 1; i < EJECT_AFTER; i++) assert.equal((await rpc(front.url, 'query.execute', board)).status, 200);
    const [event] = await verdict;
    assert.equal(event.node, bad.id);
    assert.equal(event.code, 'LF_ERR_UPSTREAM_BAD_RESPONSE');
    assert.equal(event.ejected, true);
  });

  it('a request the undici client refuses to send is not the node\'s failure', async () => {
    const front = await start({ upstreamClient: 'undici', requestTimeoutMs: 300, hedgeMode: 'off' });
    const [target] = nodes as [FakeNode];
    const board = await boardOf(front, target);
    // A DEL in a header value: uWS takes it, undici refuses it (UND_ERR_INVALID_ARG) on every node.
    const raw = () =>
      rawExchange(front.url, Buffer.from(`POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: ${board}\r\nx-v: a\x7fb\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`, 'latin1'));
    const hits = nodes.map((n) => n.hits());
    for (let i = 0; i < EJECT_AFTER * 2; i++) assert.match(await raw(), /^HTTP\/1\.1 502/);
    assert.deepEqual(nodes.map((n) => n.hits()), hits, 'nothing reached a node');
    for (const n of nodes) assert.equal(await ejections(front, n.id), 0);
  });

  it('a path beyond ASCII goes to the node under the undici client too, as its UTF-8 bytes, and nothing counts toward ejection', async () => {
    // undici refused such a path (UND_ERR_INVALID_ARG: a 502, and the pool's slot never given
    // back); it now gets the UTF-8 bytes the h1 client sends.
    const front = await start({ upstreamClient: 'undici', requestTimeoutMs: 300, hedgeMode: 'off' });
    const [target] = nodes as [FakeNode];
    const board = await boardOf(front, target);
    const raw = (path: string) =>
      rawExchange(front.url, Buffer.concat([Buffer.from('POST '), Buffer.from(path, 'utf8'), Buffer.from(` HTTP/1.1\r\nhost: x\r\nx-lakefront-board: ${board}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`)]));
    for (let i = 0; i < EJECT_AFTER * 2; i++) {
      const answer = await raw('/rpc/query.execute?q=\u4e2d');
      // The node's own answer, relayed (node:http's parser refuses the raw bytes: its 400).
      assert.match(answer, new RegExp(`^HTTP/1\\.1 400 [^]*\\r\\nx-lakefront-served-by: ${target.id}\\r\\n`, 'i'));
    }
    for (const n of nodes) assert.equal(await ejections(front, n.id), 0);
  });
});

describe('nodeFailure: which attempt errors are the node\'s', () => {
  const error = (code: string, unsent = false) => Object.assign(new Error(code), { code, unsent });
  it('counts no answer in time, resets, refused or unmade connections, names not found and bytes that are not HTTP', () => {
    for (const code of ['LF_ERR_UPSTREAM_TIMEOUT', 'LF_ERR_UPSTREAM_CLOSED', 'ECONNREFUSED', 'LF_ERR_UPSTREAM_CONNECT_TIMEOUT', 'LF_ERR_UPSTREAM_BAD_RESPONSE', 'ECONNRESET', 'EPIPE', 'UND_ERR_SOCKET', 'UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT', 'ENOTFOUND', 'HPE_INVALID_CONSTANT']) {
      assert.equal(nodeFailure(error(code)), code);
    }
    assert.equal(nodeFailure(error('ECONNREFUSED', true)), 'ECONNREFUSED', 'refused: never sent, and the node\'s all the same');
  });
  it("counts none of the front door's own: queued past the timeout behind its own connection limit, its pool closing, its size limit, a request undici would not send; nor a resolver that did not answer", () => {
    assert.equal(nodeFailure(error('LF_ERR_UPSTREAM_TIMEOUT', true)), null);
    for (const code of ['LF_ERR_POOL_CLOSED', 'LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE', 'LF_ERR_ATTEMPT_CANCELLED', 'UND_ERR_INVALID_ARG', 'UND_ERR_ABORTED', 'UND_ERR_DESTROYED', 'UND_ERR_CLOSED', 'EAI_AGAIN']) {
      assert.equal(nodeFailure(error(code)), null, code);
    }
    assert.equal(nodeFailure(new Error('no code')), null);
    assert.equal(nodeFailure(null), null);
  });
});

describe('isUnreachable: which attempt errors hold a node out at once (--unreachable-hold-ms)', () => {
  it('holds a node whose connection was refused or not made in time, or whose name was not found', () => {
    for (const code of ['ECONNREFUSED', 'EHOSTUNREACH', 'ENETUNREACH', 'ETIMEDOUT', 'LF_ERR_UPSTREAM_CONNECT_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT', 'ENOTFOUND']) {
      assert.equal(isUnreachable(code), true, code);
    }
  });
  it('does not hold a node that was reached (a late answer, a reset, a closed connection, bytes that are not HTTP), nor one whose resolver did not answer', () => {
    for (const code of ['LF_ERR_UPSTREAM_TIMEOUT', 'ECONNRESET', 'EPIPE', 'LF_ERR_UPSTREAM_CLOSED', 'LF_ERR_UPSTREAM_BAD_RESPONSE', 'UND_ERR_HEADERS_TIMEOUT', 'LF_ERR_POOL_CLOSED', 'EAI_AGAIN']) {
      assert.equal(isUnreachable(code), false, code);
    }
  });
});

describe('ejection and a leader-pinned route (etcd)', () => {
  const members = ['ejl-1', 'ejl-2', 'ejl-3'];
  const servers: Server[] = [];
  /** The member whose writes stall (a stalled leader stalls the writes followers forward too). */
  let stalled: string | null = null;
  /** The member that answers its status knowing no leader (cut off from its peers). */
  let cutOff: string | null = null;
  const puts = new Map<string, number>();
  let etcd = '';
  let door: FrontDoor | null = null;
  before(async () => {
    for (const [i, id] of members.entries()) {
      const server = createServer((req, res) => {
        req.resume();
        req.on('end', () => {
          if (req.url === '/version') return void res.end('{"etcdserver":"3.5.0"}');
          if (req.url === '/v3/maintenance/status') return void res.end(JSON.stringify({ header: { member_id: String(101 + i) }, leader: cutOff === id ? '0' : '101', raftTerm: '5' }));
          if (req.url === '/v3/kv/put') {
            puts.set(id, (puts.get(id) ?? 0) + 1);
            if (stalled === id) return; // its writes stall (a slow disk at the leader, say)
          }
          res.end('{"header":{}}');
        });
      });
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      servers.push(server);
    }
    etcd = servers.map((s, i) => `${members[i]}=http://127.0.0.1:${(s.address() as AddressInfo).port}`).join(',');
  });
  afterEach(async () => {
    await door?.stop();
    door = null;
    stalled = null;
    cutOff = null;
  });
  after(async () => {
    for (const s of servers) {
      s.closeAllConnections();
      s.close();
    }
  });

  async function start(policy: string): Promise<FrontDoor> {
    const parsed = parseCommand(['--etcd', etcd, '--etcd-policy', policy, '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--request-timeout-ms', '200', '--eject-after', String(EJECT_AFTER)], {});
    assert.ok(parsed.kind === 'run');
    return (door = await FrontDoor.start(parsed.config));
  }
  const stats = async (front: FrontDoor) => (await call(`${front.url}/stats`)).json<{ leaders: Record<string, string>; nodes: Record<string, { ejections: number }> }>();
  const put = (front: FrontDoor) => call(`${front.url}/v3/kv/put`, { method: 'POST', body: '{"key":"Zm9v","value":"YmFy"}' });

  it('writes that time out at the leader do not eject it: they would go to it anyway', async () => {
    const front = await start('hybrid');
    // The probe has found the leader (its first round runs at start).
    while ((await stats(front)).leaders.etcd !== 'ejl-1') await once(front.leaderProbes[0]!, 'change');
    stalled = 'ejl-1';
    const before = puts.get('ejl-1') ?? 0;
    for (let i = 0; i < EJECT_AFTER * 2; i++) assert.equal((await put(front)).status, 502, 'sent once, timed out: outcome unknown');
    stalled = null;
    assert.equal((puts.get('ejl-1') ?? 0) - before, EJECT_AFTER * 2, 'each write sent to the leader once');
    const seen = await stats(front);
    assert.equal(seen.nodes['ejl-1']!.ejections, 0);
    assert.equal(seen.leaders.etcd, 'ejl-1');
    const reply = await put(front);
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-served-by'], 'ejl-1');
  });

  it('holds a member out of the rankings while it knows no leader and the others do (cut off from its peers), and lets it back once it names one', async () => {
    const front = await start('hybrid');
    while ((await stats(front)).leaders.etcd !== 'ejl-1') await once(front.leaderProbes[0]!, 'change');
    const healthy = async () => (await call(`${front.url}/health`)).json<{ healthy: string[] }>().healthy;
    assert.ok((await healthy()).includes('ejl-3'));
    cutOff = 'ejl-3';
    // Its /version still answers: only its status says it is cut off.
    while ((await healthy()).includes('ejl-3')) await once(front.leaderProbes[0]!, 'leaderless');
    for (let i = 0; i < 12; i++) {
      const read = await call(`${front.url}/v3/kv/range`, { method: 'POST', body: '{"key":"Zm9v"}' });
      assert.equal(read.status, 200);
      assert.notEqual(read.headers['x-lakefront-served-by'], 'ejl-3', 'no read to a member that may be stale');
    }
    assert.equal((await stats(front)).leaders.etcd, 'ejl-1', 'the leader stays published');
    cutOff = null;
    while (!(await healthy()).includes('ejl-3')) await once(front.memberships[0]!, 'change');
  });

  it('nor do writes that time out at a follower (round_robin): a follower waits on the leader for every write', async () => {
    const front = await start('round_robin');
    stalled = 'ejl-2';
    const before = puts.get('ejl-2') ?? 0;
    let timedOut = 0;
    // Round robin: a third of the writes go to the follower whose writes stall.
    for (let i = 0; i < EJECT_AFTER * 6; i++) if ((await put(front)).status === 502) timedOut++;
    assert.ok(timedOut >= EJECT_AFTER, `${timedOut} writes timed out at ejl-2`);
    assert.equal((puts.get('ejl-2') ?? 0) - before, timedOut);
    for (const id of members) assert.equal((await stats(front)).nodes[id]!.ejections, 0, id);
  });
});

describe('Membership.eject', () => {
  const members = (n: number) => Array.from({ length: n }, (_, i) => ({ id: `m${i}`, url: `http://127.0.0.1:${10_000 + i}` }));
  const policy = { baseMs: 60_000, maxMs: 300_000, maxPercent: 10 };

  it('allows maxPercent of the members out by ejection at once, and always one', () => {
    const twenty = new Membership({ members: members(20) });
    assert.equal(twenty.eject('m0', policy).ejected, true);
    assert.equal(twenty.eject('m1', policy).ejected, true);
    const third = twenty.eject('m2', policy);
    assert.deepEqual(third, { ejected: false, reason: '2 of 20 members already out by ejection, and at most 10% (at least one) may be at once' });
    assert.equal(twenty.isHealthy('m2'), true, 'a refusal changes nothing');
    assert.deepEqual(twenty.eject('m0', policy), { ejected: false, reason: 'already ejected' });
    const half = new Membership({ members: members(4) });
    assert.equal(half.eject('m0', { ...policy, maxPercent: 50 }).ejected, true);
    assert.equal(half.eject('m1', { ...policy, maxPercent: 50 }).ejected, true);
    assert.equal(half.eject('m2', { ...policy, maxPercent: 50 }).ejected, false);
  });

  it('counts a member past its hold that fails its probe as out for its health, not against the cap', async () => {
    let down = '';
    const m = new Membership({
      members: members(3),
      fetch: async (url) => new Response('{}', { status: String(url).includes(`:${10_000 + Number(down.slice(1))}/`) ? 503 : 200 }),
    });
    const short = { baseMs: 30, maxMs: 30, maxPercent: 10 };
    assert.equal(m.eject('m0', short).ejected, true);
    assert.deepEqual(m.eject('m1', short), { ejected: false, reason: '1 of 3 members already out by ejection, and at most 10% (at least one) may be at once' });
    await delay(Math.max(0, m.heldUntil('m0') - performance.now()) + 1);
    down = 'm0'; // it died meanwhile
    await m.probeOnce();
    assert.equal(m.isHealthy('m0'), false);
    assert.equal(m.ejectionsOf('m0').ejected, false, 'out for its health now');
    assert.equal(m.eject('m1', short).ejected, true, 'the slot is free');
  });

  it('never ejects the last routable member', () => {
    const two = new Membership({ members: [...members(2), { id: 'drained', url: 'http://127.0.0.1:9999', weight: 0 }] });
    two.markUnhealthy('m1');
    assert.deepEqual(two.eject('m0', { ...policy, maxPercent: 100 }), { ejected: false, reason: 'it is the last routable member' });
    assert.equal(two.isHealthy('m0'), true);
  });

  it('holds a member ejected again soon after its hold longer each time, up to maxMs, and starts again once it stayed in', async () => {
    const short = { baseMs: 200, maxMs: 500, maxPercent: 100 };
    // Every probe passes: a member is back as soon as its hold has passed and it is probed.
    const m = new Membership({ members: members(3), fetch: async () => new Response('{}') });
    const holds: number[] = [];
    for (let i = 0; i < 4; i++) {
      const verdict = m.eject('m0', short);
      assert.ok(verdict.ejected);
      holds.push(verdict.holdMs);
      // Back (its hold passed, a probe passed), and failing again at once. A timer may fire a
      // little before the hold's end by performance.now() (it counts from the loop's cached
      // time, older under load): waited out until the hold has passed by the same clock.
      while (performance.now() <= m.heldUntil('m0')) await delay(m.heldUntil('m0') - performance.now() + 1);
      await m.probeOnce();
      assert.equal(m.isHealthy('m0'), true);
    }
    assert.deepEqual(holds, [200, 400, 500, 500]);
    // In for a whole base period: the streak starts again.
    await delay(short.baseMs + 5);
    const fresh = m.eject('m0', short);
    assert.ok(fresh.ejected && fresh.holdMs === 200 && fresh.streak === 1, JSON.stringify(fresh));
    assert.equal(m.ejectionsOf('m0').ejections, 5);
  });
});

describe('ejection settings', () => {
  it('refuses bad values, naming them', async () => {
    const nodes = ['--nodes', 'a=http://127.0.0.1:1'];
    for (const [args, pattern] of [
      [['--eject-after', '1001'], /--eject-after: 1001 is out of range 0\.\.1000/],
      [['--eject-after', '2.5'], /--eject-after: not a whole number: "2\.5"/],
      [['--eject-ms', '0'], /--eject-ms: 0 is out of range 1\.\.3600000/],
      [['--eject-max-percent', '0'], /--eject-max-percent: 0 is out of range 1\.\.100/],
    ] as const) {
      assert.throws(() => parseCommand([...args, ...nodes], {}), pattern);
    }
    const parsed = parseCommand(['--eject-after', '0', '--eject-ms', '5000', ...nodes], { LAKEFRONT_EJECT_MAX_PERCENT: '50' });
    assert.ok(parsed.kind === 'run');
    assert.equal(parsed.config.settings.ejectAfter, 0);
    assert.equal(parsed.config.ejectMs, 5000);
    assert.equal(parsed.config.ejectMaxPercent, 50);
    await assert.rejects(route({ nodes: [{ id: 'a', url: 'http://127.0.0.1:1' }], ejectAfter: 1.5 }), /^ConfigError: ejectAfter: bad value 1\.5 \(a whole number\)$/);
    await assert.rejects(route({ nodes: [{ id: 'a', url: 'http://127.0.0.1:1' }], ejectMs: 0 }), /ejectMs: bad value 0 \(milliseconds, 1-3600000\)/);
  });
});
