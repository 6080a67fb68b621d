/**
 * The data plane of one worker thread: a uWebSockets.js App on the shared port, the read-only
 * view of the membership table, and the proxy handler.
 *
 * uWS rules kept here: `onAborted` is registered before anything asynchronous; `req` is read only
 * inside the handler; `onData` chunks are copied before the callback returns; every response
 * written after the handler returned is written inside `res.cork`.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import type { HttpRequest, HttpResponse, RecognizedString, TemplatedApp, us_listen_socket } from 'uWebSockets.js';
import {
  DEFAULT_WS_BACKLOG_BYTES,
  DEFAULT_WS_PING_MS,
  HEDGED_HEADER,
  IDEMPOTENT_HEADER,
  MAX_KEY_LENGTH,
  hasDotSegment,
  isHostAuthority,
  isIdempotentPath,
  isSafeMethod,
} from '../contract.js';
import { RouteMatcher, respelledRoute } from './route-match.js';
import { ErrorCodes, errorBody } from '../errors.js';
import { Exchange, isBackOff } from '../forward/exchange.js';
import { connectionNamed, isChunkedOnly, type HeaderFields } from '../forward/fields.js';
import { H1Agent, sweepPeriodMs } from '../forward/h1.js';
import { UpstreamRequest } from '../forward/upstream.js';
import { FLAG_HEALTHY, TableReader, type NodeRow } from '../membership/table.js';
import { C_REJECTED, C_REQUESTS, CounterSlot } from '../metrics/counters.js';
import { NodeHistograms } from '../metrics/histograms.js';
import { pinFirst, placeClient, placesByTurn, type Policy } from '../policies/types.js';
import { ClusterRuntime, type ProxiedRequest } from './cluster-runtime.js';
import { OperationClassifier } from './operations.js';
import { OP_READ, OP_UNSUPPORTED, OP_WRITE, type NodeSpec, type RouteSpec, type SavedHint, type WorkerInit } from './protocol.js';
import { statusBytes, writeRelayedHeaders } from './relay.js';
import { loadUws, type Uws } from './uws.js';
import { WebSocketTunnels, type TunnelHost } from './websocket.js';
import { TicketBook } from '../affinity/tickets.js';
import { ReplicaSet, type ReplicatedCall, type ReplicatedOwner } from '../replication/fanout.js';
import { HeldHints, keyOfWrite } from '../replication/hints.js';
import { ACKS_HEADER, VersionClock } from '../replication/quorum.js';
import { AccessLog, asciiJson } from './access-log.js';
import { clientAddress } from './client-address.js';
import { chunkedLast, framingInDoubt } from './framing.js';

/** A drain closes the connections once no request has come for this long (see `drain`). */
const DRAIN_QUIET_MS = 100;

/** A refused body declared up to this size is read and dropped, not cut off (see `proxy`). */
const LINGER_BYTES = 16 * 1024 * 1024;

/**
 * A relayed body larger than this is handed to uWS only as fast as the client takes it (see
 * `sendBody`); a smaller one is ended in one call, whatever the client does with it. Not below
 * the upstream read buffer's size (h1.ts), so a body held on is never a view into that buffer.
 */
const STREAM_BODY_BYTES = 64 * 1024;

const JSON_TYPE = 'application/json';

/** A header line of the front door's own answer beside its content-type (`allow` for a 405, `retry-after`). */
export type ExtraHeader = readonly [name: string, value: string];

/**
 * Sends a small JSON answer; safe to call inside or outside the handler. `extra`: one more header
 * line (a 405's `allow`). `head`: the answer to a HEAD request, which says the body's length and
 * sends none.
 */
function replyJson(res: HttpResponse, status: number, body: string, close = false, extra: ExtraHeader | null = null, head = false, asked: CloseAsk = CLOSE_NOT_ASKED): void {
  res.cork(() => {
    res.writeStatus(statusBytes(status)).writeHeader('content-type', JSON_TYPE);
    if (extra !== null) res.writeHeader(extra[0], extra[1]);
    endJson(res, body, close || asked !== CLOSE_NOT_ASKED, head, asked === CLOSE_UWS);
  });
}

/**
 * What a request's connection field asks of its answer (RFC 9112 9.6: a client that sends
 * `close` gets `close` back, and the connection ends after the answer). uWS 20.30 reads it its
 * own way: a request whose first connection line is 5 characters long (`close`, but any 5) is
 * marked, and uWS closes after its answer without saying so, even when told to close
 * (`CLOSE_UWS`: the front door says it); a `close` in a list (`keep-alive, close`) it does not see
 * (`CLOSE_LISTED`: the front door tells it to close, and it says so itself).
 */
type CloseAsk = 0 | 1 | 2;
const CLOSE_NOT_ASKED = 0;
const CLOSE_LISTED = 1;
const CLOSE_UWS = 2;

/** What a connection field value asks (`firstLength`: its first line's length, as uWS reads it). */
function closeAsk(connection: string, firstLength: number): CloseAsk {
  if (firstLength === 5) return CLOSE_UWS;
  // Most clients that send the field send this (autocannon with every request): no regex.
  if (connection === 'keep-alive' || connection === 'Keep-Alive' || connection === '') return CLOSE_NOT_ASKED;
  return CLOSE_TOKEN.test(connection) ? CLOSE_LISTED : CLOSE_NOT_ASKED;
}

/**
 * Ends an answer with a JSON body the front door made; returns the body bytes sent. A HEAD answer
 * never carries the body (a client would take it for a next answer), only its length; one that
 * should close says so, and the client closes (see endHeadAnswer).
 */
function endJson(res: HttpResponse, body: string, close: boolean, head: boolean, uwsCloses = false): number {
  const bytes = Buffer.byteLength(body);
  if (head) {
    res.writeHeader('content-length', String(bytes));
    endHeadAnswer(res, close);
    return 0;
  }
  endBody(res, body, close, uwsCloses);
  return bytes;
}

/**
 * Ends an answer with its body. `close`: the connection ends with it, and uWS says
 * `connection: close`, except where it closes on its own account (`uwsCloses`: the request's
 * first connection line was 5 characters long, see CloseAsk): the front door says it there
 * (RFC 9112 9.6), once.
 */
function endBody(res: HttpResponse, body: RecognizedString, close: boolean, uwsCloses: boolean): void {
  if (uwsCloses) res.writeHeader('connection', 'close');
  res.end(body, close || uwsCloses);
}

/** A 204 or 304: no body, and no content-length (a 304's would be the 200's, not known here). */
function bodiless(status: number): boolean {
  return status === 204 || status === 304;
}

/** A `connection` field value that lists `close`. */
const CLOSE_TOKEN = /(?:^|,)[ \t]*close[ \t]*(?:,|$)/i;

/**
 * Ends a HEAD answer, its content-length already written as a header line (or a 204 or 304,
 * with none): `endWithoutBody()` with no argument (uWS 20.30 leaves an answer given a length
 * there unfinished: see relay.ts).
 * One that should close the connection says `connection: close`, so the client does not send its
 * next request over it (uWS 20.30 cannot end a HEAD answer and close: `endWithoutBody(undefined,
 * true)` leaves it unfinished); a draining front door closes it with the rest.
 */
function endHeadAnswer(res: HttpResponse, closing: boolean): void {
  if (closing) res.writeHeader('connection', 'close');
  res.endWithoutBody();
}

interface BoundRoute {
  readonly spec: RouteSpec;
  readonly runtime: ClusterRuntime;
  readonly policy: Policy;
  readonly classifier: OperationClassifier | null;
  /** The route's affinity tickets (seed 004), or null. */
  readonly tickets: TicketBook | null;
  /** A replicated route's replicas and hints (seed 003), or null. */
  readonly replicas: ReplicaSet | null;
  /** Per region, the next turn among its nodes (affinity placement on a round robin). */
  readonly turns: Int32Array;
}

/** What a replicated route carries: reads and whole-value writes (last write wins). */
function replicatedOp(method: string): number {
  if (method === 'GET' || method === 'HEAD') return OP_READ;
  if (method === 'PUT' || method === 'DELETE') return OP_WRITE;
  return -1;
}

const REPLICATED_METHODS = 'GET, HEAD, PUT, DELETE';
/** What the front door's own endpoints (`/health`, `/route`, `/stats`) answer. */
const OWN_METHODS = 'GET, HEAD';
/** What a proxied route's 405 for TRACE or CONNECT names as allowed: RFC 9110's methods but those two (another uWS parses is forwarded too). */
const FORWARDED_METHODS = 'GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH';

