/**
 * boltzmann: latency-adaptive exploration (seed 002, section III-C), the paper's diagnostic
 * comparator. Each member keeps an EWMA of its observed latency (alpha 0.3); the primary is drawn
 * with probability proportional to exp(-(ewma - best) / temperature) (temperature 1 ms), so
 * faster members are chosen more often and the others are still explored. A failure inflates the
 * estimate; more than three consecutive failures leave a member near-zero probability, until it
 * is down and back (then it starts afresh). It has no notion of reads and writes: that is the
 * point of comparing it.
 */
import { performance } from 'node:perf_hooks';
import type { PolicySettings } from '../server/protocol.js';
import { failureSampleMs, returned, routable, type ClusterView, type Policy } from './types.js';

/** Probability factor for a member past MAX_FAILURES consecutive failures. */
const NEAR_ZERO = 1e-6;
const MAX_FAILURES = 3;
/** A client re-placed by its ticket goes to a member drawn at least this share of the time. */
const PLACEABLE_SHARE = 0.01;

export class BoltzmannPolicy implements Policy {
  readonly name = 'boltzmann';
  private nodes: number[] = [];
  private ewmaMs: Float64Array = new Float64Array(0);
  private failures: Int32Array = new Int32Array(0);
  /** performance.now() when each member last came back (its attempts begun before are not counted). */
  private backAt: Float64Array = new Float64Array(0);
  private probability: Float64Array = new Float64Array(0);
  /** Routable members, most probable first: the failover order after the drawn primary. */
  private order: Int32Array = new Int32Array(0);
  private total = 0;

  constructor(private readonly settings: PolicySettings) {}

  update(view: ClusterView): void {
    const size = view.weights.length;
    if (this.ewmaMs.length !== size) {
      this.ewmaMs = new Float64Array(size).fill(Number.NaN);
      this.failures = new Int32Array(size);
      this.backAt = new Float64Array(size);
      this.probability = new Float64Array(size);
      this.order = new Int32Array(size);
    }
    const before = this.nodes;
    this.nodes = routable(view);
    // A member back from being down starts afresh (explored as an unmeasured one): the failures
    // that took it to near-zero probability would otherwise keep it there, never drawn again.
    const now = performance.now();
    for (const node of returned(before, this.nodes)) {
      this.ewmaMs[node] = Number.NaN;
      this.failures[node] = 0;
      this.backAt[node] = now;
    }
    this.recompute();
  }

  /** Current selection probability of `node` (for tests and stats). */
  share(node: number): number {
    return this.total > 0 ? this.probability[node]! / this.total : 0;
  }

  /**
   * A client re-placed by its ticket goes to a member drawn at least 1% of the time, not one near
   * zero; judged as if `own` (the ticket's node) were out already, so that its failing and leaving
   * do not change the answer.
   */
  placeable(node: number, own: number): boolean {
    // A member out of the routable set has probability 0 (see `recompute`).
    const ownShare = own >= 0 ? this.probability[own]! : 0;
    return this.probability[node]! >= PLACEABLE_SHARE * (this.total - ownShare);
  }

  pick(_key: string, _op: number, out: Int32Array): number {
    const nodes = this.nodes;
    const n = nodes.length;
    if (n === 0) return 0;
    let r = Math.random() * this.total;
    let primary = nodes[n - 1]!;
    for (const node of nodes) {
      r -= this.probability[node]!;
      if (r < 0) {
        primary = node;
        break;
      }
    }
    out[0] = primary;
    let count = 1;
    for (let i = 0; i < n; i++) {
      const node = this.order[i]!;
      if (node !== primary) out[count++] = node;
    }
    return count;
  }

  observe(node: number, latencyMs: number, ok: boolean, _op?: number, startedAt?: number): void {
    // Begun before the member came back: it measured the outage it was forgiven on its return.
    if (startedAt !== undefined && startedAt < this.backAt[node]!) return;
    const { ewmaAlpha: alpha } = this.settings;
    const previous = this.ewmaMs[node]!;
    let sample = latencyMs;
    if (ok) this.failures[node] = 0;
    else {
      this.failures[node]!++;
      sample = failureSampleMs(previous, latencyMs);
    }
    this.ewmaMs[node] = Number.isNaN(previous) ? sample : alpha * sample + (1 - alpha) * previous;
    this.recompute();
  }

  private recompute(): void {
    const { temperatureMs } = this.settings;
    // Unmeasured members count as the best measured one, so they are explored at once.
    let best = Infinity;
    for (const node of this.nodes) {
      const e = this.ewmaMs[node]!;
      if (!Number.isNaN(e) && e < best) best = e;
    }
    if (best === Infinity) best = 0;
    // Members no longer routable are never drawn: 0, not the probability they last had.
    this.probability.fill(0);
    let total = 0;
    for (const node of this.nodes) {
      const e = this.ewmaMs[node]!;
      let p = Math.exp(-((Number.isNaN(e) ? best : e) - best) / temperatureMs);
      // Exploration (seed 002, III-C: "still keeps some probability of exploring the others"): a
      // member's estimate moves only when it is drawn, and at 1 ms temperature one slow answer
      // (e^-(gap / 1 ms)) left a healthy member at ~0 for good. A floor of the probe share keeps
      // it drawn now and then; a member past MAX_FAILURES failures in a row stays near zero.
      if (this.failures[node]! > MAX_FAILURES) p *= NEAR_ZERO;
      else p = Math.max(p, this.settings.probeShare);
      // Keep every member representable: exp() of a large gap underflows to 0.
      p = Math.max(p, Number.MIN_VALUE);
      this.probability[node] = p;
      total += p;
    }
    this.total = total;
    // Insertion sort by probability: a handful of members, no allocation.
    const order = this.order;
    let n = 0;
    for (const node of this.nodes) {
      let j = n++;
      while (j > 0 && this.probability[order[j - 1]!]! < this.probability[node]!) {
        order[j] = order[j - 1]!;
        j--;
      }
      order[j] = node;
    }
  }
}
