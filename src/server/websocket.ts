/**
 * WebSocket proxying: a client's WebSocket on a proxied route becomes a tunnel to one node.
 *
 * - Placement: the route's policy ranks the nodes for the handshake's key (the route's key
 *   header), as for a read. The handshake is tried down the ranking: a node that refuses, resets,
 *   times out, answers 502/503/504 or picks a subprotocol nobody offered is passed over (a
 *   handshake is a GET, safe to repeat); 502 when every node was. Any other answer that is not
 *   a 101 is relayed to the client as it is, and so is a 503 with a `Retry-After` from the node
 *   the client's ticket names (it sheds load, and the client's session is there: seed 004).
 * - The node gets the path as the client sent it; a path with a dot segment is refused (400): a
 *   node that resolves it would serve another path than the one routed (and classified).
 * - The client is upgraded only once the node has accepted, with the subprotocol the node chose
 *   (none when it chose none). No compression on either side.
 * - Messages are relayed in order, text as text and binary as binary, up to `maxBodyBytes` each.
 *   Close codes travel both ways (1005 and 1006, which are never sent, as a close without a code
 *   and as a cut connection).
 * - Backpressure: while the client is behind by more than 1 MiB (a quarter of the backlog limit
 *   when that is less), the node's socket is not read; a client that lets `--ws-backlog-bytes`
 *   (16 MiB) pile up towards the node (or the node towards the client) is closed with 1013,
 *   rather than either side's messages being dropped.
 * - Bulk: a client's messages after the first in a loop turn go to the node in one write at the
 *   turn's end (ws-upstream.ts, `endTurn`); the messages of one read from the node go to the
 *   client in one corked write (`deliver`).
 * - On a stop's drain, every tunnel is closed with 1001 (going away) on both sides; on a reload's,
 *   tunnels run on until they close or the drain's deadline (then 1001). Either way a handshake
 *   still waiting for its node is answered 503.
 *
 * Upstream client: `WsUpstream` (src/forward/ws-upstream.ts), a small RFC 6455 client that reads
 * into one buffer per thread and masks a client's message straight from uWS's buffer.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import type { HttpRequest, HttpResponse, TemplatedApp, WebSocket as ClientSocket, us_socket_context_t } from 'uWebSockets.js';
import { DROPPED_REQUEST_HEADERS, MAX_KEY_LENGTH, SERVED_BY_HEADER, hasDotSegment, isHostAuthority } from '../contract.js';
import { respelledRoute, type RouteMatcher } from './route-match.js';
import { MAX_CANDIDATES, isGatewayFailure, retryAfterSeconds, soonerWait } from '../forward/exchange.js';
import { WsUpstream, type WsUpstreamHandler } from '../forward/ws-upstream.js';
import { connectionNamed } from '../forward/fields.js';
import { ErrorCodes, errorBody } from '../errors.js';
import { C_REQUESTS, C_WEBSOCKETS, N_ATTEMPTS, N_FAILURES, type CounterSlot } from '../metrics/counters.js';
import { pinFirst, placeClient, placesByTurn, type Policy } from '../policies/types.js';
import { TICKET_PROTOCOL_PREFIX, type TicketBook } from '../affinity/tickets.js';
import type { ClusterRuntime } from './cluster-runtime.js';
import type { ExtraHeader } from './front.js';
import type { OperationClassifier } from './operations.js';
import { OP_READ, OP_UNSUPPORTED, type NodeSpec, type RouteSpec } from './protocol.js';
import { statusBytes } from './relay.js';
import { clientAddress } from './client-address.js';
import { framingInDoubt } from './framing.js';

/** The ticket's own node: passed over as any other, except when it sheds load (503 + Retry-After). */
function passOverOwnNode(status: number, headers: ReadonlyMap<string, string>): boolean {
  return isGatewayFailure(status) && !(status === 503 && headers.has('retry-after'));
}

/** `WsUpstream.state` of an open socket. */
const OPEN = 1;

/**
 * Stop reading the node while the client is this far behind (at most; a quarter of the backlog
 * limit when that is less); read again below a quarter of that.
 */
const CLIENT_HIGH_WATER = 1024 * 1024;
/**
 * Liveness of the node's side: a node out of the rankings (a failed health probe, unreachable,
 * ejected) has its quiet tunnels pinged after this long, and closed without an answer within
 * `OUT_PONG_WAIT_MS`; a node in them, after `wsPingMs` each (see `sweep`).
 */
