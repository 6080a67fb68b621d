/**
 * The `lakefront` command as an operator runs it: a real process, real signals.
 */
import assert from 'node:assert/strict';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { lstatSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer as createHttpServer, type ServerResponse } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { createServer, type AddressInfo } from 'node:net';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';
import { Client } from 'undici';
import WebSocket, { WebSocketServer } from 'ws';
import { TicketBook } from '../src/affinity/tickets.js';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';
import { call, rpc, waitForLine } from './fixtures/http.js';

const CLI = fileURLToPath(new URL('../src/cli.js', import.meta.url));

interface Run {
  readonly child: ChildProcess;
  output(): string;
}

function start(args: string[], env: Record<string, string> = {}): Run {
  return startScript(CLI, args, env);
}

/** A script from test/fixtures, run as its own process. */
function startFixture(name: string): Run {
  return startScript(fileURLToPath(new URL(`./fixtures/${name}`, import.meta.url)), []);
}

function startScript(script: string, args: string[], env: Record<string, string> = {}): Run {
  const child = spawn(process.execPath, [script, ...args], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (c: Buffer) => (output += c.toString()));
  child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
  return { child, output: () => output };
}

async function exitOf(run: Run): Promise<number | null> {
  return (await endOf(run)).code;
}

/** How the process ended: its exit code, or the signal that killed it. */
async function endOf(run: Run): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const child = run.child;
  if (child.exitCode === null && child.signalCode === null) await once(child, 'exit');
  return { code: child.exitCode, signal: child.signalCode };
}

/** Resolves once the process's output (stdout and stderr) matches `pattern`. */
async function outputMatches(run: Run, pattern: RegExp): Promise<RegExpMatchArray> {
  for (;;) {
    const match = run.output().match(pattern);
    if (match) return match;
    await Promise.race([
      once(run.child.stdout!, 'data'),
      once(run.child.stderr!, 'data'),
      once(run.child, 'exit').then(() => {
        throw new Error(`process exited before printing ${pattern}; output: ${run.output()}`);
      }),
    ]);
  }
}

/** The healthy node ids, asked over a connection of its own (not one kept alive). */
async function healthyOn(url: string): Promise<string[]> {
  const client = new Client(url);
  try {
    const reply = await client.request({ path: '/health', method: 'GET' });
    return ((await reply.body.json()) as { healthy: string[] }).healthy.sort();
  } finally {
    await client.close();
  }
}

/** What Node prints when it aborts on a thread that still holds uWS's sockets. */
const ABORTED = /Assertion failed|open handles|Native stack trace/;

