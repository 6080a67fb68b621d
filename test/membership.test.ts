/**
 * Health polling's cadence: every member is probed once each interval, whatever one member that
 * does not answer does to its own probe.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { createServer, type Socket } from 'node:net';
import { afterEach, beforeEach, describe, it, mock } from 'node:test';
import { createServer as createHttpServer } from 'node:http';
import { EtcdLeaderProbe } from '../src/membership/leader.js';
import { Membership } from '../src/membership/membership.js';
import { PollLoop } from '../src/membership/poll.js';
import { TableWriter } from '../src/membership/table.js';
import { Worker } from 'node:worker_threads';
import { startNodes } from './fixtures/fake-node.js';

/**
 * A PollLoop over a fake clock (mock timers move time for setTimeout, `at` for the loop's own
 * clock), started and run to its first round, at `intervalMs`. Each round records when it
 * started and runs until `finish()`.
 */
function firstRound(intervalMs: number): { loop: PollLoop; started: number[]; at(ms: number): void; finish(): Promise<void> } {
  let clock = 0;
  const started: number[] = [];
  let finishRound: () => void = () => {};
  const loop = new PollLoop(
    intervalMs,
    () => {
      started.push(clock);
      return new Promise<void>((resolve) => (finishRound = resolve));
    },
    () => clock,
  );
  loop.start();
  clock = intervalMs;
  mock.timers.tick(intervalMs);
  assert.deepEqual(started, [intervalMs]);
  return {
    loop,
    started,
    at: (ms) => void (clock = ms),
    // Ends the round under way, and lets its `finally` run.
    async finish() {
      finishRound();
      await Promise.resolve();
      await Promise.resolve();
    },
  };
}

describe('membership table', () => {
  it('a worker thread sees each publication: a new generation, then every row as published', { timeout: 30_000 }, async () => {
    const writer = new TableWriter(3);
    // The worker asks the generation between event-loop turns, as a front door does between
    // requests, and reports each one it sees change with the rows it then reads.
    const worker = new Worker(
      `const { parentPort, workerData } = require('node:worker_threads');
      import(workerData.module).then(({ TableReader }) => {
        const reader = new TableReader(workerData.buffer);
        const rows = Array.from({ length: reader.nodeCount }, () => ({ weight: 0, flags: 0, region: 0, cluster: 0 }));
        let seen = reader.generation();
        const look = () => {
          const generation = reader.generation();
          if (generation !== seen) {
            seen = reader.read(rows);
            parentPort.postMessage({ generation: seen, rows });
            if (rows[0].weight === -1) return;
          }
          setImmediate(look);
        };
        parentPort.postMessage('ready');
        look();
      });`,
      { eval: true, workerData: { buffer: writer.buffer, module: new URL('../src/membership/table.js', import.meta.url).href } },
    );
    try {
      const [ready] = (await once(worker, 'message')) as [unknown];
      assert.equal(ready, 'ready');
      for (let round = 1; round <= 3; round++) {
        const rows = [0, 1, 2].map((n) => ({ weight: round === 3 && n === 0 ? -1 : round + n / 10, flags: round, region: n - 1, cluster: n }));
        writer.publish(rows);
        const [seen] = (await once(worker, 'message')) as [{ generation: number; rows: unknown[] }];
        assert.equal(seen.generation, writer.generation);
        assert.equal(seen.generation, round * 2, 'two steps a publication (odd while writing)');
        assert.deepEqual(seen.rows, rows);
      }
    } finally {
      await worker.terminate();
    }
  });
});

