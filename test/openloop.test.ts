/**
 * The benches' native open-loop generator (bench/native/openloop.c through bench/lib/openloop.ts,
 * `pacer: 'native'`): every request sent once, on schedule whether or not answers came, its
 * latency counted from its due time, answers judged by status, and what it cannot read refused.
 * Built with the machine's `cc`, against real servers on port 0.
 */
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
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

  it('counts each answer that says connection: close once, and goes on with new connections', { timeout: 10_000 }, async () => {
    let seen = 0;
    const { server, url } = await serve((req, res) => {
      seen++;
      // The first answer late, so the others overlap it.
      setTimeout(() => {
        res.writeHead(200, { 'content-length': 2, connection: 'close' });
        res.end('ok');
      }, req.headers['x-i'] === '0' ? 20 : 5);
    });
    try {
      const latencies: number[] = [];
      const result = await openLoop(url, { rate: 1000, seconds: 0.05, path: '/', headers: (i) => ({ 'x-i': String(i) }), pacer: 'native', onLatency: (_due, us) => latencies.push(us) });
      assert.deepEqual([result.sent, result.ok, result.failed, seen], [50, 50, 0, 50]);
      // Every latency is an answer's (the server waits 5 ms), none a request never answered (0).
      assert.ok(Math.min(...latencies) >= 1000, `smallest latency ${Math.min(...latencies)} us`);
    } finally {
      await stop(server);
    }
  });

  it('sends the requests waiting for a connection when that connection dies', { timeout: 10_000 }, async () => {
    // One connection; request 0's is dropped after 30 ms while requests 1-19 wait for it.
    const { server, url } = await serve((req, res) => {
      if (req.headers['x-i'] === '0') setTimeout(() => req.socket.destroy(), 30);
      else answer(res, 200, 'ok');
    });
    try {
      const result = await openLoop(url, { rate: 1000, seconds: 0.02, path: '/', headers: (i) => ({ 'x-i': String(i) }), connections: 1, pacer: 'native' });
      assert.deepEqual([result.sent, result.ok, result.failed], [20, 19, 1]);
    } finally {
      await stop(server);
    }
  });

  it('skips interim 1xx answers (103 Early Hints, 100 Continue) and counts the final one', { timeout: 10_000 }, async () => {
    const { server, url } = await serve((req, res) => {
      if (req.headers.expect === undefined) res.writeEarlyHints({ link: '</a.css>; rel=preload; as=style' });
      setTimeout(() => answer(res, 200, 'ok'), 2);
    });
    try {
      const hints = await openLoop(url, { rate: 500, seconds: 0.1, path: '/', headers: () => ({}), pacer: 'native' });
      assert.deepEqual([hints.ok, hints.failed], [50, 0]);
      const continued = await openLoop(url, { rate: 500, seconds: 0.1, method: 'POST', body: 'x', path: '/', headers: () => ({ expect: '100-continue' }), pacer: 'native' });
      assert.deepEqual([continued.ok, continued.failed], [50, 0]);
    } finally {
      await stop(server);
    }
  });

  it('fails a request whose connection is reset mid-upload, without dying of SIGPIPE', { timeout: 20_000 }, async () => {
    // A server (its own process, so its resets come while the generator is still writing) that
    // half-closes then resets after the first bytes of each 4 MB request: the generator's next
    // write fails with EPIPE, and raises SIGPIPE unless that is ignored.
    const server = spawn(process.execPath, ['-e', `
      const server = require('node:net').createServer((socket) => {
        socket.on('error', () => {});
        socket.once('data', () => { socket.pause(); socket.end(() => socket.resetAndDestroy()); });
      });
      server.listen(0, '127.0.0.1', () => console.log(server.address().port));`], { stdio: ['ignore', 'pipe', 'inherit'] });
    try {
      const [port] = (await once(server.stdout!, 'data')) as [Buffer];
      const url = `http://127.0.0.1:${Number(port.toString())}`;
      const result = await openLoop(url, { rate: 100, seconds: 0.1, method: 'POST', body: 'x'.repeat(4 << 20), path: '/', headers: () => ({}), pacer: 'native' });
      assert.deepEqual([result.sent, result.ok, result.failed], [10, 0, 10]);
    } finally {
      server.kill();
    }
  });

  it('counts a connection refused during the run as a failed request', { timeout: 10_000 }, async () => {
    // Request 2 closes the server and its connection: the ones after it find no server.
    const { server, url } = await serve((req, res) => {
      if (req.headers['x-i'] === '2') {
        server.close();
        req.socket.destroy();
      } else answer(res, 200, 'ok');
    });
    try {
      const result = await openLoop(url, { rate: 200, seconds: 0.05, path: '/', headers: (i) => ({ 'x-i': String(i) }), connections: 1, pacer: 'native' });
      assert.deepEqual([result.sent, result.ok, result.failed], [10, 2, 8]);
    } finally {
      server.closeAllConnections();
    }
  });

  it('fails a request never answered once the drain deadline passes, instead of waiting forever', { timeout: 10_000 }, async () => {
    const { server, url } = await serve((req, res) => {
      if (req.headers['x-i'] !== '3') answer(res, 200, 'ok');
    });
    process.env.OPENLOOP_DRAIN_MS = '300';
    try {
      const byDue: number[] = [];
      const result = await openLoop(url, { rate: 100, seconds: 0.1, path: '/', headers: (i) => ({ 'x-i': String(i) }), pacer: 'native', onLatency: (_due, us) => byDue.push(us) });
      assert.deepEqual([result.sent, result.ok, result.failed], [10, 9, 1]);
      assert.ok(byDue[3]! >= 300_000, `the unanswered one's latency ${byDue[3]} us`);
    } finally {
      delete process.env.OPENLOOP_DRAIN_MS;
      await stop(server);
    }
  });

  it('refuses a target it cannot reach by name', async () => {
    await assert.rejects(openLoop('http://localhost:1', { rate: 100, seconds: 0.05, path: '/', headers: () => ({}), pacer: 'native' }), /takes http:\/\/127\.0\.0\.1:PORT/);
  });
});