/** One proxied request: its client response, what to send upstream, and the exchange. */
class ProxyRequest implements ProxiedRequest, ReplicatedOwner {
  aborted = false;
  answered = false;
  exchange: Exchange | null = null;
  /** A replicated route's fan-out (instead of an exchange). */
  call: ReplicatedCall | null = null;
  /** The worker's list of unfinished requests (answered at the drain deadline). */
  prev: ProxyRequest | null = null;
  next: ProxyRequest | null = null;
  readonly upstream: UpstreamRequest;
  private chunks: Buffer[] | null = null;
  private received = 0;
  /** A hybrid route's write with a valid ticket: served by the leader, the ticket stays as it is. */
  private ticketKept = false;
  /** The body passed the limit: the rest is being read and dropped. */
  private overflowed = false;
  /** With the access log on: what its line needs from the request's arrival (else null). */
  arrival: Arrival | null = null;
  /** The body of a failure answer, in bytes (for the access log). */
  private failureBytes = 0;
  /** What the client's connection field asked (see CloseAsk): asked, the answer says `close` too, and the connection ends. */
  asked: CloseAsk = CLOSE_NOT_ASKED;
  /** A large answer's body while the client has not taken it all (see `sendBody`), and how much it has. */
  private unsent: Buffer | null = null;
  private sentBytes = 0;

  constructor(
    private readonly front: WorkerFront,
    private readonly res: HttpResponse,
    private readonly route: BoundRoute,
    private readonly key: string,
    private readonly method: string,
    path: string,
    headers: string[],
    private readonly retryable: boolean,
    private readonly op: number,
    /** Declared content-length, or -1 when the body is chunked. */
    private readonly expected: number,
    /** The node (cluster index) a valid affinity ticket names, or -1. */
    private pinned: number,
    /** That ticket is past half its life: the answer carries a fresh one. */
    private readonly renewTicket: boolean,
    /** An affinity route's client region: its ticket's, else the front door's (null: none). */
    private readonly region: string | null,
    /** A rotating route's client with a valid ticket: its own turn (ticketTurn), else -1. */
    private readonly placeTurn: number,
    /** The request carries a valid ticket (its node may have left the cluster: `pinned` -1). */
    private readonly ticketed = false,
  ) {
    this.upstream = new UpstreamRequest(method, path, headers, null);
  }

  onAborted(): void {
    this.aborted = true;
    // A large answer the client left before it had it all: logged with the bytes it took.
    if (this.unsent !== null && this.arrival !== null) this.logAnswer(this.sentBytes);
    this.unsent = null;
    // As nginx logs it: 499, the client closed the connection before its answer.
    if (!this.answered && this.arrival !== null) this.log(499, null, this.exchange?.hedged ?? false, 0);
    this.exchange?.cancel();
    this.finish();
  }

  /** Copies one body chunk (uWS detaches the buffer after the callback returns). */
  onChunk(chunk: ArrayBuffer, isLast: boolean): void {
    if (this.answered) return;
    const size = chunk.byteLength;
    // uWS framed the body otherwise than its content-length says: the framing is in doubt.
    if (this.expected >= 0 && this.received + size > this.expected) {
      this.dropFraming();
      return;
    }
    if (this.overflowed || this.received + size > this.front.maxBodyBytes) {
      // Too large (a chunked body: a declared length is refused before any of it comes). The
      // rest is read and dropped and the 413 sent at its end, for a body up to LINGER_BYTES:
      // closing while the client still sends would reset the connection and lose the answer.
      // A longer one is cut off there.
      this.overflowed = true;
      this.chunks = null;
      this.received += size;
      if (isLast || this.received > LINGER_BYTES) {
        this.reject(413, errorBody(`request body exceeds ${this.front.maxBodyBytes} bytes`, ErrorCodes.BODY_TOO_LARGE), !isLast || this.front.draining);
      }
      return;
    }
    if (size > 0) {
      const view = new Uint8Array(chunk);
      if (this.expected >= 0) {
        // The upstream request's body fills as it arrives.
        const upstream = this.upstream;
        if (upstream.body === null) upstream.body = Buffer.allocUnsafe(this.expected);
        upstream.body.set(view, this.received);
      } else {
        (this.chunks ??= []).push(Buffer.copyBytesFrom(view));
      }
      this.received += size;
    }
    if (!isLast) return;
    if (this.expected >= 0 && this.received !== this.expected) {
      this.dropFraming();
      return;
    }
    if (this.chunks !== null) this.upstream.body = Buffer.concat(this.chunks);
    this.start();
  }

  start(): void {
    if (this.answered) return;
    const replicas = this.route.replicas;
    if (replicas !== null) {
      // Not cancelled if the client goes: the write lands on every replica all the same.
      this.call = replicas.call(this, this.op, this.method, this.upstream.path, this.upstream.headers, this.upstream.body);
      this.call.begin(this.key);
      return;
    }
    const runtime = this.route.runtime;
    const exchange = new Exchange(runtime, runtime.size);
    exchange.context = this;
    exchange.retryable = this.retryable;
    exchange.hedgeEnabled = this.retryable && this.route.spec.hedge && this.front.hedging;
    exchange.failoverUnsent = this.route.spec.failoverUnsent;
    exchange.op = this.op;
    // A ticket's client on a rotating route takes its own turn, not the route's: where its node
    // cannot take the request (gone, or failing now), it goes to the same sibling as its other
    // requests and its sockets (seed 004), not to whichever is next in the rotation. Placed by
    // ticket, a client goes to its region first (a leader's writes stay with the leader).
    // Not a write where writes belong to the leader: neither turn nor region moves it.
    const leaderWrite = this.op !== OP_READ && this.route.policy.leaderWrites === true;
    const turn = leaderWrite ? -1 : this.placeTurn;
    // A policy ranks every routable node; the exchange holds at most MAX_CANDIDATES of them. A
    // ticket holder placed by its own turn takes none of the route's rotation: its requests
    // would shift where the next new client lands (all on one node when they keep step).
    exchange.count = Math.min(this.route.policy.pick(this.key, this.op, exchange.candidates, turn < 0), exchange.candidates.length);
    const region = this.region !== null && !leaderWrite ? runtime.regionIndex(this.region) : -1;
    if (turn >= 0 || region >= 0) placeClient(exchange.candidates, exchange.count, this.pinned, turn, runtime.regionOf, region, this.route.policy, this.route.turns, runtime.nodeKeys);
    // A client with a valid ticket is not hedged, on its node or placed anew on a sibling (its own turn,
    // above), nor when its node has left the cluster (a keyed route places it by its key): its session belongs on one node, and a hedge would answer it from another (with a
    // ticket for that one) while its other requests and sockets go to the first. A failure still
    // fails over.
    if (this.ticketed || turn >= 0) exchange.hedgeEnabled = false;
    // Where writes belong to the leader (hybrid), a ticket does not move them; the client keeps
    // it, and a client without one gets none (one naming the leader would pin its reads there).
    if (leaderWrite) this.ticketKept = true;
    else if (this.pinned >= 0) {
      const count = pinFirst(exchange.candidates, exchange.count, this.pinned, runtime.view.weights[this.pinned]! > 0);
      if (count < 0) this.pinned = -1;
      else {
        exchange.count = count;
        // Pinned (and so not hedged, above): a failure still fails over, and the client is
        // re-placed with a ticket; but the node's 503 with a Retry-After (it sheds load) is its
        // answer, and the client keeps its ticket.
        exchange.ownNodeFirst = true;
      }
    }
    if (exchange.hedgeEnabled) runtime.hedgeBudget.deposit();
    this.exchange = exchange;
    exchange.begin();
  }

  settled(_exchange: Exchange, _runtime: ClusterRuntime): void {
    this.respond();
  }

  replicated(_call: ReplicatedCall): void {
    this.respond();
  }

  /** The exchange or the fan-out has its outcome: write it, unless the client went away. */
  private respond(): void {
    if (this.aborted || this.answered) return;
    this.answered = true;
    corked = this;
    this.res.cork(writeCorked);
    corked = null;
    // A large body the client has not taken yet: finished (and logged) when it has, or goes away.
    if (this.unsent === null) this.sent();
  }

