/**
 * A small HTTP/1.1 client for the request path: keep-alive pools of `net.Socket`s, one request
 * per connection at a time (or, with `pipelining`, a loop turn's safe reads to a node behind one
 * another: see `H1Pool.send`), the request written in one piece, the response parsed in place.
 *
 * Why not undici: measured on this machine with the same uWS front and upstream, a request
 * proxied through undici's `dispatch()` cost 29-32 us of CPU (15-16 us in user space), through
 * this client 21-22 us (8 us in user space). undici stays available (`--upstream-client undici`).
 *
 * What it does and does not do:
 * - Responses: status line, headers (kept as raw byte slices, relayed byte-exact), bodies framed
 *   by `content-length`, `transfer-encoding: chunked` (trailers read and dropped), or the end of
 *   the connection; no body for HEAD, 1xx, 204 and 304; interim 1xx responses are skipped.
 * - Connections: reused LIFO; closed after `connection: close`, HTTP/1.0 without keep-alive, a
 *   body framed by connection end, or any protocol error. Idle ones are closed after
 *   `keepAliveTimeoutMs`, or one second before the server's own `keep-alive: timeout=N`, so a
 *   request is not written into a connection the server is closing.
 * - Reported headers leave out the framing and hop-by-hop ones (content-length,
 *   transfer-encoding, connection, keep-alive, te, trailer, upgrade, proxy-connection): the
 *   client consumed them.
 * - Retries one thing only: a request its caller calls resendable (by default GET, HEAD, OPTIONS)
 *   whose reused connection ends before a byte of its answer is sent once more, on a fresh
 *   connection (see `H1Connection.stale`). Any other request written to a connection that then
 *   fails is reported failed, once: whether to try elsewhere is the exchange's decision (a bare
 *   write must not be resent).
 * - Timeouts (waiting in the queue, for the response head, and each gap in the body) are checked
 *   by one sweep timer per agent, not a timer per request.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { connect, type Socket } from 'node:net';
import { HeaderFields, connectionNamed, isChunkedOnly, nameIs, parseDecimal, repeatedLengthEnd } from './fields.js';
import { PrefixViews } from './prefix-views.js';
import { DEFAULT_MAX_RESPONSE_BYTES } from '../contract.js';

/** Stable codes for client failures. */
export const H1Codes = {
  REFUSED: 'ECONNREFUSED',
  CLOSED: 'LF_ERR_UPSTREAM_CLOSED',
  TIMEOUT: 'LF_ERR_UPSTREAM_TIMEOUT',
  CONNECT_TIMEOUT: 'LF_ERR_UPSTREAM_CONNECT_TIMEOUT',
  BAD_RESPONSE: 'LF_ERR_UPSTREAM_BAD_RESPONSE',
  TOO_LARGE: 'LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE',
  CANCELLED: 'LF_ERR_ATTEMPT_CANCELLED',
  POOL_CLOSED: 'LF_ERR_POOL_CLOSED',
} as const;

/**
 * How long a connection to a node may take to be made: the request timeout, at most 5 s (the h1
 * client's, undici's and the WebSocket tunnels' alike; one not made in time holds the node out).
 */
export function connectTimeoutFor(requestTimeoutMs: number): number {
  return Math.min(requestTimeoutMs, 5_000);
}

export class H1Error extends Error {
  readonly code: string;
  /** True when the request provably never reached the node (queued, or never connected). */
  readonly unsent: boolean;
  constructor(code: string, message: string, unsent = false) {
    super(message);
    this.name = 'H1Error';
    this.code = code;
    this.unsent = unsent;
  }
}

export interface H1Options {
  /** Maximum connections to the node. */
  readonly connections: number;
  /** Bounds the queue wait, the wait for the response head, and each gap in the body. */
  readonly requestTimeoutMs: number;
  /** Idle connections are closed after this long. Default 4000. */
  readonly keepAliveTimeoutMs?: number;
  /** A connection not established after this long fails. Default: min(requestTimeoutMs, 5000). */
  readonly connectTimeoutMs?: number;
  /** Larger responses fail the attempt. Default 64 MiB. */
  readonly maxResponseBytes?: number;
  /**
   * Requests one connection may carry at once (HTTP/1.1 pipelining): the most a loop turn's
   * resendable requests to the node share one connection and one write (see `H1Pool.send`).
   * Default 1: one request a connection at a time.
   */
  readonly pipelining?: number;
  /** How long a node that refused a pipeline gets none (see `H1Pool.pausePipelining`). Default 60000. */
  readonly pipeliningPauseMs?: number;
  /** Told of each request written behind another, and of each pipeline the node refused (for `/stats`). */
  readonly pipelineCounters?: PipelineCounters;
}

export interface PipelineCounters {
  pipelined(): void;
  refused(): void;
}

/** What an attempt hands the pool. */
export interface H1Request {
  readonly method: string;
  /** Request target, e.g. `/rpc/query.execute?x=1`. */
  readonly path: string;
  /**
   * Every header line after `host`, each ending in CRLF, and the final CRLF: built once per
   * client request and shared by its attempts.
   */
  readonly headBlock: string;
  readonly body: Buffer | null;
}

/** Receives the outcome of one request. Called at most once, never synchronously from `send`. */
export interface H1Handler {
  /**
   * The complete response. `fields` and `body` may view a read buffer and are valid only during
   * this call: copy what must outlive it.
   */
  onResponse(status: number, fields: HeaderFields, body: Buffer): void;
  onError(error: H1Error | NodeJS.ErrnoException): void;
}

/**
 * A coarse clock for timeouts and idle expiry, advanced by the sweeps: stamping activity with it
 * saves a clock read per event. Checks add one sweep period, so a timeout never fires early.
 */
let coarseNow = performance.now();

/** Per-thread read buffer for every upstream socket (module state is per thread). */
const READ_BUFFER = Buffer.allocUnsafe(64 * 1024);

/** Per-thread buffer requests are laid out in before they are written (see `write`). */
const WRITE_SCRATCH_BYTES = 64 * 1024;
let writeScratch = new PrefixViews(Buffer.allocUnsafeSlow(WRITE_SCRATCH_BYTES));

function copyIfShared(view: Buffer): Buffer {
  return view.buffer === READ_BUFFER.buffer ? Buffer.from(view) : view;
}

/**
 * Offset of the first CRLF in buf[from, end): -1 when there is no line end yet, BARE_LF when a LF
 * without its CR ends the line. A JS loop: no native call per search.
 */
function findCRLF(buf: Uint8Array, from: number, end: number): number {
  for (let i = from; i < end; i++) if (buf[i] === 0x0a) return i > from && buf[i - 1] === 0x0d ? i - 1 : BARE_LF;
  return -1;
}

/**
 * findCRLF's answer when a LF without its CR ends the line: the answer fails at once (waiting for
 * a CRLF that never comes held it to the request timeout, and counted that toward ejection).
 */
const BARE_LF = -2;