const OUT_PING_AFTER_MS = 2_000;
const OUT_PONG_WAIT_MS = 5_000;
/** Largest body of a non-101 answer relayed from a node. */
const MAX_RELAYED_BODY = 64 * 1024;
/** Request headers the handshake to the node does not carry (it makes its own). */
const HANDSHAKE_HEADERS: ReadonlySet<string> = new Set(['sec-websocket-key', 'sec-websocket-version', 'sec-websocket-extensions', 'sec-websocket-protocol']);

export interface TunnelRoute {
  readonly spec: RouteSpec;
  readonly runtime: ClusterRuntime;
  readonly policy: Policy;
  readonly classifier: OperationClassifier | null;
  readonly tickets: TicketBook | null;
  /** Per region, the next turn among its nodes (affinity placement on a round robin). */
  readonly turns: Int32Array;
}

/** What the tunnels need of the worker front. */
export interface TunnelHost {
  readonly slot: CounterSlot;
  readonly nodes: readonly NodeSpec[];
  readonly maxMessageBytes: number;
  readonly handshakeTimeoutMs: number;
  /** A tunnel's node quiet this long is pinged, and the tunnel closed (1011) without an answer as long again; 0: never. */
  readonly wsPingMs: number;
  /** Backpressure either way past which a tunnel is closed (1013) rather than a message dropped. */
  readonly wsBacklogBytes: number;
  readonly draining: boolean;
  /** The front door's own region (affinity placement), or null. */
  readonly region: string | null;
  /** `--forwarded-for append`: x-forwarded-for, -proto and -host to the nodes. */
  readonly forwardedFor: boolean;
  /** Re-reads the membership table if it changed. */
  refresh(): void;
  /** Answers a request itself (counted as rejected), with one more header line if given. */
  refuse(res: HttpResponse, status: number, body: string, close: boolean, extra?: ExtraHeader | null): void;
  /** Closes the connection of a request whose framing is in doubt, unanswered (framing.ts). */
  dropFraming(res: HttpResponse): void;
  /** The last open tunnel has closed (a drain waiting for them goes on). */
  tunnelsClosed(): void;
}

interface Tunnel {
  readonly upstream: WsUpstream;
  /** The node's cluster and its index there: whether it is still in the rankings. */
  readonly runtime: ClusterRuntime;
  readonly node: number;
  /** Liveness (see `sweep`): the node's reads seen at the last sweep, since when none came, when a ping went unanswered so far (-1: none). */
  seenReads: number;
  quietSince: number;
  pingAt: number;
  /** The first message to the client (its affinity ticket), or null. */
  greeting: string | null;
  client: ClientSocket<{ tunnel: Tunnel }> | null;
  /** Messages from the node before the client's socket opened. */
  early: [Buffer, boolean][] | null;
  clientClosed: boolean;
  upstreamClosed: boolean;
  /** Inside `deliver`'s cork; an end asked for meanwhile (code and reason), done after it. */
  delivering: boolean;
  ending: [number, string | Buffer] | null;
}

/** What uWS 20.30 says (with 1006) when it cuts a client, and what the node is closed with then. */
const CLIENT_FAULTS: ReadonlyMap<string, readonly [number, string]> = new Map([
  ['Received invalid UTF-8', [1007, 'the client sent a text message that is not UTF-8']],
  ['Received too big message', [1009, 'the client sent a message over the limit']],
  ['WebSocket timed out from inactivity', [1001, 'the client stopped answering']],
]);

/** The status uWS's `upgrade` writes: written first, header lines may follow it. */
const SWITCHING_PROTOCOLS = '101 Switching Protocols';

/**
 * Writes a node's handshake answer's header lines that are the client's: not hop-by-hop ones
 * (those the node's connection field names included), nor framing, its own served-by or ticket
 * header, nor a date or uWS's mark (uWS writes its own), nor, on a 101 (`upgrade`), the
 * handshake's (uWS writes the accept and the subprotocol itself).
 */