  /** The client has the whole answer: its line, and the request is done. */
  private sent(): void {
    if (this.arrival !== null) this.logAnswer();
    this.finish();
  }

  /**
   * Ends a relayed answer with its body. A large one goes with `tryEnd`: what the client's
   * connection cannot take now stays here (the body is held until then anyway) instead of being
   * copied into uWS's backpressure, and goes on as the client reads (`onWritable`). Either way
   * uWS closes a connection whose answer has made no progress for 10 s (its idle timeout; nginx's
   * send_timeout is 60 s). `tryEnd` cannot close the connection: a draining front door's answer
   * says `connection: close` and the drain closes it once sent (the drain waits for it); one to
   * a `close` in a list (`keep-alive, close`), outside a drain, ends with `end`, which closes.
   */
  private sendBody(body: Buffer, close: boolean): void {
    const res = this.res;
    const uwsCloses = this.asked === CLOSE_UWS;
    if (body.length <= STREAM_BODY_BYTES || (close && !uwsCloses && !this.front.draining)) {
      endBody(res, body, close, uwsCloses);
      return;
    }
    if (close) res.writeHeader('connection', 'close');
    if (res.tryEnd(body, body.length)[1]) return;
    this.unsent = body;
    this.sentBytes = res.getWriteOffset();
    res.onWritable((offset) => this.sendMore(offset));
  }

  /** The client took some of a large answer: the next part (`offset`: the body bytes it has). */
  private sendMore(offset: number): boolean {
    const body = this.unsent!;
    const res = this.res;
    const [ok, done] = res.tryEnd(body.subarray(offset), body.length);
    if (!done) {
      this.sentBytes = res.getWriteOffset();
      return ok;
    }
    this.unsent = null;
    this.sent();
    return ok;
  }

  /** The access log's line for the answer just written (`sent`: the body bytes a client that left took, else -1). */
  private logAnswer(sent = -1): void {
    const call = this.call;
    const ids = this.route.runtime.ids;
    const head = this.method === 'HEAD';
    if (call !== null) {
      const failure = call.failure;
      if (failure !== null) this.log(failure.status, null, false, this.failureBytes, failure.code);
      else this.log(call.status, ids[call.servedBy]!, false, sent >= 0 ? sent : head || call.body === null ? 0 : call.body.length);
      return;
    }
    const exchange = this.exchange!;
    if (exchange.failure !== null) this.log(exchange.failure.status, null, exchange.hedged, this.failureBytes, exchange.failure.code);
    else this.log(exchange.status, ids[exchange.servedBy]!, exchange.hedged, sent >= 0 ? sent : head || exchange.body === null ? 0 : exchange.body.length);
  }

  private log(status: number, node: string | null, hedged: boolean, bytes: number, code: string | null = null): void {
    const attempts = this.exchange !== null ? this.exchange.launched : this.call !== null ? this.call.attempts : 0;
    this.front.logRequest(this.arrival!, status, node, attempts, hedged, bytes, code);
  }

  /** @internal inside `res.cork`: the answer (or the failure) in one corked write. */
  writeAnswer(): void {
    if (this.call !== null) {
      this.writeReplicated(this.call);
      return;
    }
    const exchange = this.exchange!;
    const runtime = this.route.runtime;
    const res = this.res;
    const close = this.front.draining || this.asked !== CLOSE_NOT_ASKED;
    const failure = exchange.failure;
    if (failure !== null) {
      const attempted: string[] = [];
      for (let i = 0; i < exchange.launched; i++) attempted.push(runtime.ids[exchange.candidates[i]!]!);
      // Why each attempt gave no answer, in order (as nginx's error log would say it).
      const reasons = exchange.reasons;
      const detail = reasons === null ? { attempted } : { attempted, reasons: attempted.map((_, i) => reasons[i] ?? 'cut off (another attempt ended the request)') };
      res
        .writeStatus(statusBytes(failure.status))
        .writeHeader('content-type', JSON_TYPE)
        .writeHeader(HEDGED_HEADER, exchange.hedged ? '1' : '0');
      if (failure.code === ErrorCodes.NODES_SHEDDING) res.writeHeader('retry-after', String(exchange.retryAfter));
      this.failureBytes = endJson(res, errorBody(failure.message, failure.code, detail), close, this.method === 'HEAD', this.asked === CLOSE_UWS);
      return;
    }
    // uWS writes `200 OK` itself when no status was written: one native call fewer for most.
    if (exchange.status !== 200) res.writeStatus(statusBytes(exchange.status));
    const isHead = this.method === 'HEAD';
    // Placed anew (no valid ticket, or its node could not be used), or a ticket past half its
    // life: a fresh ticket for where it landed. A node's own header of that name is not relayed.
    // Not onto a node that sheds load (a bare write's 503 with a Retry-After, relayed): the
    // client is not placed where it was just told to come back later.
    const tickets = this.route.tickets;
    if (tickets !== null && !this.ticketKept && (exchange.servedBy !== this.pinned || this.renewTicket) && !isBackOff(exchange.status, exchange.headers)) res.writeHeader(tickets.header, tickets.mint(runtime.ids[exchange.servedBy]!, this.region));
    const own = runtime.answerLines[2 * exchange.servedBy + (exchange.hedged ? 1 : 0)]!;
    writeRelayedHeaders(res, exchange.headers as HeaderFields | null, own, isHead && exchange.status !== 204, tickets === null ? null : tickets.header);
    // uWS writes its own content-length; for HEAD the node's is relayed instead (see relay.ts),
    // and a 204 or 304 has none (RFC 9110 8.6: a 204 never, not even a node's to a HEAD, as
    // nginx drops it; a 304 to a HEAD may keep the node's, the 200's length).
    if (isHead || bodiless(exchange.status)) endHeadAnswer(res, close);
    else this.sendBody(exchange.body!, close);
  }

  private writeReplicated(call: ReplicatedCall): void {
    const res = this.res;
    const close = this.front.draining || this.asked !== CLOSE_NOT_ASKED;
    const failure = call.failure;
    const runtime = this.route.runtime;
    if (failure !== null) {
      res.writeStatus(statusBytes(failure.status)).writeHeader('content-type', JSON_TYPE);
      this.failureBytes = endJson(res, errorBody(failure.message, failure.code, { acks: call.acks, required: call.required, replicas: failure.replicas }), close, this.method === 'HEAD', this.asked === CLOSE_UWS);
      return;
    }
    runtime.won(call.servedBy);
    if (call.status !== 200) res.writeStatus(statusBytes(call.status));
    res.writeHeader(ACKS_HEADER, `${call.acks}/${call.required}`);
    const isHead = this.method === 'HEAD';
    writeRelayedHeaders(res, call.headers, runtime.answerLines[2 * call.servedBy]!, isHead && call.status !== 204);
    if (isHead || bodiless(call.status)) endHeadAnswer(res, close);
    else this.sendBody(call.body!, close);
  }

  /** The drain deadline passed with this request unanswered: answer it before connections close. */
  shutDown(): void {
    if (!this.aborted && !this.answered) {
      if (this.call !== null) this.call.shutDown();
      else if (this.exchange !== null) this.exchange.shutDown();
      else this.reject(503, errorBody('the front door shut down before the request body arrived', ErrorCodes.SHUTTING_DOWN), true);
    }
    this.finish();
  }

  private reject(status: number, body: string, close: boolean): void {
    this.answered = true;
    if (this.asked !== CLOSE_NOT_ASKED) this.front.closeAsked(this.res, this.asked);
    this.front.refuse(this.res, status, body, close, null, this.method === 'HEAD', this.arrival);
    this.finish();
  }

  /** Its body came framed otherwise than it said: the connection is closed unanswered (framing.ts). */
  private dropFraming(): void {
    this.answered = true;
    this.front.dropFraming(this.res, this.arrival);
    this.finish();
  }

  private finished = false;

  private finish(): void {
    if (this.finished) return;
    this.finished = true;
    this.front.requestFinished(this);
  }
}

/**
 * A content-length value: 1*DIGIT, as a number (past 15 digits, MAX_SAFE_INTEGER: too large for
 * any body limit, so it is refused as too large rather than as malformed); -1 for anything else.
 */
function parseLength(text: string): number {
  const n = text.length;
  if (n === 0) return -1;
  let value = 0;
  for (let i = 0; i < n; i++) {
    const digit = text.charCodeAt(i) - 48;
    if (digit < 0 || digit > 9) return -1;
    value = value * 10 + digit;
  }
  return n > 15 ? Number.MAX_SAFE_INTEGER : value;
}

