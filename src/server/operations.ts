/** Read/write classification of a route's requests by path (seed 002: operation type). */
import { OP_READ, OP_UNSUPPORTED, OP_WRITE, type OperationRules } from './protocol.js';

export class OperationClassifier {
  private readonly exact = new Map<string, number>();
  private readonly prefixes: [string, number][] = [];
  private readonly otherwise: number;

  constructor(rules: OperationRules) {
    this.otherwise = rules.otherwise === 'read' ? OP_READ : OP_WRITE;
    for (const [list, op] of [[rules.reads, OP_READ], [rules.writes, OP_WRITE], [rules.unsupported ?? [], OP_UNSUPPORTED]] as const) {
      for (const path of list) {
        if (path.endsWith('*')) this.prefixes.push([path.slice(0, -1), op]);
        else this.exact.set(path, op);
      }
    }
    // Longest prefix first, so a narrower rule wins over a broader one.
    this.prefixes.sort((a, b) => b[0].length - a[0].length);
  }

  /**
   * OP_READ, OP_WRITE or OP_UNSUPPORTED for a request path (without its query string), as the
   * node will read it: percent-encoded unreserved characters decoded first (RFC 3986 6.2.2.2:
   * `/v3/%77atch` is `/v3/watch`, and etcd's router serves it as one). The node still gets the
   * path as sent.
   */
  classify(path: string): number {
    if (path.includes('%')) path = decodeUnreserved(path);
    const hit = this.exact.get(path);
    if (hit !== undefined) return hit;
    for (const [prefix, op] of this.prefixes) if (path.startsWith(prefix)) return op;
    return this.otherwise;
  }
}

/** `%XX` of a letter, a digit, `-`, `.`, `_` or `~` decoded; every other escape left as it is. */
function decodeUnreserved(path: string): string {
  return path.replace(/%([0-9A-Fa-f]{2})/g, (escape: string, hex: string) => {
    const c = parseInt(hex, 16);
    const unreserved = (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2e || c === 0x5f || c === 0x7e;
    return unreserved ? String.fromCharCode(c) : escape;
  });
}