/** parseHead results other than an offset. */
const HEAD_INCOMPLETE = -1;
const HEAD_DONE = -2;

/** 1 for a byte of a field name (tchar, RFC 9110 5.6.2). */
const TOKEN = new Uint8Array(256);
for (const c of "!#$%&'*+-.^_`|~") TOKEN[c.charCodeAt(0)] = 1;
for (let c = 0x30; c <= 0x39; c++) TOKEN[c] = 1;
for (let c = 0x41; c <= 0x5a; c++) TOKEN[c] = TOKEN[c + 0x20] = 1;

const EMPTY = Buffer.alloc(0);
const DEFAULT_KEEP_ALIVE_MS = 4_000;
const DEFAULT_PIPELINING_PAUSE_MS = 60_000;
/** Longest response head accepted. */
const MAX_HEAD_BYTES = 64 * 1024;

/** Whether the value bytes contain `token` as a comma-separated element (case-insensitive). */
function hasToken(buf: Buffer, start: number, end: number, token: string): boolean {
  const text = buf.toString('latin1', start, end).toLowerCase();
  for (const part of text.split(',')) if (part.trim() === token) return true;
  return false;
}

const enum Phase {
  Head,
  Length,
  ChunkSize,
  ChunkData,
  ChunkDataEnd,
  Trailers,
  UntilClose,
}

/** One request in flight or queued. */
class Pending {
  queuedAt = coarseNow;
  /** Set when written to a connection. */
  conn: H1Connection | null = null;
  done = false;
  /** Sent again once already, on a fresh connection (see `H1Connection.fail`). */
  resent = false;
  /** Coarse time of its first write: a resent request's timeouts still count from it. */
  writtenAt = 0;
  constructor(
    readonly request: H1Request,
    readonly handler: H1Handler,
    readonly expectBody: boolean,
    /** May be sent once more if its reused connection turns out closed: the caller's judgement. */
    readonly resendable: boolean,
  ) {}
}

/** RFC 9110 9.2.1's safe methods the h1 client resends by default (see `H1Pool.send`). */
export function isResendableMethod(method: string): boolean {
  return method === 'GET' || method === 'HEAD' || method === 'OPTIONS';
}

/** `error` as reported for `p`: once a request was resent, its first copy was sent, whatever the second did. */
function forPending(p: Pending, error: H1Error): H1Error {
  return p.resent && error.unsent ? new H1Error(error.code, error.message, false) : error;
}

/** Requests pipelined on a connection that is ending, taken off it (`H1Connection.takeFollowers`). */
interface TakenFollowers {
  /** To send again, in order (`H1Pool.forget`). */
  readonly again: Pending[] | null;
  /** To fail, with `error`. */
  readonly failed: Pending[] | null;
  readonly error: H1Error | NodeJS.ErrnoException;
}

function failFollowers(taken: TakenFollowers): void {
  const { failed, error } = taken;
  if (failed === null) return;
  for (const f of failed) f.handler.onError(error instanceof H1Error ? forPending(f, error) : error);
}

class H1Connection {
  readonly socket: Socket;
  /** The request whose answer is being read (or awaited). */
  pending: Pending | null = null;
  /**
   * Requests written behind `pending` on this connection (pipelined), in order, from
   * `followerAt`: their answers come after its answer. Resendable requests only (see `H1Pool.send`).
   */
  private followers: Pending[] | null = null;
  private followerAt = 0;
  idleSince = 0;
  /** Idle lifetime for this connection: ours, or less if the server said so. */
  keepAliveMs: number;
  closed = false;
  private phase = Phase.Head;
  private head: Buffer | null = null;
  private status = 0;
  /** The head's fields, reused for every response on this connection. */
  private readonly fields = new HeaderFields();
  private remaining = 0;
  /** The body read so far: its first part, and any further ones (most bodies come in one). */
  private firstPart: Buffer | null = null;
  private moreParts: Buffer[] | null = null;
  /**
   * A body of known length that did not come in one read: laid out once at its whole length and
   * filled as it comes (no part kept, no concatenation: one copy of each byte, half the memory).
   */
  private whole: Buffer | null = null;
  private bodyBytes = 0;
  private reusable = true;
  private closeDelimited = false;
  /** Coarse time of the write, then of the head's end and each body read: the timeout sweep reads it. */
  lastActivity = 0;
  private chunkLine: Buffer | null = null;
  /** Whether the server's keep-alive hint was read. */
  private hinted = false;
  /** Whether the TCP connection was ever established: before that, nothing was sent. */
  connected = false;
  /** Answers completed on this connection: a request written after one rides a reused connection. */
  private served = 0;
  /** A byte of the pending request's answer came (an interim 1xx, part of a head, ...). */
  private heard = false;
  readonly openedAt = coarseNow;

  constructor(
    readonly pool: H1Pool,
    port: number,
    host: string,
  ) {
    this.keepAliveMs = pool.keepAliveTimeoutMs;
    // Reads land in one buffer per thread (no allocation per read); whatever must outlive the
    // read callback is copied out of it (see `own`).
    this.socket = connect({
      port,
      host,
      noDelay: true,
      onread: { buffer: READ_BUFFER, callback: (n: number, buf: Uint8Array) => this.onRead(n, buf) },
    });
    this.socket.once('connect', () => (this.connected = true));
    this.socket.on('error', (err: NodeJS.ErrnoException) => this.fail(err, false));
    // A clean close (no error before it) is the end of a body framed by the connection's end.
    this.socket.on('close', () => this.fail(new H1Error(H1Codes.CLOSED, 'upstream closed the connection'), true));
  }

  /** Writes `p` on this connection, which has nothing in flight. */
  write(p: Pending): void {
    // The head is awaited for one request timeout from the request's first write: a copy sent
    // again (see `fail`) has what is left of it, not a timeout of its own.
    if (!p.resent) p.writtenAt = coarseNow;
    p.conn = this;
    this.begin(p);
    this.send(p);
  }

  /** Writes `p` behind the requests in flight here (pipelined): its answer comes after theirs. */
  follow(p: Pending): void {
    this.pool.counters?.pipelined();
    if (!p.resent) p.writtenAt = coarseNow;
    p.conn = this;
    (this.followers ??= []).push(p);
    this.send(p);
  }

  /** Requests written here and not yet answered. */
  get inFlight(): number {
    return (this.pending === null ? 0 : 1) + (this.followers === null ? 0 : this.followers.length - this.followerAt);
  }

  private hasFollowers(): boolean {
    return this.followers !== null && this.followerAt < this.followers.length;
  }

  /** `p`'s answer is the next to read: the parser starts afresh. */
  private begin(p: Pending): void {
    this.pending = p;
    this.phase = Phase.Head;
    this.head = null;
    this.chunkLine = null;
    this.status = 0;
    this.firstPart = null;
    this.moreParts = null;
    this.whole = null;
    this.bodyBytes = 0;
    this.reusable = true;
    this.closeDelimited = false;
    this.heard = false;
    // A request written behind others awaits its head one request timeout from its own write.
    this.lastActivity = p.writtenAt;
  }

