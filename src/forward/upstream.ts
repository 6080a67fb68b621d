/**
 * Upstream transports: how one attempt reaches one node. Two implementations behind one
 * interface:
 *
 * - `h1` (default): the small HTTP/1.1 client in ./h1.ts.
 * - `undici`: undici's low-level `dispatch()` handler API, kept as the reference transport.
 *   undici 7 runs the legacy handler shape (onConnect/onHeaders/onData/onComplete/onError)
 *   natively; the newer controller shape is wrapped in an adapter that parses headers into an
 *   object per response, so the legacy shape is used.
 *
 * Cancelling (a hedge loser, or a request whose client went away) is deferred in both: HTTP/1.1
 * cannot cancel a request already sent except by closing its connection, and a closed connection
 * costs a reconnect (measured here: GET 1 KiB under saturation went from 34 to 66 us of CPU a
 * request when every hedge loser closed its socket). So a cancelled attempt's answer is
 * discarded, and its connection is closed only if it has not finished within `cancelGraceMs` (one
 * pipelined behind another is never cut off: its answer is read and dropped, see `H1Pool.cancel`).
 * An attempt not yet written to a socket is dropped at once.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import type { Dispatcher, Pool } from 'undici';
import { isGatewayFailure, type AttemptHandle } from './exchange.js';
import { HeaderFields, isChunkedOnly } from './fields.js';
import { H1Codes, H1Error, connectTimeoutFor, headBlock, isResendableMethod, type H1Agent, type H1Handler, type H1Pool, type H1Request, type H1Ticket, type PipelineCounters } from './h1.js';
import { OP_READ } from '../server/protocol.js';

export type UpstreamClientKind = 'h1' | 'undici';

/**
 * undici, loaded by {@link loadUndici} where a front door's settings ask for it: the default h1
 * transport never needs it, and a worker thread that imports it holds about 5 MiB more live heap
 * (its code and what its start-up builds); at two threads the process held about 8 MiB more
 * resident with 10,000 idle connections, and a reload's workers started later
 * (bench/RESULTS.md, "Twenty-eighth session").
 */
let undici: typeof import('undici') | null = null;

/** Loads undici for `createTransport('undici', ...)`; once a thread. */
export async function loadUndici(): Promise<void> {
  undici ??= await import('undici');
}

/** One client request as every attempt sends it; encodings are built once, on first use. */
export class UpstreamRequest implements H1Request {
  private block: string | null = null;
  private dispatch: Dispatcher.DispatchOptions | null = null;
  /** See `undiciRefusal` (undefined: not looked at yet). */
  private refusal: string | null | undefined = undefined;

  constructor(
    readonly method: string,
    readonly path: string,
    /** End-to-end request headers, [name, value, ...], hop-by-hop ones already removed. */
    readonly headers: string[],
    public body: Buffer | null,
  ) {}

  get headBlock(): string {
    return (this.block ??= headBlock(this.headers, this.body?.length ?? 0, this.method));
  }

  /**
   * Why undici's request constructor would refuse this request, or null. Refused there, it fails
   * at dispatch and the pool's connection slot it took is never given back (see
   * {@link asUtf8Bytes}); so such a request is failed here, unsent, and never handed to undici.
   * What uWS passes and undici refuses, once beyond ASCII is UTF-8 bytes: a DEL (0x7F) in a
   * header value (uWS refuses every other control byte; undici, RFC 9110's field-vchar, DEL).
   */
  get undiciRefusal(): string | null {
    if (this.refusal === undefined) {
      this.refusal = null;
      const h = this.headers;
      for (let i = 1; i < h.length; i += 2) {
        if (h[i]!.indexOf('\x7f') >= 0) {
          this.refusal = `undici does not send a DEL (0x7F) in a header value (${h[i - 1]})`;
          break;
        }
      }
    }
    return this.refusal;
  }

  get dispatchOptions(): Dispatcher.DispatchOptions {
    return (this.dispatch ??= {
      path: asUtf8Bytes(this.path),
      method: this.method as Dispatcher.HttpMethod,
      headers: headersAsUtf8Bytes(this.headers),
      body: this.body,
      // Only safe methods may be retried inside undici's pipeline; failover is the exchange's.
      idempotent: this.method === 'GET' || this.method === 'HEAD' || this.method === 'OPTIONS',
    });
  }
}

