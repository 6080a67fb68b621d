/**
 * Request counters in shared memory, so `/stats` from any worker reports the whole process.
 *
 * One slot per thread (slot 0: the main thread's in-process `Router`; slot w: worker w), each
 * written only by its own thread with Atomics.add and summed by readers. Separate slots keep the
 * workers off each other's cache lines; Atomics keep every read well defined. BigInt64 lanes do
 * not wrap in any realistic uptime.
 *
 * A worker's slot is batched, as Envoy batches its thread-local stats: a bump adds to a plain
 * per-thread array (no atomic instruction, no BigInt), and the deltas are added to the shared
 * lanes by `flush()`: at most `FLUSH_MS` after the first bump since the last flush, and before
 * every `/stats` collection (the control plane asks each worker to collect, then reads), so
 * `/stats` is exact. A worker that crashes loses at most its last `FLUSH_MS` of counts. The main
 * thread's slot is not batched: the in-process `Router` reads it at any time.
 *
 * ```
 *  BigInt64 index within a slot (slot base = slot * stride)
 *  0              requests       proxied requests that reached routing
 *  1              hedges         hedge attempts fired
 *  2              hedgeWins      requests answered by the hedge rather than the primary
 *  3              failovers      attempts started because an earlier one failed
 *  4              rejected       requests answered 4xx/503 by the front door itself
 *  5              hedgesDenied   requests that came due for a hedge and got none: they left the
 *                                budget's waiting list unhedged after coming due there, or their
 *                                hedge timer found no token and they could not wait (the budget
 *                                had shrunk, or the list was full); counted as the request
 *                                settles, and not if a later primary was hedged
 *  6              websockets     WebSocket tunnels open (a gauge: up when the node accepts, down
 *                                when the tunnel ends)
 *  7              pipelined      reads written behind another on a connection to a node
 *                                (`--upstream-pipelining`)
 *  8              quorumFailures replicated requests the front door answered with an error of its
 *                                own: no quorum (502/503), nothing sent (503), or shut down
 *  9              standIns       writes and reads sent to a node past the key's replicas: a
 *                                stand-in for one that was down, or a read's further node
 * 10              readRepairs    newer values sent to replicas that answered an older one
 * 11              hintsPending   hints kept for replicas that were down (a gauge)
 * 12              hintsDelivered hints their replica acknowledged
 * 13              hintsExpired   hints dropped unsent after the hint window
 * 14              hintsRefused   hints their replica refused (4xx) and that were dropped
 * 15              hintsLost      hints dropped at a stop (no hints file, or it could not be
 *                                written) or at a start (their route or replica no longer
 *                                configured); a crashed worker's are not counted (they went with it)
 * 16              pipelinesRefused connections a node ended with requests pipelined on it before a
 *                                byte of the first answer (each pauses pipelining to it a while)
 * 17 + 4n + 0     node n: attempts started
 * 17 + 4n + 1     node n: attempts failed (error, timeout, 502/503/504)
 * 17 + 4n + 2     node n: attempts in flight (up on start, down on end)
 * 17 + 4n + 3     node n: attempts that won (answered the client)
 * ```
 */

export const C_REQUESTS = 0;
export const C_HEDGES = 1;
export const C_HEDGE_WINS = 2;
export const C_FAILOVERS = 3;
export const C_REJECTED = 4;
export const C_HEDGES_DENIED = 5;
export const C_WEBSOCKETS = 6;
export const C_PIPELINED = 7;
export const C_QUORUM_FAILURES = 8;
export const C_STAND_INS = 9;
export const C_READ_REPAIRS = 10;
export const C_HINTS_PENDING = 11;
export const C_HINTS_DELIVERED = 12;
export const C_HINTS_EXPIRED = 13;
export const C_HINTS_REFUSED = 14;
export const C_HINTS_LOST = 15;
export const C_PIPELINES_REFUSED = 16;
const SLOT_HEADER = 17;
const PER_NODE = 4;
export const N_ATTEMPTS = 0;
export const N_FAILURES = 1;
export const N_INFLIGHT = 2;
export const N_WINS = 3;

