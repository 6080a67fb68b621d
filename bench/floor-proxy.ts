/**
 * The floor of Lakefront's design on this machine: the least a proxy built the same way can do.
 * uWS in each worker thread on one port (SO_REUSEPORT), headers read with `forEach`, a body
 * copied, the node picked by the same XXH64 rendezvous ranking, one write of head and body to a
 * kept-alive `net.Socket` read into one buffer a thread (`onread`), the answer's head scanned for
 * its length, its header lines relayed in one `writeHeader`, the answer written corked. Nothing
 * else: no hedging, latency windows, counters, timeouts, checks of what comes in or back,
 * failover, access log or membership. Not a product (a node's bad answer, or a client that
 * pipelines, is not handled; a node that closes answers 502; bodies up to 64 KiB each way, answers
 * framed by a content-length): a bench contender, to tell what Lakefront's own work costs from
 * what any uWS + Node proxy pays for its sockets, calls and strings.
 *
 *   node dist/bench/floor-proxy.js --port 0 --threads 2 --nodes a=http://...,b=http://... [--pipelining]
 *
 * Prints `{"port":N}` once every thread listens.
 */
import { connect, createServer, type AddressInfo, type Socket } from 'node:net';
import { parseArgs } from 'node:util';
import { isMainThread, parentPort, Worker, workerData } from 'node:worker_threads';
import type { HttpRequest, HttpResponse } from 'uWebSockets.js';
import { RendezvousRanker } from '../src/hashing/rendezvous.js';
import { loadUws } from '../src/server/uws.js';

interface Node {
  id: string;
  host: string;
  port: number;
}

const HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'host', 'content-length', 'expect', 'proxy-connection']);

function serve({ nodes, port, pipelining }: { nodes: Node[]; port: number; pipelining: boolean }): void {
  PIPELINE = pipelining;
  const uws = loadUws();
  const ranker = new RendezvousRanker(
    nodes.map((n) => n.id),
    nodes.map(() => 1),
  );
  const ranking = new Int32Array(nodes.length);
  const pools = nodes.map((n) => new Pool(n));
  let lines = '';
  let board = '';
  let length = '';
  const scan = (name: string, value: string): void => {
    if (name === 'content-length') length = value;
    if (HOP.has(name)) return;
    if (name === 'x-lakefront-board') board = value;
    lines += `${name}: ${value}\r\n`;
  };
  const app = uws.App();
  app.any('/*', (res: HttpResponse, req: HttpRequest) => {
    const method = req.getCaseSensitiveMethod();
    const query = req.getQuery();
    const path = query ? `${req.getUrl()}?${query}` : req.getUrl();
    lines = '';
    board = '';
    length = '';
    req.forEach(scan);
    const exchange = new Exchange(res, `${method} ${path} HTTP/1.1\r\nhost: upstream\r\n${lines}content-length: ${length || '0'}\r\n\r\n`);
    ranker.rankInto(board, ranking);
    const pool = pools[ranking[0]!]!;
    res.onAborted(() => (exchange.aborted = true));
    if (length === '' || length === '0') pool.send(exchange, null);
    else {
      // Copied once (uWS reuses the chunk's memory after the callback).
      let body: Buffer | null = null;
      res.onData((chunk, isLast) => {
        const part = new Uint8Array(chunk);
        body = body === null ? Buffer.from(part) : Buffer.concat([body, part]);
        if (isLast) pool.send(exchange, body);
      });
    }
  });
  app.listen('127.0.0.1', port, (socket) => {
    parentPort!.postMessage({ port: socket ? uws.us_socket_local_port(socket) : -1 });
  });
}

class Exchange {
  aborted = false;
  constructor(
    readonly res: HttpResponse,
    readonly head: string,
  ) {}

  failed(): void {
    if (this.aborted) return;
    this.res.cork(() => this.res.writeStatus('502').end('{"error":"upstream failed"}'));
  }

  answer(status: number, relayed: Buffer, body: Buffer): void {
    if (this.aborted) return;
    const res = this.res;
    res.cork(() => {
      if (status !== 200) res.writeStatus(String(status));
      // The served-by value, then the node's lines: one call (as Lakefront).
      res.writeHeader('x-lakefront-served-by', relayed.subarray(0, relayed.length - 2));
      res.end(body);
    });
  }
}

const READ = Buffer.allocUnsafe(65536);
/**
 * `--pipelining`: every request a thread takes in one loop turn for one node goes on one
 * connection in one write, at the turn's end (its check phase); the answers are read in order.
 * Every request, reads and writes alike (the floor tells them apart no more than it checks
 * answers): what the least pipelining proxy of this design costs (Lakefront's h1 client
 * pipelines safe reads only: `--upstream-pipelining`).
 */