function writeNodeHeaders(res: HttpResponse, fields: readonly (readonly [string, string])[], ticketHeader: string | null, upgrade: boolean): void {
  let connection = '';
  for (const [name, value] of fields) if (name === 'connection') connection = connection === '' ? value : `${connection}, ${value}`;
  const named = connectionNamed(connection);
  for (const [name, value] of fields) {
    if (name === 'date' || name === 'content-length' || name === 'uwebsockets' || name === SERVED_BY_HEADER || name === ticketHeader || DROPPED_REQUEST_HEADERS.has(name) || named?.includes(name)) continue;
    if (upgrade && name.startsWith('sec-websocket-')) continue;
    // Read as latin1: written back as the same bytes (a string would go out as UTF-8).
    res.writeHeader(name, Buffer.from(value, 'latin1'));
  }
}

/** A close code that may be sent in a close frame (RFC 6455 7.4). */
function sendable(code: number): boolean {
  return (code >= 1000 && code <= 1003) || (code >= 1007 && code <= 1014) || (code >= 3000 && code <= 4999);
}

/** Ends a client's socket with `code` (1006: cut; a code that cannot be sent: no code). */
function endSocket(client: ClientSocket<{ tunnel: Tunnel }>, code: number, reason: string | Buffer): void {
  if (code === 1006) client.close();
  else if (sendable(code)) client.end(code, reason);
  else client.end();
}

export class WebSocketTunnels {
  private readonly open = new Set<Tunnel>();
  /** Runs while a tunnel is open (`sweep`). */
  private sweeper: NodeJS.Timeout | null = null;
  /** Handshakes waiting for a node: each answers 503 when called (drain). */
  private readonly pending = new Set<() => void>();
  /** The routes by pattern, to refuse another route's path spelled otherwise (route-match.ts); null: one route. */
  private respellings: RouteMatcher<TunnelRoute> | null = null;

  /** Per node (global index): its `ws:`/`wss:` origin, worked out once. */
  private readonly origins: readonly string[];

  /** What may wait either way (`--ws-backlog-bytes`), and the client's marks for reading its node. */
  private readonly backlogLimit: number;
  private readonly highWater: number;
  private readonly lowWater: number;

  constructor(private readonly host: TunnelHost) {
    this.origins = host.nodes.map((node) => new URL(node.url).origin.replace(/^http/, 'ws'));
    this.backlogLimit = host.wsBacklogBytes;
    this.highWater = Math.min(CLIENT_HIGH_WATER, Math.floor(this.backlogLimit / 4));
    this.lowWater = Math.floor(this.highWater / 4);
  }

  /**
   * Takes WebSocket handshakes on every proxied route; other requests fall through to `any`.
   * `respellings`: the front door's routes by pattern (null: one route), read as for requests.
   */
  mount(app: TemplatedApp, routes: readonly TunnelRoute[], respellings: RouteMatcher<TunnelRoute> | null): void {
    this.respellings = respellings;
    for (const route of routes) {
      // A replicated route's requests go to several replicas at once: no tunnel to one of them
      // (its plain handler refuses the handshake).
      if (route.spec.quorum !== null) continue;
      app.ws<{ tunnel: Tunnel }>(route.spec.pattern, {
        maxPayloadLength: this.host.maxMessageBytes,
        // No limit of uWS's own: past it uWS 20.30 drops the close frame too, and shuts the socket
        // down at once (end() takes DROPPED for sent), cutting what waited mid-frame. The backlog
        // limit is kept in `toClient`, so the 1013 goes out after what waits.
        maxBackpressure: 0,
        upgrade: (res, req, context) => this.handshake(route, res, req, context),
        open: (ws) => this.opened(ws),
        message: (ws, message, isBinary) => this.fromClient(ws.getUserData().tunnel, message, isBinary),
        drain: (ws) => {
          const tunnel = ws.getUserData().tunnel;
          if (tunnel.upstream.isPaused && ws.getBufferedAmount() < this.lowWater) tunnel.upstream.resume();
        },
        close: (ws, code, message) => this.clientClosed(ws.getUserData().tunnel, code, message),
      });
    }
  }

  /** Tunnels open now. */
  get size(): number {
    return this.open.size;
  }

  /** Handshakes still waiting for their node are answered 503 (a drain). */
  closeHandshakes(): void {
    for (const shutDown of [...this.pending]) shutDown();
    this.pending.clear();
  }

  /**
   * Closes every tunnel: 1001 (going away) to both ends, with `reason`; handshakes in flight get
   * 503.
   */
  closeAll(reason = 'the front door is shutting down'): void {
    this.closeHandshakes();
    for (const tunnel of [...this.open]) {
      this.closeUpstream(tunnel, 1001, reason);
      this.endClient(tunnel, 1001, reason);
    }
  }

