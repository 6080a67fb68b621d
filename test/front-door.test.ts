/**
 * The multi-threaded front door end to end: real worker threads on a real port, real upstream
 * servers, real sockets.
 */
import assert from 'node:assert/strict';
import { Buffer } from 'node:buffer';
import { EventEmitter, once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, createServer, Server } from 'node:net';
import { after, afterEach, before, describe, it } from 'node:test';
import type { Worker } from 'node:worker_threads';
import { DROPPED_REQUEST_HEADERS } from '../src/contract.js';
import { parseCommand } from '../src/config/config.js';
import { parseFileConfig } from '../src/config/file.js';
import { ipv6Text } from '../src/server/client-address.js';
import { route, type RouterServer } from '../src/router/index.js';
import { defaultSettings, RPC_ROUTE } from '../src/server/settings.js';
import { FrontDoor, type FrontDoorConfig } from '../src/server/supervisor.js';
import { Client, Pool } from 'undici';
import { doorConfig } from './fixtures/door.js';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';
import { startRawNode, type RawNode } from './fixtures/raw-node.js';
import { call, inTurn, ranking, rawExchange, rpc, type Reply } from './fixtures/http.js';

async function frontOver(nodes: FakeNode[], options: { hedgeDelayMs?: number; healthIntervalMs?: number } = {}): Promise<RouterServer> {
  return route({
    nodes: nodes.map((n) => ({ id: n.id, url: n.url })),
    port: 0,
    host: '127.0.0.1',
    threads: 2,
    hedgeDelayMs: options.hedgeDelayMs ?? 50,
    healthIntervalMs: options.healthIntervalMs ?? 100,
  });
}

/** Waits for membership changes until `predicate` holds. */
async function until(server: RouterServer, predicate: () => boolean): Promise<void> {
  while (!predicate()) await once(server.membership, 'change');
}

/** A JSON failure: its status and its code. */
function assertFailure(reply: Reply, status: number, code: string): void {
  assert.equal(reply.status, status, reply.text);
  assert.equal(reply.json<{ code: string }>().code, code);
}

function byId(nodes: FakeNode[], id: string): FakeNode {
  const node = nodes.find((n) => n.id === id);
  assert.ok(node, `no node ${id}`);
  return node;
}

