/**
 * The access log (`--access-log`): a JSON line for each request a route took and each 404,
 * written by every worker thread to one file; nothing secret in it; reopened on SIGUSR1.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { execFileSync, spawn } from 'node:child_process';
import { closeSync, constants, existsSync, mkdirSync, mkdtempSync, openSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { connect, Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire, syncBuiltinESMExports } from 'node:module';
import { after, before, describe, it } from 'node:test';
import { AccessLog, asciiJson } from '../src/server/access-log.js';
import { defaultSettings, RPC_ROUTE } from '../src/server/settings.js';
import { FrontDoor, type FrontDoorConfig } from '../src/server/supervisor.js';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';
import { call, ranking, rpc, waitForLine } from './fixtures/http.js';

interface Line {
  time: string;
  client: string;
  method: string;
  path: string;
  route: string | null;
  status: number;
  node: string | null;
  attempts: number;
  hedged: boolean;
  bytes: number;
  us: number;
  error: string | null;
}

/** The file's lines, each parsed (a line that is not JSON fails the test). */
function linesOf(file: string): Line[] {
  const text = readFileSync(file, 'utf8');
  assert.ok(text === '' || text.endsWith('\n'), 'every line ends with a newline');
  return text
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as Line);
}

let dir: string;
before(() => {
  dir = mkdtempSync(join(tmpdir(), 'lakefront-access-'));
});
after(() => rmSync(dir, { recursive: true, force: true }));