  private handshake(route: TunnelRoute, res: HttpResponse, req: HttpRequest, context: us_socket_context_t): void {
    // uWS takes any GET with a 24-character sec-websocket-key for a handshake. Without
    // `upgrade: websocket` it is not one: the route's plain handler gets it.
    if (!/websocket/i.test(req.getHeader('upgrade'))) {
      req.setYield(true);
      return;
    }
    const host = this.host;
    // Before any refusal: its framing in doubt, the connection is closed unanswered (framing.ts).
    if (framingInDoubt(req)) {
      host.dropFraming(res);
      return;
    }
    host.refresh();
    // Everything is read from `req` now: it is gone once this handler returns.
    const url = req.getUrl();
    const query = req.getQuery();
    const path = query ? `${url}?${query}` : url;
    const secKey = req.getHeader('sec-websocket-key');
    const tickets = route.tickets;
    const keyHeader = route.spec.keyHeader;
    const key = keyHeader === null ? '' : req.getHeader(keyHeader);
    // No prototype: a header named `constructor` or `__proto__` is just a header.
    const headers = Object.create(null) as Record<string, string>;
    let connection = '';
    let hosts = 0;
    let keys = 0;
    // The subprotocol offer: every line of it, as one list (RFC 6455 11.3.4).
    let offered = '';
    let ticketLines = 0;
    req.forEach((name, value) => {
      if (name === tickets?.header) ticketLines++;
      if (name === 'connection') connection = connection === '' ? value : `${connection}, ${value}`;
      else if (name === 'host') hosts++;
      else if (name === keyHeader) keys++;
      else if (name === 'sec-websocket-protocol') offered = offered === '' ? value : `${offered}, ${value}`;
      if (DROPPED_REQUEST_HEADERS.has(name) || HANDSHAKE_HEADERS.has(name) || name === tickets?.header) return;
      // Two field lines are one list; cookies are joined as one cookie line (RFC 9113 8.2.3).
      headers[name] = name in headers ? `${headers[name]}${name === 'cookie' ? '; ' : ', '}${value}` : value;
    });
    // An affinity ticket comes as a header or, from a browser, as an offered subprotocol. Two
    // ticket lines are none (as for a request: which one the client meant cannot be told).
    const ticket = tickets === null || ticketLines !== 1 ? '' : req.getHeader(tickets.header);
    let offeredTicket = '';
    let ticketProtocol = '';
    if (tickets !== null && offered.includes(TICKET_PROTOCOL_PREFIX)) {
      const rest: string[] = [];
      for (const item of offered.split(',')) {
        const p = item.trim();
        if (p.startsWith(TICKET_PROTOCOL_PREFIX)) {
          // The first ticket offered is the one read and the one selected back; any other is
          // dropped (offered to nobody).
          if (ticketProtocol !== '') continue;
          ticketProtocol = p;
          offeredTicket = p.slice(TICKET_PROTOCOL_PREFIX.length);
        } else if (p !== '') rest.push(p);
      }
      offered = rest.join(', ');
    }
    // Headers the connection field names are the client's hop's only (RFC 9110 7.6.1).
    for (const name of connectionNamed(connection) ?? []) delete headers[name];
    const authority = host.forwardedFor ? req.getHeader('host') : '';
    if (host.forwardedFor) {
      // As for a request (front.ts): the client's own list, then its address.
      const client = clientAddress(res);
      const list = headers['x-forwarded-for'];
      headers['x-forwarded-for'] = list === undefined || list.trim() === '' ? client : `${list}, ${client}`;
      headers['x-forwarded-proto'] = 'http';
      headers['x-forwarded-host'] = authority;
    }
    if (host.draining) {
      host.refuse(res, 503, errorBody('the front door is shutting down', ErrorCodes.SHUTTING_DOWN), true);
      return;
    }
    // As for a plain request (front.ts): which of two the node would read is anyone's guess.
    if (hosts > 1 || keys > 1) {
      host.refuse(res, 400, errorBody(`more than one ${hosts > 1 ? 'host' : keyHeader} header`, ErrorCodes.BAD_REQUEST), false);
      return;
    }
    if (host.forwardedFor && !isHostAuthority(authority)) {
      host.refuse(res, 400, errorBody('a Host that is not host[:port] is not forwarded (x-forwarded-host)', ErrorCodes.BAD_REQUEST), false);
      return;
    }
    if (keyHeader !== null && key === '') {
      host.refuse(res, 401, errorBody(`missing ${keyHeader} header`, ErrorCodes.MISSING_BOARD), false);
      return;
    }
    if (key.length > MAX_KEY_LENGTH) {
      host.refuse(res, 400, errorBody(`${keyHeader} longer than ${MAX_KEY_LENGTH} characters`, ErrorCodes.BAD_REQUEST), false);
      return;
    }
    // A node that resolves dot segments would serve another path than the one routed (and
    // classified), as for plain requests on routes with operation rules.
    if (hasDotSegment(url)) {
      host.refuse(res, 400, errorBody('a WebSocket path with a dot segment (. or ..) is not routed', ErrorCodes.BAD_REQUEST), false);
      return;
    }
    // As for a plain request (front.ts): a node may end the path at an encoded NUL.
    if (url.indexOf('%00') >= 0) {
      host.refuse(res, 400, errorBody('a WebSocket path with an encoded NUL (%00) is not routed', ErrorCodes.BAD_REQUEST), false);
      return;
    }
    const other = respelledRoute(this.respellings, route, url);
    if (other !== null) {
      host.refuse(res, 400, errorBody(`a WebSocket path that is route ${other.spec.pattern}'s spelled otherwise is not routed`, ErrorCodes.BAD_REQUEST), false);
      return;
    }
    if (route.classifier !== null && route.classifier.classify(url) === OP_UNSUPPORTED) {
      host.refuse(res, 501, errorBody(`${url} is not routed`, ErrorCodes.UNSUPPORTED), false);
      return;
    }
    const runtime = route.runtime;
    const ranking = new Int32Array(runtime.size);
    // The client's region (its ticket's, else the front door's): placed anew, it goes there first.
    let region = tickets === null ? null : host.region;
    let pin = -1;
    // A ticket's client on a rotating route takes its own turn, as its requests do (front.ts).
    let turn = -1;
    if (tickets !== null && (ticket !== '' || offeredTicket !== '')) {
      // The header's ticket first; one that does not check out gives way to the offered one.
      let checked = ticket !== '' ? tickets.check(ticket) : null;
      if ((checked === null || !('node' in checked)) && offeredTicket !== '') checked = tickets.check(offeredTicket);
      if (checked !== null && 'node' in checked) {
        pin = runtime.indexOf(checked.node);
        region = checked.region ?? region;
        if (placesByTurn(route.policy)) turn = checked.turn;
      }
    }
    // A ticket holder placed by its own turn takes none of the route's rotation (front.ts).
    let count = Math.min(route.policy.pick(key, OP_READ, ranking, turn < 0), MAX_CANDIDATES);
    if (count === 0) {
      host.refuse(res, 503, errorBody('no healthy node', ErrorCodes.NO_HEALTHY_NODE), false);
      return;
    }
    const regionIndex = runtime.regionIndex(region);
    if (turn >= 0 || regionIndex >= 0) placeClient(ranking, count, pin, turn, runtime.regionOf, regionIndex, route.policy, route.turns, runtime.nodeKeys);
    if (pin >= 0) {
      // A routable node past the candidates held goes in front of them (the last drops out).
      const pinned = pinFirst(ranking, count, pin, runtime.view.weights[pin]! > 0);
      if (pinned >= 0) count = Math.min(pinned, MAX_CANDIDATES);
    }
    host.slot.bump(C_REQUESTS);
    if (offered !== '') headers['sec-websocket-protocol'] = offered;
    let aborted = false;
    let current: WsUpstream | null = null;
    res.onAborted(() => {
      aborted = true;
      this.pending.delete(shutDown);
      current?.terminate();
    });
    /** Drain: a handshake still waiting for its node is answered 503 now (see `closeAll`). */
    const shutDown = (): void => {
      if (aborted) return;
      aborted = true;
      current?.terminate();
      host.refuse(res, 503, errorBody('the front door is shutting down', ErrorCodes.SHUTTING_DOWN), true);
    };
    this.pending.add(shutDown);
    const ticketHeader = tickets === null ? null : tickets.header;
    /** The soonest Retry-After of the nodes passed over for shedding load (503 with one), or -1. */
    let retryAfter = -1;
    const passOverShedding = (status: number, fields: ReadonlyMap<string, string>): boolean => {
      if (!isGatewayFailure(status)) return false;
      const wait = status === 503 ? fields.get('retry-after') : undefined;
      if (wait !== undefined) retryAfter = soonerWait(retryAfter, retryAfterSeconds(wait, Date.now()));
      return true;
    };
    const attempt = (ordinal: number): void => {
      const node = ranking[ordinal]!;
      const g = runtime.globalIndex[node]!;
      host.slot.bumpNode(g, N_ATTEMPTS);
      /** This node cannot take the socket: the next one is tried, or 502 after the last. */
      const failed = (reason: string): void => {
        current = null;
        // Refused or not connected in time: out of every ranking for a while, as for a request.
        runtime.failedWith(node, reason);
        if (aborted) return;
        host.slot.bumpNode(g, N_FAILURES);
        if (ordinal + 1 < count) attempt(ordinal + 1);
        else {
          this.pending.delete(shutDown);
          // Nodes that shed load said when to come back: so does the answer (as for a request).
          if (retryAfter >= 0) host.refuse(res, 503, errorBody(`every candidate node failed the WebSocket handshake, and the nodes that answered are shedding load: retry after ${retryAfter} s`, ErrorCodes.NODES_SHEDDING), false, ['retry-after', String(retryAfter)]);
          else host.refuse(res, 502, errorBody('every candidate node failed the WebSocket handshake', ErrorCodes.ALL_CANDIDATES_FAILED), false);
        }
      };
      const handshake: WsUpstreamHandler = {
        onFailed: failed,
        onRefused: (status, fields, body) => {
          current = null;
          if (aborted) return;
          this.pending.delete(shutDown);
          if (body === null) {
            host.refuse(res, 502, errorBody(`the node refused the WebSocket with a ${status} whose body is over ${MAX_RELAYED_BODY} bytes, too large to relay`, ErrorCodes.ALL_CANDIDATES_FAILED), false);
          } else this.relayRefusal(res, status, fields, body, runtime.ids[node]!, ticketHeader);
        },
        onOpen: (protocol, fields) => {
          current = null;
          this.pending.delete(shutDown);
          if (aborted) {
            upstream.terminate();
            return;
          }
          const tunnel = this.tunnel(upstream, runtime, node);
          // The first message down the socket is the ticket naming the node it reached.
          if (tickets !== null) tunnel.greeting = JSON.stringify({ t: 'affinity', ticket: tickets.mint(runtime.ids[node]!, region) });
          // A browser that offered only its ticket fails a handshake that selects nothing.
          const selected = protocol === '' ? ticketProtocol : protocol;
          // The node's own header lines go with the 101 (a session cookie set at the upgrade,
          // RFC 6455 4.2.2); uWS writes the handshake's.
          res.cork(() => {
            res.writeStatus(SWITCHING_PROTOCOLS);
            writeNodeHeaders(res, fields, ticketHeader, true);
            res.upgrade({ tunnel }, secKey, selected, '', context);
          });
        },
        // Until it opens, nothing else comes; then the tunnel takes the socket's events.
        onMessage: () => {},
        onClose: () => {},
      };
      // The node's origin and the path as the client sent it (no URL resolution).
      const upstream = new WsUpstream(
        // A node that cannot serve now (502, 503, 504) is passed over at its status line; the
        // client's own node (its ticket's) that sheds load (503 with a Retry-After) is relayed.
        { origin: this.origins[g]!, path, headers, handshakeTimeoutMs: host.handshakeTimeoutMs, maxPayload: host.maxMessageBytes, maxRefusalBytes: MAX_RELAYED_BODY, passOver: ordinal === 0 && node === pin ? passOverOwnNode : passOverShedding },
        handshake,
      );
      current = upstream;
    };
    attempt(0);
  }

