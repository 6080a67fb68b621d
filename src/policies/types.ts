/**
 * The one selection interface every routing policy implements. A policy only chooses: queueing,
 * hedging, failover and retries live once, in forward/exchange.ts.
 */

/** A cluster's routing state as published in the membership table; indices are cluster-local. */
export interface ClusterView {
  readonly ids: readonly string[];
  /** Routable weight per node: 0 excludes the node (unhealthy, disabled). */
  readonly weights: Float64Array;
  /** FLAG_* bits per node (membership/table.ts). */
  readonly flags: Int32Array;
  /** The routable node the control plane published as leader, or -1. */
  readonly leader: number;
}

export interface Policy {
  readonly name: string;
  /** Rebuild cached state from the cluster's view: called once per membership change. */
  update(view: ClusterView): void;
  /**
   * Writes candidate node indices into `out`, best first (primary, then hedge and failover
   * order), never repeating a node, and returns how many. `key` is the request's routing key
   * (`''` when the route has none); `op` its operation class (OP_READ / OP_WRITE). `takeTurn`
   * false: a ticket holder's request, which `placeClient` orders by its own turn; a rotating
   * policy ranks without moving its rotation (else every pinned request would shift where the
   * next new client is placed).
   */
  pick(key: string, op: number, out: Int32Array, takeTurn?: boolean): number;
  /**
   * Feedback after an attempt ends (latency in milliseconds; on failure, time until it failed).
   * `startedAt`: performance.now() when the attempt began, if known; an attempt begun before the
   * node last came back into the routable set (down and back) is not counted: it measured the
   * outage the node has just been forgiven (a frozen member's hung reads, answered once it runs).
   */
  observe?(node: number, latencyMs: number, ok: boolean, op: number, startedAt?: number): void;
  /** Writes go to the published leader: an affinity ticket must not move them elsewhere. */
  readonly leaderWrites?: boolean;
  /**
   * The first candidate takes turns (round robin): when a region's candidates are moved ahead,
   * they take turns among themselves too (see `preferRegion`), or the first of them after each
   * turn's start would take most placements.
   */
  readonly rotating?: boolean;
  /**
   * Whether a client re-placed by its ticket's turn may land on `node` (see `placeClient`), judged
   * without `own` (the ticket's node: the answer must not change as it fails and leaves): a
   * keyless policy that avoids some members (hybrid's slow readers, boltzmann's near-zero
   * members) says so, and the client's sibling is chosen among the others. Defined, it also
   * makes the policy place ticket holders by turn (`placesByTurn`).
   */
  placeable?(node: number, own: number): boolean;
  /** A write to the published leader could not connect: stop pinning writes to it until the next update. */
  leaderUnreachable?(node: number): void;
}

/** Indices of the routable nodes of `view`. */
export function routable(view: ClusterView): number[] {
  const out: number[] = [];
  for (let i = 0; i < view.weights.length; i++) if (view.weights[i]! > 0) out.push(i);
  return out;
}

/**
 * The nodes routable `now` that were not `before` (back from being down): a policy that learns
 * from outcomes starts them afresh. At a membership change, not a request.
 */
export function returned(before: readonly number[], now: readonly number[]): number[] {
  return now.filter((node) => !before.includes(node));
}

/**
 * Writes `nodes` into `out` starting at `nodes[start % n]` and wrapping, skipping `skip`;
 * returns the new count. The shared tail of every policy: after the primary, try the others.
 */
export function rotateInto(nodes: readonly number[], start: number, out: Int32Array, count: number, skip = -1): number {
  const n = nodes.length;
  for (let i = 0; i < n; i++) {
    const node = nodes[(start + i) % n]!;
    if (node !== skip) out[count++] = node;
  }
  return count;
}

/**
 * Puts `node` at the head of `candidates[0 .. count)`, keeping the others' order (affinity
 * tickets pin a client to the node they name). A routable node past the candidates held (a large
 * cluster) is put in front of them, the last one dropping out if there is no room. Returns the
 * new count, or -1 when `node` is not routable (the request is placed anew).
 */
