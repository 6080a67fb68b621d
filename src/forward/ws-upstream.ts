/**
 * The client side of a WebSocket tunnel: one connection to a node, RFC 6455 over `net.Socket`
 * (or `tls` for a `wss:` node), made for relaying rather than for applications.
 *
 * Why not the `ws` package (used before): a tunnel's messages passed through `ws`'s streams,
 * its receiver's buffer list, a Buffer per read and per message, and a copy of every message
 * from the client (uWS detaches it after its callback, `ws` may keep it). Here reads land in one
 * buffer per thread (`onread`), a message in one frame is handed on as a view of it, and a
 * message to the node is masked straight from uWS's buffer into a per-thread write buffer.
 *
 * What it does:
 * - Handshake: `GET` with `upgrade: websocket`, a fresh key, version 13, the caller's header
 *   lines; the 101 must carry `upgrade: websocket`, `connection: upgrade` and the matching
 *   `sec-websocket-accept`, no extension (none is offered) and a subprotocol only from the offer.
 *   Any other answer is read whole (content-length, chunked, or to the end of the connection) up
 *   to `maxRefusalBytes` and handed over (`onRefused`); 1xx answers before it are skipped.
 * - Frames from the node: text, binary, continuation, ping (answered with a pong), pong, close.
 *   A violation closes with 1002 (a masked frame, reserved bits, an unknown opcode, a fragmented
 *   or oversized control frame, a continuation out of place, a bad close frame), 1007 (text or a
 *   close reason that is not UTF-8) or 1009 (a message over `maxPayload`), as `ws` did.
 * - Frames to the node: masked with keys from a per-thread pool of random bytes (refilled from
 *   the CSPRNG), never fragmented.
 * - Close: the node's close frame is answered with its code and the connection ended; a close we
 *   start waits up to `closeWaitMs` (5 s) for the node's answer. `onClose` is called once: with the
 *   node's code (1005 for none), 1006 for a connection cut without one, or the violation's code.
 */
import { Buffer, isUtf8 } from 'node:buffer';
import { createHash, randomBytes, randomFillSync } from 'node:crypto';
import { connect, isIP, type Socket } from 'node:net';
import { performance } from 'node:perf_hooks';
import { createRequire } from 'node:module';
import { H1Codes, connectTimeoutFor } from './h1.js';
import { PrefixViews } from './prefix-views.js';

export interface WsUpstreamHandler {
  /**
   * The node accepted the handshake; `protocol` is its choice ('' for none), `headers` its 101's
   * header lines (names in lower case), handshake ones included.
   */
  onOpen(protocol: string, headers: readonly (readonly [string, string])[]): void;
  /** The node answered the handshake with `status` (not 101): its header lines and body (null: over `maxRefusalBytes`). */
  onRefused(status: number, headers: readonly (readonly [string, string])[], body: Buffer | null): void;
  /**
   * The handshake failed: no connection, a cut or timeout, a malformed or unacceptable answer.
   * `reason`: a socket error's code (`ECONNREFUSED` ...) when it came from one,
   * `LF_ERR_UPSTREAM_CONNECT_TIMEOUT` when the connection was not made in time, else a sentence.
   */
  onFailed(reason: string): void;
  /** A whole message. `data` may view a read buffer: valid only during the call. */
  onMessage(data: Buffer, isBinary: boolean): void;
  /**
   * Once open, each read's messages are delivered by calling `run` in here (a tunnel corks its
   * client around it: one write for every message of the read). Optional.
   */
  deliver?(run: () => void): void;
  /**
   * After `onOpen`, once: the node's close code and reason (1005: none; 1006: cut without a
   * close frame), or, when `violation` is true, the code this side closed with because the
   * node broke the protocol.
   */
  onClose(code: number, reason: Buffer, violation: boolean): void;
}

export interface WsUpstreamOptions {
  /** `ws:` or `wss:` origin of the node, e.g. `ws://127.0.0.1:7000`. */
  readonly origin: string;
  /** Request target as the client sent it (no resolution of dot segments). */
  readonly path: string;
  /** Further request headers (lower-case names); no framing or handshake headers among them. */
  readonly headers: Readonly<Record<string, string>>;
  /**
   * Bounds the whole handshake; the connection alone, min(this, 5000) (failing with
   * `LF_ERR_UPSTREAM_CONNECT_TIMEOUT`, as the h1 client's).
   */
  readonly handshakeTimeoutMs: number;
  /** Largest message accepted from the node (1009 past it). */
  readonly maxPayload: number;
  /** Largest refusal body handed over. */
  readonly maxRefusalBytes: number;
  /**
   * Statuses that fail the attempt as soon as the head is read (`onFailed`), its body unread:
   * the next node is tried at once rather than after a slow body. `headers`: the answer's
   * fields by lower-case name (repeats joined with ", ").
   */
  readonly passOver?: (status: number, headers: ReadonlyMap<string, string>) => boolean;
  /** How long a close this side started (or answered) waits for the node. Default 5000. */
  readonly closeWaitMs?: number;
}

