/**
 * Routes match the path as sent (uWS's router, segment by segment, no decoding). A path can
 * spell another route's path otherwise: `//admin/x`, `/%61dmin/x` (an encoded `a`), `/admin%2Fx`
 * or `/admin\x` match no `/admin/*` route, and go to a catch-all's cluster, whose node may well
 * read them as `/admin/x` (nginx merges slashes and decodes before it matches locations). The
 * front door refuses such a path when its plain spelling is another route's: the node would serve
 * a path the route table sends elsewhere.
 */

/** Routes by pattern, matched as uWS matches the shapes a configuration allows. */
export class RouteMatcher<T> {
  private readonly exact = new Map<string, T>();
  /** Wildcard routes (`/p/*`) by prefix (`/p/`), the longest first. */
  private readonly prefixes: { readonly prefix: string; readonly value: T }[] = [];

  constructor(routes: readonly { readonly pattern: string; readonly value: T }[]) {
    for (const { pattern, value } of routes) {
      if (pattern.endsWith('*')) this.prefixes.push({ prefix: pattern.slice(0, -1), value });
      else this.exact.set(pattern, value);
    }
    this.prefixes.sort((a, b) => b.prefix.length - a.prefix.length);
  }

  /** The route `path` goes to: an exact pattern, else the longest wildcard prefix; null: none. */
  match(path: string): T | null {
    const exact = this.exact.get(path);
    if (exact !== undefined) return exact;
    for (const { prefix, value } of this.prefixes) if (path.startsWith(prefix)) return value;
    return null;
  }
}

/**
 * The route `path` is when read plainly, if another than `route` (which uWS matched it to); else
 * null. Only a path with an escape, a doubled slash or a backslash is read again; `matcher` is
 * null where there is one route (no other to be).
 */
export function respelledRoute<T>(matcher: RouteMatcher<T> | null, route: T, path: string): T | null {
  if (matcher === null || !mayRespell(path)) return null;
  const other = matcher.match(plainSpelling(path));
  return other !== null && other !== route ? other : null;
}

/** Whether `path` may spell another path otherwise (an escape, a doubled slash, a backslash). */
export function mayRespell(path: string): boolean {
  return path.indexOf('%') >= 0 || path.indexOf('//') >= 0 || path.indexOf('\\') >= 0;
}

/**
 * The path as a node that normalises it would read it: escapes of unreserved characters, of `/`
 * and of `\` decoded, a backslash taken for a slash, runs of slashes merged. Other escapes are
 * kept as they are (they cannot turn one route's prefix into another's).
 */
export function plainSpelling(path: string): string {
  const decoded = path.replace(/%([0-9a-fA-F]{2})/g, (escape, hex: string) => {
    const c = parseInt(hex, 16);
    return isUnreserved(c) || c === 0x2f || c === 0x5c ? String.fromCharCode(c) : escape;
  });
  return decoded.replace(/\\/g, '/').replace(/\/{2,}/g, '/');
}

/** RFC 3986 2.3: ALPHA / DIGIT / "-" / "." / "_" / "~". */
function isUnreserved(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2e || c === 0x5f || c === 0x7e;
}