  /** A node's answer other than 101, relayed (hop-by-hop and uWS's own headers dropped). */
  private relayRefusal(res: HttpResponse, status: number, fields: readonly (readonly [string, string])[], body: Buffer, servedBy: string, ticketHeader: string | null): void {
    res.cork(() => {
      res.writeStatus(statusBytes(status));
      writeNodeHeaders(res, fields, ticketHeader, false);
      res.writeHeader(SERVED_BY_HEADER, servedBy);
      res.end(body);
    });
  }

  /** A tunnel around a node's open socket; the client side is attached when uWS opens it. */
  private tunnel(upstream: WsUpstream, runtime: ClusterRuntime, node: number): Tunnel {
    const tunnel: Tunnel = { upstream, runtime, node, seenReads: upstream.reads, quietSince: performance.now(), pingAt: -1, greeting: null, client: null, early: null, clientClosed: false, upstreamClosed: false, delivering: false, ending: null };
    this.open.add(tunnel);
    this.host.slot.bump(C_WEBSOCKETS);
    if (this.sweeper === null && this.host.wsPingMs > 0) {
      // A tenth of the wait, within 50 ms - 1 s: a quiet node is pinged, and given up on, close to its time.
      const every = Math.min(1_000, Math.max(50, Math.floor(Math.min(this.host.wsPingMs, OUT_PING_AFTER_MS) / 10)));
      // Judged after the loop's next poll (setImmediate), so that a pong already in a socket is
      // read first: a worker that was stalled must not give up on nodes that did answer.
      this.sweeper = setInterval(() => setImmediate(this.sweep), every).unref();
    }
    upstream.setHandler({
      onOpen: () => {},
      onRefused: () => {},
      onFailed: () => {},
      deliver: (run) => {
        // Every message of the node's read in one write to the client.
        const client = tunnel.client;
        if (client === null || tunnel.clientClosed) {
          run();
          return;
        }
        // An end inside a cork sends the close frame but not the FIN (uWS 20.30 shuts the socket
        // down only at an end outside a cork): one asked for meanwhile is done after it.
        tunnel.delivering = true;
        client.cork(run);
        tunnel.delivering = false;
        const ending = tunnel.ending;
        if (ending !== null) {
          tunnel.ending = null;
          endSocket(client, ending[0], ending[1]);
        }
      },
      onMessage: (data, isBinary) => {
        if (tunnel.clientClosed) return;
        // `data` may view the read buffer: a message kept for later is copied.
        if (tunnel.client === null) (tunnel.early ??= []).push([Buffer.from(data), isBinary]);
        else this.toClient(tunnel, data, isBinary);
      },
      onClose: (code, reason, violation) => {
        tunnel.upstreamClosed = true;
        this.forget(tunnel);
        // The node broke the protocol (a message too large, bad UTF-8 ...): its side was closed
        // with the matching code, and the client is told the same, not a bare cut (1006).
        // A message over --max-body-bytes is the limit's doing, not a breach: named as the client's is.
        this.endClient(tunnel, code, violation ? (code === 1009 ? 'the node sent a message over the limit' : 'the node broke the WebSocket protocol') : reason);
      },
    });
    return tunnel;
  }

