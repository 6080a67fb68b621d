/**
 * The contenders, all in front of the same upstream nodes: the upstream directly (the ceiling),
 * Lakefront, the plain Node proxy, nginx and HAProxy. Each starts as its own process tree and
 * reports which PIDs to charge CPU to.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect, createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DIST, ROOT, childPids, findBinary, pause, spawnReady, wrap, type Proc } from './procs.js';

export interface Upstream {
  readonly proc: Proc;
  readonly ports: number[];
}

export interface Contender {
  readonly name: string;
  readonly url: string;
  /** null for the upstream itself, whose cost is not a proxy's. */
  readonly proc: Proc | null;
}

export interface UpstreamOptions {
  readonly count?: number;
  readonly bodyBytes?: number;
  readonly stallMs?: number;
  readonly stallP?: number;
  /** The nodes also echo WebSocket messages. */
  readonly websocket?: boolean;
  /** Every answer carries this `x-lakefront-version` (replicas in step). */
  readonly version?: string;
}

export async function startUpstream(options: UpstreamOptions = {}): Promise<Upstream> {
  const count = options.count ?? 3;
  const args = [join(DIST, 'upstream.js'), '--ports', Array(count).fill(0).join(','), '--body-bytes', String(options.bodyBytes ?? 64)];
  if (options.stallP) args.push('--stall-ms', String(options.stallMs ?? 50), '--stall-p', String(options.stallP));
  if (options.websocket) args.push('--websocket');
  if (options.version !== undefined) args.push('--version', options.version);
  const { proc, ready } = await spawnReady('upstream', process.execPath, args);
  return { proc, ports: ready.ports as number[] };
}

function nodeList(upstream: Upstream): string {
  return upstream.ports.map((p, i) => `node-${i}=http://127.0.0.1:${p}`).join(',');
}

export function direct(upstream: Upstream): Contender {
  return { name: 'direct', url: `http://127.0.0.1:${upstream.ports[0]}`, proc: null };
}

export interface LakefrontOptions {
  readonly threads: number;
  readonly hedgeMs?: number;
  readonly hedgePercentile?: number;
  readonly extraArgs?: string[];
  readonly name?: string;
}

export async function startLakefront(upstream: Upstream, options: LakefrontOptions): Promise<Contender> {
  const args = [
    '--nodes', nodeList(upstream),
    '--threads', String(options.threads),
    ...(options.hedgeMs !== undefined ? ['--hedge-ms', String(options.hedgeMs)] : []),
    ...(options.hedgePercentile !== undefined ? ['--hedge-percentile', String(options.hedgePercentile)] : []),
    ...(options.extraArgs ?? []),
  ];
  return startLakefrontWith(options.name ?? `lakefront-${options.threads}t`, args);
}

/** Lakefront in front of etcd members (`id=url,...`) with one of the seed 002 policies. */
export function startLakefrontOver(etcdNodes: string, policy: string, threads: number): Promise<Contender> {
  return startLakefrontWith(`lakefront-${policy}`, ['--etcd', etcdNodes, '--etcd-policy', policy, '--threads', String(threads)]);
}

/** Starts `lakefront` on a free loopback port with `args`; resolves once it listens. */
export async function startLakefrontWith(name: string, args: string[]): Promise<Contender> {
  const child = spawn(process.execPath, [join(ROOT, 'dist/src/cli.js'), '--port', '0', '--host', '127.0.0.1', '--health-interval-ms', '1000', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', (c: Buffer) => {
      output += c.toString();
      const match = output.match(/listening on (http:\/\/[\d.]+:\d+)/);
      if (match) resolve(match[1]!);
    });
    child.stderr!.on('data', (c: Buffer) => (output += c.toString()));
    child.once('exit', (code) => reject(new Error(`lakefront exited ${code}: ${output}`)));
  });
  return { name, url, proc: wrap(name, child, () => [child.pid!]) };
}