/** `node:tls`, loaded at the first `wss:` node: a worker that never needs it does not carry it. */
let tls: typeof import('node:tls') | null = null;
const require = createRequire(import.meta.url);

const CONNECTING = 0;
const OPEN = 1;
const CLOSING = 2;
const CLOSED = 3;

/** A partial-frame buffer larger than this is let go once emptied (it grew for a large message). */
const KEPT_REST_BYTES = 64 * 1024;
const DEFAULT_CLOSE_WAIT_MS = 5_000;
const MAX_HEAD_BYTES = 16 * 1024;
/** A header line as RFC 9110 5.1 and 5.5 have it: tchar name, colon, tab/SP/VCHAR/obs-text value (latin1 text). */
const HEADER_LINE = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*$/;
const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const EMPTY = Buffer.alloc(0);

/**
 * Per-thread buffers (module state is per thread), made at a worker's first tunnel: reads for
 * every tunnel's socket; frames masked before they are written (see `frame`); masking keys,
 * random bytes drawn four at a time and refilled from the CSPRNG when used up.
 */
let readBuffer: Buffer | null = null;
const WRITE_SCRATCH_BYTES = 64 * 1024;
let writeScratch: PrefixViews | null = null;
const MASK_BYTES = 8 * 1024;
let masks: Buffer | null = null;
let maskAt = MASK_BYTES;

/**
 * Messages a client sends several in one loop turn (uWS hands over every frame of a read, one
 * call each) leave as one write at the turn's end, not one write (a syscall) each: the first in a
 * turn is written at once, those after it are masked into the tunnel's batch (`frame`), and the
 * batches are written once uWS's reads are done (`endTurn`, one setImmediate a thread per turn).
 */
let turn = 0;
let turnEnding = false;
let batched: WsUpstream[] = [];
let spareBatched: WsUpstream[] = [];
function endTurn(): void {
  turnEnding = false;
  turn++;
  const list = batched;
  batched = spareBatched;
  spareBatched = list;
  for (let i = 0; i < list.length; i++) list[i]!.flushBatch();
  list.length = 0;
}
function scheduleTurnEnd(): void {
  if (turnEnding) return;
  turnEnding = true;
  setImmediate(endTurn);
}

/** Whether buf[0, n) is exactly one whole frame (as a node sends it: unmasked, or masked). */
function oneFrame(buf: Buffer, n: number): boolean {
  if (n < 2) return false;
  const b1 = buf[1]!;
  const length7 = b1 & 0x7f;
  const head = (length7 === 126 ? 4 : length7 === 127 ? 10 : 2) + ((b1 & 0x80) !== 0 ? 4 : 0);
  if (n < head) return false;
  const length = length7 === 126 ? buf.readUInt16BE(2) : length7 === 127 ? buf.readUInt32BE(2) * 0x1_0000_0000 + buf.readUInt32BE(6) : length7;
  return head + length === n;
}

/** Masks `data` into `out` at `at` as one frame (FIN set) with a `header`-byte head. */
function maskFrame(out: Buffer, at: number, opcode: number, data: Uint8Array, header: number): void {
  const length = data.length;
  const keys = masks!;
  out[at] = 0x80 | opcode;
  if (length < 126) out[at + 1] = 0x80 | length;
  else if (length < 0x10000) {
    out[at + 1] = 0x80 | 126;
    out.writeUInt16BE(length, at + 2);
  } else {
    out[at + 1] = 0x80 | 127;
    out.writeUInt32BE(Math.floor(length / 0x1_0000_0000), at + 2);
    out.writeUInt32BE(length >>> 0, at + 6);
  }
  if (maskAt + 4 > MASK_BYTES) {
    randomFillSync(keys);
    maskAt = 0;
  }
  const m = at + header - 4;
  const m0 = (out[m] = keys[maskAt]!);
  const m1 = (out[m + 1] = keys[maskAt + 1]!);
  const m2 = (out[m + 2] = keys[maskAt + 2]!);
  const m3 = (out[m + 3] = keys[maskAt + 3]!);
  maskAt += 4;
  const p = at + header;
  let i = 0;
  for (; i + 3 < length; i += 4) {
    out[p + i] = data[i]! ^ m0;
    out[p + i + 1] = data[i + 1]! ^ m1;
    out[p + i + 2] = data[i + 2]! ^ m2;
    out[p + i + 3] = data[i + 3]! ^ m3;
  }
  for (; i < length; i++) out[p + i] = data[i]! ^ keys[maskAt - 4 + (i & 3)]!;
}