/**
 * `text` as undici is to write it: undici writes a head as latin1, one byte a character, and
 * refuses a path or a header value with a character above U+00FF (a euro sign, or the U+FFFD uWS
 * makes of a byte that is not UTF-8). A refused request fails at dispatch, and the pool's
 * connection slot it took is never given back (undici marks that client as waiting for a drain
 * that never comes): after `--upstream-connections` such requests every request to the node
 * waited out the request timeout and failed, never sent. So a string beyond ASCII is handed over
 * as its UTF-8 bytes, one character each: the node gets the bytes the h1 client sends.
 */
function asUtf8Bytes(text: string): string {
  return beyondAscii(text) ? Buffer.from(text, 'utf8').toString('latin1') : text;
}

function beyondAscii(text: string): boolean {
  for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) > 0x7f) return true;
  return false;
}

/** [name, value, ...] with every value as {@link asUtf8Bytes} makes it (the same array when all are ASCII). */
function headersAsUtf8Bytes(headers: string[]): string[] {
  for (let i = 1; i < headers.length; i += 2) if (beyondAscii(headers[i]!)) return headers.map(asUtf8Bytes);
  return headers;
}

/**
 * Whoever an attempt reports to: the exchange (one answer from one of its candidates), or a
 * replicated route's fan-out and hint handoff (replication/fanout.ts, replication/hints.ts).
 */
export interface AttemptSink {
  /** performance.now() as the attempt was launched: read as the attempt is made. */
  readonly launchedAt: number;
  /** Operation class (OP_READ / OP_WRITE), for the observer. */
  readonly op: number;
  /** An exchange's: the ordinal of the attempt whose answer won, or -1 (none, yet or ever). */
  readonly winner?: number;
  /** A complete response; `headers` and `body` may view a shared read buffer: copy to keep. */
  answered(ordinal: number, status: number, headers: unknown, body: Buffer, latencyMs: number): void;
  failed(ordinal: number, error: unknown): void;
}

/** Told how each attempt ended, for counters, latency windows and passive health. */
export interface AttemptObserver {
  /** `latencyMs` is -1 for an attempt we cancelled; `op` is the exchange's operation class. */
  attemptEnded(node: number, ok: boolean, latencyMs: number, error: unknown, op: number): void;
}

/** One node's connections. */
export interface NodeTransport {
  /** How long a cancelled attempt (its client gone, or a hedge loser) may still finish before its connection is closed. */
  readonly cancelGraceMs: number;
  /**
   * The same for a hedge loser: the grace, or the request timeout while the node is warming
   * (back in the rankings a short while: see ClusterRuntime.update). Set at each membership change.
   */
  loserGraceMs: number;
  attempt(exchange: AttemptSink, ordinal: number, node: number, request: UpstreamRequest): AttemptHandle;
  close(graceful: boolean): Promise<void>;
}

export interface TransportOptions {
  readonly connections: number;
  readonly requestTimeoutMs: number;
  readonly cancelGraceMs: number;
  /** The largest answer taken (default: the h1 client's 64 MiB, undici's none). */
  readonly maxResponseBytes?: number;
  /** The h1 client's pipelining (see `H1Pool.send`); undici keeps one request a connection. Default 1. */
  readonly pipelining?: number;
  /** Told of the h1 client's pipelined requests and refused pipelines. */
  readonly pipelineCounters?: PipelineCounters;
}

/**
 * What a cancelled attempt ends with. One that was on the wire and did not finish within its
 * grace is cut off, and its elapsed time is reported as a latency sample all the same: a lower
 * bound of the node's latency (it had not answered by then). Without it a node that turned slow
 * for good was never sampled while hedges kept winning (every loser cut off unsampled), so its
 * window kept its old fast latencies and every request hedged (with an unbounded budget: 200 of
 * 200). Unsent attempts (dropped from the queue) say nothing of the node: no sample.
 */