export function counterStride(nodeCount: number): number {
  // Round up to 8 lanes (64 bytes) so every slot starts on its own cache line.
  return Math.ceil((SLOT_HEADER + PER_NODE * nodeCount) / 8) * 8;
}

export function counterBytes(slots: number, nodeCount: number): number {
  return slots * counterStride(nodeCount) * 8;
}

/** The totals of every slot. */
export interface CounterTotals {
  requests: number;
  hedges: number;
  hedgeWins: number;
  failovers: number;
  rejected: number;
  hedgesDenied: number;
  websockets: number;
  quorumFailures: number;
  standIns: number;
  readRepairs: number;
  hintsPending: number;
  hintsDelivered: number;
  hintsExpired: number;
  hintsRefused: number;
  hintsLost: number;
  pipelined: number;
  pipelinesRefused: number;
  nodes: NodeTotals[];
}

export interface NodeTotals {
  attempts: number;
  failures: number;
  /** A gauge: attempts running now. */
  inflight: number;
  wins: number;
}

/**
 * Totals with the nodes by id: what a reload's front door adds to its own, so `/stats` goes on
 * counting across reloads (nodes are matched by id; one no longer configured is dropped from
 * `nodes` but stays in the totals).
 */
export interface TotalsById extends Omit<CounterTotals, 'nodes'> {
  nodes: Map<string, NodeTotals>;
}

/** Gauges: the number of things there are now, not of things that happened. */
type Gauge = 'websockets' | 'hintsPending';
const GAUGES: readonly Gauge[] = ['websockets', 'hintsPending'];

export function totalsById(totals: CounterTotals, ids: readonly string[]): TotalsById {
  const nodes = new Map<string, NodeTotals>();
  totals.nodes.forEach((node, i) => nodes.set(ids[i]!, { ...node }));
  return { ...totals, nodes };
}

/** Adds `from` to `into`, field by field and node by node (a node `into` lacks is added). */
export function addTotals(into: TotalsById, from: TotalsById): void {
  for (const key of Object.keys(from) as (keyof TotalsById)[]) {
    if (key !== 'nodes') into[key] += from[key];
  }
  for (const [id, node] of from.nodes) {
    const mine = into.nodes.get(id);
    if (mine === undefined) {
      into.nodes.set(id, { ...node });
      continue;
    }
    mine.attempts += node.attempts;
    mine.failures += node.failures;
    mine.inflight += node.inflight;
    mine.wins += node.wins;
  }
}

/** The counts of a front door whose workers have ended: its gauges are zero. */
export function endedTotals(totals: TotalsById): TotalsById {
  const nodes = new Map<string, NodeTotals>();
  for (const [id, node] of totals.nodes) nodes.set(id, { ...node, inflight: 0 });
  const ended = { ...totals, nodes };
  for (const gauge of GAUGES) ended[gauge] = 0;
  return ended;
}

/** Longest a batched slot holds counts before adding them to the shared lanes. */
export const FLUSH_MS = 100;

/** A thread's own slot: the only place that thread writes. */
export class CounterSlot {
  private readonly lanes: BigInt64Array;
  private readonly base: number;
  /** Batched: deltas not yet in the shared lanes, per lane of the slot. Else null. */
  private readonly pending: Float64Array | null;
  private flushTimer: NodeJS.Timeout | null = null;
  private readonly flushNow = (): void => this.flush();

  constructor(buffer: SharedArrayBuffer, slot: number, nodeCount: number, batched = false) {
    this.lanes = new BigInt64Array(buffer);
    this.base = slot * counterStride(nodeCount);
    if (this.base + counterStride(nodeCount) > this.lanes.length) throw new RangeError(`counter slot ${slot} out of range`);
    this.pending = batched ? new Float64Array(counterStride(nodeCount)) : null;
  }

  bump(field: number, by = 1): void {
    this.add(field, by);
  }