let PIPELINE = false;
let flushScheduled = false;
let toFlush: Pool[] = [];
function flushAll(): void {
  flushScheduled = false;
  const pools = toFlush;
  toFlush = [];
  for (const pool of pools) pool.flush();
}

/** One node's kept-alive connections, one request each at a time. */
class Pool {
  private readonly idle: Conn[] = [];
  private readonly waiting: Array<[Exchange, Buffer | null]> = [];
  private count = 0;
  readonly servedBy: Buffer;
  constructor(readonly node: Node) {
    this.servedBy = Buffer.from(`${node.id}\r\n`, 'latin1');
  }

  /** With --pipelining: this turn's requests, to go in one write. */
  batch: Array<[Exchange, Buffer | null]> = [];
  send(exchange: Exchange, body: Buffer | null): void {
    if (PIPELINE) {
      if (this.batch.length === 0) {
        toFlush.push(this);
        if (!flushScheduled) {
          flushScheduled = true;
          setImmediate(flushAll);
        }
      }
      this.batch.push([exchange, body]);
      return;
    }
    const conn = this.idle.pop();
    if (conn !== undefined) conn.send(exchange, body);
    else if (this.count < 64) {
      this.count++;
      new Conn(this).send(exchange, body);
    } else this.waiting.push([exchange, body]);
  }

  flush(): void {
    const batch = this.batch;
    this.batch = [];
    let conn = this.idle.pop();
    if (conn === undefined) {
      this.count++;
      conn = new Conn(this);
    }
    conn.sendAll(batch);
  }

  /** A connection the node closed (its idle timeout) or that failed: gone from the pool. */
  closed(conn: Conn): void {
    this.count--;
    const at = this.idle.indexOf(conn);
    if (at >= 0) this.idle.splice(at, 1);
  }

  release(conn: Conn): void {
    if (PIPELINE) {
      this.idle.push(conn);
      return;
    }
    const next = this.waiting.shift();
    if (next !== undefined) conn.send(next[0], next[1]);
    else this.idle.push(conn);
  }
}

/** Names of a node's header lines not relayed: uWS writes its own date, name and length. */
const NOT_RELAYED = ['content-length', 'date', 'uwebsockets', 'connection', 'keep-alive', 'transfer-encoding'].map((n) => Buffer.from(n, 'latin1'));
const CRLFCRLF = Buffer.from('\r\n\r\n', 'latin1');
let write = Buffer.allocUnsafeSlow(65536);
const relay = Buffer.allocUnsafeSlow(16384);

/** Whether the bytes from..to of `data` are `name` (lower case), ignoring case. */
function nameIs(data: Buffer, from: number, to: number, name: Buffer): boolean {
  if (to - from !== name.length) return false;
  for (let i = 0; i < name.length; i++) if ((data[from + i]! | 0x20) !== name[i]) return false;
  return true;
}

class Conn {
  private readonly socket: Socket;
  private exchange: Exchange | null = null;
  private queue: Exchange[] = [];
  /** What came of an answer that did not come in one read (a copy). */
  private pending: Buffer | null = null;
  private bodyAt = -1;
  private expected = 0;

  constructor(readonly pool: Pool) {
    this.socket = connect({ host: pool.node.host, port: pool.node.port, noDelay: true, onread: { buffer: READ, callback: (n) => this.onRead(n) } });
    this.socket.on('error', () => {});
    this.socket.on('close', () => {
      this.pool.closed(this);
      const exchange = this.exchange;
      this.exchange = null;
      if (exchange !== null) exchange.failed();
      for (const e of this.queue.splice(0)) e.failed();
    });
  }

  /** A turn's requests in one write (--pipelining); this connection has nothing in flight. */
  sendAll(batch: Array<[Exchange, Buffer | null]>): void {
    let size = 0;
    for (const [exchange, body] of batch) size += exchange.head.length + (body === null ? 0 : body.length);
    if (size > write.length) write = Buffer.allocUnsafeSlow(size);
    let n = 0;
    for (const [exchange, body] of batch) {
      this.queue.push(exchange);
      n += write.write(exchange.head, n, 'latin1');
      if (body !== null) n += body.copy(write, n);
    }
    this.exchange = this.queue.shift()!;
    this.socket.write(write.subarray(0, n));
    if (this.socket.writableLength !== 0) write = Buffer.allocUnsafeSlow(65536);
  }

