/**
 * The benches' peers and measures (bench/lib/contenders.ts, procs.ts, idle.ts): what the suite
 * and the memory bench compare must be configured and counted alike. Real nginx and HAProxy
 * (the Debian packages, which .ci/run installs: a missing one fails the test, by the skip line
 * startContenders gives), real servers on port 0.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { describe, it } from 'node:test';
import { Pool } from 'undici';
import { startContenders, type Contender, type Upstream } from '../bench/lib/contenders.js';
import { holdConnections, stillOpen } from '../bench/lib/idle.js';
import { rssBytes, type Proc } from '../bench/lib/procs.js';


/**
 * Three nodes that count the connections made to them and hold every answer until `wave`
 * requests have come (so the front must have that many in flight to them at once).
 */
async function holdingNodes(wave: number): Promise<{ upstream: Upstream; connections: () => number; close: () => Promise<void> }> {
  let connections = 0;
  let held: ServerResponse[] = [];
  const onRequest = (_req: IncomingMessage, res: ServerResponse): void => {
    held.push(res);
    if (held.length < wave) return;
    const now = held;
    held = [];
    for (const r of now) r.writeHead(200, { 'content-type': 'text/plain', 'content-length': '2' }).end('ok');
  };
  const servers: Server[] = [];
  for (let i = 0; i < 3; i++) {
    const server = createServer(onRequest);
    server.keepAliveTimeout = 60_000; // the nodes never close an idle connection within a test
    server.on('connection', () => connections++);
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    servers.push(server);
  }
  const ports = servers.map((s) => (s.address() as AddressInfo).port);
  return {
    upstream: { proc: null as unknown as Proc, ports },
    connections: () => connections,
    close: async () => {
      for (const s of servers) {
        s.closeAllConnections();
        s.close();
        await once(s, 'close');
      }
    },
  };
}

/** `count` requests at once, each on a board of its own, through `pool`; all must be answered 200. */
async function wave(pool: Pool, count: number): Promise<void> {
  const answers = await Promise.all(
    Array.from({ length: count }, (_, i) => pool.request({ path: '/rpc/query.execute', method: 'GET', headers: { 'x-lakefront-board': `board-${i}` } })),
  );
  for (const a of answers) {
    assert.equal(a.statusCode, 200);
    await a.body.dump();
  }
}

describe('bench peers', () => {
  // 300 requests in flight: more than the 64 a node (192) an nginx worker kept idle before.
  const inFlight = 300;
  for (const name of ['nginx-1w', 'haproxy-1t']) {
    it(`${name}, started as the suite starts it for ${inFlight} client connections, opens no new connection to the nodes once it has them`, { timeout: 30_000 }, async () => {
      const nodes = await holdingNodes(inFlight);
      const contenders: Contender[] = [];
      const skipped: string[] = [];
      let pool: Pool | null = null;
      try {
        await startContenders([name], nodes.upstream, contenders, skipped, { clientConnections: inFlight });
        assert.deepEqual(skipped, []);
        pool = new Pool(contenders[0]!.url, { connections: inFlight, pipelining: 1 });
        await wave(pool, inFlight);
        const opened = nodes.connections();
        assert.ok(opened >= inFlight, `${opened} connections to the nodes for ${inFlight} requests in flight`);
        // The same requests again: every one finds an idle connection it opened before.
        await wave(pool, inFlight);
        await wave(pool, inFlight);
        const anew = nodes.connections() - opened;
        assert.equal(anew, 0, `${name} opened ${anew} new connections to the nodes in two more waves of the same ${inFlight} requests`);
      } finally {
        await pool?.close();
        for (const c of contenders) await c.proc?.stop();
        await nodes.close();
      }
    });
  }

  it("counts a forked worker's pages it shares with its master once (nginx, 2 workers)", { timeout: 30_000 }, async () => {
    const nodes = await holdingNodes(1);
    const contenders: Contender[] = [];
    try {
      await startContenders(['nginx-2w'], nodes.upstream, contenders, []);
      const proc = contenders[0]!.proc!;
      const [master, ...workers] = proc.pids();
      assert.equal(workers.length, 2);
      const kb = (pid: number, file: string, field: string): number => Number(readFileSync(`/proc/${pid}/${file}`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'))![1]) * 1024;
      const summed = [master!, ...workers].reduce((n, pid) => n + kb(pid, 'status', 'VmRSS'), 0);
      const shared = workers.reduce((n, pid) => n + kb(pid, 'smaps_rollup', 'Shared_Clean') + kb(pid, 'smaps_rollup', 'Shared_Dirty'), 0);
      const measured = rssBytes(proc);
      // The master's whole resident set is in it; the workers' shared pages (most of theirs) not again.
      assert.ok(measured >= kb(master!, 'status', 'VmRSS'), `${measured} bytes, under the master's own`);
      assert.ok(measured <= summed - shared / 2, `${measured} bytes against ${summed} summed VmRSS, ${shared} of it the workers' shared pages`);
    } finally {
      for (const c of contenders) await c.proc?.stop();
      await nodes.close();
    }
  });
});

describe('memory bench connections', () => {
  /**
   * A front that answers each connection's request with `status`, keep-alive, then does `after`
   * to it; `ended` holds one promise a connection it ended, settled once the client ended it too.
   */
  async function front(status: number, after: (socket: Socket, i: number) => boolean = () => false): Promise<{ url: string; ended: Promise<unknown>[]; close: () => Promise<void> }> {
    const sockets = new Set<Socket>();
    const ended: Promise<unknown>[] = [];
    let n = 0;
    const server = createTcpServer((socket) => {
      sockets.add(socket);
      socket.once('data', () => {
        socket.write(`HTTP/1.1 ${status} X\r\ncontent-length: 2\r\n\r\nok`);
        if (after(socket, n++)) ended.push(once(socket, 'close'));
      });
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    return {
      url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
      ended,
      close: async () => {
        for (const s of sockets) s.destroy();
        server.close();
        await once(server, 'close');
      },
    };
  }
  const request = (i: number): string => `GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: board-${i}\r\n\r\n`;

  it('does not count as open a connection the front closed right after its answer, while others were still opening', async () => {
    // Every other connection is ended by the front as soon as it has answered (no
    // `connection: close` said): an idle connection it did not keep.
    const f = await front(200, (socket, i) => {
      if (i % 2 === 0) return false;
      socket.end();
      return true;
    });
    try {
      const sockets = await holdConnections(f.url, 40, request);
      assert.equal(sockets.length, 40);
      // The front saw each of those clients end too: each client read its end.
      await Promise.all(f.ended);
      assert.equal(f.ended.length, 20);
      assert.equal(stillOpen(sockets), 20);
      for (const s of sockets) s.destroy();
    } finally {
      await f.close();
    }
  });

  it('refuses an answer that is not a 2xx, or that closes the connection', async () => {
    const refusing = await front(503);
    try {
      await assert.rejects(holdConnections(refusing.url, 3, request), /"HTTP\/1\.1 503 X" on connection \d, not a 2xx/);
      // A front that answers 200 and says it closes.
      const saying = createTcpServer((socket) => socket.once('data', () => socket.end('HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 0\r\n\r\n')));
      saying.listen(0, '127.0.0.1');
      await once(saying, 'listening');
      try {
        await assert.rejects(holdConnections(`http://127.0.0.1:${(saying.address() as AddressInfo).port}`, 2, request), /answered with connection: close/);
      } finally {
        saying.close();
      }
    } finally {
      await refusing.close();
    }
  });
});