export async function startNodeProxy(upstream: Upstream): Promise<Contender> {
  const { proc, ready } = await spawnReady('node-proxy', process.execPath, [join(DIST, 'node-proxy.js'), '--port', '0', '--nodes', nodeList(upstream)]);
  return { name: 'node-proxy', url: `http://127.0.0.1:${ready.port as number}`, proc };
}

/** The floor of Lakefront's design (bench/floor-proxy.ts) at `threads` worker threads, pipelining or not. */
export async function startFloorProxy(upstream: Upstream, threads: number, pipelining = false): Promise<Contender> {
  const name = `floor-${pipelining ? 'pipe-' : ''}${threads}t`;
  const { proc, ready } = await spawnReady(name, process.execPath, [join(DIST, 'floor-proxy.js'), '--port', '0', '--threads', String(threads), '--nodes', nodeList(upstream), ...(pipelining ? ['--pipelining'] : [])]);
  return { name, url: `http://127.0.0.1:${ready.port as number}`, proc };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const port = (server.address() as AddressInfo).port;
      server.close(() => resolve(port));
    });
  });
}

/** Waits until `port` accepts, or fails with what the process printed if it exits first. */
async function waitForPort(port: number, child: ChildProcess, timeoutMs = 10_000): Promise<void> {
  let stderr = '';
  child.stderr?.on('data', (c: Buffer) => (stderr += c.toString()));
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`exited ${child.exitCode}: ${stderr.trim()}`);
    const ok = await new Promise<boolean>((resolve) => {
      const socket = connect(port, '127.0.0.1');
      socket.once('connect', () => {
        socket.destroy();
        resolve(true);
      });
      socket.once('error', () => resolve(false));
    });
    if (ok) return;
    if (Date.now() > deadline) throw new Error(`nothing listened on ${port} within ${timeoutMs} ms: ${stderr.trim()}`);
    await pause(50);
  }
}

function fill(template: string, values: Record<string, string>): string {
  return template.replace(/\{\{(\w+)\}\}/g, (_, key: string) => {
    const value = values[key];
    if (value === undefined) throw new Error(`template value ${key} missing`);
    return value;
  });
}

const PEERS = join(ROOT, 'bench/peers');

/** Copies a peer's error log, when it says anything, to bench/out/ before its directory goes. */
function keepLog(file: string, name: string): void {
  if (!existsSync(file) || statSync(file).size === 0) return;
  const out = join(ROOT, 'bench/out');
  mkdirSync(out, { recursive: true });
  const kept = join(out, `${name}-${new Date().toISOString().replace(/[:.]/g, '-')}.log`);
  copyFileSync(file, kept);
  process.stderr.write(`${name}: its error log is kept in ${kept}\n`);
}

/** What the load will ask of a contender, where its configuration must follow it. */
export interface LoadShape {
  /**
   * The most client connections the load opens at once. nginx's `keepalive` is no cap on its
   * connections to the nodes, only how many idle ones each worker keeps: it opens one for every
   * request it has in flight, and closes those past the cache as they come back, so with more
   * requests in flight than the cache holds it connects and closes anew all the time (Lakefront
   * and the Node proxy queue at their 64 a node instead; HAProxy keeps every one it opened). Its
   * cache is made at least this large, so it never closes a connection the load needs again.
   */
  readonly clientConnections?: number;
}

/**
 * nginx with `workers` worker processes, or null (with the reason) when nginx is missing. Each
 * worker keeps 64 idle connections a node, or `load.clientConnections` if more (see LoadShape).
 */