/** A close code a node may send (RFC 6455 7.4.1 and the IANA registry). */
function receivable(code: number): boolean {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999);
}

/** A comma-separated header value holds `token` (any case). */
function listHas(value: string | undefined, token: string): boolean {
  return value !== undefined && value.split(',').some((item) => item.trim().toLowerCase() === token);
}

const enum Refusal {
  None,
  Length,
  Chunked,
  UntilClose,
}

export class WsUpstream {
  /** CONNECTING, OPEN, CLOSING, CLOSED. */
  state = CONNECTING;
  isPaused = false;
  private readonly socket: Socket;
  /** A `wss:` node: TLS takes a write's bytes at once but says so later (see `frame`). */
  private readonly secure: boolean;
  private readonly key: string;
  private readonly offered: ReadonlySet<string>;
  private timer: NodeJS.Timeout | null;
  /** Bytes not yet parsed (a partial head or frame), copied out of the read buffer. */
  private rest: Buffer = EMPTY;
  private restLength = 0;
  /** A refusal being read: its status, headers, framing and body so far. */
  private refusal = Refusal.None;
  private refusalStatus = 0;
  private refusalHeaders: [string, string][] = [];
  private refusalRemaining = 0;
  private refusalBody: Buffer[] = [];
  private refusalBytes = 0;
  /** A fragmented message being put together: its opcode (1 text, 2 binary) and parts. */
  private fragmentOpcode = 0;
  private fragments: Buffer[] = [];
  private fragmentBytes = 0;
  /** This side sent its close frame. */
  private closeSent = false;
  /** The node's close frame came, or it broke the protocol: nothing more is read. */
  private done = false;
  /** Size of the frame (or head) the unparsed bytes begin, once known: room is made for it. */
  private wanted = 0;
  private reported = false;
  /** Reads from the node so far: whoever watches the tunnel's liveness compares it (see `ping`). */
  reads = 0;
  /** Frames masked this turn and not yet written (see `endTurn`): the bytes, and how many. */
  private batch: Buffer | null = null;
  private batchLength = 0;
  /** The loop turn in which a message was last written at once (see `endTurn`). */
  private wroteInTurn = -1;
  /** A read being handed over (see `received`): the handler may wrap its delivery (`deliver`). */
  private readBuf: Buffer = EMPTY;
  private readLength = 0;
  private readonly readNow = (): void => this.parseRead(this.readBuf, this.readLength);