  private send(p: Pending): void {
    const { request } = p;
    const headText = `${request.method} ${request.path} HTTP/1.1\r\nhost: ${this.pool.hostHeader}\r\n${request.headBlock}`;
    const body = request.body;
    const bodyLength = body === null ? 0 : body.length;
    const socket = this.socket;
    // A request with a body, a connected idle socket, and room in the per-thread write buffer
    // (the common case for writes): head and body are laid out there (one native encode, no
    // allocation) and leave in one syscall. If the kernel did not take all of it (the socket
    // keeps a view of what is left), the buffer is handed over to the socket and a fresh one
    // taken. (A head alone is cheaper written as a string.) Not while the socket is corked (a
    // pipelined turn's writes): the bytes would wait in it.
    if (body !== null && bodyLength > 0 && this.connected && socket.writableLength === 0 && socket.writableCorked === 0 && headText.length * 3 + bodyLength <= WRITE_SCRATCH_BYTES) {
      const out = writeScratch.buf;
      const headBytes = out.write(headText, 0, 'utf8');
      out.set(body, headBytes);
      socket.write(writeScratch.of(headBytes + bodyLength));
      if (socket.writableLength !== 0) writeScratch = new PrefixViews(Buffer.allocUnsafeSlow(WRITE_SCRATCH_BYTES));
      return;
    }
    // A UTF-8 length equal to the string's length means every character is ASCII: latin1 then
    // writes the same bytes, without V8's slower UTF-8 encoder.
    const headBytes = Buffer.byteLength(headText, 'utf8');
    const encoding = headBytes === headText.length ? 'latin1' : 'utf8';
    if (body === null || bodyLength === 0) {
      socket.write(headText, encoding);
      return;
    }
    // One buffer, one write: head and body leave in one syscall.
    const out = Buffer.allocUnsafe(headBytes + bodyLength);
    out.write(headText, 0, headBytes, encoding);
    body.copy(out, headBytes);
    socket.write(out);
  }

  destroy(error: H1Error): void {
    if (this.closed) return;
    this.fail(error, false);
    this.socket.destroy();
  }

  private fail(error: H1Error | NodeJS.ErrnoException, cleanClose: boolean): void {
    if (this.closed) return;
    this.closed = true;
    const p = this.pending;
    this.pending = null;
    const live = p !== null && !p.done ? p : null;
    const delimited = live !== null && cleanClose && this.closeDelimited && this.phase === Phase.UntilClose;
    // The node ended the connection (a close or a reset, not a timeout or our cancel) with
    // requests pipelined behind the one in hand, before a byte of its answer: it may not take
    // pipelines (see `H1Pool.pausePipelining`). Every one of them is unanswered, the one in hand
    // too, and is sent again, as RFC 9112 9.3.2 asks (safe reads, each once).
    const refused = this.connected && this.socket.writableCorked === 0 && this.hasFollowers() && !this.heard && (cleanClose || !(error instanceof H1Error));
    if (refused) this.pool.pausePipelining();
    const taken = this.takeFollowers(error);
    const behind = taken === null ? null : taken.again;
    if (live !== null && !delimited && (this.stale(live, error, cleanClose) || (refused && live.resendable && !live.resent))) {
      const p = live;
      // A kept-alive connection the node had closed (its idle timeout crossing our write), or a
      // pipeline it refused: a safe read is sent once more, on the connection this one's end
      // makes room for (not behind queued requests), and the node is not blamed.
      p.resent = true;
      p.conn = null;
      this.pool.forget(this, behind === null ? [p] : [p, ...behind]);
    } else {
      this.pool.forget(this, behind);
      if (live !== null) {
        const p = live;
        // A response framed by the connection's end is complete when the connection ends.
        if (delimited) this.complete(p);
        else {
          p.done = true;
          // Never connected: the request was buffered, never sent. Say so, whatever the cause
          // (unless this is its second copy). Connected: it may have been sent, whatever the
          // code says (EHOSTUNREACH after the connect is no proof of anything).
          const reported = error instanceof H1Error && (error.unsent || this.connected)
            ? error
            : new H1Error((error as { code?: string }).code ?? H1Codes.CLOSED, error.message, !this.connected);
          p.handler.onError(forPending(p, reported));
        }
      }
    }
    if (taken !== null) failFollowers(taken);
    this.socket.destroy();
  }

  /**
   * Takes the requests written behind the one in hand off this connection, which is ending
   * before their answers: each is sent again (RFC 9112 9.3.2: a client SHOULD retry unanswered
   * pipelined requests; followers are safe reads), on a fresh connection, unless it was sent
   * again once already, or the node could not be reached (a connection never made: they fail as
   * their leader does). Ones whose bytes never left (a connection not yet made, or a socket still
   * corked for its turn) and that are not failing with it (their leader was cancelled: ours, not
   * the node's) go back to the queue as they were, not as a resend. Returns those to send again
   * (for `H1Pool.forget`) and those to fail (with `failFollowers`, once the pool is in order);
   * null when there were none.
   */
  private takeFollowers(error: H1Error | NodeJS.ErrnoException): TakenFollowers | null {
    const list = this.followers;
    if (list === null || this.followerAt >= list.length) return null;
    let again: Pending[] | null = null;
    let failed: Pending[] | null = null;
    const neverLeft = !this.connected || this.socket.writableCorked > 0;
    const ours = error instanceof H1Error && error.code === H1Codes.CANCELLED;
    for (let i = this.followerAt; i < list.length; i++) {
      const f = list[i]!;
      if (f.done) continue;
      f.conn = null;
      if (neverLeft && (ours || this.connected)) (again ??= []).push(f);
      else if (this.connected && f.resendable && !f.resent) {
        f.resent = true;
        (again ??= []).push(f);
      } else {
        f.done = true;
        (failed ??= []).push(f);
      }
    }
    list.length = 0;
    this.followerAt = 0;
    // Never connected: they never left, whatever the cause.
    const reported = this.connected ? error : new H1Error((error as { code?: string }).code ?? H1Codes.CLOSED, error.message, true);
    return { again, failed, error: reported };
  }

  /**
   * Whether `p` failed as a request on a stale kept-alive connection: the connection had served
   * an answer before it was written, it ended (closed, reset, broken pipe) before any byte of
   * `p`'s answer came (an interim 1xx is one: the node had the request), and `p` may be resent
   * (its caller said so: by default a GET, HEAD or OPTIONS) and was not resent already. A
   * timeout, a cancellation or a bad answer is not that.
   */
  private stale(p: Pending, error: H1Error | NodeJS.ErrnoException, cleanClose: boolean): boolean {
    if (!p.resendable || p.resent || this.served === 0 || this.heard) return false;
    return cleanClose || !(error instanceof H1Error);
  }