  /** Head and body laid out in one buffer a thread, one write (a new buffer if the kernel kept some). */
  send(exchange: Exchange, body: Buffer | null): void {
    this.exchange = exchange;
    let n = write.write(exchange.head, 0, 'latin1');
    if (body !== null) n += body.copy(write, n);
    this.socket.write(write.subarray(0, n));
    if (this.socket.writableLength !== 0) write = Buffer.allocUnsafeSlow(65536);
  }

  private onRead(n: number): boolean {
    let data: Buffer = READ.subarray(0, n);
    for (;;) {
      const rest = this.one(data);
      if (rest === null) return true;
      data = rest;
    }
  }

  /** Answers the first answer in `data`: the bytes after it (null when no whole answer is left). */
  private one(data: Buffer): Buffer | null {
    if (data.length === 0) return null;
    let copied = false;
    if (this.pending !== null) {
      data = Buffer.concat([this.pending, data]);
      this.pending = null;
      copied = true;
    }
    if (this.bodyAt < 0) {
      const end = data.indexOf(CRLFCRLF);
      if (end < 0) {
        this.pending = copied ? data : Buffer.from(data);
        return null;
      }
      this.bodyAt = end + 4;
      this.expected = 0;
      for (let at = data.indexOf(0x0a) + 1; at < end; ) {
        const eol = data.indexOf(0x0d, at);
        const colon = data.indexOf(0x3a, at);
        if (nameIs(data, at, colon, NOT_RELAYED[0]!)) {
          let length = 0;
          for (let i = colon + 1; i < eol; i++) if (data[i] !== 0x20) length = length * 10 + data[i]! - 48;
          this.expected = length;
        }
        at = eol + 2;
      }
    }
    if (data.length < this.bodyAt + this.expected) {
      this.pending = copied ? data : Buffer.from(data);
      return null;
    }
    // The served-by value, then the node's lines to relay, in one buffer a thread.
    const servedBy = this.pool.servedBy;
    let out = servedBy.copy(relay, 0);
    const end = this.bodyAt - 4;
    for (let at = data.indexOf(0x0a) + 1; at < end; ) {
      const eol = data.indexOf(0x0d, at);
      const colon = data.indexOf(0x3a, at);
      let relayed = true;
      for (const name of NOT_RELAYED) if (nameIs(data, at, colon, name)) relayed = false;
      if (relayed) out += data.copy(relay, out, at, eol + 2);
      at = eol + 2;
    }
    const status = (data[9]! - 48) * 100 + (data[10]! - 48) * 10 + (data[11]! - 48);
    const exchange = this.exchange!;
    this.exchange = null;
    const bodyAt = this.bodyAt;
    this.bodyAt = -1;
    // uWS copies what it is given before `end` returns: the body is passed as a view.
    const after = bodyAt + this.expected;
    exchange.answer(status, relay.subarray(0, out), data.subarray(bodyAt, after));
    if (this.queue.length !== 0) {
      this.exchange = this.queue.shift()!;
      return data.subarray(after);
    }
    this.pool.release(this);
    return null;
  }
}

// Last: the classes above are initialised by now.
if (isMainThread) {
  const { values } = parseArgs({ options: { port: { type: 'string', default: '0' }, threads: { type: 'string', default: '2' }, nodes: { type: 'string' }, pipelining: { type: 'boolean', default: false } } });
  const nodes: Node[] = values.nodes!.split(',').map((entry) => {
    const eq = entry.indexOf('=');
    const url = new URL(entry.slice(eq + 1));
    return { id: entry.slice(0, eq), host: url.hostname, port: Number(url.port) };
  });
  const threads = Number(values.threads);
  // uWS sets SO_REUSEPORT only for a port it is given: a free one is found first (as Lakefront).
  const start = (port: number): Promise<number> =>
    new Promise((resolve, reject) => {
      const worker = new Worker(new URL(import.meta.url), { workerData: { nodes, port, pipelining: values.pipelining } });
      worker.once('message', (m: { port: number }) => (m.port > 0 ? resolve(m.port) : reject(new Error(`could not listen on ${port}`))));
      worker.once('error', reject);
    });
  let port = Number(values.port);
  if (port === 0) {
    const probe = createServer();
    await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
    port = (probe.address() as AddressInfo).port;
    await new Promise((resolve) => probe.close(resolve));
  }
  for (let i = 0; i < threads; i++) await start(port);
  process.stdout.write(`${JSON.stringify({ port })}\n`);
} else {
  serve(workerData as { nodes: Node[]; port: number; pipelining: boolean });
}