/**
 * A query string's parameters, percent-decoded as a form's (`+` is a space), or why it cannot be:
 * a malformed escape (`%ZZ`, a lone `%`, bytes that are not UTF-8), or a name given twice.
 */
export function parseQuery(raw: string): Map<string, string> | string {
  const params = new Map<string, string>();
  if (raw === '') return params;
  for (const part of raw.split('&')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    const rawName = eq < 0 ? part : part.slice(0, eq);
    const rawValue = eq < 0 ? '' : part.slice(eq + 1);
    let name: string;
    let value: string;
    try {
      name = decodeURIComponent(rawName.replaceAll('+', ' '));
      value = decodeURIComponent(rawValue.replaceAll('+', ' '));
    } catch {
      return `malformed percent-encoding in the query parameter ${JSON.stringify(rawName.slice(0, 64))}`;
    }
    // Two of a name: which one was meant cannot be told (as two key header lines on a request).
    if (params.has(name)) return `the query parameter ${JSON.stringify(name.slice(0, 64))} is given twice`;
    params.set(name, value);
  }
  return params;
}

/** The request whose answer `writeCorked` writes: saves a closure per answer. */
let corked: ProxyRequest | null = null;
function writeCorked(): void {
  corked!.writeAnswer();
}

export interface FrontHooks {
  /** Ask the control plane for `/stats`; it answers through `statsReply`. */
  requestStats(id: number): void;
  /** An attempt found the node unreachable (at most one report a node per 500 ms, per thread). */
  nodeUnreachable(globalNode: number): void;
  /** `--eject-after` attempts in a row at the node failed (counted across threads), the last with `code`. */
  nodeFailing(globalNode: number, failures: number, code: string): void;
  leaderFailed(globalNode: number): void;
}

export class WorkerFront implements TunnelHost {
  readonly slot: CounterSlot;
  readonly maxBodyBytes: number;
  /** Whether retryable requests may hedge (`--hedge-mode off` says no). */
  readonly hedging: boolean;
  draining = false;
  private readonly uws: Uws;
  private readonly app: TemplatedApp;
  private listenSocket: us_listen_socket | null = null;
  private readonly table: TableReader;
  private readonly rows: NodeRow[];
  private generation = -1;
  private readonly runtimes: ClusterRuntime[];
  private readonly routes: BoundRoute[];
  /** The routes by pattern, to refuse another route's path spelled otherwise; null: one route. */
  private readonly respellings: RouteMatcher<BoundRoute> | null;
  private readonly histograms: NodeHistograms;
  /** `/stats` requests waiting for the control plane, and whether each is a HEAD. */
  private readonly pendingStats = new Map<number, { res: HttpResponse; head: boolean; closes: CloseAsk }>();
  /** Proxied requests not yet answered or aborted. */
  private active = 0;
  /** Unfinished requests, newest first (an intrusive list: no allocation per request). */
  private unfinished: ProxyRequest | null = null;
  private nextStatsId = 1;
  private drainWaiter: (() => void) | null = null;
  /** Requests proxied so far (a drain waits until no more come: see `drain`). */
  private started = 0;
  private readonly rankScratch: Int32Array;
  private readonly agent: H1Agent;
  private readonly tunnels: WebSocketTunnels;
  /** The access log (`--access-log`), or null. */
  readonly accessLog: AccessLog | null;
  /**
   * With the access log on, while `proxy` (or the 404) runs: the request a refusal answers, for
   * its line (`refuse` writes it); a request proxied takes it.
   */
  private refusing: Arrival | null = null;
  /** `--forwarded-for append`: x-forwarded-for, -proto and -host to the nodes. */
  readonly forwardedFor: boolean;
  /** The hints every thread holds, by replica and key (replicated reads ask nodes past the replicas while one for their key waits). */
  readonly held: HeldHints;

  constructor(
    private readonly init: WorkerInit,
    private readonly hooks: FrontHooks,
  ) {
    this.uws = loadUws();
    this.accessLog = init.accessLog === null ? null : new AccessLog(init.accessLog, (message) => process.stderr.write(`lakefront: worker ${init.slot}: ${message}\n`));
    this.maxBodyBytes = init.settings.maxBodyBytes;
    this.hedging = init.settings.hedgeMode !== 'off';
    this.forwardedFor = init.settings.forwardedFor === true;
    this.slot = new CounterSlot(init.counters, init.slot, init.nodes.length, true);
    this.table = new TableReader(init.table);
    this.rows = init.nodes.map(() => ({ weight: 0, flags: 0, region: -1, cluster: 0 }));
    this.histograms = new NodeHistograms(init.nodes.length);
    this.agent = new H1Agent(sweepPeriodMs(init.settings.requestTimeoutMs));
    const failuresInRow = new Int32Array(init.failuresInRow);
    this.held = new HeldHints(init.hintsHeld, init.counterSlots, HeldHints.nodeHashes(init.nodes, init.clusters), init.slot, init.priorHintsHeld);
    const replication = { clock: new VersionClock(init.versionSalt + init.slot, new BigInt64Array(init.versionLane)), region: init.region, refresh: () => this.refresh(), held: this.held };
    this.runtimes = init.clusters.map(
      (spec) =>
        new ClusterRuntime(
          spec,
          init.nodes,
          init.settings,
          this.slot,
          this.histograms,
          failuresInRow,
          hooks,
          this.agent,
          replication,
        ),
    );
    this.routes = init.routes.map((spec) => {
      const runtime = this.runtimes[spec.cluster]!;
      let replicas: ReplicaSet | null = null;
      if (spec.quorum !== null) {
        runtime.replicate(this.rows);
        const set = (replicas = new ReplicaSet(runtime, spec.quorum, spec.keyHeader));
        runtime.onUpdate.push(() => set.hints.deliver());
      }
      return {
        spec,
        runtime,
        policy: runtime.policy(spec.policy),
        classifier: spec.operations ? new OperationClassifier(spec.operations) : null,
        tickets: spec.affinity ? new TicketBook(spec.affinity) : null,
        replicas,
        turns: new Int32Array(runtime.regionCount),
      };
    });
    this.respellings = this.routes.length > 1 ? new RouteMatcher(this.routes.map((r) => ({ pattern: r.spec.pattern, value: r }))) : null;
    this.rankScratch = new Int32Array(Math.max(1, ...this.runtimes.map((r) => r.size)));
    this.refresh();
    this.app = this.uws.App();
    this.tunnels = new WebSocketTunnels(this);
    this.mount();
  }

  /**
   * Takes hints an earlier run saved, or a predecessor handed over (a reload): each to its route
   * and replica, if both still exist.
   */
  adoptHints(saved: readonly SavedHint[]): void {
    for (const hint of saved) {
      const route = this.routes.find((r) => r.spec.pattern === hint.route && r.replicas !== null);
      const node = route ? route.runtime.indexOf(hint.node) : -1;
      if (!route || node < 0) continue;
      const body = hint.body === null ? null : Buffer.from(hint.body.buffer, hint.body.byteOffset, hint.body.byteLength);
      const key = hint.key ?? keyOfWrite(route.spec.keyHeader, hint.path, hint.headers);
      route.replicas!.hints.adopt({ node, key, request: new UpstreamRequest(hint.method, hint.path, [...hint.headers], body), expiresAt: hint.expiresAt });
    }
  }

  get nodes(): readonly NodeSpec[] {
    return this.init.nodes;
  }

  get maxMessageBytes(): number {
    return this.maxBodyBytes;
  }

  /** The front door's own region, or null. */
  get region(): string | null {
    return this.init.region;
  }

  get handshakeTimeoutMs(): number {
    return this.init.settings.requestTimeoutMs;
  }

  get wsPingMs(): number {
    return this.init.settings.wsPingMs ?? DEFAULT_WS_PING_MS;
  }

  get wsBacklogBytes(): number {
    return this.init.settings.wsBacklogBytes ?? DEFAULT_WS_BACKLOG_BYTES;
  }

  /** Listens on the configured port; resolves with the bound port, rejects if it could not. */
  listen(): Promise<number> {
    return new Promise((resolve, reject) => {
      this.app.listen(this.init.host, this.init.port, (socket) => {
        if (!socket) {
          reject(new Error(`could not listen on ${this.init.host}:${this.init.port}`));
          return;
        }
        this.listenSocket = socket;
        // Its share of a hints file's (or of a reload's) hints: taken once it listens, so that
        // one that cannot (its start retried in another thread) never counts them as held.
        this.adoptHints(this.init.hints);
        resolve(this.uws.us_socket_local_port(socket));
      });
    });
  }