  constructor(
    private readonly options: WsUpstreamOptions,
    private handler: WsUpstreamHandler,
  ) {
    const url = new URL(options.origin);
    const secure = (this.secure = url.protocol === 'wss:');
    const host = url.hostname.replace(/^\[|\]$/g, '');
    const port = Number(url.port || (secure ? 443 : 80));
    this.key = randomBytes(16).toString('base64');
    // The per-thread buffers, made at the thread's first tunnel (not at each frame).
    readBuffer ??= Buffer.allocUnsafe(64 * 1024);
    writeScratch ??= new PrefixViews(Buffer.allocUnsafeSlow(WRITE_SCRATCH_BYTES));
    masks ??= Buffer.allocUnsafeSlow(MASK_BYTES);
    const protocols = options.headers['sec-websocket-protocol'];
    this.offered = new Set(protocols === undefined ? [] : protocols.split(',').map((p) => p.trim()).filter((p) => p !== ''));
    if (secure) {
      // TLS: reads come as Buffers ('data'); the same parser takes them.
      tls ??= require('node:tls') as typeof import('node:tls');
      this.socket = tls.connect({ host, port, servername: isIP(host) === 0 ? host : undefined, ALPNProtocols: ['http/1.1'] });
      this.socket.on('data', (chunk: Buffer) => this.received(chunk, chunk.length));
      this.socket.once('secureConnect', () => this.sendHandshake(url.host));
    } else {
      this.socket = connect({
        host,
        port,
        noDelay: true,
        onread: {
          buffer: readBuffer,
          callback: (n: number, buf: Uint8Array) => {
            this.received(buf as Buffer, n);
            return true;
          },
        },
      });
      this.socket.once('connect', () => this.sendHandshake(url.host));
    }
    if (secure) this.socket.setNoDelay(true);
    // An error comes before the close: only a clean close completes a body framed by it.
    this.socket.on('error', (err: NodeJS.ErrnoException) => this.socketGone(err.code ?? err.message, false));
    this.socket.on('close', (hadError: boolean) => this.socketGone('the node closed the connection', !hadError));
    // Connecting gets the h1 client's bound (min(request timeout, 5 s)) and its code, so that a
    // node not reachable in time is reported unreachable as for a request; then the handshake
    // answer gets what is left of the handshake timeout.
    const startedAt = performance.now();
    const connectMs = connectTimeoutFor(options.handshakeTimeoutMs);
    let connected = false;
    this.timer = setTimeout(() => {
      this.timer = null;
      // Judged after the loop's next poll: a worker that was stalled past the timeout must read
      // a connection made meanwhile before calling the node unreachable (which holds it out of
      // every ranking), as the h1 client's sweep does.
      setImmediate(() => {
        // The h1 client's code: the node is then held unreachable, as for a request.
        if (!connected) this.fail(H1Codes.CONNECT_TIMEOUT);
      });
    }, connectMs);
    this.socket.once(secure ? 'secureConnect' : 'connect', () => {
      connected = true;
      if (this.state !== CONNECTING) return;
      this.clearTimer();
      this.timer = setTimeout(() => {
        this.timer = null;
        this.fail(`no handshake answer within ${options.handshakeTimeoutMs} ms`);
      }, Math.max(1, options.handshakeTimeoutMs - (performance.now() - startedAt)));
    });
  }

  /** Room held for a partial frame between reads (let go once a large one has passed). */
  get heldBytes(): number {
    return this.rest.length;
  }

  /** Bytes written, or batched to be written, but not yet taken by the kernel. */
  get bufferedAmount(): number {
    return this.socket.writableLength + this.batchLength;
  }

  /** Later events go to `handler` (a tunnel takes the socket over once open). */
  setHandler(handler: WsUpstreamHandler): void {
    this.handler = handler;
  }

  /** Sends one message; ignored unless open. `data` is read now (masked into a copy). */
  send(data: Uint8Array, isBinary: boolean): void {
    if (this.state !== OPEN) return;
    this.frame(isBinary ? 0x2 : 0x1, data);
  }

  pause(): void {
    if (this.isPaused) return;
    this.isPaused = true;
    this.socket.pause();
  }

  resume(): void {
    if (!this.isPaused) return;
    this.isPaused = false;
    this.socket.resume();
  }

  /** Starts the closing handshake (no code: a close frame without one). */
  close(code?: number, reason?: string | Buffer): void {
    if (this.state !== OPEN) {
      if (this.state === CONNECTING) this.terminate();
      return;
    }
    this.state = CLOSING;
    this.sendClose(code, reason);
    this.armCloseWait();
  }

  /** Sends a ping (no payload); ignored unless open. Any read after it (its pong) bumps `reads`. */
  ping(): void {
    if (this.state === OPEN && !this.closeSent) this.frame(0x9, EMPTY);
  }

  /**
   * The node stopped answering (no pong in time): the connection is cut and the handler told
   * `code` and `reason` as for a close, once.
   */
  abandon(code: number, reason: string): void {
    if (this.state === CLOSED) return;
    this.state = CLOSED;
    this.clearTimer();
    this.socket.destroy();
    this.report(code, Buffer.from(reason), false);
  }

  /** Cuts the connection at once; the handler hears nothing more. */
  terminate(): void {
    if (this.state === CLOSED) return;
    // Messages batched this turn (the client sent them before it went) are written ahead of the
    // cut, as they were when each was written at once.
    if (this.state === OPEN) this.flushBatch();
    this.state = CLOSED;
    this.clearTimer();
    this.socket.destroy();
  }

  private sendHandshake(hostHeader: string): void {
    if (this.state !== CONNECTING) return;
    let head = `GET ${this.options.path} HTTP/1.1\r\nhost: ${hostHeader}\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: ${this.key}\r\nsec-websocket-version: 13\r\n`;
    const headers = this.options.headers;
    for (const name in headers) head += `${name}: ${headers[name]}\r\n`;
    this.socket.write(`${head}\r\n`, 'utf8');
  }