  /** Ends the client's side with `code` (1006: cut; a code that cannot be sent: no code). */
  private endClient(tunnel: Tunnel, code: number, reason: string | Buffer): void {
    const client = tunnel.client;
    if (client === null || tunnel.clientClosed) return;
    tunnel.clientClosed = true;
    if (tunnel.delivering && code !== 1006) tunnel.ending = [code, reason];
    else endSocket(client, code, reason);
  }

  private opened(ws: ClientSocket<{ tunnel: Tunnel }>): void {
    const tunnel = ws.getUserData().tunnel;
    tunnel.client = ws;
    if (tunnel.greeting !== null) ws.send(tunnel.greeting, false);
    const early = tunnel.early;
    tunnel.early = null;
    if (early !== null) for (const [data, isBinary] of early) this.toClient(tunnel, data, isBinary);
    // The node may have closed between its handshake and this open.
    if (tunnel.upstreamClosed) this.endClient(tunnel, 1011, 'the node closed the connection');
  }

  private toClient(tunnel: Tunnel, data: Buffer, isBinary: boolean): void {
    if (tunnel.clientClosed) return;
    const client = tunnel.client!;
    // The limit is checked before the send, as uWS's own was: what waits, not this message.
    if (client.getBufferedAmount() > this.backlogLimit || client.send(data, isBinary) === 2) {
      // Dropped (past the backlog limit): never lose a message silently.
      this.overloaded(tunnel);
      return;
    }
    if (!tunnel.upstream.isPaused && client.getBufferedAmount() > this.highWater) tunnel.upstream.pause();
  }