const CANCELLED = new H1Error(H1Codes.CANCELLED, 'attempt cancelled');

/**
 * How a hedge loser (another attempt of its exchange won) cut off unanswered after its grace is
 * reported: a latency sample as CANCELLED's, and a failure toward ejection (cluster-runtime.ts), as
 * Envoy reports a hedge's per-try timeout. An attempt cut off because its client left, or at a
 * shutdown, is CANCELLED: the client's doing says nothing of the node.
 */
export const CUT_OFF = new H1Error('LF_ERR_ATTEMPT_CUT_OFF', 'a hedge loser cut off unanswered');

/** Whether another attempt of the exchange won: a cancelled one is then a hedge loser. */
function lostRace(exchange: AttemptSink): boolean {
  return exchange.winner !== undefined && exchange.winner >= 0;
}

/** CUT_OFF for a written hedge loser, else CANCELLED. */
function cancelledAs(exchange: AttemptSink): H1Error {
  return lostRace(exchange) ? CUT_OFF : CANCELLED;
}

/** How long a cancelled attempt may finish: a hedge loser's grace, or (its client gone) the plain one. */
function graceOf(transport: NodeTransport, exchange: AttemptSink): number {
  return lostRace(exchange) ? transport.loserGraceMs : transport.cancelGraceMs;
}

/**
 * What both attempt kinds share: an attempt ends once, and a cancelled one is given
 * `cancelGraceMs` to finish before `kill()` closes its connection. Fields and two functions, not
 * a base class: V8 (Node 20) does not inline a derived class's `super()` into the code that makes
 * the attempt, and made every attempt through its generic construct path (`bench/ir.sh`).
 */
interface CancellableAttempt extends AttemptHandle {
  /** @internal it has ended (answered, failed or killed): nothing more is reported. */
  ended: boolean;
  /** @internal cancelled: whatever comes is not the exchange's any more. */
  cancelled: boolean;
  /** @internal the grace a cancelled attempt is given to finish. */
  graceTimer: NodeJS.Timeout | null;
  /** Close the connection (or drop the queued request) now. */
  kill(): void;
}

/** Kill at once, or after the grace period when it is positive. */
function killAfter(attempt: CancellableAttempt, graceMs: number): void {
  if (graceMs <= 0) attempt.kill();
  else attempt.graceTimer = setTimeout(killAttempt, graceMs, attempt).unref();
}

/** The attempt has ended: its grace, if any, is over. */
function endAttempt(attempt: CancellableAttempt): void {
  attempt.ended = true;
  if (attempt.graceTimer !== null) {
    clearTimeout(attempt.graceTimer);
    attempt.graceTimer = null;
  }
}

// ---------------------------------------------------------------------------------------------
// h1

class H1Attempt implements CancellableAttempt, H1Handler {
  ended = false;
  cancelled = false;
  graceTimer: NodeJS.Timeout | null = null;
  private ticket: H1Ticket | null = null;
  /** The exchange read the clock as it launched this attempt. */
  private readonly startedAt: number;

  constructor(
    private readonly transport: H1Transport,
    private readonly exchange: AttemptSink,
    private readonly ordinal: number,
    private readonly node: number,
  ) {
    this.startedAt = exchange.launchedAt;
  }

  start(request: UpstreamRequest): this {
    // Sent once more on a stale kept-alive connection only if the route takes it for a read too:
    // operation rules can make a GET a write ("a write gets one attempt").
    const resendable = this.exchange.op === OP_READ && isResendableMethod(request.method);
    this.ticket = this.transport.pool.send(request, this, request.method !== 'HEAD', resendable);
    return this;
  }

  mayHaveBeenSent(): boolean {
    return this.ticket !== null && this.transport.pool.isWritten(this.ticket);
  }

  abort(): void {
    if (this.ended || this.cancelled) return;
    this.cancelled = true;
    // Not written yet: nothing to wait for.
    killAfter(this, this.transport.pool.isWritten(this.ticket!) ? graceOf(this.transport, this.exchange) : 0);
  }