  drop(field: number): void {
    this.add(field, -1);
  }

  bumpNode(node: number, field: number): void {
    this.add(SLOT_HEADER + PER_NODE * node + field, 1);
  }

  dropNode(node: number, field: number): void {
    this.add(SLOT_HEADER + PER_NODE * node + field, -1);
  }

  /** Adds every batched delta to the shared lanes. */
  flush(): void {
    const pending = this.pending;
    if (pending === null) return;
    if (this.flushTimer !== null) {
      clearTimeout(this.flushTimer);
      this.flushTimer = null;
    }
    for (let i = 0; i < pending.length; i++) {
      if (pending[i] !== 0) {
        Atomics.add(this.lanes, this.base + i, BigInt(pending[i]!));
        pending[i] = 0;
      }
    }
  }

  private add(lane: number, delta: number): void {
    const pending = this.pending;
    if (pending === null) {
      Atomics.add(this.lanes, this.base + lane, BigInt(delta));
      return;
    }
    pending[lane] += delta;
    if (this.flushTimer === null) this.flushTimer = setTimeout(this.flushNow, FLUSH_MS).unref();
  }

  /**
   * The control plane has the hints a drained worker handed back (they were counted pending in
   * its slot until then): the slot's pending hints go to zero.
   */
  clearHintsPending(): void {
    Atomics.store(this.lanes, this.base + C_HINTS_PENDING, 0n);
  }

  /**
   * Zero the gauges (in-flight attempts, open WebSocket tunnels, hints kept): used when a
   * replacement takes over a dead worker's slot, whose connections and hints died with it.
   * Returns how many hints it still kept (as far as it had counted them in): lost with it.
   */
  resetInflight(nodeCount: number): number {
    for (let n = 0; n < nodeCount; n++) Atomics.store(this.lanes, this.base + SLOT_HEADER + PER_NODE * n + N_INFLIGHT, 0n);
    Atomics.store(this.lanes, this.base + C_WEBSOCKETS, 0n);
    const hints = Atomics.exchange(this.lanes, this.base + C_HINTS_PENDING, 0n);
    return hints > 0n ? Number(hints) : 0;
  }
}

/** Sums every slot. */
export function readTotals(buffer: SharedArrayBuffer, slots: number, nodeCount: number): CounterTotals {
  const lanes = new BigInt64Array(buffer);
  const stride = counterStride(nodeCount);
  const sum = (offset: number): number => {
    let total = 0n;
    for (let s = 0; s < slots; s++) total += Atomics.load(lanes, s * stride + offset);
    return Number(total);
  };
  const nodes = [];
  for (let n = 0; n < nodeCount; n++) {
    const base = SLOT_HEADER + PER_NODE * n;
    nodes.push({
      attempts: sum(base + N_ATTEMPTS),
      failures: sum(base + N_FAILURES),
      inflight: sum(base + N_INFLIGHT),
      wins: sum(base + N_WINS),
    });
  }
  return {
    requests: sum(C_REQUESTS),
    hedges: sum(C_HEDGES),
    hedgeWins: sum(C_HEDGE_WINS),
    failovers: sum(C_FAILOVERS),
    rejected: sum(C_REJECTED),
    hedgesDenied: sum(C_HEDGES_DENIED),
    websockets: sum(C_WEBSOCKETS),
    quorumFailures: sum(C_QUORUM_FAILURES),
    standIns: sum(C_STAND_INS),
    readRepairs: sum(C_READ_REPAIRS),
    hintsPending: sum(C_HINTS_PENDING),
    hintsDelivered: sum(C_HINTS_DELIVERED),
    hintsExpired: sum(C_HINTS_EXPIRED),
    hintsRefused: sum(C_HINTS_REFUSED),
    hintsLost: sum(C_HINTS_LOST),
    pipelined: sum(C_PIPELINED),
    pipelinesRefused: sum(C_PIPELINES_REFUSED),
    nodes,
  };
}