export function pinFirst(candidates: Int32Array, count: number, node: number, routable: boolean): number {
  for (let i = 0; i < count; i++) {
    if (candidates[i] !== node) continue;
    candidates.copyWithin(1, 0, i);
    candidates[0] = node;
    return count;
  }
  if (!routable || node < 0) return -1;
  const n = Math.min(count + 1, candidates.length);
  candidates.copyWithin(1, 0, n - 1);
  candidates[0] = node;
  return n;
}

/**
 * Moves the candidates whose region is `region` (by `regionOf`) ahead of the others, each group
 * keeping its order (the region's rotated by `turn` when one is given); returns how many are in
 * `region`. Placement by affinity ticket prefers the client's region (seed 004).
 */
export function preferRegion(candidates: Int32Array, count: number, regionOf: Int32Array, region: number, turn = -1): number {
  let front = 0;
  for (let i = 0; i < count; i++) {
    const node = candidates[i]!;
    if (regionOf[node] !== region) continue;
    if (i !== front) {
      candidates.copyWithin(front + 1, front, i);
      candidates[front] = node;
    }
    front++;
  }
  // A rotating policy's turn: the region's candidates in a fixed order (by index: the policy's
  // own rotation would correlate with the turns), then rotated by it, so that they take turns.
  if (turn >= 0) inTurn(candidates, front, turn);
  return front;
}

/**
 * Puts candidates[0 .. count) in a fixed order (by node index), then rotated by `turn`: the same
 * turn gives the same order whatever order they came in.
 */
function inTurn(candidates: Int32Array, count: number, turn: number): void {
  if (count < 2) return;
  for (let i = 1; i < count; i++) {
    const node = candidates[i]!;
    let j = i;
    for (; j > 0 && candidates[j - 1]! > node; j--) candidates[j] = candidates[j - 1]!;
    candidates[j] = node;
  }
  for (let shift = turn % count; shift > 0; shift--) {
    const first = candidates[0]!;
    candidates.copyWithin(0, 1, count);
    candidates[count - 1] = first;
  }
}

/**
 * Moves the candidates[0 .. count) the policy would place on ahead of the others (each group
 * keeping its order); returns how many.
 */
function placeableFirst(candidates: Int32Array, count: number, policy: Policy, own: number): number {
  let front = 0;
  for (let i = 0; i < count; i++) {
    const node = candidates[i]!;
    if (!policy.placeable!(node, own)) continue;
    if (i !== front) {
      candidates.copyWithin(front + 1, front, i);
      candidates[front] = node;
    }
    front++;
  }
  return front;
}

/** A failed attempt counts as at least this slow (hybrid's reads, boltzmann's attempts). */
const FAILURE_PENALTY_MS = 100;
/**
 * The doubling of a failure's penalty stops here: uncapped, each failure multiplied the EWMA by
 * 1.3, so a member that failed for a while needed about 0.74 good probes for every failed one to
 * rejoin, and after about 2,700 failures the EWMA was Infinity and it never rejoined.
 */
const MAX_FAILURE_PENALTY_MS = 10_000;

/**
 * The sample a failed attempt gives a member's latency EWMA (`previous`, NaN while unmeasured):
 * its own time, at least FAILURE_PENALTY_MS, and twice the estimate so far, up to
 * MAX_FAILURE_PENALTY_MS (failures in a row push the member out fast, and not for ever).
 */
export function failureSampleMs(previous: number, latencyMs: number): number {
  return Math.max(FAILURE_PENALTY_MS, latencyMs, Number.isNaN(previous) ? 0 : Math.min(previous * 2, MAX_FAILURE_PENALTY_MS));
}