  private fromClient(tunnel: Tunnel, message: ArrayBuffer, isBinary: boolean): void {
    const upstream = tunnel.upstream;
    if (tunnel.upstreamClosed || upstream.state !== OPEN) return;
    // A node this far behind with the message is closed rather than buffered for without end.
    // What waits before the message counts, not the message itself: one larger than the limit
    // (up to --max-body-bytes) passes when the node has taken everything before it (checked
    // after the write, the part the kernel had not yet taken of a 16 MiB message closed it).
    const waiting = upstream.bufferedAmount;
    if (waiting > 0 && waiting + message.byteLength > this.backlogLimit) {
      this.overloaded(tunnel);
      return;
    }
    // Masked into a frame of its own now: uWS's buffer is not kept past this callback.
    upstream.send(new Uint8Array(message), isBinary);
  }

  private overloaded(tunnel: Tunnel): void {
    this.closeUpstream(tunnel, 1013, 'backlog limit');
    this.endClient(tunnel, 1013, 'backlog limit');
  }

  private clientClosed(tunnel: Tunnel, code: number, message: ArrayBuffer): void {
    tunnel.clientClosed = true;
    tunnel.client = null;
    const reason = Buffer.copyBytesFrom(new Uint8Array(message));
    // uWS cuts a client that broke the protocol in a way it names (1006 and its own words): the
    // node is told why with the code the client's close would have carried (as through nginx,
    // where the node reads the bad frame itself), rather than cut too.
    const told = code === 1006 ? CLIENT_FAULTS.get(reason.toString('latin1')) : undefined;
    if (told !== undefined) this.closeUpstream(tunnel, told[0], told[1]);
    else this.closeUpstream(tunnel, code, reason);
  }