  private onRead(n: number, buf: Uint8Array): boolean {
    // `buf` is READ_BUFFER (the onread option hands back the buffer it was given).
    this.onData(buf as Buffer, 0, n);
    // A response still incomplete that this read brought bytes of: what it holds of the read
    // buffer must be copied. (One whose request was pipelined and that nothing came for yet
    // holds nothing: `heard` is false.)
    if (this.pending !== null && this.heard) this.own();
    return true;
  }

  /** Copies every view into the shared read buffer that the pending response still holds. */
  private own(): void {
    if (this.fields.buf.buffer === READ_BUFFER.buffer) this.fields.own();
    if (this.phase === Phase.Length && this.whole === null) {
      // The rest of a body of known length comes in later reads: its whole length is laid out now.
      const whole = Buffer.allocUnsafe(this.bodyBytes + this.remaining);
      if (this.firstPart !== null) whole.set(this.firstPart, 0);
      this.whole = whole;
      this.firstPart = null;
    }
    if (this.firstPart !== null) this.firstPart = copyIfShared(this.firstPart);
    const more = this.moreParts;
    if (more !== null) for (let i = 0; i < more.length; i++) more[i] = copyIfShared(more[i]!);
    if (this.head !== null) this.head = copyIfShared(this.head);
    if (this.chunkLine !== null) this.chunkLine = copyIfShared(this.chunkLine);
  }