  /**
   * One read: bytes[0, n) of `buf` (the per-thread buffer, or a TLS chunk). Once open, the
   * handler's `deliver` may wrap the messages it holds (a tunnel corks its client: one write for
   * all of them).
   */
  private received(buf: Buffer, n: number): void {
    if (this.state === CLOSED || this.done || n <= 0) return;
    this.reads++;
    const handler = this.handler;
    // A read of one whole frame (most are) needs no wrapping: its message is one write anyway.
    if (this.state !== OPEN || handler.deliver === undefined || (this.restLength === 0 && oneFrame(buf, n))) {
      this.parseRead(buf, n);
      return;
    }
    this.readBuf = buf;
    this.readLength = n;
    handler.deliver(this.readNow);
    this.readBuf = EMPTY;
  }

  private parseRead(buf: Buffer, n: number): void {
    if (this.restLength === 0) {
      const used = this.parse(buf, 0, n);
      if (used < n && this.state !== CLOSED && !this.done) this.keep(buf, used, n);
      return;
    }
    this.keep(buf, 0, n);
    const used = this.parse(this.rest, 0, this.restLength);
    if (this.state === CLOSED || this.done) {
      this.restLength = 0;
      return;
    }
    this.rest.copyWithin(0, used, this.restLength);
    this.restLength -= used;
    // A buffer grown for a large message is not kept for the tunnel's life.
    if (this.restLength === 0 && this.rest.length > KEPT_REST_BYTES) {
      this.rest = EMPTY;
      this.wanted = 0;
    }
  }

  /** Appends buf[from, to) to the unparsed bytes. */
  private keep(buf: Buffer, from: number, to: number): void {
    const size = to - from;
    if (this.restLength + size > this.rest.length) {
      const grown = Buffer.allocUnsafe(Math.max(this.restLength + size, this.wanted, 2 * this.rest.length, 4096));
      this.rest.copy(grown, 0, 0, this.restLength);
      this.rest = grown;
    }
    buf.copy(this.rest, this.restLength, from, to);
    this.restLength += size;
  }

  /** Parses what it can of buf[start, end); returns where it stopped. */
  private parse(buf: Buffer, start: number, end: number): number {
    let pos = start;
    while (pos < end && this.state !== CLOSED && !this.done) {
      if (this.state === CONNECTING) {
        const used = this.refusal === Refusal.None ? this.parseHead(buf, pos, end) : this.parseRefusalBody(buf, pos, end);
        if (used === pos) return pos;
        pos = used;
        continue;
      }
      const used = this.parseFrame(buf, pos, end);
      if (used === pos) return pos;
      pos = used;
    }
    return this.state === CLOSED || this.done ? end : pos;
  }

