/**
 * Weighted rendezvous (highest-random-weight) hashing.
 *
 *   score(node, board) = -weight / ln(u(node, board))
 *
 * `u` is uniform on (0, 1) (see ./xxh.ts for the exact bytes), so `-1/ln(u)` is a draw whose
 * maximum over nodes lands on each node with probability proportional to its weight. The ranking
 * is every node with weight > 0, best score first, ties broken by id (lexical, ascending).
 */
import { SeededUnits, nodeSeed, unitHash } from './xxh.js';

/** Quantisation bands for capacity weights. */
export const WEIGHT_LEVELS: readonly number[] = Object.freeze([0.25, 0.5, 1, 1.5, 2]);

/** A routable node: `weight` 0 excludes it from every ranking. */
export interface NodeInfo {
  readonly id: string;
  readonly url: string;
  readonly weight: number;
}

/**
 * Snaps a raw capacity number to the nearest band of {@link WEIGHT_LEVELS}; `<= 0` (and NaN) map
 * to 0. A value exactly between two bands takes the higher one. Banding keeps a small drift in
 * observed capacity from reshuffling which node a board prefers.
 */
export function quantiseWeight(raw: number): number {
  if (!(raw > 0)) return 0;
  let best = WEIGHT_LEVELS[0]!;
  let bestDistance = Math.abs(raw - best);
  for (let i = 1; i < WEIGHT_LEVELS.length; i++) {
    const level = WEIGHT_LEVELS[i]!;
    const distance = Math.abs(raw - level);
    if (distance <= bestDistance) {
      best = level;
      bestDistance = distance;
    }
  }
  return best;
}

const seedCache = new Map<string, bigint>();

function seedOf(id: string): bigint {
  let seed = seedCache.get(id);
  if (seed === undefined) {
    seed = nodeSeed(id);
    if (seedCache.size > 10_000) seedCache.clear();
    seedCache.set(id, seed);
  }
  return seed;
}

/** Rendezvous score of a node for a board; `weight <= 0` scores `-Infinity`. */
export function score(node: NodeInfo, boardId: string): number {
  if (!(node.weight > 0)) return -Infinity;
  return -node.weight / Math.log(unitHash(seedOf(node.id), boardId));
}

/** All eligible (weight > 0) nodes for `boardId`, best first; ties broken by id. */
export function rank(nodes: readonly NodeInfo[], boardId: string): NodeInfo[] {
  const scored: { node: NodeInfo; score: number }[] = [];
  for (const node of nodes) {
    if (node.weight > 0) scored.push({ node, score: score(node, boardId) });
  }
  scored.sort((a, b) => b.score - a.score || (a.node.id < b.node.id ? -1 : a.node.id > b.node.id ? 1 : 0));
  return scored.map((s) => s.node);
}

/**
 * Units closer than this (relative) are ordered by their scores after all (see
 * {@link RendezvousRanker}): far above what rounding in `ln` and the division can reach (about
 * 1e-16 relative), and a pair of nodes' units comes that close about once in a billion boards
 * (with 64 nodes, 2,016 pairs, about once in 500,000 rankings: two logarithms then).
 */
const CLOSE_UNITS = 1e-9;
/** The weights the unit-order shortcut takes (see the ranker's constructor). */
const MIN_UNIFORM_WEIGHT = 1e-300;
const MAX_UNIFORM_WEIGHT = 1e290;

/**
 * Whether, of two nodes of one finite weight `w`, the one with unit `pu` (lexical position
 * `po`) ranks before the one with unit `u` (`o`): as {@link rank} orders them (best score first,
 * ties by id), without a logarithm unless the units are within {@link CLOSE_UNITS} of each other.
 * The score `-w / ln(u)` rises with `u`, so apart from those the larger unit is the better score.
 */
export function uniformBefore(pu: number, po: number, u: number, o: number, w: number): boolean {
  const gap = pu - u;
  if (gap > CLOSE_UNITS * pu) return true;
  if (-gap > CLOSE_UNITS * u) return false;
  return scoreBefore(-w / Math.log(pu), po, -w / Math.log(u), o);
}

/** {@link rank}'s order: the node scoring `ps` (lexical position `po`) before the one scoring `s` (`o`). */
function scoreBefore(ps: number, po: number, s: number, o: number): boolean {
  return ps > s || (ps === s && po < o);
}

/**
 * The hot-path form of {@link rank}: built once per membership change over a fixed node list,
 * it ranks into caller-owned typed arrays and hashes the board against every node in one call
 * into WebAssembly ({@link SeededUnits}), allocating nothing per call.
 *
 * Indices refer to the order of the `ids` given to the constructor.
 */
export class RendezvousRanker {
  readonly size: number;
  private readonly units: SeededUnits;
  private readonly weights: Float64Array;
  /** Position of each node in lexical id order, to break score ties without string compares. */
  private readonly idOrder: Int32Array;
  private readonly scores: Float64Array;
  /**
   * Every eligible node has one finite weight: the ranking is the order of the units (see
   * {@link uniformBefore}), with no logarithm a node (the usual case: weights are bands, and
   * most clusters run at one).
   */
  private readonly uniformWeight: number;

  constructor(ids: readonly string[], weights: ArrayLike<number>) {
    this.size = ids.length;
    this.units = new SeededUnits(ids.map(seedOf));
    this.weights = Float64Array.from(weights);
    const sorted = ids.map((id, i) => [id, i] as const).sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    this.idOrder = new Int32Array(ids.length);
    sorted.forEach(([, index], position) => {
      this.idOrder[index] = position;
    });
    this.scores = new Float64Array(ids.length);
    let uniform = Number.NaN;
    for (const w of this.weights) {
      if (!(w > 0)) continue;
      if (Number.isNaN(uniform)) uniform = w;
      else if (w !== uniform) uniform = Infinity;
    }
    // Only where every score stays a finite, normal number (|ln u| lies within 1e-16 and 37): a
    // weight past that makes scores tie at Infinity or lose precision, and rank() then orders by
    // id where units would not (helper-69). The bands are far inside it.
    this.uniformWeight = uniform >= MIN_UNIFORM_WEIGHT && uniform <= MAX_UNIFORM_WEIGHT ? uniform : Number.NaN;
  }

  /** Number of nodes with weight > 0. */
  get eligible(): number {
    let n = 0;
    for (let i = 0; i < this.size; i++) if (this.weights[i]! > 0) n++;
    return n;
  }

  /**
   * Writes the eligible node indices for `boardId` into `out`, best first, and returns how many.
   * `out` must hold at least {@link size} entries.
   */
  rankInto(boardId: string, out: Int32Array): number {
    const { weights, scores, idOrder } = this;
    const units = this.units.of(boardId);
    const one = this.uniformWeight;
    const byUnit = one > 0;
    let n = 0;
    for (let i = 0; i < this.size; i++) {
      const w = weights[i]!;
      if (!(w > 0)) continue;
      // With one weight for all, the unit stands for the score (see uniformBefore).
      const s = byUnit ? units[i]! : -w / Math.log(units[i]!);
      scores[i] = s;
      const o = idOrder[i]!;
      // Insertion sort: node counts are small, and it keeps the ranking in place.
      let j = n++;
      while (j > 0) {
        const prev = out[j - 1]!;
        if (byUnit ? uniformBefore(scores[prev]!, idOrder[prev]!, s, o, one) : scoreBefore(scores[prev]!, idOrder[prev]!, s, o)) break;
        out[j] = prev;
        j--;
      }
      out[j] = i;
    }
    return n;
  }
}