  /** Consumes `chunk[start, limit)`. Never reads outside it: the rest of a read buffer is stale. */
  private onData(chunk: Buffer, start: number, limit: number): void {
    let p = this.pending;
    if (p === null) {
      // Bytes nobody asked for: the connection is out of step. Drop it.
      this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'unsolicited bytes from upstream'));
      return;
    }
    this.heard = true;
    // The head must come whole within the timeout of the write (bytes of it trickled, or interim
    // answers one after another, do not hold the request longer); then each gap in the body.
    if (this.phase !== Phase.Head) this.lastActivity = coarseNow;
    let buf = chunk;
    let at = start;
    let end = limit;
    while (at < end) {
      if (this.pending !== p) {
        // `p` is answered; the bytes left answer the request pipelined behind it, if any.
        p = this.pending;
        if (p === null) return;
        this.heard = true;
      }
      switch (this.phase) {
        case Phase.Head: {
          if (this.head !== null) {
            buf = Buffer.concat([this.head, buf.subarray(at, end)]);
            at = 0;
            end = buf.length;
            this.head = null;
          }
          const next = this.parseHead(buf, at, end, p);
          if (next === HEAD_INCOMPLETE) {
            if (end - at > MAX_HEAD_BYTES) {
              this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'response head too large'));
              return;
            }
            this.head = buf.subarray(at, end);
            return;
          }
          if (next === HEAD_DONE) return;
          at = next;
          if (this.pending !== p) break;
          if (this.phase !== Phase.Head) this.lastActivity = coarseNow;
          break;
        }
        case Phase.Length: {
          const take = Math.min(this.remaining, end - at);
          this.addBody(buf.subarray(at, at + take));
          at += take;
          this.remaining -= take;
          if (this.remaining === 0) {
            // Bytes past the response mean the connection is out of step (answer, then close),
            // unless they answer a request pipelined behind it.
            if (at < end && !this.hasFollowers()) this.reusable = false;
            this.complete(p);
          }
          break;
        }
        case Phase.UntilClose: {
          this.addBody(buf.subarray(at, end));
          at = end;
          break;
        }
        case Phase.ChunkSize:
        case Phase.Trailers: {
          if (this.chunkLine !== null) {
            buf = Buffer.concat([this.chunkLine, buf.subarray(at, end)]);
            at = 0;
            end = buf.length;
            this.chunkLine = null;
          }
          const eol = findCRLF(buf, at, end);
          if (eol === BARE_LF) {
            this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'a bare LF ends a chunk line'));
            return;
          }
          if (eol < 0) {
            if (end - at > 4096) {
              this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'chunk line too long'));
              return;
            }
            this.chunkLine = buf.subarray(at, end);
            return;
          }
          const lineStart = at;
          at = eol + 2;
          if (this.phase === Phase.Trailers) {
            // Read and dropped, yet bounded as a head is: a node that sends trailer lines without
            // end would otherwise hold the attempt for as long as it keeps them coming.
            this.remaining -= at - lineStart;
            if (this.remaining < 0) {
              this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'trailer section too large'));
              return;
            }
            if (eol === lineStart) {
              if (at < end && !this.hasFollowers()) this.reusable = false;
              this.complete(p);
              break;
            }
            break; // a trailer field: read and dropped
          }
          let size = 0;
          let i = lineStart;
          for (; i < eol; i++) {
            const c = buf[i]!;
            const digit = c >= 48 && c <= 57 ? c - 48 : c >= 97 && c <= 102 ? c - 87 : c >= 65 && c <= 70 ? c - 55 : -1;
            if (digit < 0) break;
            size = size * 16 + digit;
            if (size > Number.MAX_SAFE_INTEGER / 16) break;
          }
          if (i === lineStart || (i < eol && buf[i] !== 0x3b /* ; */ && buf[i] !== 0x20 && buf[i] !== 0x09)) {
            this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'bad chunk size'));
            return;
          }
          if (size === 0) {
            this.phase = Phase.Trailers;
            this.remaining = MAX_HEAD_BYTES; // the trailer section's budget
          } else if (this.bodyBytes + size > this.pool.maxResponseBytes) {
            // Said before its bytes come (the last chunk could otherwise complete the answer).
            this.destroy(new H1Error(H1Codes.TOO_LARGE, `response larger than the limit of ${this.pool.maxResponseBytes} bytes`));
            return;
          } else {
            this.remaining = size;
            this.phase = Phase.ChunkData;
          }
          break;
        }
        case Phase.ChunkData: {
          const take = Math.min(this.remaining, end - at);
          this.addBody(buf.subarray(at, at + take));
          at += take;
          this.remaining -= take;
          if (this.remaining === 0) {
            this.phase = Phase.ChunkDataEnd;
            this.remaining = 2;
          }
          break;
        }
        case Phase.ChunkDataEnd: {
          // The CRLF after a chunk's data, possibly split across reads.
          while (this.remaining > 0 && at < end) {
            const expected = this.remaining === 2 ? 0x0d : 0x0a;
            if (buf[at] !== expected) {
              this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'chunk not followed by CRLF'));
              return;
            }
            at++;
            this.remaining--;
          }
          if (this.remaining === 0) this.phase = Phase.ChunkSize;
          break;
        }
      }
      if (this.closed) return;
    }
    if (this.bodyBytes > this.pool.maxResponseBytes) this.destroy(new H1Error(H1Codes.TOO_LARGE, `response larger than the limit of ${this.pool.maxResponseBytes} bytes`));
  }

  /**
   * Parses a response head starting at buf[start], in one pass over the bytes (no native search
   * calls). Returns the offset just past the head (the response complete if it has no body);
   * HEAD_INCOMPLETE when the head does not end before `end` (nothing is kept: it is parsed again
   * once more bytes came); HEAD_DONE when the connection is finished with.
   *
   * Strict where laxness would be unsafe to relay: a bare CR or LF, or a folded line, fails the
   * response rather than reaching the client as a line break.
   */
  private parseHead(buf: Buffer, start: number, end: number, p: Pending): number {
    const eol = findCRLF(buf, start, end);
    if (eol === BARE_LF) {
      this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'a bare LF ends the status line'));
      return HEAD_DONE;
    }
    if (eol < 0) return HEAD_INCOMPLETE;
    // Status line: HTTP/1.x SP 3DIGIT [SP reason]
    if (eol - start < 12 || buf[start] !== 0x48 || buf[start + 1] !== 0x54 || buf[start + 2] !== 0x54 || buf[start + 3] !== 0x50 || buf[start + 4] !== 0x2f || buf[start + 5] !== 0x31 || buf[start + 6] !== 0x2e || buf[start + 8] !== 0x20) {
      this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'bad status line'));
      return HEAD_DONE;
    }
    const minor = buf[start + 7]! - 48;
    const status = parseDecimal(buf, start + 9, start + 12);
    if (status < 100 || status > 999 || (minor !== 0 && minor !== 1) || (eol > start + 12 && buf[start + 12] !== 0x20)) {
      this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'bad status line'));
      return HEAD_DONE;
    }
    let contentLength = -1;
    /** Transfer codings seen, in order, across every transfer-encoding line. */
    let codings: string | null = null;
    let keepAlive = minor === 1;
    /**
     * A `close` in any connection line: the node closes after this answer, whatever another line
     * says (`connection: close` then `connection: keep-alive` kept the connection, and the next
     * request was written into one the node was closing: a bare write lost, 502 outcome unknown).
     */
    let closeSaid = false;
    /** Names a connection field listed besides close and keep-alive. */
    let hopNames: string[] | null = null;
    const fields = this.fields;
    fields.reset(buf);
    let line = eol + 2;
    let headEnd: number;
    for (;;) {
      if (line >= end) return HEAD_INCOMPLETE;
      const first = buf[line]!;
      if (first === 0x0a) {
        this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'a bare LF ends the head'));
        return HEAD_DONE;
      }
      if (line + 1 >= end) return HEAD_INCOMPLETE;
      if (first === 0x0d) {
        if (buf[line + 1] !== 0x0a) {
          this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'bad header line'));
          return HEAD_DONE;
        }
        headEnd = line + 2;
        break;
      }
      // The name: token characters up to the colon (RFC 9110 5.1). Anything else before it (a
      // space, as in `Transfer-Encoding : chunked`, a leading space of a folded line, a control
      // byte) makes the line bad: relayed, a lenient reader downstream could take it otherwise.
      let j = line;
      while (j < end && TOKEN[buf[j]!] === 1) j++;
      if (j >= end) return HEAD_INCOMPLETE;
      const colon = j;
      // The value runs to CR: tab, space, visible ASCII and bytes above 0x7f (RFC 9110 5.5). A
      // bare LF, a NUL, DEL or another control byte makes the line bad, rather than reaching
      // clients.
      for (j++; ; j++) {
        // Two compares a byte; a tab, the one control byte allowed, goes round again.
        while (j < end && buf[j]! > 0x1f && buf[j] !== 0x7f) j++;
        if (j >= end || buf[j] !== 0x09) break;
      }
      if (j + 1 >= end && (j >= end || buf[j] === 0x0d)) return HEAD_INCOMPLETE;
      if (colon === line || buf[colon] !== 0x3a || buf[j] !== 0x0d || buf[j + 1] !== 0x0a) {
        this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'bad header line'));
        return HEAD_DONE;
      }
      let vs = colon + 1;
      let ve = j;
      while (vs < ve && (buf[vs] === 0x20 || buf[vs] === 0x09)) vs++;
      while (ve > vs && (buf[ve - 1] === 0x20 || buf[ve - 1] === 0x09)) ve--;
      // Framing and hop-by-hop headers describe this connection, which the client consumed:
      // they are acted on here and not reported.
      let relay = true;
      switch (colon - line) {
        case 14:
          if (nameIs(buf, line, colon, 'content-length')) {
            // A HEAD response's length describes the body it did not send: the caller needs it.
            // Once: a repeated line of the same length (RFC 9110 8.6 lets a recipient take it
            // as one) relayed twice is refused by clients (llhttp: "Duplicate Content-Length").
            relay = !p.expectBody && contentLength < 0;
            let n = parseDecimal(buf, vs, ve);
            if (n < 0) {
              // `5, 5` is one length, relayed (for a HEAD) as `5`: clients refuse a list.
              const first = repeatedLengthEnd(buf, vs, ve);
              if (first >= 0) n = parseDecimal(buf, vs, (ve = first));
            }
            if (n < 0 || (contentLength >= 0 && contentLength !== n)) {
              this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'bad content-length'));
              return HEAD_DONE;
            }
            contentLength = n;
          }
          break;
        case 17:
          if (nameIs(buf, line, colon, 'transfer-encoding')) {
            relay = false;
            const value = buf.toString('latin1', vs, ve).toLowerCase();
            codings = codings === null ? value : `${codings},${value}`;
          }
          break;
        case 10:
          if (nameIs(buf, line, colon, 'connection')) {
            relay = false;
            if (nameIs(buf, vs, ve, 'keep-alive')) keepAlive = true;
            else {
              if (nameIs(buf, vs, ve, 'close') || hasToken(buf, vs, ve, 'close')) closeSaid = true;
              else if (hasToken(buf, vs, ve, 'keep-alive')) keepAlive = true;
              // Any other name it lists is a header of this hop only: not relayed.
              const named = connectionNamed(buf.toString('latin1', vs, ve));
              if (named !== null) (hopNames ??= []).push(...named);
            }
          } else if (nameIs(buf, line, colon, 'keep-alive')) {
            relay = false;
            // Servers repeat the hint on every response; it is read once per connection.
            if (!this.hinted) {
              this.hinted = true;
              const hint = /timeout\s*=\s*(\d+)/i.exec(buf.toString('latin1', vs, ve));
              if (hint) this.keepAliveMs = Math.min(this.pool.keepAliveTimeoutMs, Math.max(0, Number(hint[1]) * 1000 - 1000));
            }
          }
          break;
        case 7:
          relay = !(nameIs(buf, line, colon, 'trailer') || nameIs(buf, line, colon, 'upgrade'));
          break;
        case 2:
          relay = !nameIs(buf, line, colon, 'te');
          break;
        case 16:
          relay = !nameIs(buf, line, colon, 'proxy-connection');
          break;
      }
      if (relay) fields.push(line, colon, vs, ve);
      line = j + 2;
    }
    // A head that completes in a later read is held to the limit too (onData's check sees only
    // what has come so far, up to a read's 64 KiB). Here, before an answer without a body is
    // completed: after, the answer would be relayed and the request behind it failed instead.
    if (headEnd - start > MAX_HEAD_BYTES) {
      this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'response head too large'));
      return HEAD_DONE;
    }
    if (hopNames !== null) fields.dropNamed(hopNames);
    if (status < 200 && status !== 101) {
      // Interim response (100 Continue, 103 Early Hints): the real head follows.
      return headEnd;
    }
    if (status === 101) {
      this.destroy(new H1Error(H1Codes.BAD_RESPONSE, 'unexpected protocol switch'));
      return HEAD_DONE;
    }
    const more = headEnd < end;
    this.status = status;
    // RFC 9112 6.1 and 6.3: a transfer-encoding in an HTTP/1.0 answer, or beside a content-length,
    // is framing in doubt: the answer is read as chunked, and the connection not used again.
    this.reusable = keepAlive && !closeSaid && (codings === null || (minor === 1 && contentLength < 0));
    if (!p.expectBody || status === 204 || status === 304) {
      if (more && !this.hasFollowers()) this.reusable = false;
      this.complete(p);
      return headEnd;
    }
    if (codings !== null) {
      // RFC 9112 6.3: transfer-encoding overrides content-length. Only chunked alone is taken:
      // the answer is relayed decoded, with a length, and another coding (`gzip, chunked`, or
      // `gzip` to the end of the connection) would reach the client as if it were none.
      if (!isChunkedOnly(codings)) {
        this.destroy(new H1Error(H1Codes.BAD_RESPONSE, `a transfer-coding the front door does not decode: ${codings}`));
        return HEAD_DONE;
      }
      this.phase = Phase.ChunkSize;
    } else if (contentLength >= 0) {
      if (contentLength > this.pool.maxResponseBytes) {
        this.destroy(new H1Error(H1Codes.TOO_LARGE, `response larger than the limit of ${this.pool.maxResponseBytes} bytes`));
        return HEAD_DONE;
      }
      if (contentLength === 0) {
        if (more && !this.hasFollowers()) this.reusable = false;
        this.complete(p);
        return headEnd;
      }
      this.phase = Phase.Length;
      this.remaining = contentLength;
    } else {
      this.phase = Phase.UntilClose;
      this.closeDelimited = true;
      this.reusable = false;
    }
    return headEnd;
  }

  private addBody(part: Buffer): void {
    if (part.length === 0) return;
    if (this.whole !== null) {
      this.whole.set(part, this.bodyBytes);
      this.bodyBytes += part.length;
      return;
    }
    if (this.firstPart === null) this.firstPart = part;
    else (this.moreParts ??= []).push(part);
    this.bodyBytes += part.length;
  }

  private complete(p: Pending): void {
    const first = this.firstPart;
    const more = this.moreParts;
    const body = this.whole ?? (first === null ? EMPTY : more === null ? first : Buffer.concat([first, ...more], this.bodyBytes));
    const status = this.status;
    this.served++;
    this.pending = null;
    this.firstPart = null;
    this.moreParts = null;
    this.whole = null;
    // A pipelined request cancelled before its turn: its answer is read, and dropped.
    const wanted = !p.done;
    p.done = true;
    if (this.hasFollowers() && !this.closed && this.reusable) this.next();
    else if (!this.closed && this.reusable) this.pool.release(this);
    else if (!this.closed) {
      // The node closes after this answer: requests pipelined behind it go again elsewhere.
      this.closed = true;
      const taken = this.takeFollowers(new H1Error(H1Codes.CLOSED, 'upstream closed the connection'));
      this.pool.forget(this, taken === null ? null : taken.again);
      this.socket.destroy();
      if (taken !== null) failFollowers(taken);
    }
    // Release first (a queued request may take the connection now); writing a request leaves
    // `fields` alone, so they still describe this response.
    if (wanted) p.handler.onResponse(status, this.fields, body);
  }

  /**
   * The first request pipelined behind the one just answered is the next to read. If it and
   * every one behind it were cancelled (a cancel of a follower waits for its answer; a cancel is
   * the end of its grace), the connection is closed instead, as for a cancelled leader.
   */
  private next(): void {
    const list = this.followers!;
    const p = list[this.followerAt++]!;
    if (this.followerAt === list.length) {
      list.length = 0;
      this.followerAt = 0;
    }
    this.begin(p);
    if (!p.done) return;
    for (let i = this.followerAt; i < list.length; i++) if (!list[i]!.done) return;
    this.destroy(new H1Error(H1Codes.CANCELLED, 'cancelled'));
  }
}