describe('access log writer', () => {
  it('writes every line added, in order, whole, by its close', async () => {
    const file = join(dir, 'writer.log');
    const errors: string[] = [];
    const log = new AccessLog(file, (m) => errors.push(m));
    // More than a batch (64 KiB), so some go out before the close and the rest with it.
    for (let i = 0; i < 2000; i++) log.add(JSON.stringify({ i, pad: 'x'.repeat(60) }));
    await log.close();
    const lines = readFileSync(file, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { i: number }).i);
    assert.deepEqual(lines, Array.from({ length: 2000 }, (_, i) => i));
    assert.deepEqual(errors, []);
    log.add('{"after":"close"}');
    assert.equal(readFileSync(file, 'utf8').includes('after'), false, 'nothing is written after the close');
  });

  it('opens the file again on reopen (log rotation); one it cannot open leaves it on the old file, said', async () => {
    const file = join(dir, 'rotate.log');
    const errors: string[] = [];
    const log = new AccessLog(file, (m) => errors.push(m));
    log.add('{"n":1}');
    await log.close();
    const second = new AccessLog(file, (m) => errors.push(m));
    second.add('{"n":2}');
    renameSync(file, `${file}.1`);
    second.reopen();
    second.add('{"n":3}');
    // A directory in its place: the reopen fails (EISDIR, root or not), and lines keep going to
    // the file open, said once.
    const blocked = join(dir, 'blocked');
    const third = new AccessLog(blocked, (m) => errors.push(m));
    renameSync(blocked, `${blocked}.old`);
    mkdirSync(blocked);
    third.reopen();
    third.add('{"n":4}');
    await Promise.all([second.close(), third.close()]);
    assert.equal(readFileSync(`${file}.1`, 'utf8'), '{"n":1}\n{"n":2}\n', 'lines before the reopen stay in the moved file');
    assert.equal(readFileSync(file, 'utf8'), '{"n":3}\n');
    assert.equal(readFileSync(`${blocked}.old`, 'utf8'), '{"n":4}\n');
    assert.equal(errors.length, 1, errors.join('; '));
    assert.match(errors[0]!, /blocked: cannot open it again \(EISDIR.*\); still writing to the file open before/);
  });

  it('does not hold a stop for an output that takes nothing (a pipe nobody reads): drops what waits beyond 8 MiB, and says so', async () => {
    const fifo = join(dir, 'stalled.fifo');
    execFileSync('mkfifo', [fifo]);
    // A reader that never reads: the writer's open does not block, and its writes fill the pipe.
    const reader = openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK);
    const errors: string[] = [];
    try {
      const log = new AccessLog(fifo, (m) => errors.push(m));
      const line = JSON.stringify({ pad: 'y'.repeat(90) });
      for (let i = 0; i < 100_000; i++) log.add(line);
      await log.close();
    } finally {
      closeSync(reader);
    }
    assert.equal(errors.length, 3, errors.join('\n'));
    assert.match(errors[0]!, /8388608 bytes of lines wait for the output; lines are dropped/);
    assert.match(errors[1]!, /the output did not take the last lines within 1000 ms; \d+ bytes of lines still waiting were dropped/);
    const dropped = Number(/(\d+) line\(s\) were dropped/.exec(errors[2]!)?.[1]);
    // 100,000 lines of 101 bytes: what is past 8 MiB (and the pipe's 64 KiB) is dropped.
    assert.ok(dropped > 100_000 - Math.ceil((8 * 1024 * 1024) / 101) - 1000 && dropped < 100_000, errors[2]);
  });

  it('keeps two threads\' lines whole in a named pipe (writes of at most 4 KiB land whole there)', async () => {
    const fifo = join(dir, 'shared.fifo');
    execFileSync('mkfifo', [fifo]);
    const reader = new Socket({ fd: openSync(fifo, constants.O_RDONLY | constants.O_NONBLOCK), readable: true, writable: false });
    let text = '';
    // A slow reader (a chunk a turn of the event loop): the pipe fills, and writes land in parts.
    reader.on('data', (chunk: Buffer) => {
      text += chunk.toString('latin1');
      reader.pause();
      setImmediate(() => reader.resume());
    });
    const ended = once(reader, 'end');
    const errors: string[] = [];
    const logs = [new AccessLog(fifo, (m) => errors.push(m)), new AccessLog(fifo, (m) => errors.push(m))];
    for (let i = 0; i < 3000; i++) for (const [t, log] of logs.entries()) log.add(JSON.stringify({ t, i, pad: 'z'.repeat(80 + (i % 50)) }));
    await Promise.all(logs.map((log) => log.close()));
    await ended;
    const lines = text.trim().split('\n').map((l) => JSON.parse(l) as { t: number; i: number });
    assert.equal(lines.length, 6000);
    for (const t of [0, 1]) assert.deepEqual(lines.filter((l) => l.t === t).map((l) => l.i), Array.from({ length: 3000 }, (_, i) => i));
    assert.deepEqual(errors, []);
  });

  it('writes every line when the thread dies in the middle of a stop (closeNow during close)', async () => {
    const file = join(dir, 'dying.log');
    const log = new AccessLog(file, () => undefined);
    for (let i = 0; i < 20_000; i++) log.add(JSON.stringify({ i, pad: 'w'.repeat(60) }));
    const closing = log.close();
    log.closeNow();
    await closing;
    const seen = readFileSync(file, 'utf8').trim().split('\n').map((l) => (JSON.parse(l) as { i: number }).i);
    assert.deepEqual(seen.sort((a, b) => a - b), Array.from({ length: 20_000 }, (_, i) => i));
  });

  /**
   * A full disk (helper-81, on a 64 KiB tmpfs): write(2) takes the part of a batch that fits, and
   * the next write of the rest fails with ENOSPC. Simulated: node:fs's write, as the writer's
   * import of it sees it (syncBuiltinESMExports), takes 5 bytes of the first batch and fails the
   * next call; the disk has room again after. A log is made on `file`, given its first line
   * ('{"lost":1}'), and handed to `then` once that batch's write has failed; closed after it.
   * Resolves with the errors the log reported and the calls to write.
   */
  async function tornWrite(file: string, then: (log: AccessLog) => void): Promise<{ errors: string[]; calls: number }> {
    const errors: string[] = [];
    // node:fs's own exports (an ESM namespace cannot be assigned to).
    const fs = createRequire(import.meta.url)('node:fs') as typeof import('node:fs');
    const realWrite = fs.write;
    let calls = 0;
    let failed!: () => void;
    const refused = new Promise<void>((resolve) => (failed = resolve));
    const patched = ((fd: number, buffer: Buffer, offset: number, length: number, position: null, callback: (err: NodeJS.ErrnoException | null, written: number) => void): void => {
      calls++;
      if (calls === 1) {
        const written = fs.writeSync(fd, buffer, offset, 5);
        setImmediate(() => callback(null, written));
        return;
      }
      if (calls === 2) {
        const err = Object.assign(new Error('ENOSPC: no space left on device, write'), { code: 'ENOSPC' }) as NodeJS.ErrnoException;
        setImmediate(() => {
          callback(err, 0);
          failed();
        });
        return;
      }
      realWrite(fd, buffer, offset, length, position, callback);
    }) as unknown as typeof fs.write;
    (fs as { write: typeof fs.write }).write = patched;
    syncBuiltinESMExports();
    try {
      const log = new AccessLog(file, (m) => errors.push(m));
      log.add('{"lost":1}');
      // Its batch is written at the next flush (an unref'd timer: the loop is held open meanwhile):
      // 5 bytes of it, then ENOSPC.
      const hold = setInterval(() => undefined, 1_000);
      await refused;
      clearInterval(hold);
      then(log);
      await log.close();
    } finally {
      (fs as { write: typeof fs.write }).write = realWrite;
      syncBuiltinESMExports();
    }
    return { errors, calls };
  }

  it('starts a new line after a write the disk cut short (ENOSPC part way through a batch): no later line is glued to the torn one', async () => {
    const file = join(dir, 'torn.log');
    const { errors, calls } = await tornWrite(file, (log) => {
      log.add('{"after":1}');
      log.add('{"after":2}');
    });
    assert.equal(calls >= 3, true);
    assert.equal(errors.length, 1, errors.join('; '));
    assert.match(errors[0]!, /ENOSPC/);
    const lines = readFileSync(file, 'utf8').split('\n');
    // The torn part of the lost line stands alone; every line after it is whole.
    assert.deepEqual(lines, ['{"los', '{"after":1}', '{"after":2}', '']);
  });

  it('a reopened file (log rotation after a torn write) starts with a whole line, not a blank one', async () => {
    const file = join(dir, 'torn-rotated.log');
    await tornWrite(file, (log) => {
      // logrotate moves the file with the torn line; SIGUSR1 opens a fresh one.
      renameSync(file, `${file}.1`);
      log.reopen();
      log.add('{"after":1}');
    });
    assert.equal(readFileSync(`${file}.1`, 'utf8'), '{"los');
    assert.equal(readFileSync(file, 'utf8'), '{"after":1}\n');
  });

  it('escapes every character past ASCII, so a line has as many bytes as characters', () => {
    const json = asciiJson('/caf\u00e9/\u{1f600}"\n');
    assert.equal(json, '"/caf\\u00e9/\\ud83d\\ude00\\"\\n"');
    assert.equal(JSON.parse(json), '/caf\u00e9/\u{1f600}"\n');
    assert.equal(Buffer.byteLength(json), json.length);
  });
});