describe('PollLoop', () => {
  beforeEach(() => mock.timers.enable({ apis: ['setTimeout'] }));
  afterEach(() => mock.timers.reset());

  it('counts the interval from the start of one round to the start of the next', async () => {
    const { loop, started, at, finish } = firstRound(1000);
    // The round takes 400 ms (a member at its probe deadline): the next starts 600 ms later.
    at(1400);
    await finish();
    at(1999);
    mock.timers.tick(599);
    assert.deepEqual(started, [1000], 'not before the interval has passed since the last start');
    at(2000);
    mock.timers.tick(1);
    assert.deepEqual(started, [1000, 2000]);
    // A round that outlasts the interval is followed at once, never overlapped.
    at(3500);
    mock.timers.tick(1500);
    assert.deepEqual(started, [1000, 2000], 'no second round while one is under way');
    await finish();
    mock.timers.tick(0);
    assert.deepEqual(started, [1000, 2000, 3500]);
    loop.stop();
    mock.timers.tick(5000);
    assert.equal(started.length, 3);
  });

  it('a stop() and start() during a round leave one chain of rounds, not two', async () => {
    const { loop, started, at, finish } = firstRound(1000);
    loop.stop();
    loop.start();
    // The round that was under way ends now: it must not schedule a chain of its own.
    at(1100);
    await finish();
    at(2000);
    mock.timers.tick(1000);
    assert.deepEqual(started, [1000, 2000], 'the restart\'s round only');
    await finish();
    at(3000);
    mock.timers.tick(1000);
    assert.deepEqual(started, [1000, 2000, 3000], 'one round a second');
    loop.stop();
  });
});

describe('Membership probes', () => {
  it('applies each member\'s verdict as it arrives: a member that does not answer delays nobody', { timeout: 30_000 }, async () => {
    // One member accepts connections and never answers; the other fails its health check.
    const held = new Set<Socket>();
    const silent = createServer((socket) => held.add(socket));
    silent.listen(0, '127.0.0.1');
    await once(silent, 'listening');
    const [failing] = await startNodes('failing');
    failing!.healthy = false;
    const port = (silent.address() as { port: number }).port;
    const membership = new Membership({
      members: [
        { id: 'silent', url: `http://127.0.0.1:${port}` },
        { id: 'failing', url: failing!.url },
      ],
      // Far longer than the test runs: the silent member's probe is still pending below.
      timeoutMs: 600_000,
    });
    try {
      const round = membership.probeOnce();
      await once(membership, 'change');
      assert.equal(membership.isHealthy('failing'), false);
      assert.equal(membership.isHealthy('silent'), true, 'the silent member\'s probe has not ended');
      assert.equal(held.size, 1);
      // End the silent member's probe: its connection closes, and it is unhealthy too.
      for (const socket of held) socket.destroy();
      await round;
      assert.deepEqual(membership.healthyIds(), []);
    } finally {
      silent.close();
      await failing!.stop();
    }
  });
});

describe('Membership probes: what passes', () => {
  it('a 2xx passes; a 3xx (not followed), a 4xx and a 5xx do not; a probe past its deadline fails; connections are kept between rounds', async () => {
    const answers: Record<string, number> = { ok: 200, empty: 204, moved: 302, missing: 404, broken: 503, slow: 200, stalled: 200 };
    const connections = new Set<string>();
    const servers = Object.entries(answers).map(([id, status]) =>
      createHttpServer((req, res) => {
        connections.add(`${id} ${req.socket.remotePort}`);
        // The redirect names a path that would pass: a probe that followed it would call the node healthy.
        if (status === 302) res.setHeader('location', '/elsewhere');
        if (req.url === '/elsewhere') return void res.writeHead(200).end('{}');
        // Never answers: the probe's deadline ends it (the connection is closed at the end).
        if (id === 'slow') return;
        // A 2xx head, then a body that stops (a health check hung mid-answer): past the deadline
        // too, so it fails (it passed: the deadline ended the body, and the status was taken).
        if (id === 'stalled') return void res.writeHead(200, { 'content-length': '100' }).write('{');
        res.writeHead(status).end(status === 204 ? undefined : '{}');
      }),
    );
    await Promise.all(servers.map((srv) => new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve))));
    const membership = new Membership({
      members: Object.keys(answers).map((id, i) => ({ id, url: `http://127.0.0.1:${(servers[i]!.address() as { port: number }).port}` })),
      timeoutMs: 200,
    });
    try {
      for (let round = 0; round < 3; round++) {
        await membership.probeOnce();
        assert.deepEqual(membership.healthyIds().sort(), ['empty', 'ok'], `round ${round}`);
      }
      // Three rounds, one connection to each node that answered in time.
      for (const id of ['ok', 'empty', 'moved', 'missing', 'broken']) assert.equal([...connections].filter((c) => c.startsWith(`${id} `)).length, 1, id);
    } finally {
      await Promise.all(servers.map((srv) => new Promise((resolve) => { srv.closeAllConnections(); srv.close(resolve); })));
    }
  });
});