export async function startNginx(upstream: Upstream, workers: number, load: LoadShape = {}): Promise<Contender | string> {
  const binary = findBinary('/usr/sbin/nginx', '/usr/bin/nginx');
  if (!binary) return 'nginx not installed (apt-get install nginx)';
  const dir = mkdtempSync(join(tmpdir(), 'lakefront-nginx-'));
  for (const sub of ['body', 'proxy', 'fastcgi', 'uwsgi', 'scgi', 'logs']) mkdirSync(join(dir, sub), { recursive: true });
  const port = await freePort();
  const servers = upstream.ports.map((p) => `        server 127.0.0.1:${p};`).join('\n');
  writeFileSync(join(dir, 'nginx.conf'), fill(readFileSync(join(PEERS, 'nginx.conf.tmpl'), 'utf8'), { WORKERS: String(workers), DIR: dir, PORT: String(port), SERVERS: servers, KEEPALIVE: String(Math.max(64 * upstream.ports.length, load.clientConnections ?? 0)) }));
  const child = spawn(binary, ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'pipe'] });
  const removeDir = (): void => {
    keepLog(join(dir, 'error.log'), `nginx-${workers}w`);
    rmSync(dir, { recursive: true, force: true });
  };
  await waitForPort(port, child).catch((err: unknown) => {
    removeDir();
    throw err;
  });
  const name = `nginx-${workers}w`;
  return { name, url: `http://127.0.0.1:${port}`, proc: wrap(name, child, () => [child.pid!, ...childPids(child.pid!)], removeDir) };
}

export async function startHaproxy(upstream: Upstream, threads: number): Promise<Contender | string> {
  const binary = findBinary('/usr/sbin/haproxy', '/usr/bin/haproxy');
  if (!binary) return 'haproxy not installed (apt-get install haproxy)';
  const dir = mkdtempSync(join(tmpdir(), 'lakefront-haproxy-'));
  const port = await freePort();
  const servers = upstream.ports.map((p, i) => `    server n${i} 127.0.0.1:${p}`).join('\n');
  const file = join(dir, 'haproxy.cfg');
  writeFileSync(file, fill(readFileSync(join(PEERS, 'haproxy.cfg.tmpl'), 'utf8'), { THREADS: String(threads), DIR: dir, PORT: String(port), SERVERS: servers }));
  const child = spawn(binary, ['-db', '-f', file], { stdio: ['ignore', 'ignore', 'pipe'] });
  const removeDir = (): void => rmSync(dir, { recursive: true, force: true });
  await waitForPort(port, child).catch((err: unknown) => {
    removeDir();
    throw err;
  });
  const name = `haproxy-${threads}t`;
  return { name, url: `http://127.0.0.1:${port}`, proc: wrap(name, child, () => [child.pid!, ...childPids(child.pid!)], removeDir) };
}

/**
 * A contender by the benches' name for it: `direct`, `node-proxy`, or a kind and a count of
 * threads or workers: `lakefront-2t`, `lakefront-pipe-2t` (with `--upstream-pipelining 8`),
 * `floor-2t`, `floor-pipe-2t`, `nginx-2w`, `haproxy-2t`. A string says why a peer is skipped
 * (its binary is missing).
 */
export async function startContender(name: string, upstream: Upstream, load: LoadShape = {}): Promise<Contender | string> {
  if (name === 'direct') return direct(upstream);
  if (name === 'node-proxy') return startNodeProxy(upstream);
  const m = name.match(/^(lakefront|lakefront-pipe|floor|floor-pipe|nginx|haproxy)-(\d+)[tw]$/);
  if (!m) throw new Error(`unknown contender ${name}`);
  const n = Number(m[2]);
  if (m[1] === 'lakefront') return startLakefront(upstream, { threads: n });
  if (m[1] === 'lakefront-pipe') return startLakefront(upstream, { threads: n, extraArgs: ['--upstream-pipelining', '8'], name });
  if (m[1] === 'floor') return startFloorProxy(upstream, n);
  if (m[1] === 'floor-pipe') return startFloorProxy(upstream, n, true);
  if (m[1] === 'nginx') return startNginx(upstream, n, load);
  return startHaproxy(upstream, n);
}

/**
 * Starts each named contender into `contenders` (so a caller's cleanup stops those started when a
 * later one throws); one whose binary is missing is said in a line and put in `skipped` instead.
 */
export async function startContenders(names: readonly string[], upstream: Upstream, contenders: Contender[], skipped: string[], load: LoadShape = {}): Promise<void> {
  for (const name of names) {
    const started = await startContender(name, upstream, load);
    if (typeof started === 'string') {
      process.stdout.write(`skip ${name}: ${started}\n`);
      skipped.push(`${name}: ${started}`);
    } else contenders.push(started);
  }
}