  /** @internal drop the request (queued) or close its connection (written). */
  kill(): void {
    if (this.ended) return;
    endAttempt(this);
    const written = this.transport.pool.isWritten(this.ticket!);
    this.transport.pool.cancel(this.ticket!);
    this.transport.observer.attemptEnded(this.node, true, written ? performance.now() - this.startedAt : -1, written ? cancelledAs(this.exchange) : CANCELLED, this.exchange.op);
  }

  onResponse(status: number, fields: HeaderFields, body: Buffer): void {
    if (this.ended) return;
    endAttempt(this);
    const ms = performance.now() - this.startedAt;
    const ok = !isGatewayFailure(status);
    // A cancelled attempt that finished in its grace is still a true sample of the node.
    this.transport.observer.attemptEnded(this.node, ok, ms, ok ? null : status, this.exchange.op);
    if (!this.cancelled) this.exchange.answered(this.ordinal, status, fields, body, ms);
  }

  onError(error: H1Error | NodeJS.ErrnoException): void {
    if (this.ended) return;
    endAttempt(this);
    this.transport.observer.attemptEnded(this.node, false, performance.now() - this.startedAt, error, this.exchange.op);
    if (!this.cancelled) this.exchange.failed(this.ordinal, error);
  }
}

class H1Transport implements NodeTransport {
  readonly pool: H1Pool;
  constructor(
    agent: H1Agent,
    url: string,
    options: TransportOptions,
    readonly observer: AttemptObserver,
    readonly cancelGraceMs = options.cancelGraceMs,
    public loserGraceMs = options.cancelGraceMs,
  ) {
    this.pool = agent.pool(url, {
      connections: options.connections,
      requestTimeoutMs: options.requestTimeoutMs,
      ...(options.maxResponseBytes !== undefined ? { maxResponseBytes: options.maxResponseBytes } : {}),
      ...(options.pipelining !== undefined ? { pipelining: options.pipelining } : {}),
      ...(options.pipelineCounters !== undefined ? { pipelineCounters: options.pipelineCounters } : {}),
    });
  }

  attempt(exchange: AttemptSink, ordinal: number, node: number, request: UpstreamRequest): AttemptHandle {
    return new H1Attempt(this, exchange, ordinal, node).start(request);
  }

  async close(graceful: boolean): Promise<void> {
    this.pool.close(!graceful);
  }
}

// ---------------------------------------------------------------------------------------------
// undici

/**
 * The undici handler and the exchange's abort handle in one object.
 *
 * It keeps `--request-timeout-ms` with a timer of its own: undici runs its headers and body
 * timeouts on its coarse timers (a resolution of about a second), so a 300 ms timeout fired
 * after a second and a node answering at 900 ms was not timed out. The timer runs from dispatch
 * while the request waits for a connection, then again from the write for the final head
 * (interim 1xx answers do not extend it), then for each gap in the body, as the h1 client's
 * sweep does.
 */
class DispatchAttempt implements CancellableAttempt {
  ended = false;
  cancelled = false;
  graceTimer: NodeJS.Timeout | null = null;
  private abortFn: ((reason?: Error) => void) | null = null;
  private killed = false;
  private deadline: NodeJS.Timeout | null = null;
  /** The final head came: the deadline bounds each gap in the body. */
  private inBody = false;
  private status = 0;
  private rawHeaders: Buffer[] | null = null;
  private chunks: Buffer[] | null = null;
  private single: Buffer | null = null;
  /** The exchange read the clock as it launched this attempt. */
  private readonly startedAt: number;

  constructor(
    private readonly transport: UndiciTransport,
    private readonly exchange: AttemptSink,
    private readonly ordinal: number,
    private readonly node: number,
  ) {
    this.startedAt = exchange.launchedAt;
  }

  start(request: UpstreamRequest): this {
    const refusal = request.undiciRefusal;
    if (refusal !== null) {
      // As undici's own refusal would be reported (unsent, not the node's failure), without the
      // pool: a request its constructor throws at takes a connection slot for good.
      this.onError(Object.assign(new Error(refusal), { code: 'UND_ERR_INVALID_ARG' }));
      return this;
    }
    this.deadline = setTimeout(undiciDeadline, this.transport.requestTimeoutMs, this).unref();
    this.transport.pool.dispatch(request.dispatchOptions, this as unknown as Dispatcher.DispatchHandler);
    return this;
  }