/**
 * A client's turn and a node, mixed (murmur3's finalizer): each node's score for that client.
 * `node` is a key of the node's own (a hash of its id), not its place in the cluster: a reload
 * that removes or adds a node must not change the other nodes' scores.
 */
function turnScore(turn: number, node: number): number {
  let h = Math.imul(turn ^ Math.imul(node + 1, 0x9e3779b1), 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** Orders candidates[0 .. count) by their score for `turn`, highest first (rendezvous); `keys`: each node's key. */
function byTurnScore(candidates: Int32Array, count: number, turn: number, keys: Int32Array): void {
  for (let i = 1; i < count; i++) {
    const node = candidates[i]!;
    const score = turnScore(turn, keys[node]!);
    let j = i;
    for (; j > 0 && turnScore(turn, keys[candidates[j - 1]!]!) < score; j--) candidates[j] = candidates[j - 1]!;
    candidates[j] = node;
  }
}

/**
 * Whether a ticket's client placed anew (its node gone or failing) takes its own turn among the
 * siblings, so that its requests and sockets land on one of them (seed 004: both legs on the
 * same node): on a rotating policy, and on one that says which members it places on (hybrid,
 * boltzmann: the sibling is chosen among those). Neither uses a key; a keyed policy places by it.
 */
export function placesByTurn(policy: Policy): boolean {
  return policy.rotating === true || policy.placeable !== undefined;
}

/**
 * Moves `node` (if among candidates[0 .. count)) to the end of them; returns how many others come
 * before it (`count` when it is not there). A ticket's own node is set aside so that its client's
 * turn is taken over the siblings alone: the same sibling whether the node is still in the
 * rankings (failing) or out of them.
 */
function setAside(candidates: Int32Array, count: number, node: number): number {
  if (node < 0) return count;
  for (let i = 0; i < count; i++) {
    if (candidates[i] !== node) continue;
    candidates.copyWithin(i, i + 1, count);
    candidates[count - 1] = node;
    return count - 1;
  }
  return count;
}

/**
 * Orders a client's candidates[0 .. count) for placement by affinity ticket. With its own turn
 * (`turn` >= 0, a rotating route's ticket holder: ticketTurn), the siblings go in that turn, its
 * own node (`own`) set aside at the end, so that the turn names the same sibling whether that
 * node is failing or already out of the rankings (the caller pins it first if it can take the
 * request). Then the client's region (`region` >= 0, an index of `regionOf`) goes first, in its
 * turn, or in the route's (`regionTurn`) when it has none. `nodeKeys`: a key per node that a
 * reload does not change (ClusterRuntime.nodeKeys, a hash of its id), for the scores.
 */
export function placeClient(candidates: Int32Array, count: number, own: number, turn: number, regionOf: Int32Array, region: number, policy: Policy, turns: Int32Array, nodeKeys: Int32Array): void {
  let ordered = count;
  const byScore = policy.placeable !== undefined;
  if (turn >= 0) {
    ordered = setAside(candidates, count, own);
    if (byScore) {
      // Only among the members the policy would place on (all, if none), highest score for the
      // client's turn first: a sibling dropping out or coming in moves only its own clients.
      const fit = placeableFirst(candidates, ordered, policy, own);
      if (fit > 0) ordered = fit;
      byTurnScore(candidates, ordered, turn, nodeKeys);
    } else inTurn(candidates, ordered, turn);
  }
  // By score, the region's members keep their order (a rotation would undo it).
  if (region >= 0) preferRegion(candidates, ordered, regionOf, region, byScore ? -1 : turn >= 0 ? turn : regionTurn(policy, turns, region));
}

/**
 * The next turn of `region` on a route (its `turns`, one counter a region) for `preferRegion`,
 * or -1 when the route's policy does not rotate.
 */
export function regionTurn(policy: Policy, turns: Int32Array, region: number): number {
  if (policy.rotating !== true) return -1;
  const turn = turns[region]!;
  turns[region] = (turn + 1) & 0x3fffffff;
  return turn;
}