describe('lakefront command: bad configuration stops start-up with exit 2 and one line', () => {
  const cases: [string, string[], Record<string, string>, RegExp][] = [
    ['duplicate id', [], { LAKEFRONT_NODES: 'a=http://127.0.0.1:1,a=http://127.0.0.1:2' }, /duplicate node id "a"/],
    ['bad URL', [], { LAKEFRONT_NODES: 'a=not a url' }, /LAKEFRONT_NODES: bad URL for node "a" \(not a URL of the form http\(s\):\/\/host:port/],
    ['URL with a path', ['--nodes', 'a=http://127.0.0.1:1/api'], {}, /--nodes: bad URL "http:\/\/127.0.0.1:1\/api" for node "a" \(http\(s\):\/\/host:port only, no path\)/],
    ['https with the built-in client', ['--nodes', 'a=https://127.0.0.1:1'], {}, /node "a": https:\/\/127.0.0.1:1 is https, .*--upstream-client undici/],
    ['entry without =', [], { LAKEFRONT_NODES: 'a=http://127.0.0.1:1,b' }, /LAKEFRONT_NODES: bad entry 2 of 2 \(want id=url/],
    ['non-numeric port', ['--nodes', 'a=http://127.0.0.1:1'], { PORT: 'eighty' }, /PORT: not a whole number: "eighty"/],
    ['port out of range', ['--port', '70000', '--nodes', 'a=http://127.0.0.1:1'], {}, /--port: 70000 is out of range/],
    ['bad thread count', ['--threads', '0', '--nodes', 'a=http://127.0.0.1:1'], {}, /--threads: 0 is out of range/],
    // 192.0.2.1 is TEST-NET-1: documentation only, never an address of this machine.
    ['host not on this machine', ['--host', '192.0.2.1', '--port', '0', '--nodes', 'a=http://127.0.0.1:1'], {}, /host: cannot listen on "192\.0\.2\.1" \(EADDRNOTAVAIL/],
    ['bad hedge delay', [], { LAKEFRONT_NODES: 'a=http://127.0.0.1:1', LAKEFRONT_HEDGE_MS: '-5' }, /LAKEFRONT_HEDGE_MS: -5 is out of range 0\.\.600000/],
    ['bad unreachable hold', ['--unreachable-hold-ms', '3600001', '--nodes', 'a=http://127.0.0.1:1'], {}, /--unreachable-hold-ms: 3600001 is out of range 0\.\.3600000/],
    ['unknown flag', ['--nodez', 'x'], {}, /Unknown option '--nodez'/],
    ['unknown upstream client', ['--upstream-client', 'curl', '--nodes', 'a=http://127.0.0.1:1'], {}, /--upstream-client: must be h1 or undici, got "curl"/],
    ['pipelining out of range', ['--upstream-pipelining', '0', '--nodes', 'a=http://127.0.0.1:1'], {}, /--upstream-pipelining: 0 is out of range 1\.\.256/],
    ['pipelining with undici', ['--upstream-client', 'undici', '--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_UPSTREAM_PIPELINING: '4' }, /LAKEFRONT_UPSTREAM_PIPELINING: pipelining is the h1 client's; --upstream-client undici keeps one request a connection/],
    // A template whose node list came out empty: refused, not the demo cluster served.
    ['an empty node list in the environment', ['--port', '0'], { LAKEFRONT_NODES: '' }, /^lakefront: LAKEFRONT_NODES: set but empty \(unset it for the default: the demo cluster\)$/],
  ];
  for (const [name, args, env, pattern] of cases) {
    it(name, async () => {
      const run = start(args, env);
      assert.equal(await exitOf(run), 2);
      const lines = run.output().trim().split('\n');
      assert.equal(lines.length, 1, `one line, got: ${run.output()}`);
      assert.match(lines[0]!, pattern);
    });
  }

  it('a hints file that is not a regular file is refused, and left as it was', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lakefront-hints-'));
    try {
      const fifo = join(dir, 'pipe');
      execFileSync('mkfifo', [fifo]);
      const link = join(dir, 'link');
      writeFileSync(join(dir, 'target.json'), '{"version":1,"hints":[]}');
      symlinkSync(join(dir, 'target.json'), link);
      const cases: [string, RegExp][] = [
        [fifo, /not a regular file but a pipe/],
        [dir, /not a regular file but a directory/],
        [link, /not a regular file but a symbolic link \(name the file itself\)/],
        // A stop would write into a directory that is not there, and lose the hints.
        [join(dir, 'nodir') + '/', /ends in "\/", naming a directory; name the file$/],
        [join(dir, 'missing', 'hints.json'), new RegExp(`its directory ${join(dir, 'missing')} does not exist \\(a stop could not save the hints there\\)$`)],
        [join(dir, 'target.json', 'hints.json'), /: a part of the path before its name is not a directory$/],
      ];
      for (const [path, pattern] of cases) {
        const run = start(['--port', '0', '--nodes', 'a=http://127.0.0.1:1', '--hints-file', path]);
        assert.equal(await exitOf(run), 2, run.output());
        const lines = run.output().trim().split('\n');
        assert.equal(lines.length, 1, `one line, got: ${run.output()}`);
        assert.ok(lines[0]!.startsWith(`lakefront: hints file ${path}: `), lines[0]);
        assert.match(lines[0]!, pattern);
      }
      // Nothing renamed, removed or replaced.
      assert.equal(lstatSync(fifo).isFIFO(), true);
      assert.equal(lstatSync(link).isSymbolicLink(), true);
      assert.deepEqual(readdirSync(dir).sort(), ['link', 'pipe', 'target.json']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('flags win over the environment', async () => {
    const run = start(['--port', 'x1'], { PORT: '8080', LAKEFRONT_NODES: 'a=http://127.0.0.1:1' });
    assert.equal(await exitOf(run), 2);
    assert.match(run.output(), /--port: not a whole number: "x1"/);
  });

  it('--help prints every option and exits 0', async () => {
    const run = start(['--help']);
    assert.equal(await exitOf(run), 0);
    for (const flag of ['--nodes', '--port', '--threads', '--hedge-ms', '--health-interval-ms']) assert.ok(run.output().includes(flag), flag);
  });
});

describe('lakefront command: running', () => {
  let nodes: FakeNode[];
  before(async () => {
    nodes = await startNodes('c-a', 'c-b', 'c-c');
  });
  after(async () => {
    await Promise.all(nodes.map((n) => n.stop()));
  });

  it('with no nodes configured, serves an embedded demo cluster and prints a curl line', async () => {
    const run = start(['--port', '0', '--threads', '2']);
    try {
      const [, url] = await waitForLine(run.child, /try: curl .* (http:\/\/127\.0\.0\.1:\d+)\/rpc\/query\.execute/);
      await outputMatches(run, /\/kv\/greeting .*\n/);
      // Each of its own lines starts lakefront: or try: (the README's promise to `--access-log -` readers).
      for (const line of run.output().trimEnd().split('\n')) assert.match(line, /^(lakefront|try): /);
      const reply = await rpc(url!, 'query.execute', 'board-1');
      assert.equal(reply.status, 200);
      const served = reply.headers['x-lakefront-served-by'];
      assert.match(String(served), /^demo-[abc]$/);
      assert.equal(reply.json<{ node: string }>().node, served, 'the demo node names itself');
      assert.equal((await call(`${url}/health`)).json<{ healthy: string[] }>().healthy.length, 3);
      // WebSocket too: the demo nodes echo, naming themselves.
      const ws = new WebSocket(`${url!.replace('http:', 'ws:')}/rpc/live`, { headers: { 'x-lakefront-board': 'board-1' } });
      await once(ws, 'open');
      ws.send('hi');
      const [echo] = (await once(ws, 'message')) as [Buffer];
      assert.deepEqual(JSON.parse(echo.toString()), { node: served, echo: 'hi' }, 'the board\'s node, as for HTTP');
      ws.close(1000);
      await once(ws, 'close');
      // And replicated values on /kv/*: written to two of three replicas at least, read back.
      const put = await call(`${url}/kv/greeting`, { method: 'PUT', body: 'hello', headers: { 'content-type': 'text/plain' } });
      assert.equal(put.status, 204);
      assert.equal(put.headers['x-lakefront-acks'], '2/2');
      const got = await call(`${url}/kv/greeting`);
      assert.equal(got.text, 'hello');
      assert.equal(got.headers['content-type'], 'text/plain');
      assert.equal(got.headers['x-lakefront-version'], put.headers['x-lakefront-version']);
    } finally {
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0);
    }
  });

  it('on SIGTERM stops accepting, finishes in-flight requests, and exits 0; secrets never reach the log', async () => {
    const secret = 'Bearer do-not-log-me-7f3a';
    const env = {
      LAKEFRONT_NODES: nodes.map((n) => `${n.id}=${n.url}`).join(','),
      PORT: '0',
      LAKEFRONT_THREADS: '2',
      LAKEFRONT_HOST: '127.0.0.1',
    };
    const run = start([], env);
    const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    for (const n of nodes) n.behaviour = { kind: 'answer', delayMs: 300 };
    const arrived = Promise.race(nodes.map((n) => once(n, 'request')));
    const inflight = rpc(url!, 'board.append', 'drain-board', { headers: { authorization: secret } });
    await arrived;
    run.child.kill('SIGTERM');
    const reply = await inflight;
    assert.equal(reply.status, 200, 'the in-flight write was finished, not cut');
    assert.equal(await exitOf(run), 0);
    await assert.rejects(call(`${url}/health`, { fresh: true }), 'no longer accepting');
    assert.ok(!run.output().includes('do-not-log-me'), 'the Authorization header never reaches the log');
    for (const n of nodes) n.behaviour = { kind: 'answer' };
  });

  it('on SIGTERM still drains and exits 0 when its standard output\'s reader has gone (a log shipper that died): its lines are lost, not the requests', async () => {
    // helper-81: the line `lakefront: SIGTERM: draining` hit EPIPE, Node's unheard 'error' ended
    // the process with an abort (SIGABRT), and the in-flight request got no answer.
    const run = start(['--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(','), '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--access-log', '-']);
    const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    // The reader goes away: the pipe's read end closes.
    run.child.stdout!.destroy();
    assert.equal((await rpc(url!, 'query.execute', 'gone-board')).status, 200, 'its access-log line meets the closed pipe');
    for (const n of nodes) n.behaviour = { kind: 'answer', delayMs: 300 };
    try {
      const arrived = Promise.race(nodes.map((n) => once(n, 'request')));
      const inflight = rpc(url!, 'board.append', 'gone-board');
      await arrived;
      run.child.kill('SIGTERM');
      const reply = await inflight;
      assert.equal(reply.status, 200, 'the in-flight write was finished, not cut');
      assert.deepEqual(await endOf(run), { code: 0, signal: null });
    } finally {
      for (const n of nodes) n.behaviour = { kind: 'answer' };
      if (run.child.exitCode === null && run.child.signalCode === null) run.child.kill('SIGKILL');
    }
  });

  it('SIGHUP without --config says there is nothing to reload, and the front door serves on', async () => {
    const run = start(['--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(','), '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--health-interval-ms', '60000']);
    try {
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      run.child.kill('SIGHUP');
      await outputMatches(run, /lakefront: SIGHUP: nothing to reload \(no --config\); still serving\n/);
      assert.equal((await rpc(url!, 'query.execute', 'after-hup')).status, 200);
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0, run.output());
      assert.doesNotMatch(run.output(), ABORTED);
    } finally {
      run.child.kill('SIGKILL');
    }
  });

  it('SIGHUP reads the --config file again and takes over the port; a bad file changes nothing', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'lf-reload-'));
    const file = join(dir, 'lf.json');
    const write = (ids: string[]): void =>
      writeFileSync(file, JSON.stringify({
        clusters: [{ name: 'boards', nodes: nodes.filter((n) => ids.includes(n.id)).map((n) => ({ id: n.id, url: n.url })) }],
        routes: [{ path: '/rpc/*', cluster: 'boards', keyHeader: 'x-lakefront-board' }],
      }));
    write(['c-a']);
    const run = start(['--config', file, '--port', '0', '--host', '127.0.0.1', '--threads', '2', '--health-interval-ms', '60000']);
    try {
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      assert.deepEqual(await healthyOn(url!), ['c-a']);
      write(['c-b', 'c-c']);
      run.child.kill('SIGHUP');
      // The same port, and the flags still apply (two threads).
      const [, served] = await outputMatches(run, /lakefront: SIGHUP: reloaded \S+lf\.json: serving on (http:\/\/127\.0\.0\.1:\d+) with 2 worker thread\(s\) over c-b=\S+, c-c=\S+; the previous configuration drains\n/);
      assert.equal(served, url);
      await outputMatches(run, /lakefront: the previous configuration has drained/);
      assert.deepEqual(await healthyOn(url!), ['c-b', 'c-c']);
      // A file that does not parse: one line, and the configuration in place goes on.
      writeFileSync(file, '{"clusters": [');
      run.child.kill('SIGHUP');
      await outputMatches(run, /lakefront: SIGHUP: \S+lf\.json: not valid JSON .*; still serving the previous configuration\n/);
      assert.deepEqual(await healthyOn(url!), ['c-b', 'c-c']);
      const reply = await rpc(url!, 'query.execute', 'after-reload');
      assert.equal(reply.status, 200);
      assert.match(String(reply.headers['x-lakefront-served-by']), /^c-[bc]$/);
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0, run.output());
      assert.doesNotMatch(run.output(), ABORTED);
    } finally {
      run.child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a SIGHUP or SIGUSR1 that comes while the front door starts is done once it serves, not the end of the process', async () => {
    // A node whose first health probe waits for the test: the start waits for it, with the signals
    // in. Before: SIGHUP's default ended the process there.
    const held: ServerResponse[] = [];
    const node = createHttpServer((req, res) => {
      if (req.url === '/health' && held.length === 0) held.push(res);
      else res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
    node.listen(0, '127.0.0.1');
    await once(node, 'listening');
    const nodeUrl = `http://127.0.0.1:${(node.address() as AddressInfo).port}`;
    const dir = mkdtempSync(join(tmpdir(), 'lf-early-'));
    const file = join(dir, 'lf.json');
    writeFileSync(file, JSON.stringify({ clusters: [{ name: 'boards', nodes: [{ id: 'early-a', url: nodeUrl }] }], routes: [{ path: '/rpc/*', cluster: 'boards', keyHeader: 'x-lakefront-board' }] }));
    const run = start(['--config', file, '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--health-interval-ms', '60000']);
    try {
      while (held.length === 0) await once(node, 'request');
      run.child.kill('SIGUSR1');
      run.child.kill('SIGHUP');
      // The signals are pending in the process when kill returns; the start still has its worker
      // threads to start after this answer.
      held[0]!.writeHead(200).end('{}');
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      await outputMatches(run, /lakefront: SIGHUP: reloaded \S+lf\.json: serving on \S+ with 1 worker thread\(s\) over early-a=/);
      assert.equal((await rpc(url!, 'query.execute', 'after-early-hup')).status, 200);
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0, run.output());
      assert.doesNotMatch(run.output(), /Debugger listening/);
      assert.doesNotMatch(run.output(), ABORTED);
    } finally {
      run.child.kill('SIGKILL');
      node.closeAllConnections();
      node.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('rotates affinity keys at SIGHUP from --affinity-keys-file: the new key signs, the old one verifies until it is dropped', async () => {
    const KEY_OLD = 'o'.repeat(32) + '-old';
    const KEY_NEW = 'n'.repeat(32) + '-new';
    const dir = mkdtempSync(join(tmpdir(), 'lf-keys-'));
    const file = join(dir, 'lf.json');
    const keys = join(dir, 'keys');
    writeFileSync(file, JSON.stringify({
      clusters: [{ name: 'live', nodes: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [{ path: '/rpc/*', cluster: 'live', policy: 'round_robin', keyHeader: null, affinity: { app: 'rot' } }],
    }));
    writeFileSync(keys, `# signing key first\n${KEY_OLD}\n`, { mode: 0o600 });
    const run = start(['--config', file, '--affinity-keys-file', keys, '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--health-interval-ms', '60000']);
    const signedBy = (ticket: string, key: string): boolean => 'node' in new TicketBook({ app: 'rot', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 0, keys: [key] }).check(ticket);
    const read = (url: string, ticket?: string) => call(`${url}/rpc/query.execute`, { headers: ticket === undefined ? {} : { 'x-lakefront-affinity': ticket } });
    const reload = async (n: number): Promise<void> => {
      run.child.kill('SIGHUP');
      // The n-th reload's line, and its predecessor's drain.
      await outputMatches(run, new RegExp(`(?:SIGHUP: reloaded [^]*){${n}}`));
      await outputMatches(run, new RegExp(`(?:the previous configuration has drained[^]*){${n}}`));
    };
    try {
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      const placed = await read(url!);
      const old = String(placed.headers['x-lakefront-affinity']);
      const home = placed.headers['x-lakefront-served-by'];
      assert.ok(signedBy(old, KEY_OLD));
      // Rotation: the new key first, the old one kept to verify.
      writeFileSync(keys, `${KEY_NEW}\n\n${KEY_OLD}\n`);
      await reload(1);
      const kept = await read(url!, old);
      assert.equal(kept.headers['x-lakefront-served-by'], home, 'an old ticket still holds');
      assert.equal(kept.headers['x-lakefront-affinity'], undefined, 'and is not replaced');
      const fresh = String((await read(url!)).headers['x-lakefront-affinity']);
      assert.ok(signedBy(fresh, KEY_NEW) && !signedBy(fresh, KEY_OLD), 'new tickets are signed with the new key');
      // The old key dropped: its tickets are no tickets, and the client is placed anew.
      writeFileSync(keys, `${KEY_NEW}\n`);
      await reload(2);
      const replaced = await read(url!, old);
      assert.equal(replaced.status, 200);
      assert.ok(signedBy(String(replaced.headers['x-lakefront-affinity']), KEY_NEW), 'a fresh ticket, signed with the new key');
      // A keys file that went bad at a reload changes nothing, and names no key.
      writeFileSync(keys, 'short\n');
      run.child.kill('SIGHUP');
      await outputMatches(run, /lakefront: SIGHUP: --affinity-keys-file: key 1 of 1 has 5 characters; at least 32 are needed; still serving the previous configuration\n/);
      assert.equal((await read(url!, fresh)).headers['x-lakefront-affinity'], undefined, 'the new key still verifies');
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0, run.output());
      for (const key of [KEY_OLD, KEY_NEW]) assert.ok(!run.output().includes(key), 'no key in the output');
    } finally {
      run.child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('says on the way out how many hints for replicas that were down it dropped', async () => {
    const replicas = await startNodes('hint-a', 'hint-b', 'hint-c', 'hint-d');
    const dir = mkdtempSync(join(tmpdir(), 'lf-hints-'));
    try {
      for (const n of replicas) n.behaviour = { kind: 'replica' };
      replicas[0]!.healthy = false; // down from the start: its writes go to stand-ins, as hints
      const file = join(dir, 'lf.json');
      writeFileSync(file, JSON.stringify({
        clusters: [{ name: 'kv', nodes: replicas.map((n) => ({ id: n.id, url: n.url })) }],
        routes: [{ path: '/kv/*', cluster: 'kv', quorum: { n: 3 } }],
      }));
      const run = start(['--config', file, '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--health-interval-ms', '60000']);
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      // hint-a is one of three replicas of most keys.
      for (let i = 0; i < 4; i++) assert.equal((await call(`${url}/kv/key-${i}`, { method: 'PUT', body: 'x' })).status, 204);
      const held = (await call(`${url}/stats`)).json<{ quorum: { hints: { pending: number } } }>().quorum.hints.pending;
      assert.ok(held > 0);
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0);
      // A stand-in's acknowledgement may come after its write was answered (and after /stats).
      const said = /lakefront: (\d+) hint\(s\) for replicas that were down were dropped at shutdown/.exec(run.output());
      assert.ok(said, run.output());
      assert.ok(Number(said[1]) >= held && Number(said[1]) <= 4, `${said[1]} dropped, ${held} held before`);
    } finally {
      await Promise.all(replicas.map((n) => n.stop()));
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('on every interface (--host 0.0.0.0), says so, and the loopback URL to reach it from this machine', async () => {
    const run = start(['--port', '0', '--threads', '1', '--host', '0.0.0.0', '--health-interval-ms', '60000', '--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(',')]);
    try {
      const [, bound, url, port] = await waitForLine(run.child, /listening on 0\.0\.0\.0:(\d+) \(every interface; (http:\/\/127\.0\.0\.1:(\d+)) from this machine\)/);
      assert.equal(bound, port);
      assert.equal((await call(`${url}/health`)).status, 200);
    } finally {
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0);
    }
  });

  it('a second SIGINT during the drain ends the process by that signal at once, not by an abort', async () => {
    const run = start(['--port', '0', '--threads', '2', '--host', '127.0.0.1', '--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(',')]);
    const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
    for (const n of nodes) n.behaviour = { kind: 'hang' };
    try {
      // A request the drain would wait for: its worker keeps its uWS sockets open meanwhile.
      const arrived = Promise.race(nodes.map((n) => once(n, 'request')));
      const inflight = rpc(url!, 'board.append', 'second-signal').then(
        (reply) => reply.status,
        () => 'cut',
      );
      await arrived;
      const draining = waitForLine(run.child, /SIGINT: draining/);
      run.child.kill('SIGINT');
      await draining;
      run.child.kill('SIGINT');
      assert.deepEqual(await endOf(run), { code: null, signal: 'SIGINT' });
      assert.match(run.output(), /lakefront: second SIGINT: exiting without draining/);
      assert.doesNotMatch(run.output(), ABORTED);
      assert.equal(await inflight, 'cut', 'the in-flight request ends with the process');
    } finally {
      for (const n of nodes) n.behaviour = { kind: 'answer' };
    }
  });

  it('a worker stuck in JavaScript makes stop() reject naming it after the drain deadline, and nothing aborts', async () => {
    const run = startFixture('stuck-worker.js');
    assert.deepEqual(await endOf(run), { code: null, signal: 'SIGKILL' }, run.output());
    const output = run.output();
    assert.match(output, /^rejected: worker thread 1 did not stop within 5100 ms of the drain \(stuck in JavaScript\?\); only the process's end can stop it$/m);
    assert.match(output, /^listed: \[1\]; not ended by closeNow: \[1\]$/m);
    assert.doesNotMatch(output, ABORTED);
  });

  it('a reload over a worker stuck in JavaScript takes over, and the old front door\'s drained rejects naming it', async () => {
    const run = startFixture('stuck-reload.js');
    assert.deepEqual(await endOf(run), { code: null, signal: 'SIGKILL' }, run.output());
    const output = run.output();
    assert.match(output, /^took over: 1$/m);
    assert.match(output, /^drained rejected: worker thread 1 did not stop within 5100 ms of the drain \(stuck in JavaScript\?\); only the process's end can stop it$/m);
    assert.doesNotMatch(output, ABORTED);
  });

  it('a lone worker that crashes is replaced, after its backoff too, and one whose replacement cannot start yet is tried again', async () => {
    // Before: the process ended (exit 13 here, 0 from the command) while the replacement waited
    // on an unref'd timer with no thread running; and a replacement that could not start was
    // never tried again.
    const run = startFixture('lone-worker.js');
    assert.deepEqual(await endOf(run), { code: 0, signal: null }, run.output());
    const lines = run.output().split('\n').filter((l) => !l.startsWith('lakefront: worker 1 crashed') && !l.startsWith('    at '));
    assert.deepEqual(lines.filter((l) => l !== ''), [
      'replaced 1',
      'replaced 2',
      "replacement failed: ENOENT: no such file or directory, open '<dir>/access.log'",
      'replaced 3',
      'stopped',
    ]);
    assert.doesNotMatch(run.output(), ABORTED);
  });

  it('closeNow closes every worker\'s sockets and ends them, so the process can exit cleanly', async () => {
    const run = startFixture('close-now.js');
    assert.deepEqual(await endOf(run), { code: 0, signal: null }, run.output());
    const output = run.output();
    assert.match(output, /^not ended: \[\]; in-flight request: cut; in flight at the node: 0$/m);
    assert.doesNotMatch(output, ABORTED);
  });

  it('proxies through the undici transport when asked to', async () => {
    const run = start(['--port', '0', '--threads', '1', '--host', '127.0.0.1', '--upstream-client', 'undici', '--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(',')]);
    try {
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      const reply = await rpc(url!, 'query.execute', 'undici-board', { body: '{"via":"undici"}' });
      assert.equal(reply.status, 200);
      const served = nodes.find((n) => n.id === reply.headers['x-lakefront-served-by'])!;
      assert.equal(served.received.at(-1)!.body, '{"via":"undici"}');
    } finally {
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0);
    }
  });

  it('reaches an https node through the undici transport, and tunnels a WebSocket to it over TLS (trusting the CA given in NODE_EXTRA_CA_CERTS)', async () => {
    // Sources are compiled to dist/test; the certificate stays in test/fixtures/tls.
    const tlsDir = new URL('../../test/fixtures/tls/', import.meta.url);
    const certFile = fileURLToPath(new URL('cert.pem', tlsDir));
    const paths: string[] = [];
    const secure = createHttpsServer({ key: readFileSync(new URL('key.pem', tlsDir)), cert: readFileSync(certFile) }, (req, res) => {
      paths.push(req.url!);
      res.setHeader('content-type', 'application/json');
      res.end(req.url === '/health' ? '{"ok":true}' : '{"secure":true}');
    });
    // The same node echoes WebSocket messages (wss:), prefixed so the echo is known to be its.
    const echo = new WebSocketServer({ server: secure });
    echo.on('connection', (socket) => socket.on('message', (data, isBinary) => socket.send(isBinary ? data : `tls:${String(data)}`, { binary: isBinary })));
    secure.listen(0, '127.0.0.1');
    await once(secure, 'listening');
    const port = (secure.address() as AddressInfo).port;
    const run = start(['--port', '0', '--threads', '1', '--host', '127.0.0.1', '--upstream-client', 'undici', '--nodes', `tls-node=https://127.0.0.1:${port}`], {
      NODE_EXTRA_CA_CERTS: certFile,
    });
    try {
      const [, url] = await waitForLine(run.child, /listening on (http:\/\/127\.0\.0\.1:\d+)/);
      const reply = await rpc(url!, 'query.execute', 'tls-board');
      assert.equal(reply.status, 200);
      assert.equal(reply.headers['x-lakefront-served-by'], 'tls-node');
      assert.equal(reply.text, '{"secure":true}');
      assert.ok(paths.includes('/health'), 'the health probe spoke https too');
      assert.deepEqual((await call(`${url}/health`)).json<{ healthy: string[] }>().healthy, ['tls-node']);
      const socket = new WebSocket(`${url!.replace('http:', 'ws:')}/rpc/live`, { headers: { 'x-lakefront-board': 'tls-board' } });
      await once(socket, 'open');
      socket.send('over tls');
      const [message] = (await once(socket, 'message')) as [Buffer];
      assert.equal(String(message), 'tls:over tls');
      socket.close(1000);
      await once(socket, 'close');
    } finally {
      run.child.kill('SIGTERM');
      assert.equal(await exitOf(run), 0);
      echo.close();
      secure.closeAllConnections();
      secure.close();
    }
  });

  it('refuses the port of a running Lakefront (both would bind it with SO_REUSEPORT and split its connections)', async () => {
    const first = start(['--port', '0', '--threads', '2', '--host', '127.0.0.1', '--nodes', `a=${nodes[0]!.url}`]);
    try {
      const [, port] = await waitForLine(first.child, /listening on http:\/\/127\.0\.0\.1:(\d+)/);
      const second = start(['--port', port!, '--threads', '1', '--host', '127.0.0.1', '--nodes', `a=${nodes[0]!.url}`]);
      assert.equal(await exitOf(second), 1);
      assert.equal(second.output().trim(), `lakefront: could not listen on 127.0.0.1:${port}: the port is in use`);
      // The first one still has every connection.
      assert.equal((await call(`http://127.0.0.1:${port}/health`)).status, 200);
    } finally {
      first.child.kill('SIGTERM');
      assert.equal(await exitOf(first), 0);
    }
  });

  it('names a port that is already taken and exits 1', async () => {
    // uWS shares a port with its own sockets through SO_REUSEPORT; a plain listener blocks it.
    const blocker = createServer();
    blocker.listen(0, '127.0.0.1');
    await once(blocker, 'listening');
    const port = (blocker.address() as AddressInfo).port;
    try {
      const run = start(['--port', String(port), '--threads', '1', '--host', '127.0.0.1', '--nodes', `a=${nodes[0]!.url}`]);
      assert.equal(await exitOf(run), 1);
      assert.match(run.output(), new RegExp(`could not listen on 127\\.0\\.0\\.1:${port}`));
    } finally {
      blocker.close();
    }
  });
});