  /** @internal the deadline passed with no answer, or no further part of one. */
  timedOut(): void {
    this.deadline = null;
    if (this.ended) return;
    const ms = this.transport.requestTimeoutMs;
    // Still waiting for a connection: failed here, unsent; undici drops it at onConnect.
    if (this.abortFn === null) this.onError(new H1Error(H1Codes.TIMEOUT, `no connection to the node within ${ms} ms`, true));
    else this.abortFn(this.inBody ? new undici!.errors.BodyTimeoutError(`no further part of the response within ${ms} ms`) : new undici!.errors.HeadersTimeoutError(`no response from the node within ${ms} ms`));
  }

  private end(): void {
    endAttempt(this);
    if (this.deadline !== null) {
      clearTimeout(this.deadline);
      this.deadline = null;
    }
  }

  /** undici calls onConnect once the request has a socket, just before writing it. */
  mayHaveBeenSent(): boolean {
    return this.abortFn !== null;
  }

  abort(): void {
    if (this.ended || this.cancelled) return;
    this.cancelled = true;
    if (this.abortFn === null) return; // not on a socket yet: onConnect drops it
    killAfter(this, graceOf(this.transport, this.exchange));
  }

  /** @internal grace expired: close the connection. */
  kill(): void {
    if (this.ended || this.killed) return;
    this.killed = true;
    this.abortFn?.(CANCELLED);
  }

  onConnect(abort: (reason?: Error) => void): void {
    if (this.cancelled || this.ended) {
      // Cancelled (or timed out) while queued for a connection: throwing here makes undici drop
      // the request without writing it and keep the socket (calling `abort` would destroy it).
      this.killed = true;
      throw CANCELLED;
    }
    this.abortFn = abort;
    this.deadline?.refresh();
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], _resume: () => void, _statusText: string): boolean {
    // 1xx: the final head is still to come, within the same deadline (from the write).
    if (statusCode < 200) return true;
    const codings = transferCodings(rawHeaders);
    if (codings !== null && !isChunkedOnly(codings)) {
      // As the h1 client: undici decodes chunked and leaves any other coding in the body.
      this.abortFn!(new H1Error(H1Codes.BAD_RESPONSE, `a transfer-coding the front door does not decode: ${codings}`));
      return false;
    }
    this.inBody = true;
    this.deadline?.refresh();
    this.status = statusCode;
    this.rawHeaders = rawHeaders;
    return true;
  }

  onData(chunk: Buffer): boolean {
    this.deadline?.refresh();
    if (this.single === null && this.chunks === null) this.single = chunk;
    else {
      if (this.chunks === null) {
        this.chunks = [this.single!];
        this.single = null;
      }
      this.chunks.push(chunk);
    }
    return true;
  }

  onComplete(_trailers: unknown): void {
    if (this.ended) return;
    this.end();
    const ms = performance.now() - this.startedAt;
    const body = this.chunks !== null ? Buffer.concat(this.chunks) : this.single ?? EMPTY;
    const ok = !isGatewayFailure(this.status);
    this.transport.observer.attemptEnded(this.node, ok, ms, ok ? null : this.status, this.exchange.op);
    if (!this.cancelled) this.exchange.answered(this.ordinal, this.status, HeaderFields.fromRaw(this.rawHeaders), body, ms);
  }

  onError(err: Error): void {
    if (this.ended) return;
    this.end();
    if (this.killed) {
      // Dropped or closed by us (cancelled): not the node's fault; cut off on the wire, a lower
      // bound of its latency (see CANCELLED).
      const onSocket = this.abortFn !== null;
      this.transport.observer.attemptEnded(this.node, true, onSocket ? performance.now() - this.startedAt : -1, onSocket ? cancelledAs(this.exchange) : CANCELLED, this.exchange.op);
      return;
    }
    // One failure for both: passive health reads its code as the exchange does.
    const failure = undiciFailure(err, !this.mayHaveBeenSent());
    this.transport.observer.attemptEnded(this.node, false, performance.now() - this.startedAt, failure, this.exchange.op);
    if (!this.cancelled) this.exchange.failed(this.ordinal, failure);
  }

  onResponseStarted(): void {}

  onUpgrade(): void {
    this.onError(new H1Error(H1Codes.BAD_RESPONSE, 'unexpected upgrade from upstream'));
  }
}