/** Keep-alive connections to one node. */
export class H1Pool {
  readonly host: string;
  readonly port: number;
  readonly hostHeader: string;
  readonly keepAliveTimeoutMs: number;
  readonly maxResponseBytes: number;
  readonly maxConnections: number;
  readonly requestTimeoutMs: number;
  readonly connectTimeoutMs: number;
  /** Requests a connection may carry at once (1: no pipelining). */
  readonly pipelining: number;
  /** This loop turn's connection that resendable requests may follow on, corked until the turn ends. */
  turnConn: H1Connection | null = null;
  private readonly pipeliningPauseMs: number;
  /** @internal told of pipelined requests and refused pipelines. */
  readonly counters: PipelineCounters | null;
  /** Coarse time before which nothing is pipelined to the node (see `pausePipelining`). */
  private pipeliningPausedUntil = 0;
  private readonly idle: H1Connection[] = [];
  private readonly all = new Set<H1Connection>();
  private queue: Pending[] = [];
  private queueHead = 0;
  private closed = false;

  constructor(url: string, options: H1Options) {
    const parsed = new URL(url);
    if (parsed.protocol !== 'http:') throw new Error(`the h1 client speaks plain http only, not ${parsed.protocol}`);
    this.host = parsed.hostname.replace(/^\[|\]$/g, '');
    this.port = Number(parsed.port || 80);
    this.hostHeader = parsed.host;
    this.maxConnections = Math.max(1, options.connections);
    this.requestTimeoutMs = options.requestTimeoutMs;
    this.connectTimeoutMs = options.connectTimeoutMs ?? connectTimeoutFor(options.requestTimeoutMs);
    this.keepAliveTimeoutMs = options.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_MS;
    this.maxResponseBytes = options.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES;
    this.pipelining = Math.max(1, options.pipelining ?? 1);
    this.pipeliningPauseMs = options.pipeliningPauseMs ?? DEFAULT_PIPELINING_PAUSE_MS;
    this.counters = options.pipelineCounters ?? null;
  }

  /** Whether requests are not pipelined to the node for now (see `pausePipelining`). */
  get pipeliningPaused(): boolean {
    return coarseNow < this.pipeliningPausedUntil;
  }

  /**
   * @internal the node ended a connection with requests pipelined on it before a byte of the
   * first answer: as a server that does not take pipelines does (a uWebSockets.js server closes
   * the connection when a request comes behind an answer it has deferred). Those requests are sent
   * again (`takeFollowers`); for `pipeliningPauseMs` this thread sends the node one request a
   * connection at a time, then tries again. (A node that restarts under load pauses it too: a
   * minute of the plain way.)
   */
  pausePipelining(): void {
    this.counters?.refused();
    this.pipeliningPausedUntil = coarseNow + this.pipeliningPauseMs;
  }