describe('access log of a front door', () => {
  let nodes: FakeNode[];
  before(async () => {
    nodes = await startNodes('al-a', 'al-b');
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop()));
  });

  function config(file: string): FrontDoorConfig {
    return {
      host: '127.0.0.1',
      port: 0,
      threads: 2,
      clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [RPC_ROUTE, { pattern: '/kv/*', cluster: 'default', policy: 'ring', keyHeader: null, quorum: { n: 2, w: 2, r: 2, consistency: 'quorum', sloppy: false, hintWindowMs: 60_000, maxHintBytes: 1 << 20 } }],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      accessLog: file,
      // No grace for a cancelled attempt: a client that goes closes its node's connection at once.
      // No hedging: a read hedged at its node's own p95 may be answered by another node, and the
      // lines say which node answered each.
      settings: defaultSettings({ hedgeMode: 'off', cancelGraceMs: 0 }),
    };
  }

  it('has a line for each answer (proxied, refused, failed, 404, client gone), from both threads, with no header, query or key in it', async () => {
    const file = join(dir, 'door.log');
    const door = await FrontDoor.start(config(file));
    const b = nodes[1]!;
    let stopped = false;
    try {
      const boardOn = async (id: string): Promise<string> => {
        for (let i = 0; ; i++) if ((await ranking(door.url, `al-${i}`))[0] === id) return `al-${i}`;
      };
      const toA = await boardOn('al-a');
      const toB = await boardOn('al-b');
      const secret = 'Bearer very-secret-token';
      const ok = await call(`${door.url}/rpc/query.execute?token=query-secret`, { method: 'POST', body: '{"q":1}', headers: { 'x-lakefront-board': toA, authorization: secret } });
      assert.equal(ok.status, 200);
      // Many more over fresh connections, so both worker threads take some.
      for (let i = 0; i < 20; i++) assert.equal((await rpc(door.url, 'query.execute', toB, { fresh: true })).status, 200);
      assert.equal((await call(`${door.url}/rpc/query.execute`, { method: 'POST', body: '{}' })).status, 401);
      assert.equal((await call(`${door.url}/elsewhere`)).status, 404);
      // A path too long for a line under 4 KiB is cut, and marked so.
      assert.equal((await call(`${door.url}/${'x'.repeat(3000)}`)).status, 404);
      // A replicated write every replica resets: its line has the failure's status and body.
      for (const n of nodes) n.behaviour = { kind: 'reset' };
      const failedWrite = await call(`${door.url}/kv/k`, { method: 'PUT', body: 'v' });
      assert.equal(failedWrite.status, 502);
      for (const n of nodes) n.behaviour = { kind: 'answer' };
      // A node that resets: a bare write fails once (outcome unknown).
      b.behaviour = { kind: 'reset' };
      assert.equal((await rpc(door.url, 'board.append', toB)).status, 502);
      // A client that goes away before its answer.
      b.behaviour = { kind: 'hang' };
      const socket = connect(door.port, '127.0.0.1');
      await once(socket, 'connect');
      socket.write(`POST /rpc/board.append HTTP/1.1\r\nhost: x\r\nx-lakefront-board: ${toB}\r\ncontent-length: 2\r\n\r\n{}`);
      await b.waitForRequests(b.received.length + 1);
      const abandoned = once(b, 'abandoned');
      socket.destroy();
      await abandoned;
      b.behaviour = { kind: 'answer' };
      await door.stop();
      stopped = true;
      const text = readFileSync(file, 'utf8');
      assert.doesNotMatch(text, /very-secret-token|query-secret|authorization/i);
      assert.equal(text.includes(toA), false, 'no routing key');
      const lines = linesOf(file);
      assert.equal(lines.length, 1 + 20 + 1 + 1 + 1 + 1 + 1 + 1, JSON.stringify(lines));
      const first = lines.find((l) => l.method === 'POST' && l.path === '/rpc/query.execute' && l.status === 200 && l.node === 'al-a')!;
      assert.ok(first, JSON.stringify(lines));
      assert.equal(first.client, '127.0.0.1');
      assert.equal(first.route, '/rpc/*');
      assert.equal(first.attempts, 1);
      assert.equal(first.hedged, false);
      assert.equal(first.error, null);
      assert.ok(first.bytes > 0 && first.us > 0);
      assert.ok(Math.abs(Date.parse(first.time) - Date.now()) < 60_000, first.time);
      assert.equal(lines.filter((l) => l.status === 200 && l.node === 'al-b').length, 20);
      assert.deepEqual(
        lines.filter((l) => l.status !== 200).map((l) => [l.status, l.path.slice(0, 20), l.route, l.node, l.attempts, l.bytes > 0, l.error]).sort(),
        [
          [401, '/rpc/query.execute', '/rpc/*', null, 0, true, 'LF_ERR_MISSING_BOARD'],
          [404, '/elsewhere', null, null, 0, true, 'LF_ERR_NOT_FOUND'],
          [404, `/${'x'.repeat(19)}`, null, null, 0, true, 'LF_ERR_NOT_FOUND'],
          [499, '/rpc/board.append', '/rpc/*', null, 1, false, null],
          [502, '/kv/k', '/kv/*', null, 2, true, 'LF_ERR_QUORUM_FAILED'],
          [502, '/rpc/board.append', '/rpc/*', null, 1, true, 'LF_ERR_OUTCOME_UNKNOWN'],
        ],
      );
      const cut = lines.find((l) => l.path.startsWith('/xxx'))! as Line & { truncated?: boolean };
      assert.equal(cut.path.length, 256);
      assert.equal(cut.truncated, true);
      assert.equal(lines.find((l) => l.path === '/kv/k')!.bytes, Buffer.byteLength(failedWrite.text));
    } finally {
      if (!stopped) await door.stop();
      for (const n of nodes) n.behaviour = { kind: 'answer' };
    }
  });

  it('logs a large answer when the client has it (its bytes), or, for a client that left in the middle, the bytes it took', async () => {
    const file = join(dir, 'large.log');
    const big = 'z'.repeat(32 * 1024 * 1024);
    const door = await FrontDoor.start(config(file));
    let stopped = false;
    try {
      for (const n of nodes) n.behaviour = { kind: 'answer', body: big };
      const whole = await rpc(door.url, 'query.execute', 'al-large');
      assert.equal(whole.text.length, big.length);
      // A client that reads the first bytes and goes: more than the kernel's buffers hold waits.
      const socket = connect(door.port, '127.0.0.1');
      await once(socket, 'connect');
      socket.write('GET /rpc/query.execute HTTP/1.1\r\nhost: x\r\nx-lakefront-board: al-large\r\n\r\n');
      await once(socket, 'data');
      socket.destroy();
      await door.stop();
      stopped = true;
      const lines = linesOf(file).filter((l) => l.path === '/rpc/query.execute');
      assert.equal(lines.length, 2, JSON.stringify(lines));
      assert.deepEqual(lines.map((l) => l.status), [200, 200]);
      const [first, left] = lines.sort((x, y) => y.bytes - x.bytes);
      assert.equal(first!.bytes, big.length);
      assert.ok(left!.bytes > 0 && left!.bytes < big.length, JSON.stringify(left));
    } finally {
      if (!stopped) await door.stop();
      for (const n of nodes) n.behaviour = { kind: 'answer' };
    }
  });

  it('a file it cannot open stops the start with its reason', async () => {
    await assert.rejects(FrontDoor.start(config(join(dir, 'missing-dir', 'x.log'))), /access log .*missing-dir\/x\.log: cannot open it for appending \(ENOENT/);
  });
});

