/**
 * Consistent hashing with virtual nodes (seed 003): every node owns tokens on a ring, and a key's
 * preference list is the distinct nodes met walking clockwise from the key's position. Adding or
 * removing a node moves only the keys whose walk meets its tokens first (about 1/n of them).
 *
 * Positions are fixed so that any implementation can reproduce a ring (same hash as ./xxh.ts):
 *
 *   token(node, i)   = u(XXH64(utf8(String(i)), seed = XXH64(utf8(node.id), 0)))   i = 0, 1, ...
 *   position(key)    = u(XXH64(utf8(key), seed = 0))
 *
 * with `u` the top 52 bits as a value in (0, 1). A node of weight w owns its first
 * max(1, round(128 w)) tokens (128 at weight 1, as seed 003; weight 0: none). Tokens are a prefix
 * of one sequence per node, so a weight change moves keys only to or from that node. Equal
 * positions are ordered by node id.
 */
import { SeededUnits, nodeSeed, unitHash } from './xxh.js';

/** Tokens a node of weight 1 owns. */
export const TOKENS_PER_WEIGHT = 128;

/** Positions of a node's first tokens, cached by id (a weight change re-reads, not re-hashes). */
const tokenCache = new Map<string, number[]>();

function tokensOf(id: string, count: number): number[] {
  let list = tokenCache.get(id);
  if (list === undefined) {
    if (tokenCache.size > 10_000) tokenCache.clear();
    list = [];
    tokenCache.set(id, list);
  }
  if (list.length < count) {
    const seed = nodeSeed(id);
    for (let i = list.length; i < count; i++) list.push(unitHash(seed, String(i)));
  }
  return list;
}

/** Tokens a node of `weight` owns. */
export function tokenCount(weight: number): number {
  return weight > 0 ? Math.max(1, Math.round(TOKENS_PER_WEIGHT * weight)) : 0;
}

/**
 * A ring over a fixed node list, built once per membership change. `preferenceInto` walks it
 * into a caller-owned array, allocating nothing per call.
 */
export class HashRing {
  readonly size: number;
  /** Nodes with weight > 0: the length of a full preference list. */
  readonly eligible: number;
  /** Token positions, ascending, and the node index owning each. */
  private readonly positions: Float64Array;
  private readonly owners: Int32Array;
  private readonly keys = new SeededUnits([0n]);
  /** Per node, the walk that last met it (a stamp per walk: no clearing between walks). */
  private readonly seen: Int32Array;
  private stamp = 0;

  constructor(ids: readonly string[], weights: ArrayLike<number>) {
    this.size = ids.length;
    const tokens: { position: number; node: number }[] = [];
    let eligible = 0;
    for (let node = 0; node < ids.length; node++) {
      const count = tokenCount(weights[node]!);
      if (count > 0) eligible++;
      const positions = tokensOf(ids[node]!, count);
      for (let i = 0; i < count; i++) tokens.push({ position: positions[i]!, node });
    }
    tokens.sort((a, b) => a.position - b.position || (ids[a.node]! < ids[b.node]! ? -1 : ids[a.node]! > ids[b.node]! ? 1 : 0));
    this.eligible = eligible;
    this.positions = Float64Array.from(tokens, (t) => t.position);
    this.owners = Int32Array.from(tokens, (t) => t.node);
    this.seen = new Int32Array(ids.length);
  }

  /** The key's position on the ring, in (0, 1). */
  position(key: string): number {
    return this.keys.of(key)[0]!;
  }

  /**
   * Writes the key's preference list into `out` (node indices, first replica first: every node
   * with weight > 0, in the order the walk meets them) and returns how many, at most `limit`.
   */
  preferenceInto(key: string, out: Int32Array, limit = this.eligible): number {
    const { positions, owners, seen } = this;
    const tokens = positions.length;
    const want = Math.min(limit, this.eligible, out.length);
    if (want <= 0) return 0;
    const at = this.keys.of(key)[0]!;
    // First token at or after the key (clockwise), wrapping past the end.
    let lo = 0;
    let hi = tokens;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (positions[mid]! < at) lo = mid + 1;
      else hi = mid;
    }
    if (++this.stamp === 0x7fffffff) {
      seen.fill(0);
      this.stamp = 1;
    }
    const stamp = this.stamp;
    let n = 0;
    for (let step = 0, i = lo; step < tokens; step++, i++) {
      if (i === tokens) i = 0;
      const node = owners[i]!;
      if (seen[node] === stamp) continue;
      seen[node] = stamp;
      out[n++] = node;
      if (n === want) break;
    }
    return n;
  }
}
