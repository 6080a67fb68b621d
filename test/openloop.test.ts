/**
 * The benches' native open-loop generator (bench/native/openloop.c through bench/lib/openloop.ts,
 * `pacer: 'native'`): every request sent once, on schedule whether or not answers came, its
 * latency counted from its due time, answers judged by status, and what it cannot read refused.
 * Built with the machine's `cc`, against real servers on port 0.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { describe, it } from 'node:test';
import { openLoop } from '../bench/lib/openloop.js';

async function serve(handler: (req: IncomingMessage, res: ServerResponse, body: string) => void): Promise<{ server: Server; url: string }> {
  const server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (chunk: string) => (body += chunk));
    req.on('end', () => handler(req, res, body));
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { server, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

function answer(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

async function stop(server: Server): Promise<void> {
  server.closeAllConnections();
  server.close();
  await once(server, 'close');
}

describe('native open-loop generator', () => {
  it('sends each request once, with its own headers and body, and counts answers by status', async () => {
    const seen: { i: number; method: string; path: string; body: string }[] = [];
    const { server, url } = await serve((req, res, body) => {
      const i = Number(req.headers['x-i']);
      seen.push({ i, method: req.method!, path: req.url!, body });
      answer(res, i % 10 === 0 ? 503 : 200, `answer ${i}`);
    });
    try {
      const latencies: number[] = [];
      const dues: number[] = [];
      const result = await openLoop(url, {
        rate: 400,
        seconds: 0.5,
        method: 'POST',
        path: '/rpc/put',
        body: '{"v":1}',
        headers: (i) => ({ 'x-i': String(i) }),
        pacer: 'native',
        onLatency: (due, us) => {
          dues.push(due);
          latencies.push(us);
        },
      });
      assert.equal(result.sent, 200);
      assert.equal(result.ok, 180);
      assert.equal(result.failed, 20);
      assert.deepEqual(
        seen.map((s) => s.i).sort((a, b) => a - b),
        Array.from({ length: 200 }, (_, i) => i),
      );
      for (const s of seen) assert.deepEqual([s.method, s.path, s.body], ['POST', '/rpc/put', '{"v":1}']);
      // One a due time, in schedule order, 2.5 ms apart at 400 a second.
      assert.equal(dues.length, 200);
      for (let i = 0; i < 200; i++) assert.ok(Math.abs(dues[i]! - i * 2.5) < 0.002, `request ${i} due at ${dues[i]} ms`);
      // The percentiles are the requests' own (HDR, three digits: within 0.1%).
      const sorted = [...latencies].sort((a, b) => a - b);
      for (const [p, got] of [[50, result.p50Us], [99, result.p99Us]] as const) {
        const exact = sorted[Math.ceil((p / 100) * sorted.length) - 1]!;
        assert.ok(Math.abs(got - exact) <= exact / 1000 + 1, `p${p} ${got} us, the latencies' own ${exact}`);
      }
      assert.ok(Math.abs(result.maxUs - sorted.at(-1)!) <= sorted.at(-1)! / 1000 + 1);
    } finally {
      await stop(server);
    }
  });

  it('keeps its schedule while answers wait, and counts latency from the due time', async () => {
    // The server answers nothing until every request has arrived: a generator that waited for
    // answers before sending more would never get there. The first request's latency then spans
    // at least the schedule to the last one's due time.
    const total = 100;
    const held: { res: ServerResponse; i: number }[] = [];
    const { server, url } = await serve((req, res) => {
      held.push({ res, i: Number(req.headers['x-i']) });
      if (held.length === total) for (const h of held) answer(h.res, 200, 'ok');
    });
    try {
      const byDue: number[] = [];
      const result = await openLoop(url, { rate: 1000, seconds: total / 1000, path: '/', headers: (i) => ({ 'x-i': String(i) }), pacer: 'native', onLatency: (_due, us) => byDue.push(us) });
      assert.equal(result.ok, total);
      assert.equal(result.failed, 0);
      // Due 99 ms after the first: the first answer came after the last request left.
      assert.ok(byDue[0]! >= 99_000, `first latency ${byDue[0]} us`);
      assert.ok(byDue[0]! >= byDue[total - 1]!, 'the first request waited longest');
    } finally {
      await stop(server);
    }
  });

  it('holds to its connection limit, and a request waiting for a connection is late from its due time', async () => {
    // One connection and a first answer that takes 30 ms (the fixture's slow node): requests 1-19,
    // due every millisecond, wait for it, and both their latency and their lateness count that
    // wait (a generator timing from the send would not).
    const sockets = new Set<unknown>();
    const { server, url } = await serve((req, res) => {
      sockets.add(req.socket);
      if (req.headers['x-i'] === '0') setTimeout(() => answer(res, 200, 'slow'), 30);
      else answer(res, 200, 'ok');
    });
    try {
      const byDue: number[] = [];
      const result = await openLoop(url, { rate: 1000, seconds: 0.02, path: '/', headers: (i) => ({ 'x-i': String(i) }), connections: 1, pacer: 'native', onLatency: (_due, us) => byDue.push(us) });
      assert.equal(result.ok, 20);
      assert.equal(sockets.size, 1);
      for (let i = 1; i < 20; i++) assert.ok(byDue[i]! >= (30 - i) * 1000, `request ${i}: ${byDue[i]} us`);
      assert.ok(result.lateP99Us >= 10_000, `late p99 ${result.lateP99Us} us`);
    } finally {
      await stop(server);
    }
  });

  it('counts a request whose connection closes without an answer as failed, and goes on', async () => {
    const { server, url } = await serve((req, res) => {
      const i = Number(req.headers['x-i']);
      if (i % 25 === 7) req.socket.destroy();
      else answer(res, 200, 'ok');
    });
    try {
      const result = await openLoop(url, { rate: 500, seconds: 0.2, path: '/', headers: (i) => ({ 'x-i': String(i) }), pacer: 'native' });
      assert.equal(result.sent, 100);
      assert.equal(result.failed, 4);
      assert.equal(result.ok, 96);
    } finally {
      await stop(server);
    }
  });

  it('refuses an answer it cannot frame (chunked) with a clear error', async () => {
    const { server, url } = await serve((_req, res) => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('no length');
      res.end();
    });
    try {
      await assert.rejects(openLoop(url, { rate: 100, seconds: 0.05, path: '/', headers: () => ({}), pacer: 'native' }), /chunked answer/);
    } finally {
      await stop(server);
    }
  });

  it('refuses a target it cannot reach by name', async () => {
    await assert.rejects(openLoop('http://localhost:1', { rate: 100, seconds: 0.05, path: '/', headers: () => ({}), pacer: 'native' }), /takes http:\/\/127\.0\.0\.1:PORT/);
  });
});