describe('Membership probes: a node that switches protocols', () => {
  // The probe's deadline is longer than the test's own timeout: a probe that waited for it (as
  // node:http left it, the socket destroyed without a word) fails the test.
  it('a 101 answer to the probe fails it at once, not at its deadline', { timeout: 20_000 }, async () => {
    const server = createServer((socket) => {
      socket.once('data', () => socket.write('HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n'));
      socket.on('error', () => undefined);
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const membership = new Membership({ members: [{ id: 'switcher', url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }], timeoutMs: 120_000 });
    try {
      await membership.probeOnce();
      assert.deepEqual(membership.healthyIds(), []);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

describe('Membership probes: a caller\'s own fetch', () => {
  it('with the caller\'s fetch too, a 3xx is not followed and does not pass; a 2xx passes', async () => {
    const paths: string[] = [];
    const servers = ['moved', 'ok'].map((id) =>
      createHttpServer((req, res) => {
        paths.push(`${id} ${req.url}`);
        // The redirect names a path that would pass: a probe that followed it would call the node healthy.
        if (id === 'moved' && req.url === '/health') return void res.writeHead(302, { location: '/elsewhere' }).end();
        res.writeHead(200).end('{}');
      }),
    );
    await Promise.all(servers.map((srv) => new Promise<void>((resolve) => srv.listen(0, '127.0.0.1', resolve))));
    let calls = 0;
    const membership = new Membership({
      members: ['moved', 'ok'].map((id, i) => ({ id, url: `http://127.0.0.1:${(servers[i]!.address() as { port: number }).port}` })),
      timeoutMs: 2_000,
      fetch: (input, init) => {
        calls++;
        return fetch(input, init);
      },
    });
    try {
      await membership.probeOnce();
      assert.equal(calls, 2, 'the caller\'s fetch made the probes');
      assert.deepEqual(membership.healthyIds(), ['ok']);
      assert.deepEqual(paths.sort(), ['moved /health', 'ok /health'], 'the redirect was not followed');
    } finally {
      await Promise.all(servers.map((srv) => new Promise((resolve) => { srv.closeAllConnections(); srv.close(resolve); })));
    }
  });
});

describe('Membership probes: a kept-alive connection the node closes', () => {
  it('a probe whose kept connection the node closes unanswered (its idle timeout crossing the probe) is asked again on a new one, and passes', async () => {
    // The first two probes that come on a connection kept from an earlier one find it closed,
    // unanswered, as when the node's idle timeout ends the connection just as the probe goes out:
    // the first by a FIN, the second by a reset (what that race gave, every few rounds, against a
    // server closing connections idle for the probe interval). Every other probe is answered.
    const used = new Set<Socket>();
    let closed = 0;
    const server = createHttpServer((req, res) => {
      if (used.has(req.socket) && closed < 2) {
        if (closed++ === 0) req.socket.destroy();
        else req.socket.resetAndDestroy();
        return;
      }
      used.add(req.socket);
      res.writeHead(200).end('{}');
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const membership = new Membership({ members: [{ id: 'idle-closer', url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }], timeoutMs: 5_000 });
    let changes = 0;
    membership.on('change', () => changes++);
    try {
      for (let round = 0; round < 6; round++) {
        await membership.probeOnce();
        assert.ok(membership.isHealthy('idle-closer'), `round ${round}`);
      }
      assert.equal(changes, 0, 'never out of the rankings');
      assert.equal(closed, 2, 'probes went out on kept connections, which the node closed');
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

describe('EtcdLeaderProbe: which leader it publishes', () => {
  /** Three members answering /v3/maintenance/status as scripted (over real HTTP). */
  async function members(): Promise<{ urls: string[]; answer: { memberId: string; leader: string; term: number }[]; close(): Promise<void> }> {
    const answer = [
      { memberId: '11', leader: '11', term: 5 },
      { memberId: '22', leader: '11', term: 5 },
      { memberId: '33', leader: '11', term: 5 },
    ];
    const servers = answer.map((_, i) =>
      createHttpServer((_req, res) => {
        const a = answer[i]!;
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ header: { member_id: a.memberId }, leader: a.leader, raftTerm: String(a.term) }));
      }),
    );
    await Promise.all(servers.map((s) => new Promise<void>((resolve) => s.listen(0, '127.0.0.1', resolve))));
    return {
      urls: servers.map((s) => `http://127.0.0.1:${(s.address() as { port: number }).port}`),
      answer,
      close: () => Promise.all(servers.map((s) => new Promise((resolve) => s.close(resolve)))).then(() => undefined),
    };
  }

  it('with the caller\'s fetch, a status answer that redirects is not followed (no leader from it)', async () => {
    // One member redirects its status (a 307 keeps the POST) to a path that would name it leader.
    const asked: string[] = [];
    const server = createHttpServer((req, res) => {
      asked.push(`${req.method} ${req.url}`);
      if (req.url === '/v3/maintenance/status') return void res.writeHead(307, { location: '/elsewhere' }).end();
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ header: { member_id: '11' }, leader: '11', raftTerm: '5' }));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const probe = new EtcdLeaderProbe({ members: [{ id: 'e0', url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }], fetch: (input, init) => fetch(input, init) });
    try {
      await probe.probeOnce();
      assert.equal(probe.leader, null);
      assert.deepEqual(asked, ['POST /v3/maintenance/status'], 'the redirect was not followed');
    } finally {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    }
  });

  it('publishes the leader of the newest term that has one and says so itself, and none while a majority is electing past it', async () => {
    const m = await members();
    const probe = new EtcdLeaderProbe({ members: m.urls.map((url, i) => ({ id: `e${i}`, url })) });
    try {
      await probe.probeOnce();
      assert.equal(probe.leader, 'e0');
      // A lone member cut off from the others campaigns term after term (etcd 3.4, no pre-vote):
      // its newer term without a leader is no election of the cluster's.
      m.answer[2] = { memberId: '33', leader: '0', term: 9 };
      await probe.probeOnce();
      assert.equal(probe.leader, 'e0', 'one member past the term does not unpublish the leader');
      // e1 and e2 moved to term 6 and are electing; e0, cut off from them, still names itself.
      m.answer[1] = { memberId: '22', leader: '0', term: 6 };
      m.answer[2] = { memberId: '33', leader: '0', term: 6 };
      await probe.probeOnce();
      assert.equal(probe.leader, null, 'not the stale leader of term 5');
      // The election is over: e2 leads term 6.
      m.answer[1] = { memberId: '22', leader: '33', term: 6 };
      m.answer[2] = { memberId: '33', leader: '33', term: 6 };
      await probe.probeOnce();
      assert.equal(probe.leader, 'e2');
      // A member named at the newest term that says itself that it knows no leader is not
      // published: the others' word is stale (etcd 3.4 reports the term of the last applied
      // entry, so an election does not show as a newer term: helper-50 saw writes pinned to a
      // member answering 'no leader' for 1.6 s).
      m.answer[0] = { memberId: '11', leader: '0', term: 7 };
      m.answer[1] = { memberId: '22', leader: '11', term: 7 };
      await probe.probeOnce();
      assert.equal(probe.leader, null, 'not a leader that does not say so itself');
      m.answer[2] = { memberId: '33', leader: '11', term: 6 };
      m.answer[0] = { memberId: '11', leader: '22', term: 7 };
      await probe.probeOnce();
      assert.equal(probe.leader, null, 'nor one that names another');
      // Once it says so, one member at the newest term naming it is enough.
      m.answer[0] = { memberId: '11', leader: '11', term: 7 };
      await probe.probeOnce();
      assert.equal(probe.leader, 'e0');
    } finally {
      probe.stop();
      await m.close();
    }
  });
});