describe('access log of the lakefront command', () => {
  it('is opened again on SIGUSR1 (logrotate), and a bad path stops start-up with one line', async () => {
    const [node] = await startNodes('al-cli');
    const file = join(dir, 'cli.log');
    const cli = fileURLToPath(new URL('../src/cli.js', import.meta.url));
    const child = spawn(process.execPath, [cli, '--port', '0', '--threads', '2', '--host', '127.0.0.1', '--nodes', `al-cli=${node!.url}`, '--access-log', file], { stdio: ['ignore', 'pipe', 'pipe'] });
    try {
      const [, url] = await waitForLine(child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      assert.equal((await rpc(url!, 'query.execute', 'before')).status, 200);
      renameSync(file, `${file}.1`);
      child.kill('SIGUSR1');
      // The file is made again as the workers open it; after that, requests land in it.
      let sent = 1;
      for (let i = 0; i < 200 && !existsSync(file); i++, sent++) assert.equal((await rpc(url!, 'query.execute', `after-${i}`, { fresh: true })).status, 200);
      assert.ok(existsSync(file), 'the file is opened again');
      for (let i = 0; i < 10; i++, sent++) assert.equal((await rpc(url!, 'query.execute', `then-${i}`, { fresh: true })).status, 200);
      child.kill('SIGTERM');
      await once(child, 'exit');
      assert.equal(child.exitCode, 0);
      const moved = linesOf(`${file}.1`);
      const now = linesOf(file);
      assert.equal(moved[0]!.path, '/rpc/query.execute');
      assert.equal(moved.length + now.length, sent, 'every request has its line, in one file or the other');
      assert.ok(now.length >= 10, `${now.length} lines in the file opened again`);
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
      await node!.stop();
    }
    const bad = spawn(process.execPath, [cli, '--port', '0', '--nodes', 'x=http://127.0.0.1:9', '--access-log', join(dir, 'nope', 'x.log')], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stderr = '';
    bad.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
    await once(bad, 'exit');
    assert.equal(bad.exitCode, 2, stderr);
    assert.match(stderr.trim(), /^lakefront: access log .*nope\/x\.log: cannot open it for appending \(ENOENT[^\n]*$/);
  });
});