  /** Connections open (idle or busy). */
  get size(): number {
    return this.all.size;
  }

  /**
   * Queues or writes the request; the outcome reaches `handler` later. Returns a cancel token.
   * `resendable`: whether it may be sent once more when its reused connection turns out closed
   * before a byte of its answer (default: a safe method; a caller that knows the request for a
   * write, whatever its method, says false).
   *
   * With `pipelining` over 1, resendable requests sent in one loop turn share connections: the
   * first takes one as any request does, and its socket is corked until the turn's end (the check
   * phase, past the poll that brought the requests); the next ones, up to `pipelining` in flight,
   * are written behind it, and all leave in one write. One write and, as often, one read for
   * several requests instead of one each (measured: a quarter of the CPU a GET at saturation).
   * Only resendable requests take part, leading or following: a write has a connection to itself,
   * as RFC 9112 9.3.2 asks (nothing pipelined behind a non-idempotent request), and is never sent
   * twice; a follower whose connection ends before its answer is sent again (see `takeFollowers`).
   * The cost is head-of-line blocking within a turn's requests to one node: one that waits on a
   * slow answer waits behind it (hedging still starts a copy elsewhere at its own trigger), and
   * times out with it if that answer takes longer than the request timeout (it runs from each
   * request's own write). A node that refuses pipelines is sent none for a while (`pausePipelining`).
   */
  send(request: H1Request, handler: H1Handler, expectBody = true, resendable = isResendableMethod(request.method)): H1Ticket {
    const p = new Pending(request, handler, expectBody, resendable);
    if (this.closed) {
      p.done = true;
      queueMicrotask(() => handler.onError(new H1Error(H1Codes.POOL_CLOSED, 'pool closed', true)));
      return p;
    }
    if (resendable && this.pipelining > 1 && !this.pipeliningPaused) {
      const open = this.turnConn;
      if (open !== null && !open.closed && open.inFlight < this.pipelining) {
        open.follow(p);
        return p;
      }
      const conn = this.takeIdle() ?? (this.all.size < this.maxConnections ? this.open() : null);
      if (conn === null) this.queue.push(p);
      else {
        corkForTurn(conn);
        this.turnConn = conn;
        conn.write(p);
      }
      return p;
    }
    const conn = this.takeIdle();
    if (conn !== null) conn.write(p);
    else if (this.all.size < this.maxConnections) this.open().write(p);
    else this.queue.push(p);
    return p;
  }

  /**
   * Stops an attempt. Queued: dropped, nothing sent. Written: its connection is closed (the only
   * way to abort a sent HTTP/1.1 request; requests pipelined behind it go again on a fresh one).
   * Pipelined behind another: its answer is read when it comes, and dropped (closing the
   * connection would cut off the requests ahead of it). Either way the handler hears nothing more.
   */
  cancel(ticket: H1Ticket): void {
    const p = ticket as Pending;
    if (p.done) return;
    p.done = true;
    if (p.conn !== null && p.conn.pending === p) p.conn.destroy(new H1Error(H1Codes.CANCELLED, 'cancelled'));
  }

  /**
   * Whether the ticket's request may have left for the node: written to a connection that is
   * connected. (A connection still connecting holds the bytes; Node writes them only after the
   * 'connect' listener that sets `connected` has run.)
   */
  isWritten(ticket: H1Ticket): boolean {
    const conn = (ticket as Pending).conn;
    return conn !== null && conn.connected;
  }

  /** @internal a connection finished its response and may be reused. */
  release(conn: H1Connection): void {
    if (this.closed) {
      conn.destroy(new H1Error(H1Codes.POOL_CLOSED, 'pool closed'));
      return;
    }
    conn.idleSince = coarseNow;
    // Not reused before the loop's next poll: reused now, by a queued request or one that comes
    // later in this turn, it could take a connection the node is closing. A FIN that came with
    // the answer is read only in the next poll (libuv stops reading a socket at a short read),
    // so a bare write sent into it would be lost, its outcome unknown (and a read failed over,
    // the node counted toward ejection). See `settleReleased`.
    releasedNow.push(conn);
    if (!settleScheduled) {
      settleScheduled = true;
      setImmediate(settleReleased);
    }
  }

  /** @internal after `release` and a poll: the next queued request on `conn` (or on a fresh connection), else idle. */
  resume(conn: H1Connection): void {
    if (conn.closed) return; // its close made room for the queue (`forget`)
    if (this.closed) {
      conn.destroy(new H1Error(H1Codes.POOL_CLOSED, 'pool closed'));
      return;
    }
    if (conn.socket.readableEnded || conn.socket.destroyed) {
      conn.destroy(new H1Error(H1Codes.CLOSED, 'upstream closed the connection'));
      return;
    }
    const next = this.dequeue();
    if (next !== null) conn.write(next);
    else {
      conn.idleSince = coarseNow;
      this.idle.push(conn);
    }
  }

  /**
   * @internal a connection is gone: its room goes to `resends` (requests taken off it to send
   * again, in order: see `H1Connection.fail` and `takeFollowers`), ahead of queued requests.
   */
  forget(conn: H1Connection, resends: Pending[] | null = null): void {
    if (this.turnConn === conn) this.turnConn = null;
    if (this.all.delete(conn)) {
      const i = this.idle.indexOf(conn);
      if (i >= 0) this.idle.splice(i, 1);
    } else if (resends === null) return;
    if (this.closed) {
      if (resends !== null) {
        for (const p of resends) {
          p.done = true;
          p.handler.onError(forPending(p, new H1Error(H1Codes.POOL_CLOSED, 'pool closed', true)));
        }
      }
      return;
    }
    if (resends !== null) {
      // Their queue time counts from their first write.
      for (const p of resends) p.queuedAt = p.writtenAt;
      this.queue.splice(this.queueHead, 0, ...resends);
    }
    // Room on fresh connections, first for them, then for queued requests. (The first resend
    // always finds room: the connection it failed on was counted until now.)
    while (this.all.size < this.maxConnections) {
      const next = this.dequeue();
      if (next === null) break;
      this.open().write(next);
    }
  }

  /** Expires queued requests, stalled responses and idle connections; `slackMs`: sweep period. */
  sweep(now: number, slackMs: number): void {
    const timeout = this.requestTimeoutMs + slackMs;
    for (let i = this.queueHead; i < this.queue.length; i++) {
      const p = this.queue[i]!;
      if (!p.done && now - p.queuedAt > timeout) {
        p.done = true;
        p.handler.onError(forPending(p, new H1Error(H1Codes.TIMEOUT, `no connection to the node within ${this.requestTimeoutMs} ms`, true)));
      }
    }
    for (const conn of [...this.all]) {
      if (!conn.connected) {
        if (now - conn.openedAt > this.connectTimeoutMs + slackMs) {
          conn.destroy(new H1Error(H1Codes.CONNECT_TIMEOUT, `could not connect to the node within ${this.connectTimeoutMs} ms`, true));
        }
      } else if (conn.pending !== null) {
        if (now - conn.lastActivity > timeout) conn.destroy(new H1Error(H1Codes.TIMEOUT, `no response from the node within ${this.requestTimeoutMs} ms`));
      } else if (now - conn.idleSince > conn.keepAliveMs) {
        conn.destroy(new H1Error(H1Codes.CLOSED, 'idle'));
      }
    }
  }