  /** Closes the node's side with `code` (1006: cut; a code that cannot be sent: no code). */
  private closeUpstream(tunnel: Tunnel, code: number, reason: string | Buffer): void {
    if (tunnel.upstreamClosed) return;
    tunnel.upstreamClosed = true;
    this.forget(tunnel);
    const upstream = tunnel.upstream;
    // Paused (the client was behind), the node's answering close frame would never be read
    // and the connection would wait out the client's close wait.
    if (upstream.isPaused) upstream.resume();
    if (upstream.state !== OPEN || code === 1006) upstream.terminate();
    else if (sendable(code)) upstream.close(code, reason);
    else upstream.close();
  }

  private forget(tunnel: Tunnel): void {
    if (!this.open.delete(tunnel)) return;
    this.host.slot.drop(C_WEBSOCKETS);
    if (this.open.size === 0) {
      if (this.sweeper !== null) clearInterval(this.sweeper);
      this.sweeper = null;
      this.host.tunnelsClosed();
    }
  }

  /**
   * Whether each tunnel's node still answers. A node can stop without closing (a hung process, a
   * host gone, a partition): its TCP connection stays open, the client's pings are answered by
   * uWS, and the client, which would reconnect (and be placed on a live node: seed 004's
   * re-placement), never learns. So a node that has sent nothing for a while is pinged, and one
   * that answers nothing, not even the pong, is given up on: the tunnel is closed, 1011 to the
   * client with the reason and the node's side cut. Quiet for `wsPingMs` (30 s), then as long
   * again for the pong; for a node out of the rankings (a failed health probe, held unreachable,
   * ejected) 2 s and then 5 s, so that a hung node's clients move within seconds of its probe
   * failing, while a node merely marked out keeps the tunnels it still serves.
   */
  private readonly sweep = (): void => {
    const now = performance.now();
    this.host.refresh();
    const quietMs = this.host.wsPingMs;
    for (const tunnel of this.open) {
      const upstream = tunnel.upstream;
      if (upstream.state !== OPEN || tunnel.upstreamClosed) continue;
      // Not read while the client is behind (backpressure): its pong would wait unread too. The
      // quiet is ours, not the node's.
      if (upstream.isPaused || upstream.reads !== tunnel.seenReads) {
        tunnel.seenReads = upstream.reads;
        tunnel.quietSince = now;
        tunnel.pingAt = -1;
        continue;
      }
      const out = tunnel.runtime.view.weights[tunnel.node] === 0;
      if (tunnel.pingAt >= 0) {
        if (now - tunnel.pingAt >= (out ? OUT_PONG_WAIT_MS : quietMs)) {
          const waited = now - tunnel.pingAt;
          upstream.abandon(1011, `the node did not answer a ping within ${waited < 1_000 ? `${Math.round(waited)} ms` : `${Math.round(waited / 1000)} s`}`);
        }
        continue;
      }
      if (now - tunnel.quietSince >= (out ? Math.min(OUT_PING_AFTER_MS, quietMs) : quietMs)) {
        tunnel.pingAt = now;
        upstream.ping();
      }
    }
  };
}
