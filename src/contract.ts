/**
 * The wire contract between clients, the front door and the nodes behind it: header names and the
 * rule for which requests may be sent more than once.
 *
 * A request is *retryable* when sending it twice cannot land twice: a read, or a mutation that
 * carries an idempotency key (the node deduplicates by key). Retryable requests may be hedged and
 * failed over; everything else gets exactly one attempt on exactly one node.
 */

/** Opt-in header: a mutation carrying `x-lakefront-idempotent: 1` is deduplicated by the node. */
export const IDEMPOTENT_HEADER = 'x-lakefront-idempotent';

/** Header naming the board (the routing key) of an `/rpc/*` request. */
export const BOARD_HEADER = 'x-lakefront-board';

/** Response header: id of the node whose answer was relayed. */
export const SERVED_BY_HEADER = 'x-lakefront-served-by';

/** Response header: `1` when a hedge was fired for this request, else `0`. */
export const HEDGED_HEADER = 'x-lakefront-hedged';

/** Procedures that only read: re-running them is always safe. */
export const IDEMPOTENT_PROCEDURES: ReadonlySet<string> = new Set([
  'query.execute',
  'node.stats',
  'changes.read',
]);

const RPC_PREFIX = '/rpc/';

/**
 * Whether `path` names a procedure in {@link IDEMPOTENT_PROCEDURES}: `/rpc/<procedure>`, with an
 * optional query string, e.g. `/rpc/query.execute?x=1`.
 */
export function isIdempotentPath(path: string): boolean {
  if (!path.startsWith(RPC_PREFIX)) return false;
  // Compared in place (no slice to hash): it runs for every write the front door forwards.
  for (const name of IDEMPOTENT_LIST) {
    const end = RPC_PREFIX.length + name.length;
    if ((path.length === end || path.charCodeAt(end) === 0x3f) && path.startsWith(name, RPC_PREFIX.length)) return true;
  }
  return false;
}

const IDEMPOTENT_LIST: readonly string[] = [...IDEMPOTENT_PROCEDURES];

/** Anything with a `get(name)` that answers a header value: WHATWG `Headers`, or a small adapter. */
export interface HeaderLookup {
  get(name: string): string | null | undefined;
}

/**
 * `isIdempotentPath(path)`, or `headers` carrying {@link IDEMPOTENT_HEADER} set to `"1"`.
 */
export function isRetryable(path: string, headers?: HeaderLookup | Record<string, string | undefined>): boolean {
  if (isIdempotentPath(path)) return true;
  if (headers === undefined) return false;
  const value = typeof (headers as HeaderLookup).get === 'function'
    ? (headers as HeaderLookup).get(IDEMPOTENT_HEADER)
    : (headers as Record<string, string | undefined>)[IDEMPOTENT_HEADER];
  return value === '1';
}

/**
 * Methods that HTTP defines as safe (RFC 9110 section 9.2.1): a proxy may repeat them. The front
 * door treats them as retryable whatever the path.
 */
export function isSafeMethod(method: string): boolean {
  // By length first: at most one string compare.
  switch (method.length) {
    case 3:
      return method === 'GET';
    case 4:
      return method === 'HEAD';
    case 7:
      return method === 'OPTIONS';
    default:
      return false;
  }
}

/**
 * Hop-by-hop request headers (RFC 9110 section 7.6.1, plus `expect`, `host` and `content-length`,
 * which the upstream client sets itself). They are never handed to undici: several make it throw,
 * and a throw after the pool slot is taken leaks the slot.
 */
export const DROPPED_REQUEST_HEADERS: ReadonlySet<string> = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'proxy-authenticate',
  'proxy-authorization',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'expect',
  'host',
  'content-length',
]);

/** Longest routing key (the key header's value) the front door accepts. */
export const MAX_KEY_LENGTH = 1024;

/** Largest answer relayed from a node by default (`--max-response-bytes`; answers are buffered whole). */
export const DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024;
/** WebSocket tunnels: a node quiet this long is pinged; without an answer as long again, the tunnel closes (1011). */
export const DEFAULT_WS_PING_MS = 30_000;
/** WebSocket tunnels: what may wait either way before a tunnel is closed (1013), by default (`--ws-backlog-bytes`). */
export const DEFAULT_WS_BACKLOG_BYTES = 16 * 1024 * 1024;

/**
 * Whether a request path holds a dot segment (`.` or `..`, or either with the dot
 * percent-encoded, with or without `;parameters`, which servlet containers strip) between
 * separators that a node might take for `/`: the slash itself, a percent-encoded one (`%2F`), and
 * a backslash, plain or encoded (`%5C`), which some servers read as a slash; or before a `#`
 * (uWS passes a fragment on in the path, and a node drops it, then resolves the dots). A node that normalises the path would serve another one than the front door
 * classified (a write under a read prefix could be hedged: sent twice) or routed (`/public/../admin`
 * under `/public/*`), so the front door refuses such paths on every route and WebSocket handshake.
 */
export function hasDotSegment(path: string): boolean {
  // A dot segment needs a separator then a dot, or an encoded dot: most paths have neither.
  if (path.indexOf('/.') < 0 && path.indexOf('%') < 0 && path.indexOf('\\') < 0) return false;
  return DOT_SEGMENT.test(path);
}

const DOT_SEGMENT = /(?:^|\/|\\|%2f|%5c)(?:\.|%2e){1,2}(?:(?:;|%3b)[^/\\#]*)?(?:\/|\\|%2f|%5c|#|$)/i;

/**
 * Whether a `Host` value is an authority a node may build URLs from: a registered name or IPv4
 * address (RFC 3986 reg-name characters), or a bracketed IPv6 literal, and an optional port. Empty
 * is not one (RFC 9110 4.2.1: an http authority needs a host), nor anything with a `/`, `?`, `#`,
 * `@`, `\\`, a space, a quote or angle brackets. (RFC 9112 3.2: an invalid Host gets 400.)
 */
export function isHostAuthority(host: string): boolean {
  return HOST_AUTHORITY.test(host);
}

const HOST_AUTHORITY = /^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]+)(?::[0-9]{1,5})?$/;