  /** Fails queued requests, closes idle connections, and (destroy) the busy ones too. */
  close(destroyBusy: boolean): void {
    this.closed = true;
    for (let p = this.dequeue(); p !== null; p = this.dequeue()) {
      p.done = true;
      p.handler.onError(forPending(p, new H1Error(H1Codes.POOL_CLOSED, 'pool closed', true)));
    }
    for (const conn of [...this.all]) {
      if (destroyBusy || conn.pending === null) conn.destroy(new H1Error(H1Codes.POOL_CLOSED, 'pool closed'));
    }
  }

  private open(): H1Connection {
    const conn = new H1Connection(this, this.port, this.host);
    this.all.add(conn);
    return conn;
  }

  private takeIdle(): H1Connection | null {
    while (this.idle.length > 0) {
      const conn = this.idle.pop()!;
      if (conn.closed) continue;
      // The node ended it while idle: its FIN was read ('end'), and the socket closes only once
      // our side's shutdown is done, a poll or more later. Written now, a request would meet
      // EPIPE with nothing sent (a bare write answered 502, outcome unknown). Closed instead,
      // as `resume` does; its room goes to the queue first.
      if (conn.socket.readableEnded || conn.socket.destroyed) {
        conn.destroy(new H1Error(H1Codes.CLOSED, 'upstream closed the connection'));
        continue;
      }
      return conn;
    }
    return null;
  }

  private dequeue(): Pending | null {
    while (this.queueHead < this.queue.length) {
      const p = this.queue[this.queueHead++]!;
      if (this.queueHead > 1024 && this.queueHead * 2 > this.queue.length) {
        this.queue = this.queue.slice(this.queueHead);
        this.queueHead = 0;
      }
      if (!p.done) return p;
    }
    if (this.queueHead > 0) {
      this.queue = [];
      this.queueHead = 0;
    }
    return null;
  }
}

/**
 * Connections released (answer complete, reusable) in this loop turn, and in the one before:
 * per thread (module state is), shared by every pool, so that one `setImmediate` a turn serves
 * them all.
 */
let releasedNow: H1Connection[] = [];
let releasedBefore: H1Connection[] = [];
let settleScheduled = false;

/**
 * In a loop turn's check phase (after its poll): the connections released in the turn before
 * have been through a poll since, so a FIN that came with their last answer has been read (and
 * closed them); the rest take a queued request or go idle. Those released in this turn wait for
 * the next poll. The cost is one immediate a turn while connections are released, and a pool
 * that holds a turn's worth of connections more.
 */
function settleReleased(): void {
  const ready = releasedBefore;
  for (let i = 0; i < ready.length; i++) {
    const conn = ready[i]!;
    conn.pool.resume(conn);
  }
  ready.length = 0;
  releasedBefore = releasedNow;
  releasedNow = ready;
  if (releasedBefore.length > 0) setImmediate(settleReleased);
  else settleScheduled = false;
}

/**
 * Connections corked in this loop turn (pipelining: see `H1Pool.send`), uncorked together in the
 * turn's check phase: per thread, one `setImmediate` a turn while requests are pipelined.
 */
let corkedNow: H1Connection[] = [];
let corkedSpare: H1Connection[] = [];
let uncorkScheduled = false;

function corkForTurn(conn: H1Connection): void {
  conn.socket.cork();
  corkedNow.push(conn);
  if (!uncorkScheduled) {
    uncorkScheduled = true;
    setImmediate(uncorkTurn);
  }
}

/** The turn's requests leave: each corked connection's in one write; none takes followers now. */
function uncorkTurn(): void {
  uncorkScheduled = false;
  const list = corkedNow;
  corkedNow = corkedSpare;
  corkedSpare = list;
  for (let i = 0; i < list.length; i++) {
    const conn = list[i]!;
    if (conn.pool.turnConn === conn) conn.pool.turnConn = null;
    conn.socket.uncork();
  }
  list.length = 0;
}

/** Opaque handle of one sent or queued request. */
export type H1Ticket = object;

/**
 * Owns pools and the one sweep timer that enforces their timeouts.
 *
 * The sweep runs after the reads of the loop turn its timer fires in (`setImmediate`: past the
 * poll phase), not in the timer itself: a thread that was stalled (a long pause, a blocking call)
 * wakes with its timers overdue and the answers that came meanwhile still in the sockets; judged
 * first, those would count as timeouts (and toward ejection). Read first, they are answers.
 */
export class H1Agent {
  private readonly pools: H1Pool[] = [];
  private readonly timer: NodeJS.Timeout;
  private closed = false;

  constructor(private readonly sweepEveryMs: number) {
    this.timer = setInterval(() => {
      // Activity the coming reads stamp is stamped with the time they are read at.
      coarseNow = performance.now();
      setImmediate(this.sweep);
    }, sweepEveryMs);
    this.timer.unref();
  }

  private readonly sweep = (): void => {
    if (this.closed) return;
    const now = performance.now();
    coarseNow = now;
    for (const pool of this.pools) pool.sweep(now, this.sweepEveryMs);
  };

  pool(url: string, options: H1Options): H1Pool {
    const pool = new H1Pool(url, options);
    this.pools.push(pool);
    return pool;
  }

  close(destroyBusy: boolean): void {
    this.closed = true;
    clearInterval(this.timer);
    for (const pool of this.pools) pool.close(destroyBusy);
  }
}

/** Sweep period for a request timeout: a quarter of it, between 10 and 250 ms. */
export function sweepPeriodMs(requestTimeoutMs: number): number {
  return Math.min(250, Math.max(10, Math.floor(requestTimeoutMs / 4)));
}

/**
 * The header block shared by every attempt of one request: `name: value` lines for `headers`
 * ([name, value, ...]), `content-length` when there is a body, and the blank line.
 */
export function headBlock(headers: readonly string[], bodyLength: number, method: string): string {
  let block = '';
  for (let i = 0; i + 1 < headers.length; i += 2) block += `${headers[i]}: ${headers[i + 1]}\r\n`;
  if (bodyLength > 0 || method === 'POST' || method === 'PUT' || method === 'PATCH') block += lengthLine(bodyLength);
  return `${block}\r\n`;
}

/** `content-length: n\r\n` lines for the smaller bodies, made once per length. */
const LENGTH_LINES: (string | undefined)[] = [];

function lengthLine(length: number): string {
  if (length > 4096) return `content-length: ${length}\r\n`;
  return (LENGTH_LINES[length] ??= `content-length: ${length}\r\n`);
}