/**
 * An undici error as the exchange judges it: never on a socket (no onConnect; undici writes a
 * request right after it, one at a time per connection) means nothing was sent, whatever the
 * code; once on a socket, it may have been, whatever the code (EHOSTUNREACH can follow a write).
 * @internal exported for tests
 */
export function undiciFailure(err: Error, neverOnSocket: boolean): Error & { code: unknown; unsent: boolean } {
  let code = (err as { code?: unknown }).code;
  // undici 7.30's parser errors carry no code (it looks the parser's number up in a map of
  // names): a malformed answer is the h1 client's BAD_RESPONSE, and counts toward ejection as
  // there.
  if (typeof code !== 'string' && err.name === 'HTTPParserError') code = H1Codes.BAD_RESPONSE;
  return Object.assign(new Error(err.message, { cause: err }), { code, unsent: neverOnSocket });
}

class UndiciTransport implements NodeTransport {
  readonly pool: Pool;
  readonly cancelGraceMs: number;
  loserGraceMs: number;
  readonly requestTimeoutMs: number;
  constructor(
    url: string,
    options: TransportOptions,
    readonly observer: AttemptObserver,
  ) {
    this.cancelGraceMs = options.cancelGraceMs;
    this.loserGraceMs = options.cancelGraceMs;
    this.requestTimeoutMs = options.requestTimeoutMs;
    if (undici === null) throw new Error('the undici transport needs loadUndici() first');
    this.pool = new undici.Pool(url, {
      connections: options.connections,
      pipelining: 1,
      keepAliveTimeout: 4_000,
      keepAliveMaxTimeout: 60_000,
      headersTimeout: options.requestTimeoutMs,
      bodyTimeout: options.requestTimeoutMs,
      connect: { timeout: connectTimeoutFor(options.requestTimeoutMs) },
      ...(options.maxResponseBytes !== undefined ? { maxResponseSize: options.maxResponseBytes } : {}),
    });
  }

  attempt(exchange: AttemptSink, ordinal: number, node: number, request: UpstreamRequest): AttemptHandle {
    return new DispatchAttempt(this, exchange, ordinal, node).start(request);
  }

  async close(graceful: boolean): Promise<void> {
    await (graceful ? this.pool.close() : this.pool.destroy()).catch(() => undefined);
  }
}

const EMPTY = Buffer.alloc(0);

/** Every transfer-encoding line of undici's raw head, joined as one list; null when none. */
function transferCodings(raw: Buffer[]): string | null {
  let codings: string | null = null;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!;
    if (name.length === 17 && name.toString('latin1').toLowerCase() === 'transfer-encoding') {
      const value = raw[i + 1]!.toString('latin1');
      codings = codings === null ? value : `${codings}, ${value}`;
    }
  }
  return codings;
}

function undiciDeadline(attempt: DispatchAttempt): void {
  attempt.timedOut();
}

/**
 * A loser's grace is over: it is killed after this loop turn's reads (`setImmediate`), so one
 * whose answer came while the thread was stalled is answered, not cut off (and counted a failure).
 */
function killAttempt(attempt: { kill(): void }): void {
  setImmediate(killNow, attempt);
}

function killNow(attempt: { kill(): void }): void {
  attempt.kill();
}

/** A transport to `url` of the given kind; h1 transports share `agent` (its timeout sweep). */
export function createTransport(
  kind: UpstreamClientKind,
  url: string,
  options: TransportOptions,
  observer: AttemptObserver,
  agent: H1Agent,
): NodeTransport {
  return kind === 'undici' ? new UndiciTransport(url, options, observer) : new H1Transport(agent, url, options, observer);
}