  /** A response head, if complete: a 101 opens the socket, anything else starts a refusal. */
  private parseHead(buf: Buffer, start: number, end: number): number {
    // Searched in a view: the read buffer holds older bytes past `end`.
    const found = buf.subarray(start, end).indexOf('\r\n\r\n', 0, 'latin1');
    const stop = found < 0 ? -1 : start + found;
    if (stop < 0 || stop - start > MAX_HEAD_BYTES) {
      if (end - start > MAX_HEAD_BYTES) this.fail('the handshake answer head is too large');
      return stop < 0 ? start : end;
    }
    const lines = buf.toString('latin1', start, stop).split('\r\n');
    const status = /^HTTP\/1\.[01] (\d{3})(?: |$)/.exec(lines[0]!);
    if (status === null) {
      this.fail('the handshake answer is not HTTP/1.1');
      return end;
    }
    const code = Number(status[1]);
    // 000-099 is no status (RFC 9110 15): relayed, the client got `HTTP/1.1 0 ` (as the h1 client).
    if (code < 100) {
      this.fail('the handshake answer has a status below 100');
      return end;
    }
    const headers: [string, string][] = [];
    const byName = new Map<string, string>();
    for (let i = 1; i < lines.length; i++) {
      const line = lines[i]!;
      // A token, its colon, and a value of no control byte but tab (a bare LF in it would reach
      // the client as a line of its own when a refusal is relayed): as the h1 client.
      if (!HEADER_LINE.test(line)) {
        this.fail('a malformed header line in the handshake answer');
        return end;
      }
      const colon = line.indexOf(':');
      const name = line.slice(0, colon).toLowerCase();
      const value = line.slice(colon + 1).trim();
      headers.push([name, value]);
      const seen = byName.get(name);
      byName.set(name, seen === undefined ? value : `${seen}, ${value}`);
    }
    const after = stop + 4;
    if (code === 101) {
      if (!listHas(byName.get('upgrade'), 'websocket') || !listHas(byName.get('connection'), 'upgrade')) {
        this.fail('the 101 answer does not upgrade to websocket');
        return end;
      }
      const accept = createHash('sha1').update(this.key + GUID).digest('base64');
      if (byName.get('sec-websocket-accept') !== accept) {
        this.fail('the 101 answer has the wrong sec-websocket-accept');
        return end;
      }
      if (byName.has('sec-websocket-extensions')) {
        this.fail('the node chose an extension that was not offered');
        return end;
      }
      const protocol = byName.get('sec-websocket-protocol') ?? '';
      if (protocol !== '' && !this.offered.has(protocol)) {
        this.fail(`the node chose the subprotocol "${protocol}", which was not offered`);
        return end;
      }
      this.clearTimer();
      this.state = OPEN;
      this.handler.onOpen(protocol, headers);
      return after;
    }
    // Interim answers (100, 102, 103) come before the final one.
    if (code >= 100 && code < 200) return after;
    if (this.options.passOver?.(code, byName) === true) {
      this.fail(`the node answered ${code}`);
      return end;
    }
    this.refusalStatus = code;
    this.refusalHeaders = headers;
    const length = byName.get('content-length');
    if (code === 204 || code === 304) this.refusal = Refusal.Length;
    else if (listHas(byName.get('transfer-encoding'), 'chunked')) this.refusal = Refusal.Chunked;
    else if (length !== undefined) {
      if (!/^\d{1,15}$/.test(length)) {
        this.fail('the handshake answer has a malformed content-length');
        return end;
      }
      this.refusal = Refusal.Length;
      this.refusalRemaining = Number(length);
    } else this.refusal = Refusal.UntilClose;
    if (this.refusal === Refusal.Length && this.refusalRemaining === 0) this.refused();
    return after;
  }

  /** A refusal's body: kept up to the limit, counted past it. */
  private parseRefusalBody(buf: Buffer, start: number, end: number): number {
    if (this.refusal === Refusal.Length) {
      const take = Math.min(this.refusalRemaining, end - start);
      this.bodyPart(buf, start, start + take);
      this.refusalRemaining -= take;
      if (this.refusalRemaining === 0) this.refused();
      return start + take;
    }
    if (this.refusal === Refusal.UntilClose) {
      this.bodyPart(buf, start, end);
      return end;
    }
    // Chunked: a size line, the chunk and its CRLF; trailers after the last one are skipped.
    let pos = start;
    while (pos < end) {
      if (this.refusalRemaining > 0) {
        const take = Math.min(this.refusalRemaining, end - pos);
        this.bodyPart(buf, pos, pos + take);
        this.refusalRemaining -= take;
        pos += take;
        if (this.refusalRemaining > 0) return pos;
        // Each chunk ends in CRLF, read as an empty line below.
        this.refusalRemaining = -1;
        continue;
      }
      const found = buf.subarray(pos, end).indexOf('\r\n', 0, 'latin1');
      const eol = found < 0 ? -1 : pos + found;
      if (eol < 0) {
        if (end - pos > 1024) this.fail('a malformed chunk in the handshake answer');
        return pos;
      }
      const line = buf.toString('latin1', pos, eol);
      pos = eol + 2;
      if (this.refusalRemaining === -1) {
        // The CRLF after a chunk.
        if (line !== '') {
          this.fail('a malformed chunk in the handshake answer');
          return end;
        }
        this.refusalRemaining = 0;
        continue;
      }
      if (this.refusalRemaining === -2) {
        // Trailers, up to the empty line.
        if (line === '') {
          this.refused();
          return pos;
        }
        continue;
      }
      const size = /^([0-9a-fA-F]{1,8})(?:;.*)?$/.exec(line);
      if (size === null) {
        this.fail('a malformed chunk in the handshake answer');
        return end;
      }
      this.refusalRemaining = Number.parseInt(size[1]!, 16);
      if (this.refusalRemaining === 0) this.refusalRemaining = -2;
    }
    return pos;
  }

  private bodyPart(buf: Buffer, from: number, to: number): void {
    this.refusalBytes += to - from;
    if (this.refusalBytes <= this.options.maxRefusalBytes && to > from) this.refusalBody.push(Buffer.from(buf.subarray(from, to)));
  }

