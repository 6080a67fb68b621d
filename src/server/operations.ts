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

  /** OP_READ, OP_WRITE or OP_UNSUPPORTED for a request path (without its query string). */
  classify(path: string): number {
    const hit = this.exact.get(path);
    if (hit !== undefined) return hit;
    for (const [prefix, op] of this.prefixes) if (path.startsWith(prefix)) return op;
    return this.otherwise;
  }
}