  /**
   * For `/stats`: adds this thread's batched counts to the shared counters, and returns its
   * encoded per-node latency histograms for the control plane's merge.
   */
  collect(): (string | null)[] {
    this.slot.flush();
    return this.histograms.encode();
  }

  statsReply(id: number, body: string): void {
    const pending = this.pendingStats.get(id);
    if (!pending) return;
    this.pendingStats.delete(id);
    replyJson(pending.res, 200, body, this.draining, null, pending.head, pending.closes);
  }

  /** @internal A new request joins the list of unfinished ones. */
  requestStarted(request: ProxyRequest): void {
    this.active++;
    this.started++;
    const head = this.unfinished;
    request.next = head;
    if (head !== null) head.prev = request;
    this.unfinished = request;
  }

  /** Closes every WebSocket tunnel now (1001): a drain letting them run on stops waiting. */
  closeTunnels(): void {
    this.tunnels.closeAll();
  }

  /** @internal The last open tunnel closed: a drain waiting for them goes on. */
  tunnelsClosed(): void {
    if (this.drainWaiter !== null && this.active === 0) this.drainWaiter();
  }

  /** @internal The request was answered, rejected or abandoned by its client. */
  requestFinished(request: ProxyRequest): void {
    this.active--;
    const { prev, next } = request;
    if (prev !== null) prev.next = next;
    else this.unfinished = next;
    if (next !== null) next.prev = prev;
    request.prev = request.next = null;
    if (this.drainWaiter !== null && this.active === 0 && this.tunnels.size === 0) this.drainWaiter();
  }