  /** The refusal is read: handed over, and the connection cut. */
  private refused(): void {
    if (this.state !== CONNECTING) return;
    this.state = CLOSED;
    this.clearTimer();
    this.socket.destroy();
    const body = this.refusalBytes > this.options.maxRefusalBytes ? null : Buffer.concat(this.refusalBody);
    this.handler.onRefused(this.refusalStatus, this.refusalHeaders, body);
  }

  /** One frame, if complete; returns where it stopped. */
  private parseFrame(buf: Buffer, start: number, end: number): number {
    if (end - start < 2) return start;
    const b0 = buf[start]!;
    const b1 = buf[start + 1]!;
    const fin = (b0 & 0x80) !== 0;
    const opcode = b0 & 0x0f;
    let length = b1 & 0x7f;
    let header = 2;
    if (length === 126) {
      if (end - start < 4) return start;
      length = buf.readUInt16BE(start + 2);
      header = 4;
    } else if (length === 127) {
      if (end - start < 10) return start;
      const high = buf.readUInt32BE(start + 2);
      // Past 2^53 bytes the length cannot be a message this side would take.
      if (high > 0x1fffff) return this.violate(1009, end);
      length = high * 0x1_0000_0000 + buf.readUInt32BE(start + 6);
      header = 10;
    }
    if ((b0 & 0x70) !== 0 || (b1 & 0x80) !== 0) return this.violate(1002, end);
    if (opcode >= 0x8) {
      if (!fin || length > 125 || (opcode !== 0x8 && opcode !== 0x9 && opcode !== 0xa)) return this.violate(1002, end);
    } else if (opcode === 0x0) {
      if (this.fragmentOpcode === 0) return this.violate(1002, end);
    } else if (opcode === 0x1 || opcode === 0x2) {
      if (this.fragmentOpcode !== 0) return this.violate(1002, end);
    } else return this.violate(1002, end);
    if (opcode < 0x8 && this.fragmentBytes + length > this.options.maxPayload) return this.violate(1009, end);
    const stop = start + header + length;
    if (stop > end) {
      // Room is made for the whole frame when its bytes are kept (see `keep`).
      this.wanted = header + length;
      return start;
    }
    const payload = buf.subarray(start + header, stop);
    if (opcode === 0x1 || opcode === 0x2) {
      if (fin) {
        if (opcode === 0x1 && !isUtf8(payload)) return this.violate(1007, end);
        this.handler.onMessage(payload, opcode === 0x2);
      } else {
        this.fragmentOpcode = opcode;
        this.fragments.push(Buffer.from(payload));
        this.fragmentBytes = length;
      }
    } else if (opcode === 0x0) {
      this.fragments.push(Buffer.from(payload));
      this.fragmentBytes += length;
      if (fin) {
        const message = Buffer.concat(this.fragments, this.fragmentBytes);
        const isBinary = this.fragmentOpcode === 0x2;
        this.fragmentOpcode = 0;
        this.fragments = [];
        this.fragmentBytes = 0;
        if (!isBinary && !isUtf8(message)) return this.violate(1007, end);
        this.handler.onMessage(message, isBinary);
      }
    } else if (opcode === 0x9) {
      if (this.state === OPEN) this.frame(0xa, payload);
    } else if (opcode === 0x8) {
      return this.closeReceived(payload, stop, end);
    }
    return stop;
  }

  /** The node's close frame: answered (unless this side already sent one), reported, ended. */
  private closeReceived(payload: Buffer, stop: number, end: number): number {
    let code = 1005;
    let reason = EMPTY;
    if (payload.length === 1) return this.violate(1002, end);
    if (payload.length >= 2) {
      code = payload.readUInt16BE(0);
      if (!receivable(code)) return this.violate(1002, end);
      reason = Buffer.from(payload.subarray(2));
      if (!isUtf8(reason)) return this.violate(1007, end);
    }
    if (!this.closeSent) this.sendClose(code === 1005 ? undefined : code, undefined);
    this.stopReading(code, reason, false);
    // Nothing after a close frame is read.
    return Math.max(stop, end);
  }

  /** The node broke the protocol: close with `code`, tell the handler, read nothing more. */
  private violate(code: number, end: number): number {
    if (!this.closeSent && this.state === OPEN) this.sendClose(code, undefined);
    this.stopReading(code, EMPTY, true);
    return end;
  }

  /** No frame after this one is read: this side's end is sent, and the close reported. */
  private stopReading(code: number, reason: Buffer, violation: boolean): void {
    this.state = CLOSING;
    this.done = true;
    // Read on (paused, the client being behind): the node's FIN ends the socket, not the timer.
    this.resume();
    this.socket.end();
    this.armCloseWait();
    this.report(code, reason, violation);
  }