describe('front door: the hedge budget', () => {
  let nodes: FakeNode[];
  let server: RouterServer;
  before(async () => {
    nodes = await startNodes('node-a', 'node-b', 'node-c');
    // One worker thread: one budget. 10% of requests, a burst of 10 saved tokens.
    server = await route({
      nodes: nodes.map((n) => ({ id: n.id, url: n.url })),
      port: 0,
      host: '127.0.0.1',
      threads: 1,
      hedgeDelayMs: 30,
      hedgeBudgetPercent: 10,
      healthIntervalMs: 60_000,
    });
  });
  after(async () => {
    await server.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  it('a stalled read that found the budget spent is hedged when requests bring a token', async () => {
    const [primary, runnerUp] = await ranking(server.url, 'budget-board');
    const stalling = byId(nodes, primary!);
    stalling.behaviour = { kind: 'answer', delayMs: 5_000 };
    // A deadline for the whole exchange of requests: a regression fails here, not on the stall.
    let expired!: (reason: Error) => void;
    const deadline = new Promise<never>((_, reject) => (expired = reject));
    const timer = setTimeout(() => expired(new Error('the stalled reads were not all hedged within 3 s')), 3_000);
    try {
      // Twelve reads stall on the same node. The ten saved tokens (and the twelve reads' own
      // deposits) hedge most of them: at their trigger down to the reserve, at twice it from the
      // reserve. The rest find the budget spent and wait for tokens.
      let answered = 0;
      let tenAnswered!: () => void;
      const ten = new Promise<void>((resolve) => (tenAnswered = resolve));
      const stalled = Array.from({ length: 12 }, () =>
        rpc(server.url, 'query.execute', 'budget-board').then((reply) => {
          if (++answered === 10) tenAnswered();
          return reply;
        }),
      );
      // The ten saved tokens are spent once ten have their answers (from their hedges).
      await Promise.race([ten, deadline]);
      // Reads elsewhere bring a tenth of a token each.
      let fastBoard = 0;
      const fastBoards: string[] = [];
      while (fastBoards.length < 4) {
        const board = `fast-${fastBoard++}`;
        if ((await ranking(server.url, board))[0] !== primary) fastBoards.push(board);
      }
      for (let i = 0; i < 40; i++) {
        const reply = await rpc(server.url, 'query.execute', fastBoards[i % fastBoards.length]!);
        assert.equal(reply.status, 200);
      }
      const replies = await Promise.race([Promise.all(stalled), deadline]);
      for (const reply of replies) {
        assert.equal(reply.status, 200);
        assert.equal(reply.headers['x-lakefront-served-by'], runnerUp, 'answered by the hedge, not after the 5 s stall');
        assert.equal(reply.headers['x-lakefront-hedged'], '1');
      }
    } finally {
      clearTimeout(timer);
      stalling.behaviour = { kind: 'answer' };
    }
  });

  it('refuses a bad hedge budget, hedge delay, health interval, request or drain timeout, host or an https node (the built-in client speaks http), naming it', async () => {
    const nodes = [{ id: 'x', url: 'http://127.0.0.1:9' }];
    await assert.rejects(route({ nodes, hedgeBudgetPercent: 101 }), /hedgeBudgetPercent: bad value 101/);
    await assert.rejects(route({ nodes, drainTimeoutMs: Number.NaN }), /drainTimeoutMs: bad value NaN/);
    await assert.rejects(route({ nodes, drainTimeoutMs: -1 }), /drainTimeoutMs: bad value -1/);
    // The same ranges as the command's flags, each refused as a ConfigError with its own name.
    for (const [options, pattern] of [
      [{ hedgeDelayMs: -1 }, /^hedgeDelayMs: bad value -1 \(milliseconds, 0-600000\)$/],
      [{ hedgeDelayMs: Number.NaN }, /^hedgeDelayMs: bad value NaN/],
      [{ requestTimeoutMs: 0 }, /^requestTimeoutMs: bad value 0 \(milliseconds, 1-3600000\)$/],
      [{ requestTimeoutMs: -1 }, /^requestTimeoutMs: bad value -1/],
      [{ healthIntervalMs: 0 }, /^healthIntervalMs: bad value 0 \(milliseconds, 10-3600000\)$/],
      [{ unreachableHoldMs: -1 }, /^unreachableHoldMs: bad value -1 \(milliseconds, 0-3600000\)$/],
      [{ upstreamPipelining: 0 }, /^upstreamPipelining: bad value 0 \(requests a connection, 1-256\)$/],
      [{ upstreamPipelining: 2.5 }, /^upstreamPipelining: bad value 2\.5 \(a whole number\)$/],
    ] as const) {
      await assert.rejects(route({ nodes, ...options }), (err: Error) => {
        assert.equal(err.name, 'ConfigError');
        assert.equal((err as { code?: string }).code, 'LF_ERR_CONFIG');
        assert.match(err.message, pattern);
        return true;
      });
    }
    await assert.rejects(route({ nodes, host: 42 as unknown as string }), /host: bad value 42/);
    // Before any worker starts, not as a plain Error from a worker later on.
    await assert.rejects(route({ nodes: [{ id: 's', url: 'https://127.0.0.1:9' }], port: 0 }), (err: Error) => {
      assert.equal(err.name, 'ConfigError');
      assert.match(err.message, /node "s": https:\/\/127.0.0.1:9 is https/);
      return true;
    });
  });
});

describe('front door: hedging at a node\'s own p95', () => {
  let nodes: FakeNode[];
  let door: FrontDoor;
  before(async () => {
    nodes = await startNodes('p95-a', 'p95-b', 'p95-c');
    // One worker (one latency window a node); every slow request may hedge (budget 100%); a
    // fallback delay far above anything here, so only a learned p95 can trigger a hedge.
    door = await FrontDoor.start(doorConfig(nodes, { hedgeDelayMs: 60_000, hedgeBudgetPercent: 100, cancelGraceMs: 20 }));
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  it('hedges at the p95 it learned (not the fallback), and learns a node that turned slow for good', async () => {
    const [home, runnerUp] = await ranking(door.url, 'p95-board');
    const node = byId(nodes, home!);
    for (let i = 0; i < 20; i++) assert.equal((await rpc(door.url, 'query.execute', 'p95-board')).headers['x-lakefront-served-by'], home);
    // Slow from now on: 100 ms, far past its learned p95 (a few ms), far under the 60 s fallback.
    node.behaviour = { kind: 'answer', delayMs: 100 };
    try {
      const hedged: boolean[] = [];
      // The window climbs in steps of about seven cut-off samples (its p95 is its seventh
      // highest) of trigger + hedge + grace each: some 30 requests to 100 ms. Eighty leave margin.
      for (let i = 0; i < 80; i++) {
        const reply = await rpc(door.url, 'query.execute', 'p95-board');
        assert.equal(reply.status, 200);
        hedged.push(reply.headers['x-lakefront-hedged'] === '1');
        if (i === 0) assert.equal(reply.headers['x-lakefront-served-by'], runnerUp, 'hedged at the learned p95');
      }
      assert.equal(hedged[0], true);
      // The losers it cut off count as samples of at least their time: the window learns 100 ms,
      // and hedging falls from every request towards the tail. Not all the way to 5% yet: the
      // 128-sample window still holds the fast and cut-off samples of before, so its p95 sits
      // near the 75th percentile of the new latencies (about one request in four hedged; 20 of
      // 20 without the cut-off samples).
      const late = hedged.slice(-20).filter(Boolean).length;
      assert.ok(late <= 10, `${late} of the last 20 of 80 requests hedged`);
    } finally {
      node.behaviour = { kind: 'answer' };
    }
  });
});

describe('front door: HTTP surface', () => {
  let nodes: FakeNode[];
  let server: RouterServer;
  before(async () => {
    nodes = await startNodes('node-a', 'node-b', 'node-c');
    server = await frontOver(nodes, { hedgeDelayMs: 50, healthIntervalMs: 60_000 });
  });
  after(async () => {
    await server.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });
  afterEach(() => {
    for (const n of nodes) {
      n.behaviour = { kind: 'answer' };
      n.received.length = 0;
    }
  });

  it('refuses a request with two host lines (RFC 9112 3.2) or two board headers with 400, and forwards nothing', async () => {
    const ask = (extra: string) => rawExchange(server.url, `POST /rpc/board.write HTTP/1.1\r\nhost: a\r\nx-lakefront-board: two-b\r\n${extra}content-length: 2\r\nconnection: close\r\n\r\n{}`);
    for (const [extra, name] of [['host: b\r\n', 'host'], ['x-lakefront-board: two-c\r\n', 'x-lakefront-board'], ['x-lakefront-board: two-b\r\n', 'x-lakefront-board']] as const) {
      const answer = await ask(extra);
      assert.match(answer, /^HTTP\/1\.1 400 /, extra);
      assert.equal(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)).error, `more than one ${name} header`);
    }
    assert.equal(nodes.reduce((n, node) => n + node.received.length, 0), 0, 'no node saw any of them');
    assert.match(await ask(''), /^HTTP\/1\.1 200 /, 'one of each goes through');
  });

  it('answers 401 with a JSON reason when the board header is missing', async () => {
    const reply = await call(`${server.url}/rpc/query.execute`, { method: 'POST', body: '{}' });
    assert.equal(reply.status, 401);
    assert.match(reply.json<{ error: string }>().error, /x-lakefront-board/);
    assert.equal(nodes.reduce((s, n) => s + n.hits(), 0), 0, 'nothing was forwarded');
  });

  it('answers 404 {"error":"not found","code":"LF_ERR_NOT_FOUND"} for anything else', async () => {
    for (const [method, path] of [['GET', '/nope'], ['POST', '/healthz'], ['DELETE', '/']]) {
      const reply = await call(`${server.url}${path}`, { method: method! });
      assert.equal(reply.status, 404, `${method} ${path}`);
      assert.deepEqual(reply.json(), { error: 'not found', code: 'LF_ERR_NOT_FOUND' });
    }
  });

  it('reports health and a board\'s ranking', async () => {
    const health = (await call(`${server.url}/health`)).json<{ ok: boolean; healthy: string[] }>();
    assert.deepEqual(health, { ok: true, healthy: ['node-a', 'node-b', 'node-c'] });
    const info = (await call(`${server.url}/route?board=b-1`)).json<{ board: string; ranking: { id: string; weight: number }[]; healthy: string[] }>();
    assert.equal(info.board, 'b-1');
    assert.deepEqual(info.ranking.map((r) => r.id).sort(), ['node-a', 'node-b', 'node-c']);
    assert.ok(info.ranking.every((r) => r.weight === 1));
    assert.deepEqual(server.router.route('b-1').map((n) => n.id), info.ranking.map((r) => r.id), 'the workers agree with the library');
    assert.equal((await call(`${server.url}/route`)).status, 400);
    // Decoded as a form's query: %XX escapes, + a space. A malformed escape is no board at all.
    const boardOf = async (query: string): Promise<string> => (await call(`${server.url}/route?${query}`)).json<{ board: string }>().board;
    assert.equal(await boardOf('board=a%2Bb'), 'a+b');
    assert.equal(await boardOf('board=a+b'), 'a b');
    assert.equal(await boardOf('x=1&board=%C3%A9t%C3%A9'), 'été');
    // Two boards, or one no request may carry (as two key lines, or a longer key, on a request).
    for (const [query, why] of [['board=a&board=b', /^the query parameter "board" is given twice$/], ['board=a&x=1&x=2', /"x" is given twice/], [`board=${'k'.repeat(1025)}`, /^board longer than 1024 characters$/]] as const) {
      const reply = await call(`${server.url}/route?${query}`);
      assert.equal(reply.status, 400, query.slice(0, 40));
      assert.match(reply.json<{ error: string }>().error, why);
    }
    assert.equal(await boardOf(`board=${'k'.repeat(1024)}`), 'k'.repeat(1024));
    for (const query of ['board=%ZZ', 'board=100%', 'board=%C3', 'bo%rd=x']) {
      const reply = await call(`${server.url}/route?${query}`);
      assert.equal(reply.status, 400, query);
      assert.match(reply.json<{ error: string }>().error, /^malformed percent-encoding in the query parameter "bo(ard|%rd)"$/, query);
    }
  });

  it('keeps capacity apart from health: a healthy node at capacity 0 leaves the rankings, not /health', async () => {
    server.membership.setCapacity('node-a', 0);
    try {
      const info = (await call(`${server.url}/route?board=b-1`)).json<{ ranking: { id: string }[]; healthy: string[] }>();
      assert.deepEqual(info.ranking.map((r) => r.id).sort(), ['node-b', 'node-c']);
      assert.deepEqual(info.healthy, ['node-a', 'node-b', 'node-c']);
      const health = (await call(`${server.url}/health`)).json<{ healthy: string[] }>();
      assert.deepEqual(health.healthy, ['node-a', 'node-b', 'node-c']);
      const stats = (await call(`${server.url}/stats`)).json<{ healthy: string[] }>();
      assert.deepEqual(stats.healthy, health.healthy, '/stats and /health agree');
    } finally {
      server.membership.setCapacity('node-a', 1);
    }
    const info = (await call(`${server.url}/route?board=b-1`)).json<{ ranking: { id: string }[] }>();
    assert.deepEqual(info.ranking.map((r) => r.id).sort(), ['node-a', 'node-b', 'node-c']);
  });

  it('proxies to the board\'s native node and passes status, content type, headers and body through', async () => {
    const [native] = await ranking(server.url, 'board-7');
    byId(nodes, native!).behaviour = {
      kind: 'answer',
      status: 418,
      body: 'short and stout',
      // The node's own served-by and hedged lines must not reach the client beside ours.
      headers: { 'content-type': 'text/plain; charset=utf-8', 'x-extra': 'kept', 'X-Lakefront-Served-By': 'spoof', 'x-lakefront-hedged': '1', 'x-last': 'last' },
    };
    const reply = await rpc(server.url, 'query.execute', 'board-7', { body: '{"sql":"select 1"}' });
    assert.equal(reply.status, 418);
    assert.equal(reply.text, 'short and stout');
    assert.equal(reply.headers['content-type'], 'text/plain; charset=utf-8');
    assert.equal(reply.headers['x-extra'], 'kept');
    assert.equal(reply.headers['x-last'], 'last');
    assert.equal(reply.headers['x-node'], native);
    assert.equal(reply.headers['x-lakefront-served-by'], native);
    assert.equal(reply.headers['x-lakefront-hedged'], '0');
    // One date and one content-length (uWS writes its own; the node's are not relayed).
    assert.equal(typeof reply.headers['date'], 'string');
    assert.equal(reply.headers['content-length'], String('short and stout'.length));
    const got = byId(nodes, native!).received[0]!;
    assert.equal(got.method, 'POST');
    assert.equal(got.path, '/rpc/query.execute');
    assert.equal(got.body, '{"sql":"select 1"}');
    assert.equal(got.headers['x-lakefront-board'], 'board-7');
  });

  it('forwards Authorization verbatim and drops hop-by-hop headers', async () => {
    const [native] = await ranking(server.url, 'auth-board');
    const secret = 'Bearer s3cr3t-t0k3n, "odd"  spacing';
    await rpc(server.url, 'query.execute', 'auth-board', {
      headers: { authorization: secret, 'x-custom': 'yes', 'proxy-authorization': 'Basic Zm9v', te: 'trailers' },
    });
    const headers = byId(nodes, native!).received[0]!.headers;
    assert.equal(headers.authorization, secret);
    assert.equal(headers['x-custom'], 'yes');
    assert.equal(headers['proxy-authorization'], undefined);
    assert.equal(headers.te, undefined);
  });

  it('drops every hop-by-hop request header (each name in DROPPED_REQUEST_HEADERS)', async () => {
    const [native] = await ranking(server.url, 'hop-board');
    // Framing ones are covered by the body tests; every other name is sent on one raw request.
    const framing = new Set(['host', 'content-length', 'transfer-encoding']);
    const names = [...DROPPED_REQUEST_HEADERS].filter((name) => !framing.has(name) && name !== 'connection');
    const head = `GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: hop-board\r\n${names.map((name) => `${name}: v\r\n`).join('')}x-kept: 1\r\nconnection: close\r\n\r\n`;
    const answer = await rawExchange(server.url, head);
    assert.match(answer, /^HTTP\/1\.1 200/);
    const headers = byId(nodes, native!).received[0]!.headers;
    assert.equal(headers['x-kept'], '1');
    for (const name of [...names, 'connection']) assert.equal(headers[name], undefined, name);
  });

  it('drops the headers a connection field names, both ways, with either upstream client (RFC 9110 7.6.1)', async () => {
    const other = await FrontDoor.start(doorConfig(nodes, { upstreamClient: 'undici' }));
    try {
      for (const url of [server.url, other.url]) {
        const [native] = await ranking(url, 'named-board');
        const node = byId(nodes, native!);
        node.received.length = 0;
        node.behaviour = { kind: 'answer', headers: { connection: 'keep-alive, X-Internal', 'x-internal': 'leak', 'x-other': 'ok' } };
        const head = `GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: named-board\r\nx-drop-me: 1\r\nx-keep: 1\r\nconnection: X-Drop-Me, close\r\n\r\n`;
        const answer = await rawExchange(url, head);
        assert.match(answer, /^HTTP\/1\.1 200/, url);
        assert.match(answer, /\r\nx-other: ok\r\n/i, url);
        assert.doesNotMatch(answer, /x-internal/i, `${url}: a header the node's connection field named`);
        const headers = node.received[0]!.headers;
        assert.equal(headers['x-keep'], '1');
        assert.equal(headers['x-drop-me'], undefined, `${url}: a header the client's connection field named`);
      }
    } finally {
      await other.stop();
    }
  });

  it('drops the headers named over several connection lines, in any case and spacing, both ways, with either upstream client', async () => {
    // A first line of keep-alive alone, the names on later lines (one after the header it names).
    const answer = 'HTTP/1.1 200 OK\r\nConnection: keep-alive\r\nX-Internal: leak\r\nConnection: X-INTERNAL\r\nX-Other: leak\r\nConnection:\tx-other ,  \r\nX-Kept: ok\r\ncontent-length: 2\r\n\r\nok';
    const raw = await startRawNode('several-lines', (socket) => socket.write(answer));
    try {
      for (const upstreamClient of ['h1', 'undici'] as const) {
        const door = await FrontDoor.start(doorConfig([raw], { upstreamClient, hedgeMode: 'off' }));
        try {
          raw.requests.length = 0;
          const head = 'GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: b\r\nconnection: keep-alive\r\nx-a: 1\r\nX-B: 2\r\nconnection: X-A\r\nconnection:  x-b ,\tKEEP-ALIVE\r\nx-keep: 1\r\nconnection: close\r\n\r\n';
          const reply = await rawExchange(door.url, head);
          assert.match(reply, /^HTTP\/1\.1 200 /, `${upstreamClient}: ${reply}`);
          assert.match(reply, /\r\nX-Kept: ok\r\n/, upstreamClient);
          assert.doesNotMatch(reply, /x-internal|x-other/i, `${upstreamClient}: a header a later connection line of the node's named`);
          const sent = raw.requests[0]!;
          assert.match(sent, /\r\nx-keep: 1\r\n/, upstreamClient);
          assert.doesNotMatch(sent, /\r\nx-[ab]:/i, `${upstreamClient}: a header a later connection line of the client's named`);
        } finally {
          await door.stop();
        }
      }
    } finally {
      await raw.stop();
    }
  });

  it('takes --max-response-bytes as the limit, with either upstream client', async () => {
    const [native] = await ranking(server.url, 'limit-board');
    byId(nodes, native!).behaviour = { kind: 'answer', body: 'y'.repeat(2048) };
    for (const upstreamClient of ['h1', 'undici'] as const) {
      const door = await FrontDoor.start(doorConfig(nodes, { upstreamClient, hedgeMode: 'off', maxResponseBytes: 2047 }));
      try {
        const reply = await call(`${door.url}/rpc/query.execute`, { headers: { 'x-lakefront-board': 'limit-board' } });
        assertFailure(reply, 502, 'LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE');
        for (const n of nodes) assert.equal(n.hits(), n.id === native ? 1 : 0, `${upstreamClient}: ${n.id} was asked`);
        for (const n of nodes) n.received.length = 0;
      } finally {
        await door.stop();
      }
    }
    const door = await FrontDoor.start(doorConfig(nodes, { maxResponseBytes: 2048 }));
    try {
      const reply = await call(`${door.url}/rpc/query.execute`, { headers: { 'x-lakefront-board': 'limit-board' } });
      assert.equal(reply.status, 200, 'an answer of the limit exactly');
      assert.equal(reply.text.length, 2048);
    } finally {
      await door.stop();
    }
    await assert.rejects(FrontDoor.start(doorConfig(nodes, { maxResponseBytes: 10 })), /^ConfigError: maxResponseBytes: bad value 10 \(bytes, 1024-1073741824\)$/);
  });

  it('keeps --request-timeout-ms with either upstream client (undici\'s own timers fire up to a second late)', async () => {
    // Every node answers 600 ms after the timeout: the answer must be the timeout's 502, from the
    // one node asked (a bare write is not sent again), not the node's late 200.
    for (const n of nodes) n.behaviour = { kind: 'answer', delayMs: 900 };
    for (const upstreamClient of ['h1', 'undici'] as const) {
      const door = await FrontDoor.start(doorConfig(nodes, { upstreamClient, hedgeMode: 'off', requestTimeoutMs: 300 }));
      try {
        const reply = await call(`${door.url}/rpc/board.write`, { method: 'POST', body: '{}', headers: { 'x-lakefront-board': 'late-board' } });
        assert.equal(reply.status, 502, `${upstreamClient}: ${reply.text}`);
        const { reasons } = reply.json<{ reasons: string[] }>();
        assert.match(reasons.join(' '), upstreamClient === 'h1' ? /LF_ERR_UPSTREAM_TIMEOUT/ : /UND_ERR_HEADERS_TIMEOUT/, upstreamClient);
        assert.equal(nodes.reduce((sum, n) => sum + n.hits(), 0), 1, `${upstreamClient}: one node asked`);
        for (const n of nodes) n.received.length = 0;
      } finally {
        await door.stop();
      }
    }
  });

  it('does not let interim answers hold a request past --request-timeout-ms, with either upstream client', async () => {
    // 103 Early Hints every 20 ms for a second, then the answer: the timeout counts from the
    // write. (A 100 Continue nobody asked for, undici fails as a bad response at once.)
    const interim = await startRawNode('interim', (socket) => {
      let sent = 0;
      const timer = setInterval(() => {
        if (socket.destroyed) clearInterval(timer);
        else if (sent++ < 50) socket.write('HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n');
        else {
          clearInterval(timer);
          socket.write('HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nlate');
        }
      }, 20);
    });
    try {
      for (const upstreamClient of ['h1', 'undici'] as const) {
        const door = await FrontDoor.start(doorConfig([interim], { upstreamClient, hedgeMode: 'off', requestTimeoutMs: 300 }));
        try {
          const reply = await call(`${door.url}/rpc/board.write`, { method: 'POST', body: '{}', headers: { 'x-lakefront-board': 'interim-board' } });
          assert.equal(reply.status, 502, `${upstreamClient}: ${reply.text}`);
          assert.match(reply.json<{ reasons: string[] }>().reasons[0]!, upstreamClient === 'h1' ? /LF_ERR_UPSTREAM_TIMEOUT/ : /UND_ERR_HEADERS_TIMEOUT/, upstreamClient);
        } finally {
          await door.stop();
        }
      }
    } finally {
      await interim.stop();
    }
  });

  it('times out a request still waiting for a connection after --request-timeout-ms, unsent, with either upstream client', async () => {
    // One node, one connection to it. Each answer trickles its body a byte every 150 ms (600 ms
    // in all, no gap past the 300 ms timeout), so the connection stays busy with the first
    // request while the second waits for it. (Health probes come on connections of their own.)
    const arrived = new EventEmitter();
    const trickler = await startRawNode('trickler', (socket) => {
      arrived.emit('request');
      socket.write('HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\n');
      let sent = 0;
      const timer = setInterval(() => {
        socket.write('abcd'[sent++]!);
        if (sent === 4) clearInterval(timer);
      }, 150);
      socket.on('close', () => clearInterval(timer));
    });
    try {
      for (const upstreamClient of ['h1', 'undici'] as const) {
        trickler.requests.length = 0;
        const door = await FrontDoor.start(doorConfig([trickler], { upstreamClient, upstreamConnections: 1, hedgeMode: 'off', requestTimeoutMs: 300 }));
        try {
          const post = () => call(`${door.url}/rpc/board.write`, { method: 'POST', body: '{}', headers: { 'x-lakefront-board': 'queued-board' } });
          const first = post();
          await once(arrived, 'request');
          const second = await post();
          assert.equal(second.status, 503, `${upstreamClient}: ${second.text}`);
          assert.equal(second.json<{ code: string }>().code, 'LF_ERR_NOT_SENT');
          assert.match(second.json<{ reasons: string[] }>().reasons.join(' '), /LF_ERR_UPSTREAM_TIMEOUT.*no connection to the node within 300 ms/, upstreamClient);
          const answered = await first;
          assert.equal(answered.status, 200, `${upstreamClient}: ${answered.text}`);
          assert.equal(answered.text, 'abcd');
          // Had the second been written once the connection was free, the node would read it
          // before this one.
          assert.equal((await post()).text, 'abcd', upstreamClient);
          assert.equal(trickler.requests.length, 2, `${upstreamClient}: the timed-out request was never sent`);
        } finally {
          await door.stop();
        }
      }
    } finally {
      await trickler.stop();
    }
  });

  it('relays a 204 and a 304 without a content-length (RFC 9110 8.6), with either upstream client, and the connection carries on', async () => {
    // A 304 may carry the 200's content-length; undici 7.30 fails such a 304 as a length
    // mismatch (UND_ERR_RES_CONTENT_LENGTH_MISMATCH, README), so it gets one without.
    const answers = (client: string) => ['HTTP/1.1 204 No Content\r\nx-n: 1\r\n\r\n', `HTTP/1.1 304 Not Modified\r\netag: "v1"\r\n${client === 'h1' ? 'content-length: 1234\r\n' : ''}\r\n`, 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok'];
    let next = '';
    const raw = await startRawNode('bodiless', (socket) => socket.write(next));
    try {
      for (const upstreamClient of ['h1', 'undici'] as const) {
        const door = await FrontDoor.start(doorConfig([raw], { upstreamClient, hedgeMode: 'off' }));
        const client = connect(Number(new URL(door.url).port), '127.0.0.1');
        try {
          let text = '';
          const received = new EventEmitter();
          client.on('data', (data) => {
            text += data.toString('latin1');
            received.emit('data');
          });
          // One answer at a time on one connection: each must end where its head says.
          const answer = async (complete: (t: string) => boolean): Promise<string> => {
            while (!complete(text)) await once(received, 'data');
            const got = text;
            text = '';
            return got;
          };
          const ask = () => client.write('GET /rpc/x HTTP/1.1\r\nhost: x\r\nx-lakefront-board: b\r\n\r\n');
          for (const [i, status] of [[0, 204], [1, 304]] as const) {
            next = answers(upstreamClient)[i]!;
            ask();
            const head = await answer((t) => t.includes('\r\n\r\n'));
            assert.match(head, new RegExp(`^HTTP/1\\.1 ${status} `), `${upstreamClient}: ${head}`);
            assert.doesNotMatch(head, /content-length/i, `${upstreamClient}: ${head}`);
            assert.ok(head.endsWith('\r\n\r\n'), 'nothing after the head');
          }
          next = answers(upstreamClient)[2]!;
          ask();
          assert.match(await answer((t) => t.endsWith('\r\n\r\nok')), /^HTTP\/1\.1 200 [^]*content-length: 2\r\n/i, `${upstreamClient}: the next answer on the connection`);
        } finally {
          client.destroy();
          await door.stop();
        }
      }
    } finally {
      await raw.stop();
    }
  });

  it("answers a HEAD with a node's 204 without the content-length the node put on it (RFC 9110 8.6, as nginx), with either upstream client; a 200's stays", async () => {
    let next = '';
    const raw = await startRawNode('head-204', (socket) => socket.write(next));
    try {
      for (const upstreamClient of ['h1', 'undici'] as const) {
        const door = await FrontDoor.start(doorConfig([raw], { upstreamClient, hedgeMode: 'off' }));
        try {
          const head = 'HEAD /rpc/x HTTP/1.1\r\nhost: x\r\nx-lakefront-board: b\r\nconnection: close\r\n\r\n';
          next = 'HTTP/1.1 204 No Content\r\ncontent-length: 0\r\nx-n: 1\r\n\r\n';
          const answer = await rawExchange(door.url, head);
          assert.match(answer, /^HTTP\/1\.1 204 [^]*\r\nx-n: 1\r\n/, `${upstreamClient}: ${answer}`);
          assert.doesNotMatch(answer, /content-length/i, `${upstreamClient}: ${answer}`);
          next = 'HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n';
          assert.match(await rawExchange(door.url, head), /^HTTP\/1\.1 200 [^]*\r\ncontent-length: 1234\r\n/, upstreamClient);
        } finally {
          await door.stop();
        }
      }
    } finally {
      await raw.stop();
    }
  });

  it('refuses an answer in a transfer-coding other than chunked alone (502), with either upstream client', async () => {
    // Decoded as chunked and relayed with a length, `gzip, chunked` would reach the client as
    // plain bytes; `gzip` alone would be read to the end of the connection and relayed the same.
    const answers = ['HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n', 'HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\nconnection: close\r\n\r\nabc'];
    let next = '';
    const raw = await startRawNode('coder', (socket) => {
      socket.write(next);
      if (next.includes('connection: close')) socket.end();
    });
    try {
      for (const upstreamClient of ['h1', 'undici'] as const) {
        const door = await FrontDoor.start(doorConfig([raw], { upstreamClient, hedgeMode: 'off' }));
        try {
          for (const answer of answers) {
            next = answer;
            const reply = await call(`${door.url}/rpc/board.write`, { method: 'POST', body: '{}', headers: { 'x-lakefront-board': 'coded' } });
            assert.equal(reply.status, 502, `${upstreamClient}, ${JSON.stringify(answer)}: ${reply.text}`);
            assert.match(reply.json<{ reasons: string[] }>().reasons[0]!, /a transfer-coding the front door does not decode: gzip/, upstreamClient);
          }
          next = 'HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n';
          const plain = await call(`${door.url}/rpc/board.write`, { method: 'POST', body: '{}', headers: { 'x-lakefront-board': 'coded' } });
          assert.equal(plain.text, 'abc', `${upstreamClient}: chunked alone is decoded and relayed`);
        } finally {
          await door.stop();
        }
      }
    } finally {
      await raw.stop();
    }
  });

  it('never forwards a CR, LF, NUL or other control byte in a header value', async () => {
    // The front door relies on uWS's parser here (it checks nothing per character itself): a
    // value with a bare CR or LF, a NUL or another control byte never reaches a handler.
    // `end`: also send FIN (uWS answers nothing to a malformed head and would otherwise hold the
    // connection until its idle timeout); a well-formed request is answered before the FIN is read.
    const raw = (head: Buffer, end = false): Promise<string> => rawExchange(server.url, head, { end });
    const request = (value: Buffer, path = '/rpc/query.execute'): Buffer =>
      Buffer.concat([Buffer.from(`GET ${path} HTTP/1.1\r\nhost: x\r\nx-lakefront-board: inj\r\nx-evil: `), value, Buffer.from('\r\nconnection: close\r\n\r\n')]);
    for (const value of [Buffer.from('a\nx-injected: 1'), Buffer.from('a\rx-injected: 1'), Buffer.from('a\0b'), Buffer.from('a\x01b')]) {
      const answer = await raw(request(value), true);
      assert.doesNotMatch(answer, /^HTTP\/1\.1 200/, JSON.stringify(value.toString('latin1')));
    }
    assert.equal(nodes.reduce((n, node) => n + node.received.length, 0), 0, 'no node saw any of them');
    const answer = await raw(request(Buffer.from('fine\tand ~ printable')));
    assert.match(answer, /^HTTP\/1\.1 200/);
    const got = nodes.flatMap((node) => node.received);
    assert.equal(got.length, 1);
    assert.equal(got[0]!.headers['x-evil'], 'fine\tand ~ printable');
  });

  it('sends a header value or a path beyond Latin-1 (a euro sign, a byte uWS makes U+FFFD) as the same UTF-8 bytes with either upstream client, and undici\'s pool keeps its connections', async () => {
    // undici refuses a character above U+00FF in a header value or a path: the request failed
    // (502, a failure counted against the node) and the connection slot it had taken stayed
    // taken, so after --upstream-connections such requests every request to the node waited out
    // the request timeout, unsent.
    const raw = await startRawNode('utf8', (socket) => socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok'));
    try {
      const sent: Record<string, string[]> = {};
      for (const upstreamClient of ['h1', 'undici'] as const) {
        const door = await FrontDoor.start(doorConfig([raw], { upstreamClient, hedgeMode: 'off', upstreamConnections: 1, requestTimeoutMs: 2_000 }));
        try {
          raw.requests.length = 0;
          for (const [path, value] of [['/rpc/caf\xc3\xa9', 'a\xe2\x82\xacb'], ['/rpc/x\xe2\x82\xac', 'caf\xc3\xa9'], ['/rpc/y', 'a\xffb'], ['/rpc/plain', 'ok']]) {
            const reply = await rawExchange(door.url, Buffer.from(`GET ${path} HTTP/1.1\r\nhost: x\r\nx-lakefront-board: b\r\nx-v: ${value}\r\nconnection: close\r\n\r\n`, 'latin1'));
            assert.match(reply, /^HTTP\/1\.1 200 /, `${upstreamClient}, ${JSON.stringify(path)} ${JSON.stringify(value)}: ${reply}`);
          }
          sent[upstreamClient] = raw.requests.map((r) => r.split('\r\n').filter((line) => line.startsWith('GET ') || line.startsWith('x-v:')).join(' | '));
        } finally {
          await door.stop();
        }
      }
      assert.deepEqual(sent.undici, sent.h1, 'the node gets the same bytes from either client');
      assert.equal(sent.h1![0], 'GET /rpc/caf\xc3\xa9 HTTP/1.1 | x-v: a\xe2\x82\xacb');
    } finally {
      await raw.stop();
    }
  });

  it('fails a header value with a DEL (which uWS passes and undici refuses) without taking one of undici\'s connection slots for good', async () => {
    // undici's request constructor throws at a DEL (0x7F) in a header value; thrown at dispatch,
    // the pool never gave the slot back: after --upstream-connections such requests every request
    // to the node waited out the request timeout, unsent. (The h1 client sends it as it came.)
    const raw = await startRawNode('del', (socket) => socket.write('HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok'));
    const door = await FrontDoor.start(doorConfig([raw], { upstreamClient: 'undici', hedgeMode: 'off', upstreamConnections: 1, requestTimeoutMs: 2_000 }));
    try {
      for (let i = 0; i < 2; i++) {
        const refused = await rawExchange(door.url, Buffer.from('GET /rpc/d HTTP/1.1\r\nhost: x\r\nx-lakefront-board: b\r\nx-v: a\x7fb\r\nconnection: close\r\n\r\n', 'latin1'));
        assert.match(refused, /^HTTP\/1\.1 502 /, refused);
        assert.match(refused, /UND_ERR_INVALID_ARG/, refused);
      }
      // Before: a 502 after the request timeout, waiting for the slot the refused ones kept.
      const plain = await rawExchange(door.url, 'GET /rpc/plain HTTP/1.1\r\nhost: x\r\nx-lakefront-board: b\r\nconnection: close\r\n\r\n');
      assert.match(plain, /^HTTP\/1\.1 200 /, plain);
      assert.deepEqual(raw.requests.map((r) => r.slice(0, r.indexOf(' HTTP/'))), ['GET /rpc/plain']);
    } finally {
      await door.stop();
      await raw.stop();
    }
  });

  it('closes the connection of a request whose transfer-encoding does not end in chunked (framing in doubt), refuses any coding before chunked (501), and forwards nothing', async () => {
    // No `connection: close`: a 400 would keep the connection open, only a drop ends it.
    const send = (codingLines: string, keyed = true): Promise<string> =>
      rawExchange(server.url, `POST /rpc/board.append HTTP/1.1\r\nhost: x\r\n${keyed ? 'x-lakefront-board: te-board\r\n' : ''}${codingLines}\r\n2\r\n{}\r\n0\r\n\r\n`);
    // uWS reads each of these bodies as chunked; a proxy in front may not, and what follows
    // must not be read as a request: closed at once, unanswered.
    for (const lines of [
      'transfer-encoding: gzip\r\n',
      'transfer-encoding: chunked, gzip\r\n',
      'transfer-encoding: chunked, chunked\r\n',
      // Empty, uWS still reads a chunked body: the front door must not take it for no body.
      'transfer-encoding: \r\n',
      // An empty line before chunked: uWS then reads no body at all.
      'transfer-encoding: \r\ntransfer-encoding: chunked\r\n',
    ]) {
      assert.equal(await send(lines), '', lines);
      assert.equal(await send(lines, false), '', `${lines} (before the missing board's 401)`);
    }
    // A coding before chunked: framed by chunked all the same, so answered (and closed).
    for (const lines of ['transfer-encoding: gzip, chunked\r\n', 'transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n']) {
      const answer = await rawExchange(server.url, `POST /rpc/board.append HTTP/1.1\r\nhost: x\r\nx-lakefront-board: te-board\r\n${lines}connection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n`);
      assert.match(answer, /^HTTP\/1\.1 501 /, lines);
      assert.match(answer, /"code":"LF_ERR_UNSUPPORTED"/);
      assert.match(answer, /is not supported \(only chunked\)/);
    }
    assert.equal(nodes.reduce((n, node) => n + node.received.length, 0), 0, 'no node saw any of them');
    // Chunked alone, in any case, is forwarded (de-chunked, with a content-length).
    const answer = await rawExchange(server.url, 'POST /rpc/board.append HTTP/1.1\r\nhost: x\r\nx-lakefront-board: te-board\r\nTransfer-Encoding: Chunked\r\nconnection: close\r\n\r\n2\r\n{}\r\n0\r\n\r\n');
    assert.match(answer, /^HTTP\/1\.1 200 /);
    const got = nodes.flatMap((node) => node.received);
    assert.equal(got.length, 1);
    assert.equal(got[0]!.body, '{}');
    assert.equal(got[0]!.headers['content-length'], '2');
  });

  it('closes a connection whose request has two different content-length lines, unanswered, and proxies nothing hidden behind it; two equal ones are one', async () => {
    // A request hidden where the first length says the body ends: uWS would read it as the next
    // request. Answering 400 and closing after let it through (proxied, and answered).
    const hidden = 'GET /rpc/smuggled HTTP/1.1\r\nhost: x\r\nx-lakefront-board: cl-board\r\n\r\n';
    const send = (start: string, lengths: string, body: string): Promise<string> => rawExchange(server.url, `${start} HTTP/1.1\r\nhost: x\r\n${lengths}\r\n${body}`);
    const cases: [string, string, string][] = [
      ['POST /rpc/board.append', `x-lakefront-board: cl-board\r\ncontent-length: 0\r\ncontent-length: ${hidden.length}\r\n`, hidden],
      ['POST /rpc/board.append', 'x-lakefront-board: cl-board\r\ncontent-length: 3\r\ncontent-length: 2\r\n', 'abc'],
      // The first frames the body for uWS: 100 bytes that never come (this one once had no answer).
      ['POST /rpc/board.append', 'x-lakefront-board: cl-board\r\ncontent-length: 100\r\ncontent-length: 2\r\n', '{}'],
      // Before any other refusal (the missing board's 401 keeps its connection open) ...
      ['POST /rpc/board.append', `content-length: 0\r\ncontent-length: ${hidden.length}\r\n`, hidden],
      // ... and on the front door's own endpoints, a 405 and the 404 alike.
      ['GET /health', `content-length: 0\r\ncontent-length: ${hidden.length}\r\n`, hidden],
      ['POST /stats', `content-length: 0\r\ncontent-length: ${hidden.length}\r\n`, hidden],
      ['GET /nothing/here', `content-length: 0\r\ncontent-length: ${hidden.length}\r\n`, hidden],
      // And a WebSocket handshake.
      ['GET /rpc/live', `x-lakefront-board: cl-board\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\ncontent-length: 0\r\ncontent-length: ${hidden.length}\r\n`, hidden],
      // An empty first line is a length too (uWS reads no body by it).
      ['POST /rpc/board.append', `x-lakefront-board: cl-board\r\ncontent-length: \r\ncontent-length: ${hidden.length}\r\n`, hidden],
      ['HEAD /rpc/board.append', `content-length: \r\ncontent-length: ${hidden.length}\r\n`, hidden],
      // A transfer-encoding that does not end in chunked, on the own endpoints, the 404 and a
      // handshake (uWS reads a chunked body, here empty, and then the hidden request).
      ['GET /health', 'transfer-encoding: gzip\r\n', `0\r\n\r\n${hidden}`],
      ['GET /route?board=b', 'transfer-encoding: chunked;x\r\n', `0\r\n\r\n${hidden}`],
      ['POST /nothing/here', 'transfer-encoding: gzip\r\n', `0\r\n\r\n${hidden}`],
      ['GET /rpc/live', 'upgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\ntransfer-encoding: gzip\r\n', `0\r\n\r\n${hidden}`],
    ];
    for (const [start, lengths, body] of cases) assert.equal(await send(start, lengths, body), '', `${start}: closed without an answer`);
    assert.equal(nodes.reduce((n, node) => n + node.received.length, 0), 0, 'no node saw any of them, nor a hidden request');
    const same = await rawExchange(server.url, `POST /rpc/board.append HTTP/1.1\r\nhost: x\r\nx-lakefront-board: cl-board\r\ncontent-length: 2\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`);
    assert.match(same, /^HTTP\/1\.1 200 /);
    assert.equal(nodes.flatMap((node) => node.received)[0]!.body, '{}');
  });

  it('passes a WebSocket handshake on as one (a node that answers it with a plain response has it relayed); other upgrades are ignored', async () => {
    const send = (upgrade: string): Promise<string> =>
      rawExchange(
        server.url,
        `GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: ws-board\r\nupgrade: ${upgrade}\r\nconnection: upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n`,
        // The h2c request is answered on a connection kept open: stop at the end of its body.
        { done: (text) => /\r\n\r\n[\s\S]*\}$/.test(text) },
      );
    // These nodes do not speak WebSocket: the board's node answers the handshake with a 200.
    const [home] = await ranking(server.url, 'ws-board');
    const relayed = await send('websocket');
    assert.match(relayed, /^HTTP\/1\.1 200 /);
    assert.match(relayed, new RegExp(`x-lakefront-served-by: ${home}\r\n`));
    const handshakes = nodes.flatMap((node) => node.received);
    assert.equal(handshakes.length, 1);
    assert.equal(handshakes[0]!.headers.upgrade, 'websocket', 'the node got a handshake of its own');
    const seen = nodes.map((node) => node.received.length);
    const served = await send('h2c');
    assert.match(served, /^HTTP\/1\.1 200 /);
    const got = nodes.flatMap((node, i) => node.received.slice(seen[i]));
    assert.equal(got.length, 1);
    assert.equal(got[0]!.headers.upgrade, undefined, 'a hop-by-hop header is not forwarded');
  });

  it('keeps a query string and relays GET as a safe read', async () => {
    const [native] = await ranking(server.url, 'get-board');
    const reply = await call(`${server.url}/rpc/changes.read?since=42&x=%20`, { headers: { 'x-lakefront-board': 'get-board' } });
    assert.equal(reply.status, 200);
    assert.equal(byId(nodes, native!).received[0]!.path, '/rpc/changes.read?since=42&x=%20');
    assert.equal(byId(nodes, native!).received[0]!.method, 'GET');
  });

  it('answers HEAD with the node\'s content-length and keeps the connection usable', async () => {
    const [native] = await ranking(server.url, 'head-board');
    byId(nodes, native!).behaviour = { kind: 'answer', body: 'h'.repeat(40), headers: { 'content-length': '40' } };
    // One raw connection, one request at a time (a client library would quietly reconnect if
    // the front door closed it).
    const request = (method: string) => `${method} /rpc/node.stats HTTP/1.1\r\nhost: x\r\nx-lakefront-board: head-board\r\n\r\n`;
    const { answers, closed } = await inTurn(server.port, [request('HEAD'), request('GET')]);
    const [head, get] = answers;
    assert.match(head!, /^HTTP\/1\.1 200 /);
    assert.match(head!, /\r\ncontent-length: 40\r\n/i);
    assert.equal(head!.match(/content-length/gi)!.length, 1, 'one content-length');
    assert.ok(head!.endsWith('\r\n\r\n'), 'no body');
    assert.match(get ?? '', /^HTTP\/1\.1 200 [^]*\r\n\r\nh{40}$/, 'the same connection still answers');
    assert.equal(closed, false);
  });

  it('answers HEAD without a body when it answers itself (404, 401), and keeps the connection usable', async () => {
    const { answers, closed } = await inTurn(server.port, [
      'HEAD /nowhere HTTP/1.1\r\nhost: x\r\n\r\n',
      'HEAD /rpc/node.stats HTTP/1.1\r\nhost: x\r\n\r\n',
      'GET /health HTTP/1.1\r\nhost: x\r\n\r\n',
    ]);
    assert.equal(answers.length, 3, `answers: ${JSON.stringify(answers)}`);
    for (const [i, status] of [[0, 404], [1, 401]] as const) {
      assert.match(answers[i]!, new RegExp(`^HTTP/1\\.1 ${status} `));
      assert.ok(answers[i]!.endsWith('\r\n\r\n'), 'no body');
      assert.match(answers[i]!, /\r\ncontent-length: [1-9]\d*\r\n/i, 'the length the body would have');
    }
    assert.match(answers[2]!, /^HTTP\/1\.1 200 [^]*"ok":true/);
    assert.equal(closed, false);
  });

  it('answers HEAD on its own endpoints as GET without the body, and 405 for other methods', async () => {
    const paths = ['/health', '/route?board=own-board', '/stats'];
    const { answers, closed } = await inTurn(server.port, [
      ...paths.map((path) => `HEAD ${path} HTTP/1.1\r\nhost: x\r\n\r\n`),
      ...paths.map((path) => `GET ${path} HTTP/1.1\r\nhost: x\r\n\r\n`),
    ]);
    assert.equal(answers.length, 6, `answers: ${JSON.stringify(answers)}`);
    assert.equal(closed, false);
    for (let i = 0; i < paths.length; i++) {
      const head = answers[i]!;
      const get = answers[i + paths.length]!;
      assert.match(head, /^HTTP\/1\.1 200 /, paths[i]);
      assert.ok(head.endsWith('\r\n\r\n'), `HEAD ${paths[i]}: no body`);
      assert.match(head, /\r\ncontent-type: application\/json\r\n/i);
      const body = get.slice(get.indexOf('\r\n\r\n') + 4);
      assert.ok(body.startsWith('{'), `GET ${paths[i]} has its JSON body`);
      // /stats counts change between the two; /health and /route say the same length.
      if (paths[i] !== '/stats') assert.equal(Number(/content-length: (\d+)/i.exec(head)![1]), Buffer.byteLength(body), paths[i]);
    }
    const hits = nodes.reduce((s, n) => s + n.hits(), 0);
    for (const path of ['/health', '/route', '/stats']) {
      const reply = await call(`${server.url}${path}`, { method: 'POST', body: 'x' });
      assert.equal(reply.status, 405, path);
      assert.equal(reply.headers['allow'], 'GET, HEAD');
      assert.match(reply.json<{ error: string }>().error, /answers GET and HEAD, not POST/);
    }
    assert.equal(nodes.reduce((s, n) => s + n.hits(), 0), hits, 'nothing was proxied');
  });

  it('rejects a body over the limit with 413 and forwards nothing', async () => {
    const reply = await rpc(server.url, 'query.execute', 'big', { body: 'x'.repeat(1024 * 1024 + 1) });
    assert.equal(reply.status, 413);
    assert.match(reply.json<{ error: string }>().error, /exceeds/);
    assert.equal(nodes.reduce((s, n) => s + n.hits(), 0), 0);
  });

  it('reads and drops a refused body before going on, so the client sees the 413 and keeps its connection', async () => {
    const over = 1024 * 1024 + 1;
    const answers = (text: string): string[] => text.match(/HTTP\/1\.1 \d+/g) ?? [];
    const next = 'GET /health HTTP/1.1\r\nhost: x\r\n\r\n';
    // A declared length over the limit: 413 at once, the body read and dropped after it.
    const declared = await rawExchange(
      server.url,
      Buffer.concat([Buffer.from(`POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: big\r\ncontent-length: ${over}\r\n\r\n`), Buffer.alloc(over, 120), Buffer.from(next)]),
      { done: (text) => answers(text).length === 2 },
    );
    assert.deepEqual(answers(declared), ['HTTP/1.1 413', 'HTTP/1.1 200'], declared.slice(0, 300));
    // A chunked body that passes the limit: dropped to its end, then the 413.
    const chunk = `${(64 * 1024).toString(16)}\r\n${'y'.repeat(64 * 1024)}\r\n`;
    const chunked = await rawExchange(
      server.url,
      `POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: big\r\ntransfer-encoding: chunked\r\n\r\n${chunk.repeat(17)}0\r\n\r\n${next}`,
      { done: (text) => answers(text).length === 2 },
    );
    assert.deepEqual(answers(chunked), ['HTTP/1.1 413', 'HTTP/1.1 200'], chunked.slice(0, 300));
    assert.match(chunked, /LF_ERR_BODY_TOO_LARGE/);
    // Declared far beyond what is worth reading (16 MiB): 413, and the connection is closed.
    const huge = await rawExchange(server.url, `POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: big\r\ncontent-length: ${16 * 1024 * 1024 + 1}\r\n\r\n`);
    assert.deepEqual(answers(huge), ['HTTP/1.1 413']);
    assert.equal(nodes.reduce((s, n) => s + n.hits(), 0), 0, 'nothing forwarded');
  });

  it('hedges a slow primary\'s read to the runner-up, which answers; the primary is aborted', async () => {
    const [primary, runnerUp] = await ranking(server.url, 'hedge-board');
    const slow = byId(nodes, primary!);
    slow.behaviour = { kind: 'answer', delayMs: 5_000 };
    const abandoned = once(slow, 'abandoned');
    const reply = await rpc(server.url, 'query.execute', 'hedge-board');
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-served-by'], runnerUp);
    assert.equal(reply.headers['x-lakefront-hedged'], '1');
    assert.equal(reply.json<{ node: string }>().node, runnerUp);
    await abandoned; // the loser's connection was closed, not left to run
    assert.equal(slow.hits(), 1);
    assert.equal(byId(nodes, runnerUp!).hits(), 1);
  });

  it('sends a bare write to a slow node exactly once, to exactly one node', async () => {
    const [primary] = await ranking(server.url, 'write-board');
    byId(nodes, primary!).behaviour = { kind: 'answer', delayMs: 400 }; // eight hedge delays
    const reply = await rpc(server.url, 'board.append', 'write-board', { body: '{"row":1}' });
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-served-by'], primary);
    assert.equal(reply.headers['x-lakefront-hedged'], '0');
    for (const n of nodes) assert.equal(n.hits(), n.id === primary ? 1 : 0, `${n.id} saw the write ${n.hits()} times`);
  });

  it('tells the caller a failed bare write may or may not have landed, and never resends it', async () => {
    const [primary] = await ranking(server.url, 'lost-write');
    byId(nodes, primary!).behaviour = { kind: 'reset' };
    const reply = await rpc(server.url, 'board.append', 'lost-write');
    assert.equal(reply.status, 502);
    const body = reply.json<{ code: string; error: string; attempted: string[] }>();
    assert.equal(body.code, 'LF_ERR_OUTCOME_UNKNOWN');
    assert.match(body.error, /may or may not/);
    assert.deepEqual(body.attempted, [primary]);
    for (const n of nodes) assert.equal(n.hits(), n.id === primary ? 1 : 0);
  });

  it('tells the caller a bare write whose node refused the connection was not sent (503), and sends it nowhere else', async () => {
    const [gone] = await startNodes('gone');
    const solo = await route({ nodes: [{ id: 'gone', url: gone!.url }, ...nodes.map((n) => ({ id: n.id, url: n.url }))], port: 0, host: '127.0.0.1', threads: 1, healthIntervalMs: 60_000 });
    try {
      let board = '';
      for (let i = 0; board === ''; i++) if ((await ranking(solo.url, `refused-${i}`))[0] === 'gone') board = `refused-${i}`;
      // The node goes down between two health polls: its port refuses connections.
      await gone!.stop();
      const reply = await rpc(solo.url, 'board.append', board);
      assertFailure(reply, 503, 'LF_ERR_NOT_SENT');
      for (const n of nodes) assert.equal(n.hits(), 0, `${n.id} was not sent the write`);
    } finally {
      await solo.stop();
    }
  });

  it('hedges a keyed write (x-lakefront-idempotent: 1)', async () => {
    const [primary, runnerUp] = await ranking(server.url, 'keyed-board');
    byId(nodes, primary!).behaviour = { kind: 'answer', delayMs: 5_000 };
    const reply = await rpc(server.url, 'board.append', 'keyed-board', { headers: { 'x-lakefront-idempotent': '1' } });
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-hedged'], '1');
    assert.equal(reply.headers['x-lakefront-served-by'], runnerUp);
  });

  it('takes a write with two x-lakefront-idempotent lines for a bare write (read together they are not "1"): sent once, not failed over', async () => {
    const [primary, runnerUp] = await ranking(server.url, 'twice-keyed');
    byId(nodes, primary!).behaviour = { kind: 'reset' };
    for (const [a, b] of [['1', '0'], ['0', '1'], ['1', '1']]) {
      const raw = await rawExchange(server.url, `POST /rpc/board.append HTTP/1.1\r\nhost: a\r\nx-lakefront-board: twice-keyed\r\nx-lakefront-idempotent: ${a}\r\nx-lakefront-idempotent: ${b}\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`);
      assert.match(raw, /^HTTP\/1\.1 502 /, `${a}, ${b}`);
      assert.match(raw, /LF_ERR_OUTCOME_UNKNOWN/);
    }
    assert.equal(byId(nodes, runnerUp!).hits(), 0, 'never failed over to the runner-up');
  });

  it('fails a read over down the ranking, in ranking order', async () => {
    const order = await ranking(server.url, 'failover-board');
    byId(nodes, order[0]!).behaviour = { kind: 'reset' };
    byId(nodes, order[1]!).behaviour = { kind: 'answer', status: 503 };
    const reply = await rpc(server.url, 'query.execute', 'failover-board');
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-served-by'], order[2]);
    const arrivals = order.map((id) => byId(nodes, id).received[0]!.at);
    assert.ok(arrivals[0]! < arrivals[1]! && arrivals[1]! < arrivals[2]!, `arrivals out of ranking order: ${arrivals}`);
  });

  it('answers 502 when a retryable request exhausts every candidate, saying why each failed', async () => {
    const order = await ranking(server.url, 'doomed-board');
    for (const n of nodes) n.behaviour = { kind: 'reset' };
    byId(nodes, order[1]!).behaviour = { kind: 'answer', status: 503 };
    const reply = await rpc(server.url, 'query.execute', 'doomed-board');
    assert.equal(reply.status, 502);
    const body = reply.json<{ code: string; attempted: string[]; reasons: string[] }>();
    assert.equal(body.code, 'LF_ERR_ALL_CANDIDATES_FAILED');
    assert.deepEqual(body.attempted, order);
    assert.equal(body.reasons.length, 3);
    // A reset: the front door's own code with its words, or the system's code alone (its message
    // names the node's address).
    for (const i of [0, 2]) assert.match(body.reasons[i]!, /^(LF_ERR_\w+: .*closed.*|ECONNRESET|EPIPE)$/, body.reasons[i]);
    assert.equal(body.reasons[1], 'answered 503');
    assert.doesNotMatch(JSON.stringify(body), /127\.0\.0\.1/, 'no node address');
    for (const n of nodes) assert.equal(n.hits(), 1);
  });

  it('answers 503 with the soonest Retry-After when every candidate failed and those that answered shed load', async () => {
    const order = await ranking(server.url, 'shed-board');
    byId(nodes, order[0]!).behaviour = { kind: 'reset' };
    byId(nodes, order[1]!).behaviour = { kind: 'answer', status: 503, headers: { 'retry-after': '7' } };
    byId(nodes, order[2]!).behaviour = { kind: 'answer', status: 503, headers: { 'retry-after': '4' } };
    const reply = await rpc(server.url, 'query.execute', 'shed-board');
    assert.equal(reply.status, 503);
    assert.equal(reply.headers['retry-after'], '4');
    const body = reply.json<{ code: string; attempted: string[]; reasons: string[] }>();
    assert.equal(body.code, 'LF_ERR_NODES_SHEDDING');
    assert.deepEqual(body.attempted, order);
    assert.deepEqual(body.reasons.slice(1), ['answered 503, retry after 7 s', 'answered 503, retry after 4 s']);
  });

  it('answers 502 for an answer over 64 MiB (the default limit), and asks no other node for it', async () => {
    // No hedging here: the node takes a while to send 64 MiB, and a hedge would be a second ask.
    const door = await FrontDoor.start(doorConfig(nodes, { hedgeMode: 'off' }));
    try {
      const [native] = await ranking(door.url, 'huge-board');
      const body = 'x'.repeat(64 * 1024 * 1024 + 1);
      byId(nodes, native!).behaviour = { kind: 'answer', body, headers: { 'content-length': String(body.length) } };
      const reply = await call(`${door.url}/rpc/query.execute`, { headers: { 'x-lakefront-board': 'huge-board' } });
      assertFailure(reply, 502, 'LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE');
      assert.match(reply.json<{ error: string }>().error, /--max-response-bytes/);
      assert.match(reply.json<{ reasons: string[] }>().reasons[0]!, /limit of 67108864 bytes/);
      for (const n of nodes) assert.equal(n.hits(), n.id === native ? 1 : 0, `${n.id} was asked`);
      // Without a length, as chunks: refused at the chunk that passes the limit.
      byId(nodes, native!).behaviour = { kind: 'answer', body };
      assertFailure(await call(`${door.url}/rpc/query.execute`, { headers: { 'x-lakefront-board': 'huge-board' } }), 502, 'LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE');
    } finally {
      await door.stop();
    }
  });

  it('agrees with a second, independent front door on every ranking', async () => {
    const other = await frontOver(nodes, { healthIntervalMs: 60_000 });
    try {
      for (let i = 0; i < 40; i++) {
        const board = `agree-${i}`;
        assert.deepEqual(await ranking(other.url, board), await ranking(server.url, board), board);
      }
    } finally {
      await other.stop();
    }
  });

  it('reports whole-process counters and per-node latency from any worker', async () => {
    const before = (await call(`${server.url}/stats`, { fresh: true })).json<{ requests: number }>().requests;
    const sent = 30;
    const replies = await Promise.all(
      Array.from({ length: sent }, (_, i) => rpc(server.url, 'query.execute', `stats-${i}`, { fresh: true })),
    );
    assert.ok(replies.every((r) => r.status === 200));
    // Ask several times over fresh connections, so different workers answer.
    for (let i = 0; i < 6; i++) {
      const stats = (await call(`${server.url}/stats`, { fresh: true })).json<{
        requests: number;
        healthy: string[];
        nodes: Record<string, { attempts: number; wins: number; latencyUs: { count: number; p50: number; p99: number; p999: number } }>;
      }>();
      assert.equal(stats.requests - before, sent);
      assert.deepEqual(stats.healthy, ['node-a', 'node-b', 'node-c']);
      const served = Object.values(stats.nodes);
      assert.ok(served.reduce((s, n) => s + n.attempts, 0) >= sent);
      for (const node of served) {
        if (node.wins === 0) continue;
        assert.ok(node.latencyUs.count > 0 && node.latencyUs.p50 > 0 && node.latencyUs.p999 >= node.latencyUs.p50);
      }
    }
  });
});

describe('front door: node ids that are names every JavaScript object has', () => {
  it('a node named __proto__ or constructor is in /stats like any other', async () => {
    const nodes = await startNodes('__proto__', 'constructor');
    const server = await frontOver(nodes, { healthIntervalMs: 60_000 });
    try {
      const replies = await Promise.all(Array.from({ length: 40 }, (_, i) => rpc(server.url, 'query.execute', `proto-${i}`)));
      assert.ok(replies.every((r) => r.status === 200));
      const stats = (await call(`${server.url}/stats`)).json<{ requests: number; nodes: Record<string, { attempts: number }> }>();
      assert.deepEqual(Object.keys(stats.nodes).sort(), ['__proto__', 'constructor']);
      const attempts = Object.values(stats.nodes).reduce((n, node) => n + node.attempts, 0);
      assert.ok(attempts >= 40, `every attempt counted under a node: ${attempts}`);
      assert.ok(stats.nodes['__proto__']!.attempts > 0 && stats.nodes['constructor']!.attempts > 0, 'both served some');
    } finally {
      await server.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
});

describe('front door: --forwarded-for', () => {
  let nodes: FakeNode[];
  before(async () => {
    nodes = await startNodes('fwd-a');
  });
  after(async () => Promise.all(nodes.map((n) => n.stop())));

  const doorWith = (flags: string[]): Promise<FrontDoor> =>
    FrontDoor.start((parseCommand(['--nodes', `fwd-a=${nodes[0]!.url}`, '--port', '0', '--host', '127.0.0.1', '--threads', '1', ...flags], {}) as { config: FrontDoorConfig }).config);
  const claims = { 'x-forwarded-for': '203.0.113.7', 'x-forwarded-proto': 'https', 'x-forwarded-host': 'claimed.example' };
  const seen = (): Record<string, unknown> => {
    const { headers } = nodes[0]!.received.at(-1)!;
    return { for: headers['x-forwarded-for'], proto: headers['x-forwarded-proto'], host: headers['x-forwarded-host'] };
  };

  it('append: the client\'s address after its own list, the scheme and host the front door saw', async () => {
    const door = await doorWith(['--forwarded-for', 'append']);
    try {
      const authority = new URL(door.url).host;
      assert.equal((await rpc(door.url, 'query.execute', 'b')).status, 200);
      assert.deepEqual(seen(), { for: '127.0.0.1', proto: 'http', host: authority });
      assert.equal((await rpc(door.url, 'query.execute', 'b', { headers: claims })).status, 200);
      assert.deepEqual(seen(), { for: '203.0.113.7, 127.0.0.1', proto: 'http', host: authority }, "the client's claims of scheme and host are not relayed");
      // Several lines are one list, an empty one adds nothing.
      const raw = await rawExchange(door.url, `POST /rpc/query.execute HTTP/1.1\r\nhost: h.example\r\nx-lakefront-board: b\r\nx-forwarded-for: 198.51.100.9\r\nx-forwarded-for: \r\nx-forwarded-for: 10.0.0.1\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}`);
      assert.match(raw, /^HTTP\/1\.1 200 /);
      assert.deepEqual(seen(), { for: '198.51.100.9, 10.0.0.1, 127.0.0.1', proto: 'http', host: 'h.example' });
      // A Host that is not host[:port] gets 400 (RFC 9112 3.2), not passed on as x-forwarded-host:
      // a node building a redirect from it would take a path, a space or markup in.
      const received = nodes[0]!.received.length;
      for (const host of ['evil.test/x?y <script>', '', 'a b', 'user@h.example', 'h.example:80x', 'h"x']) {
        const answer = await rawExchange(door.url, `GET /rpc/query.execute HTTP/1.1\r\nhost: ${host}\r\nx-lakefront-board: b\r\nconnection: close\r\n\r\n`);
        assert.match(answer, /^HTTP\/1\.1 400 /, JSON.stringify(host));
        assert.match(answer, /a Host that is not host\[:port\]/, JSON.stringify(host));
      }
      assert.equal(nodes[0]!.received.length, received, 'none reached the node');
      for (const host of ['h.example:8080', '10.0.0.1', '[::1]:80', 'xn--bcher-kva.example']) {
        const answer = await rawExchange(door.url, `GET /rpc/query.execute HTTP/1.1\r\nhost: ${host}\r\nx-lakefront-board: b\r\nconnection: close\r\n\r\n`);
        assert.match(answer, /^HTTP\/1\.1 200 /, host);
        assert.equal(seen().host, host);
      }
    } finally {
      await door.stop();
    }
  });

  it('gives an IPv6 client in its short form (::1, not uWS\'s eight full groups)', async () => {
    const door = await FrontDoor.start((parseCommand(['--nodes', `fwd-a=${nodes[0]!.url}`, '--port', '0', '--host', '::1', '--threads', '1', '--forwarded-for', 'append'], {}) as { config: FrontDoorConfig }).config);
    try {
      assert.equal(door.url, `http://[::1]:${door.port}`);
      assert.equal((await rpc(door.url, 'query.execute', 'b')).status, 200);
      assert.equal(seen().for, '::1');
    } finally {
      await door.stop();
    }
    // Against Node's own serialisation (WHATWG URL, RFC 5952's compression) for a spread of forms.
    for (const address of ['::', '::1', '2001:db8::1', '2001:db8:0:0:1:0:0:1', 'fe80::1:0:0:0', '2001:0:0:1:0:0:0:1', '1:2:3:4:5:6:7:8', '0:0:1::']) {
      const bytes = Buffer.alloc(16);
      const full = new URL(`http://[${address}]/`).hostname.slice(1, -1);
      const halves = full.split('::');
      const left = halves[0] ? halves[0].split(':') : [];
      const right = halves.length > 1 && halves[1] ? halves[1].split(':') : [];
      const groups = [...left, ...Array(8 - left.length - right.length).fill('0'), ...right];
      groups.forEach((g, i) => bytes.writeUInt16BE(parseInt(g, 16), i * 2));
      assert.equal(ipv6Text(new DataView(bytes.buffer, bytes.byteOffset, 16)), full, address);
    }
  });

  it('off (the default): the client\'s own headers pass through untouched, and nothing is added', async () => {
    const door = await doorWith([]);
    try {
      await rpc(door.url, 'query.execute', 'b');
      assert.deepEqual(seen(), { for: undefined, proto: undefined, host: undefined });
      await rpc(door.url, 'query.execute', 'b', { headers: claims });
      assert.deepEqual(seen(), { for: '203.0.113.7', proto: 'https', host: 'claimed.example' });
    } finally {
      await door.stop();
    }
    assert.throws(() => parseCommand(['--forwarded-for', 'yes'], {}), /--forwarded-for: must be append or off, got "yes"/);
  });
});

describe('front door: node weights from a configuration file', () => {
  it('ranks by each node\'s configured weight (quantised), and weight 0 takes no board', async () => {
    const nodes = await startNodes('w-heavy', 'w-light', 'w-off');
    const weights = { 'w-heavy': 2, 'w-light': 0.6, 'w-off': 0 } as Record<string, number>;
    const dir = mkdtempSync(join(tmpdir(), 'lf-weights-'));
    const file = join(dir, 'lf.json');
    writeFileSync(file, JSON.stringify({
      clusters: [{ name: 'c', nodes: nodes.map((n) => ({ id: n.id, url: n.url, weight: weights[n.id] })) }],
      routes: [{ path: '/rpc/*', cluster: 'c', keyHeader: 'x-lakefront-board' }],
    }));
    const door = await FrontDoor.start((parseCommand(['--config', file, '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--health-interval-ms', '60000'], {}) as { config: FrontDoorConfig }).config);
    try {
      const info = (await call(`${door.url}/route?board=w-1`)).json<{ ranking: { id: string; weight: number }[] }>();
      assert.deepEqual(Object.fromEntries(info.ranking.map((r) => [r.id, r.weight])), { 'w-heavy': 2, 'w-light': 0.5 }, 'quantised; weight 0 out of the ranking');
      const first = new Map<string, number>();
      for (let i = 0; i < 400; i++) {
        const [head] = await ranking(door.url, `w-board-${i}`);
        first.set(head!, (first.get(head!) ?? 0) + 1);
      }
      // Rendezvous gives each node its weight's share of boards: 2 / 2.5 and 0.5 / 2.5.
      assert.ok((first.get('w-heavy') ?? 0) > 280 && (first.get('w-light') ?? 0) > 40, JSON.stringify([...first]));
      assert.equal(first.get('w-off'), undefined);
      const reply = await rpc(door.url, 'query.execute', 'w-board-0');
      assert.equal(reply.status, 200);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
      rmSync(dir, { recursive: true, force: true });
    }
    assert.throws(() => parseFileConfig({ clusters: [{ name: 'c', nodes: [{ id: 'a', url: 'http://127.0.0.1:1', weight: 3 }] }], routes: [{ path: '/x/*', cluster: 'c', policy: 'round_robin', keyHeader: null }] }, 'lf.json'), /bad weight 3 for node "a" \(a number 0-2/);
    assert.throws(() => parseFileConfig({ clusters: [{ name: 'c', nodes: [{ id: 'a', url: 'http://127.0.0.1:1', weight: '1' }] }], routes: [{ path: '/x/*', cluster: 'c', policy: 'round_robin', keyHeader: null }] }, 'lf.json'), /bad weight "1" for node "a"/);
  });
});

describe('front door: membership and health', () => {
  let nodes: FakeNode[];
  let server: RouterServer;
  before(async () => {
    nodes = await startNodes('h-a', 'h-b', 'h-c');
    server = await frontOver(nodes, { healthIntervalMs: 50 });
  });
  after(async () => {
    await server.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  it('drops a node that stops answering /health from every ranking, and takes it back', async () => {
    const board = 'health-board';
    const [native] = await ranking(server.url, board);
    const node = byId(nodes, native!);
    node.healthy = false;
    await until(server, () => !server.membership.healthyIds().includes(native!));
    assert.ok(!(await ranking(server.url, board)).includes(native!));
    const moved = await rpc(server.url, 'query.execute', board);
    assert.notEqual(moved.headers['x-lakefront-served-by'], native);
    assert.deepEqual((await call(`${server.url}/health`)).json<{ healthy: string[] }>().healthy.includes(native!), false);

    node.healthy = true;
    await until(server, () => server.membership.healthyIds().includes(native!));
    assert.equal((await ranking(server.url, board))[0], native);
    assert.equal((await rpc(server.url, 'query.execute', board)).headers['x-lakefront-served-by'], native);
  });

  it('answers 503 when no node is healthy', async () => {
    for (const n of nodes) n.healthy = false;
    await until(server, () => server.membership.healthyIds().length === 0);
    const forwardedBefore = nodes.reduce((s, n) => s + n.hits(), 0);
    const reply = await rpc(server.url, 'query.execute', 'any-board');
    assert.equal(reply.status, 503);
    assert.equal(reply.json<{ code: string }>().code, 'LF_ERR_NO_HEALTHY_NODE');
    assert.equal(nodes.reduce((s, n) => s + n.hits(), 0), forwardedBefore, 'nothing was forwarded');
    for (const n of nodes) n.healthy = true;
    await until(server, () => server.membership.healthyIds().length === 3);
    assert.equal((await rpc(server.url, 'query.execute', 'any-board')).status, 200);
  });

  it('marks a node that refuses connections unhealthy at once, before its next probe', async () => {
    const slowPolls = await startNodes('r-a', 'r-b');
    const front = await frontOver(slowPolls, { healthIntervalMs: 60_000 });
    try {
      const [native, other] = await ranking(front.url, 'refused');
      await byId(slowPolls, native!).stop();
      const reply = await rpc(front.url, 'query.execute', 'refused');
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['x-lakefront-served-by'], other);
      await until(front, () => !front.membership.healthyIds().includes(native!));
      assert.deepEqual(await ranking(front.url, 'refused'), [other]);
    } finally {
      await front.stop();
      await Promise.all(slowPolls.map((n) => n.stop().catch(() => undefined)));
    }
  });
});

describe('front door: upstream pipelining', () => {
  /**
   * A node that answers each request at once with its path: a read of it with two requests or
   * more means they were written behind one another (answers go at once, so nothing else can put
   * two on one connection's read).
   */
  function readNode(): Promise<RawNode> {
    return startRawNode('n', (socket, request) => {
      const path = request.slice(request.indexOf(' ') + 1, request.indexOf(' HTTP/'));
      socket.write(`HTTP/1.1 200 OK\r\ncontent-length: ${path.length}\r\n\r\n${path}`);
    });
  }

  /** 600 GETs and 150 POSTs over 32 client connections: every answer its own, and what the node read. */
  async function load(door: FrontDoor, node: { reads: string[][] }): Promise<string[][]> {
    const client = new Pool(door.url, { connections: 32 });
    try {
      let next = 0;
      await Promise.all(
        Array.from({ length: 32 }, async () => {
          while (next < 750) {
            const i = next++;
            const write = i % 5 === 4;
            const path = `/rpc/${write ? 'w' : 'r'}${i}`;
            const res = await client.request({ path, method: write ? 'POST' : 'GET', headers: { 'x-lakefront-board': `board-${i % 7}` }, ...(write ? { body: '{}' } : {}) });
            assert.equal(res.statusCode, 200);
            assert.equal(await res.body.text(), path, 'each request its own answer');
          }
        }),
      );
    } finally {
      await client.close();
    }
    const all = node.reads.flat();
    assert.equal(all.length, 750, 'each request reached the node once');
    assert.equal(new Set(all).size, 750);
    return node.reads;
  }

  it("writes a turn's reads to a node behind one another, never a write, and each gets its own answer", async () => {
    const node = await readNode();
    const door = await FrontDoor.start(doorConfig([node], { upstreamPipelining: 8, hedgeMode: 'off' }));
    try {
      const reads = await load(door, node);
      const shared = reads.filter((r) => r.length > 1);
      assert.ok(shared.length > 0, 'some reads of the node held two requests or more');
      for (const read of shared) assert.ok(read.every((r) => r.startsWith('GET ')), `a write shared a read: ${read.join(', ')}`);
      assert.ok(Math.max(...reads.map((r) => r.length)) <= 8, 'at most 8 a connection');
      const stats = (await call(`${door.url}/stats`)).json<{ pipelining: { pipelined: number; refused: number } }>();
      // Each request the node read behind another in one read followed it (a batch split over two reads would count fewer here).
      assert.ok(stats.pipelining.pipelined >= reads.reduce((n, r) => n + r.length - 1, 0) && stats.pipelining.pipelined > 0, `/stats counts each request that followed another: ${stats.pipelining.pipelined}`);
      assert.ok(stats.pipelining.pipelined < 600, 'only reads follow');
      assert.equal(stats.pipelining.refused, 0);
    } finally {
      await door.stop();
      await node.stop();
    }
  });

  it('route() takes upstreamPipelining as the command takes --upstream-pipelining', async () => {
    const node = await readNode();
    const server = await route({ nodes: [{ id: 'n', url: node.url }], port: 0, host: '127.0.0.1', threads: 1, healthIntervalMs: 60_000, hedgeDelayMs: 60_000, upstreamPipelining: 8 });
    try {
      const reads = await load(server.frontDoor, node);
      assert.ok(reads.some((r) => r.length > 1));
      assert.ok((await call(`${server.url}/stats`)).json<{ pipelining: { pipelined: number } }>().pipelining.pipelined > 0);
    } finally {
      await server.stop();
      await node.stop();
    }
  });

  it('writes one request a connection at a time by default', async () => {
    const node = await readNode();
    const door = await FrontDoor.start(doorConfig([node], { hedgeMode: 'off' }));
    try {
      const reads = await load(door, node);
      assert.deepEqual(reads.filter((r) => r.length > 1), []);
      assert.deepEqual((await call(`${door.url}/stats`)).json<{ pipelining: unknown }>().pipelining, { pipelined: 0, refused: 0 });
    } finally {
      await door.stop();
      await node.stop();
    }
  });
});

describe('front door: workers', () => {
  let nodes: FakeNode[];
  let server: RouterServer;
  before(async () => {
    nodes = await startNodes('w-a', 'w-b');
    server = await frontOver(nodes, { healthIntervalMs: 60_000 });
  });
  after(async () => {
    await server.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  it('replaces a worker that dies while the other keeps serving', async () => {
    const door = server.frontDoor;
    assert.deepEqual(door.workerSlots.sort(), [1, 2]);
    const exited = once(door, 'worker-exit');
    const replaced = once(door, 'worker-replaced');
    door.crashWorker(1);
    const [slot, code] = (await exited) as [number, number];
    assert.equal(slot, 1);
    assert.equal(code, 70);
    // While slot 1 is down, new connections still get answers (from slot 2).
    for (let i = 0; i < 10; i++) assert.equal((await rpc(server.url, 'query.execute', `during-${i}`, { fresh: true })).status, 200);
    await replaced;
    assert.deepEqual(door.workerSlots.sort(), [1, 2]);
    const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => rpc(server.url, 'query.execute', `after-${i}`, { fresh: true })));
    assert.ok(replies.every((r) => r.status === 200));
  });

  it('a worker that dies answers its requests in flight first: 502 for a bare write sent, 503 for a read; nothing is sent again', async () => {
    const held = await startNodes('crash-a');
    held[0]!.behaviour = { kind: 'hang' };
    const door = await FrontDoor.start(doorConfig(held, { hedgeDelayMs: 60_000 }));
    try {
      const url = door.url;
      const write = rpc(url, 'board.append', 'crash-in-flight');
      const read = rpc(url, 'query.execute', 'crash-in-flight');
      while (held[0]!.hits('/rpc/') < 2) await once(held[0]!, 'request');
      const replaced = once(door, 'worker-replaced');
      door.crashWorker(1);
      // Before: both connections were cut (ECONNRESET), the write's outcome left unsaid.
      const [writeReply, readReply] = await Promise.all([write, read]);
      assertFailure(writeReply, 502, 'LF_ERR_OUTCOME_UNKNOWN');
      assertFailure(readReply, 503, 'LF_ERR_SHUTTING_DOWN');
      await replaced;
      assert.equal(held[0]!.hits('/rpc/board.append'), 1, 'the bare write was sent once');
    } finally {
      await door.stop();
      await held[0]!.stop();
    }
  });
});

/** `bytes` ASCII characters that do not repeat with any short period (an offset error shows). */
function unevenText(bytes: number): string {
  const out = Buffer.allocUnsafe(bytes);
  let x = 12345;
  for (let i = 0; i < bytes; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    out[i] = 97 + ((x >>> 16) % 26);
  }
  return out.toString('latin1');
}

/**
 * One request over a raw connection whose reader stops after the first bytes of the answer and
 * reads on once `resume` settles. Resolves with the answer's head and its body bytes as read
 * until the connection closed (`closed`) or (unless `untilClose`) the body's length was read.
 */
async function readLate(port: number, request: string, resume: (firstBytes: Promise<void>) => Promise<unknown>, untilClose = false): Promise<{ head: string; body: Buffer; closed: boolean }> {
  const socket = connect(port, '127.0.0.1');
  const chunks: Buffer[] = [];
  let total = 0;
  let length = -1;
  let headBytes = -1;
  let head = '';
  let closed = false;
  const first = new Promise<void>((resolve) => socket.once('data', () => resolve()));
  const done = new Promise<void>((resolve) => {
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      total += chunk.length;
      if (headBytes < 0) {
        const all = Buffer.concat(chunks);
        const end = all.indexOf('\r\n\r\n');
        if (end < 0) return;
        headBytes = end + 4;
        head = all.subarray(0, end).toString('latin1');
        length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? -1);
      }
      if (!untilClose && length >= 0 && total - headBytes >= length) resolve();
    });
    socket.on('close', () => {
      closed = true;
      resolve();
    });
  });
  socket.on('error', () => {});
  socket.write(request);
  await first;
  socket.pause();
  await resume(first);
  socket.resume();
  await done;
  const body = Buffer.concat(chunks).subarray(Math.max(headBytes, 0));
  socket.destroy();
  return { head, body, closed };
}

describe('front door: large answers to clients that read late', () => {
  const BIG = unevenText(8 * 1024 * 1024);
  let nodes: FakeNode[];
  before(async () => {
    nodes = await startNodes('big-a');
    nodes[0]!.behaviour = { kind: 'answer', body: BIG };
  });
  after(() => Promise.all(nodes.map((n) => n.stop())));

  it('sends every byte of an 8 MiB answer, in order, once the client reads; where the client asked to close, closes after it, saying so once', async () => {
    const door = await FrontDoor.start(doorConfig(nodes, { hedgeMode: 'off', maxResponseBytes: 16 * 1024 * 1024 }));
    try {
      const ask = (connection: string): string => `GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: late${connection}\r\n\r\n`;
      // The client reads on once the front door has answered another request meanwhile.
      const kept = await readLate(door.port, ask(''), () => rpc(door.url, 'query.execute', 'meanwhile'));
      assert.equal(kept.body.length, BIG.length);
      assert.ok(kept.body.equals(Buffer.from(BIG, 'latin1')), 'the body arrived as the node sent it');
      assert.equal(kept.closed, false, 'a keep-alive answer leaves the connection open');
      // Read until the connection closes: the whole body came before the close, and nothing after it.
      const closing = await readLate(door.port, ask('\r\nconnection: close'), () => rpc(door.url, 'query.execute', 'meanwhile'), true);
      assert.ok(closing.closed);
      assert.ok(closing.body.equals(Buffer.from(BIG, 'latin1')));
      assert.equal(closing.head.match(/\r\nconnection: close/gi)?.length, 1, closing.head);
    } finally {
      await door.stop();
    }
  });

  it('a stop waits for a client still reading a large answer (until the drain deadline), then closes: the client has all of it', async () => {
    const door = await FrontDoor.start(doorConfig(nodes, { hedgeMode: 'off', maxResponseBytes: 16 * 1024 * 1024, drainTimeoutMs: 10_000 }));
    let stopped = false;
    let stoppedBeforeReading = true;
    let stopping: Promise<void> | null = null;
    const answer = await readLate(door.port, 'GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: drain-late\r\n\r\n', async () => {
      stopping = door.stop().then(() => {
        stopped = true;
      });
      // Long past the drain's quiet period (100 ms), in which a front door that counted the
      // answer as done would have closed the connection with the rest unsent.
      await Promise.race([stopping, new Promise((resolve) => setTimeout(resolve, 500))]);
      stoppedBeforeReading = stopped;
    });
    assert.equal(stoppedBeforeReading, false, 'the stop waited for the answer');
    await stopping;
    assert.equal(answer.body.length, BIG.length);
    assert.ok(answer.body.equals(Buffer.from(BIG, 'latin1')));
  });

  it('an answer that comes during a stop says connection: close, and a client reading it late has all of it before the close', async () => {
    const door = await FrontDoor.start(doorConfig(nodes, { hedgeMode: 'off', maxResponseBytes: 16 * 1024 * 1024, drainTimeoutMs: 10_000 }));
    const node = nodes[0]!;
    // The node holds its answer a moment, so that it comes once the stop has begun.
    node.behaviour = { kind: 'answer', body: BIG, delayMs: 300 };
    let stopped = false;
    let stopping: Promise<void> | null = null;
    node.once('request', () => {
      stopping = door.stop().then(() => {
        stopped = true;
      });
    });
    try {
      // Whether the stop had ended when the client reads on (it ends only after the close the
      // client then waits for, so it is asked then, not after).
      let stoppedBeforeReading = true;
      const answer = await readLate(
        door.port,
        'GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: drain-during\r\n\r\n',
        async () => {
          await Promise.race([stopping, new Promise((resolve) => setTimeout(resolve, 500))]);
          stoppedBeforeReading = stopped;
        },
        true,
      );
      assert.equal(stoppedBeforeReading, false, 'the stop waited for the answer');
      assert.equal(answer.head.match(/\r\nconnection: close/gi)?.length, 1, answer.head);
      assert.ok(answer.closed);
      assert.equal(answer.body.length, BIG.length);
      assert.ok(answer.body.equals(Buffer.from(BIG, 'latin1')));
      await stopping;
    } finally {
      node.behaviour = { kind: 'answer', body: BIG };
    }
  });
});

describe('front door: the drain deadline', () => {
  it('answers every request still unanswered before it closes: 502 for a bare write that may have landed, 503 otherwise', async () => {
    const nodes = await startNodes('d-a', 'd-b');
    for (const node of nodes) node.behaviour = { kind: 'hang' };
    const server = await route({
      nodes: nodes.map((n) => ({ id: n.id, url: n.url })),
      port: 0,
      host: '127.0.0.1',
      threads: 1,
      hedgeDelayMs: 60_000,
      healthIntervalMs: 60_000,
      drainTimeoutMs: 100,
    });
    // A request whose body never finishes arriving: headers and 2 of 10 bytes.
    const partial = connect(Number(new URL(server.url).port), '127.0.0.1');
    await once(partial, 'connect');
    let partialReply = '';
    partial.on('data', (chunk: Buffer) => (partialReply += chunk.toString()));
    try {
      // Written before the other two connect: the worker reads it first (one thread).
      partial.write('POST /rpc/board.append HTTP/1.1\r\nhost: x\r\nx-lakefront-board: drain-deadline\r\ncontent-length: 10\r\n\r\n{}');
      const write = rpc(server.url, 'board.append', 'drain-deadline');
      const read = rpc(server.url, 'query.execute', 'drain-deadline');
      // Both proxied requests are held by a node before the stop begins.
      while (nodes.reduce((sum, n) => sum + n.hits('/rpc/'), 0) < 2) await Promise.race(nodes.map((n) => once(n, 'request')));
      const closed = once(partial, 'close');
      await server.stop();
      const [writeReply, readReply] = await Promise.all([write, read]);
      assertFailure(writeReply, 502, 'LF_ERR_OUTCOME_UNKNOWN');
      assertFailure(readReply, 503, 'LF_ERR_SHUTTING_DOWN');
      await closed;
      assert.match(partialReply, /^HTTP\/1\.1 503 /);
      assert.match(partialReply, /"code":"LF_ERR_SHUTTING_DOWN"/);
      assert.equal(nodes.reduce((sum, n) => sum + n.hits('/rpc/board.append'), 0), 1, 'the bare write was sent once');
    } finally {
      partial.destroy();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
  for (const upstreamClient of ['h1', 'undici'] as const) it(`a bare write still queued for a connection at the deadline gets 503: it never left (${upstreamClient})`, async () => {
    const [node] = await startNodes('q-a');
    node!.behaviour = { kind: 'hang' };
    // One connection to the node: the second write waits in the pool's queue.
    const door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [{ name: 'default', members: [{ id: 'q-a', url: node!.url }] }],
      routes: [RPC_ROUTE],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({ upstreamClient, upstreamConnections: 1, drainTimeoutMs: 100, hedgeDelayMs: 60_000 }),
    });
    try {
      const sent = rpc(door.url, 'board.append', 'queued-1');
      await node!.waitForRequests(1);
      // No body: the request is queued in the same handler call that counts it.
      const queued = rpc(door.url, 'board.append', 'queued-2', { body: '' });
      while (((await door.stats()) as { requests: number }).requests < 2);
      await door.stop();
      const [sentReply, queuedReply] = await Promise.all([sent, queued]);
      assertFailure(sentReply, 502, 'LF_ERR_OUTCOME_UNKNOWN');
      assertFailure(queuedReply, 503, 'LF_ERR_SHUTTING_DOWN');
      assert.deepEqual(node!.received.map((r) => r.headers['x-lakefront-board']), ['queued-1']);
    } finally {
      await node!.stop();
    }
  });
});

/** A kernel setting under /proc/sys, trimmed; null where it cannot be read. */
function readSysctl(path: string): string | null {
  try {
    return readFileSync(`/proc/sys/${path}`, 'utf8').trim();
  } catch {
    return null;
  }
}

/**
 * A read on a new connection of its own (a raw socket: a client's pool would reuse a kept-alive
 * one): which node answered it, or undefined when nothing came (a reset).
 */
async function servedByOnNewConnection(url: string, board: string): Promise<string | undefined> {
  const { host } = new URL(url);
  const text = await rawExchange(url, `GET /rpc/query.execute HTTP/1.1\r\nhost: ${host}\r\nx-lakefront-board: ${board}\r\nconnection: close\r\n\r\n`);
  return /x-lakefront-served-by: ([^\r]*)/i.exec(text)?.[1];
}

describe('front door: reload', () => {
  function configOver(members: readonly FakeNode[], threads = 2): FrontDoorConfig {
    return {
      host: '127.0.0.1',
      port: 0,
      threads,
      clusters: [{ name: 'default', members: members.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [RPC_ROUTE],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({ hedgeDelayMs: 60_000 }),
    };
  }

  it('takes over the port with the new nodes, and not one request fails or is sent twice (keep-alive writes in closed loops, through four reloads)', async () => {
    const [a, b] = await startNodes('rl-a', 'rl-b');
    let door = await FrontDoor.start(configOver([a!]));
    const port = door.port;
    // Keep-alive connections, as clients hold them: each answer that closes one says so.
    const pool = new Pool(door.url, { connections: 8 });
    const statuses = new Map<number | string, number>();
    let running = true;
    const loops = Array.from({ length: 8 }, async (_, i) => {
      for (let n = 0; running; n++) {
        try {
          const reply = await pool.request({ path: '/rpc/board.append', method: 'POST', body: `{"n":${n}}`, headers: { 'x-lakefront-board': `loop-${i}` } });
          await reply.body.text();
          statuses.set(reply.statusCode, (statuses.get(reply.statusCode) ?? 0) + 1);
        } catch (err) {
          const code = (err as { code?: string }).code ?? String(err);
          statuses.set(code, (statuses.get(code) ?? 0) + 1);
        }
      }
    });
    /** Resolves at the next request either node gets. */
    const nextRequest = (): Promise<void> =>
      new Promise((resolve) => {
        const seen = (): void => {
          a!.off('request', seen);
          b!.off('request', seen);
          resolve();
        };
        a!.on('request', seen);
        b!.on('request', seen);
      });
    try {
      const sets = [[a!, b!], [b!], [a!], [a!, b!]];
      for (const members of sets) {
        // Some answers from the front door in place before each reload.
        const before = a!.hits('/rpc/') + b!.hits('/rpc/');
        while (a!.hits('/rpc/') + b!.hits('/rpc/') < before + 50) await nextRequest();
        const previous = door;
        door = await previous.reload(configOver(members, members.length));
        assert.equal(door.port, port);
        // Once the previous one has drained, every connection reaches the new one (until then
        // a connection kept alive may still reach the old one, and get its answer).
        await previous.drained;
        // Over a connection of its own: one kept alive from the last round was closed by the drain.
        const client = new Client(door.url);
        try {
          const health = await client.request({ path: '/health', method: 'GET' });
          assert.deepEqual(((await health.body.json()) as { healthy: string[] }).healthy.sort(), members.map((m) => m.id).sort());
        } finally {
          await client.close();
        }
      }
      // The last configuration serves: its nodes get the writes now.
      const seen = b!.hits('/rpc/');
      while (b!.hits('/rpc/') < seen + 20) await once(b!, 'request');
    } finally {
      running = false;
      await Promise.all(loops);
      await pool.close();
      await door.stop();
      await Promise.all([a!.stop(), b!.stop()]);
    }
    const answered = statuses.get(200) ?? 0;
    // A connection the kernel queued on an old worker's listening socket as it closed is reset,
    // unless net.ipv4.tcp_migrate_req is 1 (README, reload; clients reconnect as old connections
    // close): then, and only then, a reset. Nothing else fails.
    const failed = [...statuses].filter(([outcome]) => outcome !== 200);
    if (readSysctl('net/ipv4/tcp_migrate_req') === '1') assert.deepEqual(failed, [], `every request answered 200: ${JSON.stringify([...statuses])}`);
    else assert.ok(failed.every(([outcome, n]) => outcome === 'ECONNRESET' && n <= answered / 1000), `every request answered 200 but for a rare reset: ${JSON.stringify([...statuses])}`);
    // Exactly once: as many writes reached the nodes as were answered (a reset one never left).
    assert.equal(a!.hits('/rpc/board.append') + b!.hits('/rpc/board.append'), answered);
  });

  it('answers what was in flight from the configuration it began in', async () => {
    const [slow, fresh] = await startNodes('rl-slow', 'rl-fresh');
    slow!.behaviour = { kind: 'answer', delayMs: 300, body: 'from the old configuration' };
    const door = await FrontDoor.start(configOver([slow!], 1));
    let next: FrontDoor | null = null;
    try {
      const pending = rpc(door.url, 'board.append', 'in-flight');
      await slow!.waitForRequests(1);
      next = await door.reload(configOver([fresh!], 1));
      // New requests go to the new configuration while the old one still waits for its node. On
      // a new connection, a raw one: a client's pool would reuse one the old workers still answer
      // on (the in-flight request's, if its answer came while the new workers started). (A
      // connection the kernel queued on an old worker's listening socket as it closed is reset
      // unless net.ipv4.tcp_migrate_req is 1: README, reload: no answer, and the read is tried again.)
      const after = (): Promise<string | undefined> => servedByOnNewConnection(next!.url, 'after');
      assert.equal((await after()) ?? (await after()), 'rl-fresh');
      const reply = await pending;
      assert.equal(reply.status, 200);
      assert.equal(reply.text, 'from the old configuration');
      assert.equal(reply.headers['x-lakefront-served-by'], 'rl-slow');
      await door.drained;
    } finally {
      await door.stop();
      await next?.stop();
      await Promise.all([slow!.stop(), fresh!.stop()]);
    }
  });

  it('sends every connection made once the reload has resolved to the new configuration', async () => {
    const [old, fresh] = await startNodes('ru-old', 'ru-fresh');
    const door = await FrontDoor.start(configOver([old!], 1));
    let next: FrontDoor | null = null;
    try {
      // Old workers with connections of their own, as a front door in use has.
      for (let i = 0; i < 4; i++) assert.equal((await rpc(door.url, 'query.execute', `ru-${i}`)).headers['x-lakefront-served-by'], 'ru-old');
      next = await door.reload(configOver([fresh!], 1));
      // At once, twenty new connections side by side (raw sockets: a client's pool would reuse the
      // connections above, which the old workers still answer on): none may land on an old worker,
      // which would answer from the old configuration. One the kernel had queued on an old
      // worker's socket as it closed is reset (README, reload): such a read is tried again.
      const ask = (i: number): Promise<string | undefined> => servedByOnNewConnection(next!.url, `ru-after-${i}`);
      const servedBy = await Promise.all(Array.from({ length: 20 }, async (_, i) => (await ask(i)) ?? (await ask(i))));
      assert.deepEqual(new Set(servedBy), new Set(['ru-fresh']));
      await door.drained;
    } finally {
      await door.stop();
      await next?.stop();
      await Promise.all([old!.stop(), fresh!.stop()]);
    }
  });

  it('counts on in /stats across reloads: requests, and each node by id (also a node left out of one configuration and back in the next)', async () => {
    const [slow, other] = await startNodes('rs-slow', 'rs-other');
    // Slow enough that the reload and a /stats come well within it.
    slow!.behaviour = { kind: 'answer', delayMs: 1500 };
    type Stats = { requests: number; nodes: Record<string, { attempts: number; wins: number; inflight: number }> };
    /** /stats over a fresh connection (one landing on an old worker as it closes is reset: README, reload). */
    const stats = async (door: FrontDoor): Promise<Stats> => {
      const ask = (): Promise<Reply> => call(`${door.url}/stats`, { fresh: true });
      return (await ask().catch(ask)).json<Stats>();
    };
    const first = await FrontDoor.start(configOver([slow!, other!], 1));
    let second: FrontDoor | null = null;
    let third: FrontDoor | null = null;
    try {
      // Boards that rank each node first (a write goes to its first node only).
      const boardFor = async (id: string): Promise<string> => {
        for (let i = 0; ; i++) if ((await ranking(first.url, `rs-${i}`))[0] === id) return `rs-${i}`;
      };
      const toSlow = await boardFor('rs-slow');
      const toOther = await boardFor('rs-other');
      for (const board of [toOther, toOther, toOther]) assert.equal((await rpc(first.url, 'board.append', board)).status, 200);
      const held = rpc(first.url, 'board.append', toSlow);
      await slow!.waitForRequests(1);
      second = await first.reload(configOver([slow!], 1));
      // The old front door still waits for its slow node: its counts and what it has in flight are in.
      const during = await stats(second);
      assert.equal(during.requests, 4, JSON.stringify(during));
      assert.equal(during.nodes['rs-slow']!.inflight, 1, JSON.stringify(during));
      assert.equal(during.nodes['rs-other'], undefined, 'a node no longer configured is not listed');
      assert.equal((await held).status, 200);
      await first.drained;
      // The new configuration has one node: every board goes there.
      assert.equal((await rpc(second.url, 'board.append', toOther)).status, 200);
      const after = await stats(second);
      assert.equal(after.requests, 5, JSON.stringify(after));
      assert.equal(after.nodes['rs-slow']!.inflight, 0);
      assert.equal(after.nodes['rs-slow']!.wins, 2);
      // Every attempt either node ever got is counted, by node id, through both reloads.
      third = await second.reload(configOver([slow!, other!], 1));
      await second.drained;
      const last = await stats(third);
      assert.equal(last.nodes['rs-slow']!.attempts, slow!.hits('/rpc/'));
      assert.equal(last.nodes['rs-other']!.attempts, other!.hits('/rpc/'));
      assert.equal(last.nodes['rs-other']!.wins, 3);
      assert.equal(last.requests, after.requests);
    } finally {
      await first.stop();
      await second?.stop();
      await third?.stop();
      await Promise.all([slow!.stop(), other!.stop()]);
    }
  });

  it('answers a /stats reaching an old worker during its drain for the newest front door, after two reloads', async () => {
    const [node] = await startNodes('rn-one');
    node!.behaviour = { kind: 'answer', delayMs: 1500 };
    const first = await FrontDoor.start(configOver([node!], 1));
    let second: FrontDoor | null = null;
    let third: FrontDoor | null = null;
    // A keep-alive connection the first front door's worker accepted.
    const socket = connect(first.port, '127.0.0.1');
    await once(socket, 'connect');
    let text = '';
    socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')));
    const statsOverIt = async (): Promise<{ requests: number; nodes: Record<string, { inflight: number }> }> => {
      text = '';
      socket.write('GET /stats HTTP/1.1\r\nhost: x\r\n\r\n');
      for (;;) {
        const at = text.indexOf('\r\n\r\n');
        const length = /content-length: (\d+)/i.exec(text);
        if (at >= 0 && length && text.length >= at + 4 + Number(length[1])) return JSON.parse(text.slice(at + 4));
        await once(socket, 'data');
      }
    };
    try {
      assert.equal((await statsOverIt()).requests, 0);
      // Held by the slow node: the first front door drains until it is answered.
      const held = rpc(first.url, 'board.append', 'held');
      await node!.waitForRequests(1);
      node!.behaviour = { kind: 'answer' };
      second = await first.reload(configOver([node!], 1));
      third = await second.reload(configOver([node!], 1));
      for (let i = 0; i < 2; i++) assert.equal((await rpc(third.url, 'query.execute', `then-${i}`, { fresh: true }).catch(() => rpc(third!.url, 'query.execute', `again-${i}`, { fresh: true }))).status, 200);
      const old = await statsOverIt();
      const newest = (await third.stats()) as { requests: number; nodes: Record<string, { inflight: number }> };
      assert.equal(old.requests, newest.requests);
      assert.equal(old.requests, 3);
      assert.equal(old.nodes['rn-one']!.inflight, 1, 'the held request, in the first front door');
      assert.equal((await held).status, 200);
      await Promise.all([first.drained, second.drained]);
    } finally {
      socket.destroy();
      await first.stop();
      await second?.stop();
      await third?.stop();
      await node!.stop();
    }
  });

  it('says connection: close on every answer of a draining front door (HEAD, /stats, /route refusals), so keep-alive clients move on', async () => {
    const [slow, fresh] = await startNodes('rl-hold', 'rl-next');
    slow!.behaviour = { kind: 'answer', delayMs: 300 };
    const door = await FrontDoor.start(configOver([slow!], 1));
    /** A keep-alive connection the old workers accepted (one answer on it), to ask one thing later. */
    const kept = async (): Promise<{ ask: (request: string) => Promise<string>; close: () => void }> => {
      const socket = connect(door.port, '127.0.0.1');
      await once(socket, 'connect');
      let text = '';
      socket.on('data', (chunk: Buffer) => (text += chunk.toString('latin1')));
      const ask = async (request: string): Promise<string> => {
        const from = text.length;
        socket.write(request);
        while (!text.slice(from).includes('\r\n\r\n')) await once(socket, 'data');
        // The head and whatever came with it (a body is written with its head, in one piece).
        return text.slice(from);
      };
      await ask('GET /health HTTP/1.1\r\nhost: x\r\n\r\n');
      return { ask, close: () => socket.destroy() };
    };
    const connections = await Promise.all([kept(), kept(), kept(), kept()]);
    let next: FrontDoor | null = null;
    try {
      // Held by the slow node: the old front door drains until it is answered.
      const pending = rpc(door.url, 'board.append', 'holding');
      await slow!.waitForRequests(1);
      next = await door.reload(configOver([fresh!], 1));
      const [stats, route, head, ownHead] = await Promise.all([
        connections[0]!.ask('GET /stats HTTP/1.1\r\nhost: x\r\n\r\n'),
        connections[1]!.ask('GET /route HTTP/1.1\r\nhost: x\r\n\r\n'),
        connections[2]!.ask('HEAD /rpc/node.stats HTTP/1.1\r\nhost: x\r\nx-lakefront-board: draining\r\n\r\n'),
        connections[3]!.ask('HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n'),
      ]);
      // A HEAD answer the front door makes itself: its length, no body, and the close.
      assert.match(ownHead, /^HTTP\/1\.1 200 [^]*\r\nconnection: close/i, ownHead);
      assert.match(ownHead, /\r\ncontent-length: [1-9]\d*\r\n/i, ownHead);
      assert.ok(ownHead.endsWith('\r\n\r\n'), `no body after a HEAD answer: ${ownHead}`);
      assert.match(stats, /^HTTP\/1\.1 200 [^]*\r\nconnection: close/i, stats);
      assert.match(route, /^HTTP\/1\.1 400 [^]*\r\nconnection: close/i, route);
      // Answered by the old configuration (its connection), saying it closes.
      assert.match(head, /^HTTP\/1\.1 200 [^]*x-lakefront-served-by: rl-hold[^]*\r\nconnection: close/i, head);
      assert.ok(head.endsWith('\r\n\r\n'), head);
      assert.equal((await pending).status, 200);
      await door.drained;
    } finally {
      for (const c of connections) c.close();
      await door.stop();
      await next?.stop();
      await Promise.all([slow!.stop(), fresh!.stop()]);
    }
  });

  it('refuses another port or host, or a configuration that cannot start, and goes on serving', async () => {
    const [a] = await startNodes('rl-keep');
    const door = await FrontDoor.start(configOver([a!], 1));
    try {
      await assert.rejects(door.reload({ ...configOver([a!], 1), port: door.port === 65535 ? 65534 : door.port + 1 }), /port: a reload keeps port \d+/);
      await assert.rejects(door.reload({ ...configOver([a!], 1), host: '0.0.0.0' }), /host: a reload keeps the address 127\.0\.0\.1/);
      await assert.rejects(door.reload(configOver([{ id: 'tls', url: 'https://127.0.0.1:9' } as FakeNode], 1)), /is https, which the built-in upstream client does not speak/);
      const reply = await rpc(door.url, 'query.execute', 'still');
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['x-lakefront-served-by'], 'rl-keep');
      // One reload at a time; once done, it is the front door that took over that reloads next.
      const first = door.reload(configOver([a!], 1));
      await assert.rejects(door.reload(configOver([a!], 1)), /a reload is already under way, or done/);
      const next = await first;
      try {
        await assert.rejects(door.reload(configOver([a!], 1)), /the front door is stopping/);
        // Once the old front door has drained, no connection can land on its workers.
        await door.drained;
        assert.equal((await rpc(next.url, 'query.execute', 'next')).status, 200);
      } finally {
        await next.stop();
      }
    } finally {
      await door.stop();
      await a!.stop();
    }
  });
});

describe('front door: start-up', () => {
  it('takes a route on every path (/*), keeping its own /health, and refuses a route on /health', async () => {
    const nodes = await startNodes('all-a', 'all-b');
    const door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [{ pattern: '/*', cluster: 'default', policy: 'round_robin', keyHeader: null }],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({}),
    });
    try {
      const reply = await call(`${door.url}/any/path?x=1`);
      assert.equal(reply.status, 200);
      assert.match(String(reply.headers['x-lakefront-served-by']), /^all-[ab]$/);
      assert.deepEqual((await call(`${door.url}/health`)).json<{ healthy: string[] }>().healthy.sort(), ['all-a', 'all-b']);
      // Every method on its own paths is the front door's: not passed to the catch-all route.
      const hits = nodes.reduce((s, n) => s + n.hits(), 0);
      assert.equal((await call(`${door.url}/health`, { method: 'POST', body: 'x' })).status, 405);
      assert.equal(nodes.reduce((s, n) => s + n.hits(), 0), hits);
      await assert.rejects(
        FrontDoor.start({
          host: '127.0.0.1',
          port: 0,
          threads: 1,
          clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
          routes: [{ pattern: '/health', cluster: 'default', policy: 'round_robin', keyHeader: null }],
          healthIntervalMs: 60_000,
          healthTimeoutMs: 500,
          settings: defaultSettings({}),
        }),
        /route \/health: the front door answers \/health, \/route, \/stats itself/,
      );
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('refuses a path with a dot segment on a plain route: /public/../admin must not reach the node behind /public/*', async () => {
    const nodes = await startNodes('pub-a');
    const door = await FrontDoor.start(doorConfig(nodes, {}, { routes: [{ pattern: '/public/*', cluster: 'default', policy: 'round_robin', keyHeader: null }, RPC_ROUTE] }));
    try {
      // Raw bytes: fetch and undici would resolve the segments before sending.
      const paths = ['/public/../admin', '/public/./x', '/public/%2e%2e/admin', '/public/.%2E;v=1/admin', '/public/x%2F..%2F..%2Fadmin', '/public/..\\admin', '/public/x/..', '/public/..#x', '/public/x/.%2e#', '/rpc/board.append/../board.delete'];
      for (const path of paths) {
        const raw = await rawExchange(door.url, `GET ${path} HTTP/1.1\r\nhost: x\r\nx-lakefront-board: dots\r\n\r\n`, { done: (text) => text.endsWith('}') });
        assert.match(raw, /^HTTP\/1\.1 400 /, path);
        assert.match(raw, /dot segment/, path);
        assert.match(raw, /LF_ERR_BAD_REQUEST/, path);
      }
      assert.equal(nodes[0]!.hits(), 0, 'no dotted path reached the node');
      // Dots inside a segment are a name, not a dot segment.
      for (const path of ['/public/a..b', '/public/.well-known/x', '/public/v1.2/...']) {
        const raw = await rawExchange(door.url, `GET ${path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n`);
        assert.match(raw, /^HTTP\/1\.1 200 /, path);
      }
      assert.equal(nodes[0]!.hits(), 3);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('refuses TRACE and CONNECT (405, with allow) and a path with an encoded NUL (400), as nginx does, without asking a node', async () => {
    const nodes = await startNodes('trace-a');
    const door = await FrontDoor.start(doorConfig(nodes, {}, { routes: [{ pattern: '/public/*', cluster: 'default', policy: 'round_robin', keyHeader: null }, RPC_ROUTE] }));
    try {
      // On the keyed route, without its key too: the method is refused first.
      for (const [method, path, board] of [['TRACE', '/public/x', ''], ['TRACE', '/rpc/board.get', 'x-lakefront-board: t\r\n'], ['TRACE', '/rpc/board.get', ''], ['CONNECT', '/public/x', ''], ['CONNECT', '/rpc/x', 'x-lakefront-board: t\r\n']] as const) {
        const raw = await rawExchange(door.url, `${method} ${path} HTTP/1.1\r\nhost: x\r\n${board}\r\n`, { done: (text) => text.endsWith('}') });
        assert.match(raw, /^HTTP\/1\.1 405 /, `${method} ${path}`);
        assert.match(raw, /\r\nallow: GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH\r\n/i, path);
        assert.match(raw, new RegExp(`${method} is not forwarded`), path);
        assert.match(raw, /LF_ERR_METHOD_NOT_ALLOWED/, path);
      }
      for (const path of ['/public/admin%00.txt', '/public/%00', '/rpc/board.get%000']) {
        const raw = await rawExchange(door.url, `GET ${path} HTTP/1.1\r\nhost: x\r\nx-lakefront-board: t\r\n\r\n`, { done: (text) => text.endsWith('}') });
        assert.match(raw, /^HTTP\/1\.1 400 /, path);
        assert.match(raw, /encoded NUL/, path);
        assert.match(raw, /LF_ERR_BAD_REQUEST/, path);
      }
      assert.equal(nodes[0]!.hits(), 0, 'neither reached the node');
      // An encoded percent sign followed by zeros is not a NUL; other methods pass.
      for (const request of ['GET /public/%2500 HTTP/1.1', 'OPTIONS /public/x HTTP/1.1', 'GET /public/a?q=%00 HTTP/1.1']) {
        const raw = await rawExchange(door.url, `${request}\r\nhost: x\r\nconnection: close\r\n\r\n`);
        assert.match(raw, /^HTTP\/1\.1 200 /, request);
      }
      assert.equal(nodes[0]!.hits(), 3);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('resends a read whose kept-alive connection the node had closed, to the same node, unblamed; never a GET the route takes for a write', async () => {
    const destroyed = new Set<string>();
    const node = await startRawNode('stale', (socket, request) => {
      const target = request.split(' ')[1]!;
      // The first time each of these arrives, the node closes the (kept-alive) connection on it.
      if ((target === '/zk/create' || target === '/zk/get?stale') && !destroyed.has(target)) {
        destroyed.add(target);
        socket.destroy();
      } else socket.write(`HTTP/1.1 200 OK\r\ncontent-length: ${target.length}\r\n\r\n${target}`);
    });
    const door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [{ name: 'default', members: [{ id: node.id, url: node.url }] }],
      routes: [{ pattern: '/zk/*', cluster: 'default', policy: 'round_robin', keyHeader: null, operations: { reads: ['/zk/get'], writes: [], otherwise: 'write' }, hedge: false }],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({}),
    });
    const failures = async (): Promise<number> => (await call(`${door.url}/stats`)).json<{ nodes: Record<string, { failures: number }> }>().nodes[node.id]!.failures;
    const warm = async (): Promise<void> => {
      assert.equal((await call(`${door.url}/zk/get`)).status, 200);
      await new Promise((resolve) => setImmediate(() => setImmediate(resolve)));
    };
    try {
      // A GET the operation rules make a write: one attempt, its outcome unknown, sent once.
      await warm();
      const write = await call(`${door.url}/zk/create`);
      assert.equal(write.status, 502, write.text);
      assert.equal(write.json<{ code: string }>().code, 'LF_ERR_OUTCOME_UNKNOWN');
      assert.equal(node.requests.filter((r) => r.startsWith('GET /zk/create ')).length, 1, 'the write went once');
      // A read: sent again on a fresh connection, answered, and not counted against the node.
      await warm();
      const before = await failures();
      const read = await call(`${door.url}/zk/get?stale`);
      assert.equal(read.status, 200, read.text);
      assert.equal(read.text, '/zk/get?stale');
      assert.equal(node.requests.filter((r) => r.startsWith('GET /zk/get?stale ')).length, 2, 'the read went twice');
      assert.equal(await failures(), before, 'the node was not blamed');
    } finally {
      await door.stop();
      await node.stop();
    }
  });

  it("relays a node's header lines but uWS's mark, which the front door's uWS writes itself (no second uWebSockets line)", async () => {
    const node = await startRawNode('marked', (socket) => socket.write('HTTP/1.1 200 OK\r\nuWebSockets: 20\r\nx-node-own: kept\r\ncontent-length: 2\r\n\r\nok'));
    const door = await FrontDoor.start(doorConfig([node], { hedgeMode: 'off' }));
    try {
      const raw = await rawExchange(door.url, 'GET /rpc/board.get HTTP/1.1\r\nhost: x\r\nx-lakefront-board: m\r\nconnection: close\r\n\r\n');
      assert.match(raw, /^HTTP\/1\.1 200 /);
      assert.match(raw, /\r\nx-node-own: kept\r\n/);
      assert.equal(raw.match(/\r\nuwebsockets:/gi)?.length, 1, raw);
    } finally {
      await door.stop();
      await node.stop();
    }
  });

  it("refuses another route's path spelled otherwise (//admin/x, /%61dmin/x under a catch-all), and passes a respelling within its own route", async () => {
    const [adminNode, allNode] = await startNodes('adm', 'all');
    const door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [
        { name: 'admin', members: [{ id: adminNode!.id, url: adminNode!.url }] },
        { name: 'default', members: [{ id: allNode!.id, url: allNode!.url }] },
      ],
      routes: [
        { pattern: '/admin/*', cluster: 'admin', policy: 'round_robin', keyHeader: null },
        { pattern: '/*', cluster: 'default', policy: 'round_robin', keyHeader: null },
      ],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({}),
    });
    try {
      const ask = (path: string, ws = false) =>
        rawExchange(door.url, `GET ${path} HTTP/1.1\r\nhost: x\r\n${ws ? 'upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n' : 'connection: close\r\n'}\r\n`, { done: (text) => text.endsWith('}') });
      for (const path of ['//admin/x', '/%61dmin/x', '/ad%6Din/x', '/admin%2Fx', '/admin%5Cx', '/admin\\x', '///admin//x']) {
        const raw = await ask(path);
        assert.match(raw, /^HTTP\/1\.1 400 /, path);
        assert.match(raw, /route \/admin\/\*'s spelled otherwise/, path);
        const handshake = await ask(path, true);
        assert.match(handshake, /^HTTP\/1\.1 400 /, `${path} (WebSocket)`);
      }
      assert.equal(allNode!.hits(), 0, "the catch-all's node got none of them");
      assert.equal(adminNode!.hits(), 0);
      // Within its own route, or a plain spelling no other route has: as sent.
      for (const [path, node] of [['/admin//x', adminNode!], ['/admin/a%2Fb', adminNode!], ['/other//x', allNode!], ['/%6Fther/x', allNode!], ['/adm%69n', allNode!]] as const) {
        const raw = await ask(path);
        assert.match(raw, /^HTTP\/1\.1 200 /, path);
        assert.ok(node.received.some((r) => r.path === path), `${path} reached ${node.id} as sent`);
      }
    } finally {
      await door.stop();
      await Promise.all([adminNode!.stop(), allNode!.stop()]);
    }
  });

  /**
   * Sends `request` and then a second one on the same connection: the answer to the first, how
   * many `connection: close` lines it has, and whether the front door closed the connection
   * after it (the second unanswered).
   */
  async function answerThenClose(port: number, request: string): Promise<{ answer: string; lines: number; closedAfter: boolean }> {
    const { answers, closed } = await inTurn(port, [request, 'GET /health HTTP/1.1\r\nhost: x\r\n\r\n']);
    const answer = answers[0] ?? '';
    return { answer, lines: (answer.match(/\r\nconnection: close\r\n/gi) ?? []).length, closedAfter: closed && answers.length === 1 };
  }

  it("says connection: close, once, on the answer to a client that asked for it (RFC 9112 9.6), and closes", async () => {
    const nodes = await startNodes('cc-a');
    const door = await FrontDoor.start(doorConfig(nodes));
    try {
      // uWS closes on its own after `close` (any 5 characters) in the first line, and a listed
      // `close` only when told to: either way one line, and the connection ends.
      for (const [method, connection] of [['POST', 'close'], ['HEAD', 'Close'], ['POST', 'x-trace, close'], ['POST', 'keep-alive, close'], ['POST', 'abcde']] as const) {
        const { answer, lines, closedAfter } = await answerThenClose(door.port, `${method} /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: cc\r\ncontent-length: 2\r\nconnection: ${connection}\r\n\r\n{}`);
        assert.match(answer, /^HTTP\/1\.1 200 /, `${method} ${connection}`);
        assert.equal(lines, 1, `${method} ${connection}: ${answer}`);
        assert.equal(closedAfter, true, `${method} ${connection}: closed after the answer`);
      }
      // Kept alive: no such line, and the connection serves the next request.
      const { lines, closedAfter } = await answerThenClose(door.port, 'POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: cc\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n{}');
      assert.equal(lines, 0);
      assert.equal(closedAfter, false);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('/stats requests never goes back: a chunked body refused while it comes stays counted (in rejected too)', async () => {
    const nodes = await startNodes('sd-a');
    const door = await FrontDoor.start(doorConfig(nodes, { maxBodyBytes: 16 }, { threads: 1 }));
    const stats = async (): Promise<{ requests: number; rejected: number }> => (await call(`${door.url}/stats`)).json();
    const socket = connect(door.port, '127.0.0.1');
    try {
      await once(socket, 'connect');
      socket.on('data', () => undefined);
      socket.write('POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: sd\r\ntransfer-encoding: chunked\r\n\r\n4\r\nabcd\r\n');
      // Counted once it reached routing (the workers' counts reach /stats within 100 ms).
      let before = await stats();
      while (before.requests === 0) before = await stats();
      socket.write(`20\r\n${'x'.repeat(32)}\r\n0\r\n\r\n`);
      let after = await stats();
      while (after.rejected === 0) after = await stats();
      // Before: 1 then 0 (taken back when the body was refused).
      assert.deepEqual([before.requests, after.requests, after.rejected], [1, 1, 1]);
    } finally {
      socket.destroy();
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it("starts its worker threads with the young generation capped (workerYoungMb, 12 MiB unless given), and refuses a bad cap", async () => {
    const nodes = await startNodes('yg-a');
    const limits = (door: FrontDoor): (number | undefined)[] =>
      [...(door as unknown as { workers: Map<number, { worker: Worker }> }).workers.values()].map((h) => h.worker.resourceLimits?.maxYoungGenerationSizeMb);
    const given = await FrontDoor.start(doorConfig(nodes, {}, { threads: 2, workerYoungMb: 6 }));
    try {
      assert.deepEqual(limits(given), [6, 6]);
    } finally {
      await given.stop();
    }
    const byDefault = await FrontDoor.start(doorConfig(nodes, {}, { threads: 1 }));
    try {
      assert.deepEqual(limits(byDefault), [12]);
    } finally {
      await byDefault.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
    await assert.rejects(FrontDoor.start(doorConfig(nodes, {}, { workerYoungMb: 0.5 })), /^ConfigError: workerYoungMb: bad value 0\.5 \(MiB, 1-1024\)$/);
  });

  it('/stats rejected counts its own endpoints\' refusals: a /route 400 or 404 as a /health 405', async () => {
    const nodes = await startNodes('sr-a');
    const door = await FrontDoor.start(doorConfig(nodes, {}, { threads: 1 }));
    try {
      assert.equal((await call(`${door.url}/route`)).status, 400);
      assert.equal((await call(`${door.url}/route?board=b&route=/nope`)).status, 404);
      assert.equal((await call(`${door.url}/route?board=${'k'.repeat(1025)}`)).status, 400);
      assert.equal((await call(`${door.url}/route?board=b`)).status, 200);
      // Last, the one refusal counted before: one thread's counts reach /stats together, so once
      // it shows, the /route answers before it have too.
      assert.equal((await call(`${door.url}/health`, { method: 'POST' })).status, 405);
      let stats = (await call(`${door.url}/stats`)).json<{ rejected: number }>();
      while (stats.rejected === 0) stats = (await call(`${door.url}/stats`)).json();
      // Before: 1 (the 405 alone).
      assert.equal(stats.rejected, 4);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it("says connection: close, once, on its own answers too (refusals, its endpoints) to a client that asked for it, closes, and does neither for others", async () => {
    const nodes = await startNodes('cc-b');
    const door = await FrontDoor.start(doorConfig(nodes, { maxBodyBytes: 16 }));
    const chunked = `POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: cc\r\ntransfer-encoding: chunked\r\nconnection: keep-alive, close\r\n\r\n20\r\n${'x'.repeat(32)}\r\n0\r\n\r\n`;
    try {
      const cases: [string, string, number][] = [
        ['a refusal before routing (no board)', 'POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}', 401],
        ['a refusal before routing, close listed', 'POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: te, close\r\n\r\n{}', 401],
        ['a declared body over the limit', 'POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: cc\r\ncontent-length: 17\r\nconnection: close\r\n\r\n' + 'x'.repeat(17), 413],
        ['a chunked body over the limit (refused as it arrives)', chunked, 413],
        ['the 404', 'GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, close\r\n\r\n', 404],
        ['the 404, close alone', 'GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n', 404],
        ['an endpoint', 'GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n', 200],
        ['an endpoint, close listed', 'GET /health HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, close\r\n\r\n', 200],
        ['an endpoint, HEAD', 'HEAD /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n', 200],
        ["an endpoint's 405", 'POST /health HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\nconnection: close\r\n\r\n', 405],
        ["an endpoint's 400", 'GET /route HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n', 400],
        ['/stats (answered once the control plane replies)', 'GET /stats HTTP/1.1\r\nhost: x\r\nconnection: Close\r\n\r\n', 200],
        ['/stats, close listed', 'GET /stats HTTP/1.1\r\nhost: x\r\nconnection: keep-alive, close\r\n\r\n', 200],
      ];
      for (const [what, request, status] of cases) {
        const { answer, lines, closedAfter } = await answerThenClose(door.port, request);
        assert.match(answer, new RegExp(`^HTTP/1\\.1 ${status} `), what);
        assert.equal(lines, 1, `${what}: ${answer}`);
        assert.equal(closedAfter, true, `${what}: closed after the answer`);
      }
      // Asked for by none: no such line on the same kinds of answer, and the connection lives on.
      const { answers, closed } = await inTurn(door.port, [
        'POST /rpc/query.execute HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}',
        'GET /nowhere HTTP/1.1\r\nhost: x\r\nconnection: keep-alive\r\n\r\n',
        'GET /stats HTTP/1.1\r\nhost: x\r\n\r\n',
        'GET /health HTTP/1.1\r\nhost: x\r\n\r\n',
      ]);
      assert.equal(closed, false);
      assert.deepEqual(answers.map((a) => a.slice(0, 12)), ['HTTP/1.1 401', 'HTTP/1.1 404', 'HTTP/1.1 200', 'HTTP/1.1 200']);
      for (const answer of answers) assert.doesNotMatch(answer, /\r\nconnection: close\r\n/i);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('picks another free port when something takes the one it chose before the workers bind it', async () => {
    // The race: the port found free is taken between the check and the workers' bind.
    const close = Server.prototype.close;
    let competitor: Server | null = null;
    let taken = 0;
    Server.prototype.close = function (this: Server, callback?: (err?: Error) => void) {
      const address = this.address();
      const result = close.call(this, callback);
      if (competitor === null && address !== null && typeof address === 'object') {
        taken = address.port;
        competitor = createServer().listen({ port: address.port, host: '127.0.0.1', exclusive: true });
      }
      return result;
    } as typeof close;
    let server: RouterServer | null = null;
    try {
      try {
        server = await route({ nodes: [{ id: 'x', url: 'http://127.0.0.1:9' }], port: 0, host: '127.0.0.1', threads: 1, healthIntervalMs: 60_000 });
      } finally {
        Server.prototype.close = close;
      }
      assert.notEqual(taken, 0);
      assert.notEqual(server.port, taken);
      assert.equal((await call(`${server.url}/health`)).status, 200);
    } finally {
      await server?.stop();
      (competitor as Server | null)?.close();
    }
  });
});

describe('front door: a cluster larger than an exchange holds', () => {
  it('fails a read over at most 64 nodes and answers 502, the worker alive (70 nodes, all failing)', async () => {
    const nodes = await startNodes(...Array.from({ length: 70 }, (_, i) => `big-${i}`));
    for (const node of nodes) node.behaviour = { kind: 'answer', status: 503 };
    const server = await route({ nodes: nodes.map((n) => ({ id: n.id, url: n.url })), port: 0, host: '127.0.0.1', threads: 1, healthIntervalMs: 60_000 });
    try {
      let exits = 0;
      server.frontDoor.on('worker-exit', () => exits++);
      for (let i = 0; i < 2; i++) {
        const reply = await rpc(server.url, 'query.execute', `big-board-${i}`);
        assertFailure(reply, 502, 'LF_ERR_ALL_CANDIDATES_FAILED');
        assert.equal(reply.json<{ attempted: string[] }>().attempted.length, 64);
      }
      assert.equal(nodes.reduce((sum, n) => sum + n.hits('/rpc/'), 0), 128);
      assert.equal(exits, 0, 'no worker crashed');
    } finally {
      await server.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
});