  /**
   * Stops accepting, lets in-flight requests finish (up to `drainTimeoutMs`), then closes every
   * connection and pool. Returns how many requests were still running at the deadline, and
   * (`keepHints`) the pending hints, handed back rather than dropped.
   *
   * Answers written before the drain began said nothing of closing, so a client may have its
   * next request on its way over the same connection: closing then would reset it unanswered.
   * So the connections close once none is in flight and none has come for DRAIN_QUIET_MS (each
   * one meanwhile answered with `connection: close`), or at the deadline.
   *
   * `lingerTunnels` (a reload): WebSocket tunnels run on until they close, and the connections
   * wait for them (a connection kept alive meanwhile may bring one more request, answered with
   * `connection: close`); at the deadline they are closed with 1001.
   */
  async drain(keepHints: boolean, lingerTunnels: boolean): Promise<{ abandoned: number; hints: SavedHint[] }> {
    this.draining = true;
    this.closeListenSocket();
    // WebSockets are long-lived: at a stop they are told the front door is going away (1001) now;
    // at a reload they run on until they close or the deadline comes (then 1001).
    if (lingerTunnels) this.tunnels.closeHandshakes();
    else this.tunnels.closeAll();
    const deadline = performance.now() + this.init.settings.drainTimeoutMs;
    for (;;) {
      const left = deadline - performance.now();
      if (left <= 0) break;
      if (this.active > 0 || this.tunnels.size > 0) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, left);
          this.drainWaiter = () => {
            clearTimeout(timer);
            resolve();
          };
        });
        this.drainWaiter = null;
        continue;
      }
      const seen = this.started;
      await new Promise<void>((resolve) => setTimeout(resolve, Math.min(DRAIN_QUIET_MS, left)));
      // A /stats request waiting for the control plane gets its answer too (within a second).
      if (this.started === seen && this.active === 0 && this.pendingStats.size === 0) break;
    }
    const abandoned = this.active;
    // A reload's old workers (their tunnels lingered) say so: the front door itself goes on.
    this.tunnels.closeAll(lingerTunnels ? 'the front door reloaded its configuration' : undefined);
    // The hints still held are handed back (a hints file, or a reload's successor, takes them) or
    // dropped (and counted).
    const hints: SavedHint[] = [];
    for (const route of this.routes) {
      const store = route.replicas?.hints;
      if (!store) continue;
      if (keepHints) {
        for (const { node, key, request, expiresAt } of store.export()) {
          const { method, path, headers, body } = request;
          hints.push({ route: route.spec.pattern, node: route.runtime.ids[node]!, key, method, path, headers, body, expiresAt });
        }
      }
      store.close(keepHints);
    }
    this.answerUnfinished(false);
    this.closeApp();
    await Promise.all(this.runtimes.map((r) => r.close(false)));
    this.agent.close(true);
    this.histograms.destroy();
    this.slot.flush();
    await this.accessLog?.close();
    return { abandoned, hints };
  }

  /** Adds this thread's batched counts to the shared counters now. */
  flushCounters(): void {
    this.slot.flush();
  }

  /**
   * Every request still unanswered gets what a drain's deadline gives it (503, or 502
   * `LF_ERR_OUTCOME_UNKNOWN` for a bare write that may have been applied) before the connections
   * close, and so does a `/stats` request waiting for the control plane. `crashing`: the thread's
   * last word before `emergencyClose` (its clients are told, not just cut); the error it dies of
   * may have left a request half answered, so one whose answer throws is skipped (cut with the rest).
   */
  answerUnfinished(crashing: boolean): void {
    const requests: ProxyRequest[] = [];
    for (let r = this.unfinished; r !== null; r = r.next) requests.push(r);
    for (const request of requests) {
      if (!crashing) request.shutDown();
      else {
        try {
          request.shutDown();
        } catch {
          // Cut by emergencyClose.
        }
      }
    }
    const why = crashing ? "the front door's worker thread failed before the statistics arrived" : 'the front door shut down before the statistics arrived';
    for (const { res, head, closes } of this.pendingStats.values()) {
      try {
        replyJson(res, 503, errorBody(why, ErrorCodes.SHUTTING_DOWN), true, null, head, closes);
      } catch (err) {
        if (!crashing) throw err;
      }
    }
    this.pendingStats.clear();
  }

  /**
   * Synchronous last resort before the thread dies: a worker that exits holding uWS sockets
   * aborts the whole process, so close them first.
   */
  emergencyClose(): void {
    this.slot.flush();
    this.closeListenSocket();
    this.tunnels.closeAll();
    this.closeApp();
    // After the app: requests its close cut short have their lines (499) too.
    this.accessLog?.closeNow();
  }

  private closeListenSocket(): void {
    if (this.listenSocket !== null) {
      this.uws.us_listen_socket_close(this.listenSocket);
      this.listenSocket = null;
    }
  }

  private closeApp(): void {
    // Present in the native build, missing from its type definitions.
    (this.app as unknown as { close?: () => void }).close?.();
  }

  /** Re-reads the membership table when its generation moved: once per change, not per request. */
  refresh(): void {
    const generation = this.table.generation();
    if (generation === this.generation) return;
    this.generation = this.table.read(this.rows);
    for (const runtime of this.runtimes) runtime.update(this.rows);
  }

  private mount(): void {
    const app = this.app;
    // The front door's own endpoints: GET, and HEAD (the same answer without its body: uWS
    // routes HEAD apart from GET); any other method gets 405, not the proxied route or the 404.
    const own: [string, (res: HttpResponse, req: HttpRequest, head: boolean) => void][] = [
      ['/health', (res, _req, head) => this.health(res, head)],
      ['/route', (res, req, head) => this.routeInfo(res, req, head)],
      ['/stats', (res, _req, head) => this.stats(res, head)],
    ];
    // Not the hot path: each checks its framing with a pass of its own (see framing.ts), and
    // reads the connection field for an answer that echoes a close.
    const answer = (res: HttpResponse, req: HttpRequest): boolean => {
      if (framingInDoubt(req)) {
        this.dropFraming(res);
        return false;
      }
      // Its first line, as uWS reads it (a list over several lines is not looked into).
      const connection = req.getHeader('connection');
      const how = closeAsk(connection, connection.length);
      if (how !== CLOSE_NOT_ASKED) this.closeAsked(res, how);
      return true;
    };
    for (const [path, handler] of own) {
      app.get(path, (res, req) => {
        if (answer(res, req)) handler(res, req, false);
      });
      app.head(path, (res, req) => {
        if (answer(res, req)) handler(res, req, true);
      });
      app.any(path, (res, req) => {
        if (!answer(res, req)) return;
        const method = req.getCaseSensitiveMethod();
        this.refuse(res, 405, errorBody(`${path} answers GET and HEAD, not ${method}`, ErrorCodes.METHOD_NOT_ALLOWED), this.draining, ['allow', OWN_METHODS]);
      });
    }
    // WebSocket handshakes on a proxied route become tunnels; uWS passes any other request on.
    this.tunnels.mount(app, this.routes, this.respellings);
    for (const route of this.routes) app.any(route.spec.pattern, (res, req) => this.proxy(route, res, req));
    // The 404 for everything else, unless a route takes every path (uWS refuses the same
    // pattern twice: "Internal routing error").
    if (!this.routes.some((r) => r.spec.pattern === '/*')) {
      app.any('/*', (res, req) => {
        if (this.accessLog !== null) this.mayRefuse(null, req.getCaseSensitiveMethod(), req.getUrl(), clientAddress(res));
        if (!answer(res, req)) return;
        this.refuse(res, 404, errorBody('not found', ErrorCodes.NOT_FOUND), this.draining, null, req.getMethod() === 'head');
      });
    }
  }

  /**
   * Members whose health check passes, as `/stats` and `Membership.healthyIds()` say: health is
   * kept apart from capacity, so a healthy node at capacity 0 (weight 0, never routed to) is
   * listed.
   */
  private healthyIds(runtime: ClusterRuntime): string[] {
    const out: string[] = [];
    const flags = runtime.view.flags;
    for (let i = 0; i < runtime.size; i++) if ((flags[i]! & FLAG_HEALTHY) !== 0) out.push(runtime.ids[i]!);
    return out;
  }

  private health(res: HttpResponse, head: boolean): void {
    this.refresh();
    const healthy: string[] = [];
    for (const runtime of this.runtimes) healthy.push(...this.healthyIds(runtime));
    replyJson(res, 200, JSON.stringify({ ok: true, healthy }), this.draining, null, head, this.tookClose(res));
  }

  private routeInfo(res: HttpResponse, req: HttpRequest, head: boolean): void {
    this.refresh();
    // Decoded strictly here: uWS's getQuery(name) decodes a malformed escape (`%ZZ`) into some
    // other board, and would answer for it.
    const query = parseQuery(req.getQuery() ?? '');
    if (typeof query === 'string') {
      this.refuse(res, 400, errorBody(query, ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    const board = query.get('board');
    const clusterName = query.get('cluster');
    if (!board) {
      this.refuse(res, 400, errorBody('missing query parameter "board"', ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    const pattern = query.get('route');
    const route = pattern ? this.routes.find((r) => r.spec.pattern === pattern) : clusterName ? this.routes.find((r) => r.runtime.name === clusterName) : this.routes[0];
    if (!route) {
      const what = pattern ? `route "${pattern}"` : `cluster "${clusterName}"`;
      this.refuse(res, 404, errorBody(`unknown ${what}`, ErrorCodes.NOT_FOUND), this.draining, null, head);
      return;
    }
    // A key no request may carry is ranked for none: refused as the request would be. Only a key
    // header is held to MAX_KEY_LENGTH: on a route keyed by path the key is the whole path, as
    // long as a request line may be.
    if (route.spec.keyHeader !== null && board.length > MAX_KEY_LENGTH) {
      this.refuse(res, 400, errorBody(`board longer than ${MAX_KEY_LENGTH} characters`, ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    const runtime = route.runtime;
    // A look, not a request: a rotating policy's turn is not taken (the next request's is shown).
    const n = route.policy.pick(board, OP_READ, this.rankScratch, false);
    const ranking = [];
    for (let i = 0; i < n; i++) {
      const node = this.rankScratch[i]!;
      ranking.push({ id: runtime.ids[node]!, weight: runtime.view.weights[node]! });
    }
    const answer: Record<string, unknown> = { board, ranking, healthy: this.healthyIds(runtime) };
    if (route.replicas !== null) {
      // A replicated route: the key's replicas, healthy or not (stand-ins come from the ranking).
      const count = Math.min(route.replicas.settings.n, runtime.membersFor(board, this.rankScratch, route.replicas.walk));
      const replicas = [];
      for (let i = 0; i < count; i++) replicas.push({ id: runtime.ids[this.rankScratch[i]!]!, healthy: runtime.isRoutable(this.rankScratch[i]!) });
      answer.replicas = replicas;
    }
    replyJson(res, 200, JSON.stringify(answer), this.draining, null, head, this.tookClose(res));
  }

  private stats(res: HttpResponse, head: boolean): void {
    const id = this.nextStatsId++;
    this.pendingStats.set(id, { res, head, closes: this.tookClose(res) });
    res.onAborted(() => this.pendingStats.delete(id));
    this.hooks.requestStats(id);
  }

  /**
   * A coding before a final chunked (`gzip, chunked`): framed by chunked, but uWS de-chunks every
   * body, so gzip would reach the node stripped of its coding, as if it were the content: 501.
   * (Codings whose last is not chunked leave the framing in doubt: `dropFraming`.)
   */
  private refuseCodings(res: HttpResponse, codings: string, head: boolean): void {
    const reason = `transfer-encoding ${JSON.stringify(codings)} is not supported (only chunked)`;
    this.refuse(res, 501, errorBody(reason, ErrorCodes.UNSUPPORTED), true, null, head);
  }

  /**
   * @internal The front door answers a request itself (4xx or 501), counted as rejected; with the
   * access log on, the request's line (`arrival`: the request being routed, by default).
   */
  refuse(res: HttpResponse, status: number, body: string, close: boolean, extra: ExtraHeader | null = null, head = false, arrival = this.refusing): void {
    this.slot.bump(C_REJECTED);
    replyJson(res, status, body, close, extra, head, this.tookClose(res));
    this.refusing = null;
    if (arrival !== null) this.logRequest(arrival, status, null, 0, false, head ? 0 : body.length, errorCodeOf(body));
  }

  /**
   * The response object of the last request that said `connection: close` (`askedHow`: see
   * CloseAsk) and may yet get an answer of the front door's own: that answer says it too, and
   * the connection ends. Kept by response object, so it never carries over to another request.
   */
  private askedClose: HttpResponse | null = null;
  private askedHow: CloseAsk = CLOSE_NOT_ASKED;

  /** @internal The request `res` answers asked for its connection to close (see `askedClose`). */
  closeAsked(res: HttpResponse, how: CloseAsk): void {
    this.askedClose = res;
    this.askedHow = how;
  }

  /** What the request `res` answers asked of its connection; forgets it. */
  private tookClose(res: HttpResponse): CloseAsk {
    if (this.askedClose !== res) return CLOSE_NOT_ASKED;
    this.askedClose = null;
    return this.askedHow;
  }

  /**
   * A request whose framing is in doubt (framing.ts): the connection is closed at once, without
   * an answer, so that uWS reads nothing after it as a request. Counted as refused, and logged as
   * a 400 with no body.
   */
  dropFraming(res: HttpResponse, arrival = this.refusing): void {
    this.slot.bump(C_REJECTED);
    this.refusing = null;
    this.askedClose = null;
    res.close();
    if (arrival !== null) this.logRequest(arrival, 400, null, 0, false, 0, ErrorCodes.BAD_REQUEST);
  }

  /** With the access log on: what a refusal of this request, if one comes, logs. */
  private mayRefuse(route: string | null, method: string, path: string, client: string): void {
    this.refusing = { route, method, path, client, startedAt: performance.now() };
  }

  /** @internal One line of the access log (which must be on). */
  logRequest(arrival: Arrival, status: number, node: string | null, attempts: number, hedged: boolean, bytes: number, code: string | null): void {
    const { route, method, path, client, startedAt } = arrival;
    const us = Math.round((performance.now() - startedAt) * 1000);
    const j = this.logJson;
    this.accessLog!.add(
      `{"time":"${j.time()}","client":${j.client.of(client)},"method":${j.method.of(method)},"path":${logPath(path)},"route":${route === null ? 'null' : j.route.of(route)},"status":${status},"node":${node === null ? 'null' : j.node.of(node)},"attempts":${attempts},"hedged":${hedged},"bytes":${bytes},"us":${us},"error":${code === null ? 'null' : asciiJson(code)}}`,
    );
  }

  /** The access log's fields that repeat from line to line, each made once while it does. */
  private readonly logJson = {
    client: new LastJson(),
    method: new LastJson(),
    route: new LastJson(),
    node: new LastJson(),
    ms: -1,
    iso: '',
    time(): string {
      const now = Date.now();
      if (now !== this.ms) {
        this.ms = now;
        this.iso = new Date(now).toISOString();
      }
      return this.iso;
    },
  };

  /** Opens the access log's file again (`SIGUSR1`: log rotation). */
  reopenLog(): void {
    this.accessLog?.reopen();
  }

  private proxy(route: BoundRoute, res: HttpResponse, req: HttpRequest): void {
    this.refresh();
    const method = req.getCaseSensitiveMethod();
    const head = method === 'HEAD';
    const url = req.getUrl();
    const query = req.getQuery();
    const path = query ? `${url}?${query}` : url;
    const keyHeader = route.spec.keyHeader;
    if (this.accessLog !== null) this.mayRefuse(route.spec.pattern, method, url, clientAddress(res));
    // One pass over the headers picks out everything the front door reads (no getHeader call
    // per name) and collects what is forwarded.
    const tickets = route.tickets;
    scan.begin(keyHeader ?? '', tickets === null ? '' : tickets.header);
    req.forEach(scanHeader);
    // Headers the connection field names are the client's hop's only (RFC 9110 7.6.1).
    let closes: CloseAsk = CLOSE_NOT_ASKED;
    if (scan.connection !== '') {
      dropConnectionNamed(scan.connection);
      closes = closeAsk(scan.connection, scan.firstConnectionLength);
      if (closes !== CLOSE_NOT_ASKED) this.closeAsked(res, closes);
    }
    const authority = this.forwardedFor ? req.getHeader('host') : '';
    if (this.forwardedFor) addForwarded(this.refusing === null ? clientAddress(res) : this.refusing.client, authority);
    // Which of two lengths frames the body, or whether a transfer-encoding whose last coding is
    // not chunked frames it at all, is the request smuggler's question (RFC 9112 6.3): before
    // anything else, the connection is closed (framing.ts). uWS reads such a body as chunked.
    // (`chunked` alone, nearly every chunked request, is told by one compare, without a split.)
    if (scan.lengthConflict || (scan.chunked && !isChunkedOnly(scan.codings) && !chunkedLast(scan.codings))) {
      this.dropFraming(res);
      return;
    }
    // Two hosts (RFC 9112 3.2), or two keys: which one the node would read is anyone's guess.
    if (scan.doubled !== '') {
      this.refuse(res, 400, errorBody(`more than one ${scan.doubled} header`, ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    // Passed on as x-forwarded-host, a Host must be one (a node may build redirects from it).
    if (this.forwardedFor && !isHostAuthority(authority)) {
      this.refuse(res, 400, errorBody('a Host that is not host[:port] is not forwarded (x-forwarded-host)', ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    // TRACE echoes the request back: through a proxy, the client would read the headers the front
    // door adds (x-forwarded-for...) and whatever else the node is sent. CONNECT asks the node for
    // a tunnel: Node's http server drops the connection (a failed attempt: any client could get a
    // healthy node ejected with a few), another may open one. nginx answers both with 405.
    if (method === 'TRACE' || method === 'CONNECT') {
      this.refuse(res, 405, errorBody(`${method} is not forwarded`, ErrorCodes.METHOD_NOT_ALLOWED), this.draining, ['allow', route.replicas !== null ? REPLICATED_METHODS : FORWARDED_METHODS], head);
      return;
    }
    const headers = scan.headers;
    let key = '';
    if (keyHeader !== null) {
      key = scan.key;
      if (key === '') {
        this.refuse(res, 401, errorBody(`missing ${keyHeader} header`, ErrorCodes.MISSING_BOARD), this.draining, null, head);
        return;
      }
      if (key.length > MAX_KEY_LENGTH) {
        this.refuse(res, 400, errorBody(`${keyHeader} longer than ${MAX_KEY_LENGTH} characters`, ErrorCodes.BAD_REQUEST), this.draining, null, head);
        return;
      }
    }
    // A dot segment (`/a/../b`, `%2e`, between `%2F`s...): a node that resolves it serves another
    // path than the one routed here. On any route: `/public/../admin` matched `/public/*` would
    // reach a path no route sends to that cluster; a replicated key would have two spellings;
    // a write under a read prefix of the operation rules could be hedged.
    if (hasDotSegment(url)) {
      this.refuse(res, 400, errorBody('a path with a dot segment (. or ..) is not forwarded: a node that resolves it would serve another path than the one routed', ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    // An encoded NUL: a node written in C (or handing the path to one) ends the path there, and
    // serves another than the one routed (nginx refuses it so too: 400).
    if (url.indexOf('%00') >= 0) {
      this.refuse(res, 400, errorBody('a path with an encoded NUL (%00) is not forwarded: a node may end the path there', ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    // Another route's path spelled otherwise (`//admin/x`, `/%61dmin/x` under a catch-all).
    const other = respelledRoute(this.respellings, route, url);
    if (other !== null) {
      this.refuse(res, 400, errorBody(`a path that is route ${other.spec.pattern}'s spelled otherwise is not forwarded: routes match the path as sent`, ErrorCodes.BAD_REQUEST), this.draining, null, head);
      return;
    }
    let op: number;
    let retryable: boolean;
    if (route.replicas !== null) {
      op = replicatedOp(method);
      if (op < 0) {
        this.refuse(res, 405, errorBody(`${method} is not carried by a replicated route (${REPLICATED_METHODS})`, ErrorCodes.METHOD_NOT_ALLOWED), this.draining, ['allow', REPLICATED_METHODS], head);
        return;
      }
      if (keyHeader === null) key = url;
      retryable = false;
    } else if (route.classifier !== null) {
      op = route.classifier.classify(url);
      if (op === OP_UNSUPPORTED) {
        this.refuse(res, 501, errorBody(`${url} is not routed: a streaming call, and answers are relayed whole`, ErrorCodes.UNSUPPORTED), this.draining, null, head);
        return;
      }
      retryable = op === OP_READ;
    } else {
      retryable = isSafeMethod(method) || isIdempotentPath(url) || scan.idempotent;
      op = retryable ? OP_READ : OP_WRITE;
    }
    // A WebSocket handshake uWS did not take: on a replicated route (no tunnels there), or not a
    // GET, or without a valid sec-websocket-key. Forwarded as a plain request it would get the
    // node's 200 and fail. (Any other upgrade, such as h2c, is ignored, as a server may: the
    // request is served over HTTP/1.1.)
    if (scan.upgrade !== '' && /websocket/i.test(scan.upgrade)) {
      if (route.replicas !== null) this.refuse(res, 501, errorBody('a replicated route carries no WebSockets: each request goes to several replicas', ErrorCodes.UNSUPPORTED), true, null, head);
      else this.refuse(res, 400, errorBody('bad WebSocket handshake: a GET with a sec-websocket-key of 24 characters is needed', ErrorCodes.BAD_REQUEST), true, null, head);
      return;
    }
    if (scan.chunked && !isChunkedOnly(scan.codings)) {
      this.refuseCodings(res, scan.codings, head);
      return;
    }
    const contentLength = scan.contentLength;
    let expected = -1;
    if (!scan.chunked) {
      expected = contentLength === '' ? 0 : parseLength(contentLength);
      if (expected < 0) {
        this.refuse(res, 400, errorBody('bad content-length', ErrorCodes.BAD_REQUEST), true, null, head);
        return;
      }
      if (expected > this.maxBodyBytes) {
        // Closing now, with the body still arriving, resets the connection: the client's upload
        // fails (EPIPE, ECONNRESET) and the 413 is lost with it (4-7% of 1 MiB uploads here).
        // So, as nginx's lingering close: a body of a bounded size is read and dropped after
        // the answer (uWS keeps parsing it) and the connection lives on; beyond that, close.
        this.refuse(res, 413, errorBody(`request body exceeds ${this.maxBodyBytes} bytes`, ErrorCodes.BODY_TOO_LARGE), this.draining || expected > LINGER_BYTES, null, head);
        return;
      }
    }
    // A ticket that checks out pins the request to its node (if that node can take it).
    let pinned = -1;
    let renew = false;
    let region: string | null = null;
    let turn = -1;
    let ticketed = false;
    if (tickets !== null) {
      region = this.init.region;
      if (scan.ticket !== '') {
        const checked = tickets.check(scan.ticket);
        if ('node' in checked) {
          ticketed = true;
          pinned = route.runtime.indexOf(checked.node);
          renew = tickets.wearing(checked.expiresAt);
          region = checked.region ?? region;
          if (placesByTurn(route.policy)) turn = checked.turn;
        }
      }
    }
    // Counted once it reaches routing, never taken back (a rate read from /stats must not see a
    // count go down): a body refused after this (chunked past --max-body-bytes, framing dropped,
    // a stop before it came) is counted in rejected too.
    this.slot.bump(C_REQUESTS);
    const request = new ProxyRequest(this, res, route, key, method, path, headers, retryable, op, expected, pinned, renew, region, turn, ticketed);
    if (closes !== CLOSE_NOT_ASKED) {
      request.asked = closes;
      this.askedClose = null;
    }
    if (this.refusing !== null) {
      request.arrival = this.refusing;
      this.refusing = null;
    }
    this.requestStarted(request);
    res.onAborted(() => request.onAborted());
    if (expected === 0) request.start();
    else res.onData((chunk, isLast) => request.onChunk(chunk, isLast));
  }
}

/**
 * `--forwarded-for append`, after the scan (which it leaves alone, so that costs nothing when
 * off): as nginx's $proxy_add_x_forwarded_for, the client's own list then its address; the
 * scheme and the host the front door saw, in place of the client's claims.
 */
function addForwarded(client: string, host: string): void {
  const h = scan.headers;
  let list = '';
  for (let i = 0; i < h.length; ) {
    const name = h[i]!;
    if (name === 'x-forwarded-for' || name === 'x-forwarded-proto' || name === 'x-forwarded-host') {
      const value = h[i + 1]!;
      if (name === 'x-forwarded-for' && value !== '') list = list === '' ? value : `${list}, ${value}`;
      h.splice(i, 2);
    } else i += 2;
  }
  h.push('x-forwarded-for', list === '' ? client : `${list}, ${client}`, 'x-forwarded-proto', 'http');
  if (host !== '') h.push('x-forwarded-host', host);
}

/** Takes the headers a request's `connection` field lists out of what is forwarded. */
function dropConnectionNamed(list: string): void {
  const named = connectionNamed(list);
  if (named === null) return;
  const h = scan.headers;
  for (let i = 0; i < h.length; ) {
    if (named.includes(h[i]!)) h.splice(i, 2);
    else i += 2;
  }
}

/**
 * What one pass over a request's headers found. Module state, filled by `scanHeader` during
 * `req.forEach` (one function for every request, not a closure each).
 */
const scan = {
  keyHeader: '',
  /** The route's affinity ticket header ('' when it has none), and the ticket found. */
  ticketHeader: '',
  ticket: '',
  ticketLines: 0,
  headers: [] as string[],
  key: '',
  contentLength: '',
  /** A content-length line came (its value may be empty), and two with different values. */
  lengthSeen: false,
  lengthConflict: false,
  chunked: false,
  /** The transfer-encoding list ('' when none). */
  codings: '',
  /** The upgrade header ('' when none). */
  upgrade: '',
  /** The connection header's list ('' when none), and its first line's length (-1: none). */
  connection: '',
  firstConnectionLength: -1,
  idempotent: false,
  idempotentSeen: false,
  hostSeen: false,
  keySeen: false,
  /** A header that may come once and came again ('' when none): host, or the route's key header. */
  doubled: '',
  begin(keyHeader: string, ticketHeader: string): void {
    this.keyHeader = keyHeader;
    this.ticketHeader = ticketHeader;
    this.ticket = '';
    this.ticketLines = 0;
    this.headers = [];
    this.key = '';
    this.contentLength = '';
    this.lengthSeen = false;
    this.lengthConflict = false;
    this.chunked = false;
    this.codings = '';
    this.upgrade = '';
    this.connection = '';
    this.firstConnectionLength = -1;
    this.idempotent = false;
    this.idempotentSeen = false;
    this.hostSeen = false;
    this.keySeen = false;
    this.doubled = '';
  },
};

/**
 * uWS hands names in lower case, and rejects a request whose header values hold a CR, LF, NUL or
 * other control byte before any handler runs (tested: a value cannot write its own header line
 * upstream). Hop-by-hop headers (see DROPPED_REQUEST_HEADERS) are not forwarded.
 */
function scanHeader(name: string, value: string): void {
  // By length first: most names are ruled out without comparing a character. The names here are
  // DROPPED_REQUEST_HEADERS (a test keeps the two lists the same).
  switch (name.length) {
    case 2:
      if (name === 'te') return;
      break;
    case 4:
      if (name === 'host') {
        if (scan.hostSeen) scan.doubled = name;
        scan.hostSeen = true;
        return;
      }
      break;
    case 6:
      if (name === 'expect') return;
      break;
    case 7:
      if (name === 'trailer') return;
      if (name === 'upgrade') {
        scan.upgrade = value;
        return;
      }
      break;
    case 10:
      if (name === 'connection') {
        if (scan.firstConnectionLength < 0) scan.firstConnectionLength = value.length;
        scan.connection = scan.connection === '' ? value : `${scan.connection}, ${value}`;
        return;
      }
      if (name === 'keep-alive') return;
      break;
    case 14:
      if (name === 'content-length') {
        if (scan.lengthSeen && scan.contentLength !== value) scan.lengthConflict = true;
        scan.lengthSeen = true;
        scan.contentLength = value;
        return;
      }
      break;
    case 16:
      if (name === 'proxy-connection') return;
      break;
    case 17:
      if (name === 'transfer-encoding') {
        // Every field line, joined as one list (an empty one too); checked in `proxy`.
        scan.codings = scan.chunked ? `${scan.codings}, ${value}` : value;
        // Present at all, uWS reads a chunked body (even for an empty value).
        scan.chunked = true;
        return;
      }
      break;
    case 18:
      if (name === 'proxy-authenticate') return;
      break;
    case 19:
      if (name === 'proxy-authorization') return;
      break;
    case 22:
      // One line saying 1: two lines read together say "1, 0" or "1, 1", which is not 1 (as
      // contract.ts's isRetryable reads them): a write in doubt is a bare write, sent once.
      if (name === IDEMPOTENT_HEADER) {
        scan.idempotent = value === '1' && !scan.idempotentSeen;
        scan.idempotentSeen = true;
      }
      break;
  }
  if (name.length === scan.keyHeader.length && name === scan.keyHeader) {
    if (scan.keySeen) scan.doubled = name;
    scan.keySeen = true;
    scan.key = value;
  }
  // The ticket is the front door's business: not forwarded.
  if (name.length === scan.ticketHeader.length && name === scan.ticketHeader) {
    // Two ticket lines are none: which one the client meant cannot be told.
    scan.ticket = scan.ticketLines === 0 ? value : '';
    scan.ticketLines++;
    return;
  }
  scan.headers.push(name, value);
}

/** A request as the access log sees it when it comes (`route` null: no route took it, a 404). */
interface Arrival {
  readonly route: string | null;
  readonly method: string;
  /** Without its query, which may carry a token. */
  readonly path: string;
  /** The client's address. */
  readonly client: string;
  /** performance.now() at its arrival. */
  readonly startedAt: number;
}

/**
 * A path as the access log writes it: cut to its first LOG_PATH_CHARS characters (and marked so)
 * when longer, so a line stays under 4 KiB, which lands whole in a pipe.
 */
function logPath(path: string): string {
  return path.length <= LOG_PATH_CHARS ? asciiJson(path) : `${asciiJson(path.slice(0, LOG_PATH_CHARS))},"truncated":true`;
}
/** At most six bytes a character once escaped: 1,536 bytes of path at most in a line. */
const LOG_PATH_CHARS = 256;

/** The `LF_ERR_*` code of an error body the front door answered with (`errorBody`), or null. */
function errorCodeOf(body: string): string | null {
  const match = ERROR_CODE.exec(body);
  return match === null ? null : match[1]!;
}
const ERROR_CODE = /"code":"(LF_ERR_[A-Z_]+)"/;

/** `asciiJson` of the text last asked for, kept: a field's value often repeats from line to line. */
class LastJson {
  private text = '';
  private json = '""';

  of(text: string): string {
    if (text !== this.text) {
      this.text = text;
      this.json = asciiJson(text);
    }
    return this.json;
  }
}