  private sendClose(code: number | undefined, reason: string | Buffer | undefined): void {
    this.closeSent = true;
    if (code === undefined) {
      this.frame(0x8, EMPTY);
      return;
    }
    const text = reason === undefined ? EMPTY : typeof reason === 'string' ? Buffer.from(reason) : reason;
    // A control frame carries at most 125 bytes: the code and up to 123 of the reason.
    const payload = Buffer.allocUnsafe(2 + Math.min(text.length, 123));
    payload.writeUInt16BE(code, 0);
    text.copy(payload, 2, 0, payload.length - 2);
    this.frame(0x8, payload);
  }

  /**
   * Writes one masked frame (FIN set). A message after another in the same loop turn, or while
   * the socket still holds bytes, goes into the batch written at the turn's end (`endTurn`); a
   * control frame (close, ping, pong) first writes the batch, so the order holds.
   */
  private frame(opcode: number, data: Uint8Array): void {
    const length = data.length;
    const header = length < 126 ? 6 : length < 0x10000 ? 8 : 14;
    const total = header + length;
    const socket = this.socket;
    if (opcode < 0x8) {
      if (this.batchLength > 0 || this.wroteInTurn === turn || socket.writableLength !== 0) {
        this.toBatch(opcode, data, header, total);
        return;
      }
      this.wroteInTurn = turn;
      scheduleTurnEnd();
    } else this.flushBatch();
    // The per-thread buffer when the socket holds nothing (it keeps a view of what the kernel did
    // not take: the buffer is then handed over and a fresh one made), else a buffer of its own.
    // Not for TLS: it reports every write done only later, so the buffer would never be reused.
    const scratch = !this.secure && total <= WRITE_SCRATCH_BYTES && socket.writableLength === 0;
    const out = scratch ? writeScratch!.buf : Buffer.allocUnsafe(total);
    maskFrame(out, 0, opcode, data, header);
    if (scratch) {
      socket.write(writeScratch!.of(total));
      if (socket.writableLength !== 0) writeScratch = new PrefixViews(Buffer.allocUnsafeSlow(WRITE_SCRATCH_BYTES));
    } else socket.write(out);
  }

  /** Masks a message's frame into the batch, made or grown to hold it. */
  private toBatch(opcode: number, data: Uint8Array, header: number, total: number): void {
    const at = this.batchLength;
    let batch = this.batch;
    if (batch === null || at + total > batch.length) {
      const grown = Buffer.allocUnsafe(Math.max(at + total, 2 * at, 4096));
      if (batch !== null) batch.copy(grown, 0, 0, at);
      this.batch = batch = grown;
    }
    maskFrame(batch, at, opcode, data, header);
    if (at === 0) {
      batched.push(this);
      scheduleTurnEnd();
    }
    this.batchLength = at + total;
  }

  /** @internal Writes the batch (one write), if any; the socket keeps the buffer. */
  flushBatch(): void {
    const length = this.batchLength;
    if (length === 0) return;
    const batch = this.batch!;
    this.batch = null;
    this.batchLength = 0;
    if (this.state === CLOSED) return;
    this.socket.write(length === batch.length ? batch : batch.subarray(0, length));
  }

  private armCloseWait(): void {
    this.clearTimer();
    this.timer = setTimeout(() => {
      this.timer = null;
      this.socket.destroy();
    }, this.options.closeWaitMs ?? DEFAULT_CLOSE_WAIT_MS);
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private fail(reason: string): void {
    if (this.state !== CONNECTING) return;
    this.state = CLOSED;
    this.clearTimer();
    this.socket.destroy();
    this.handler.onFailed(reason);
  }

  /** The connection errored, or closed (`clean`: without an error). */
  private socketGone(reason: string, clean: boolean): void {
    if (this.state === CONNECTING) {
      // A refusal framed by the connection's end is complete at a clean close, not at a reset.
      if (this.refusal === Refusal.UntilClose && clean) this.refused();
      else this.fail(reason);
      return;
    }
    if (this.state === CLOSED) return;
    this.state = CLOSED;
    this.clearTimer();
    this.socket.destroy();
    this.report(1006, EMPTY, false);
  }

  private report(code: number, reason: Buffer, violation: boolean): void {
    if (this.reported) return;
    this.reported = true;
    this.handler.onClose(code, reason, violation);
  }
}
