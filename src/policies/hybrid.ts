/**
 * hybrid: operation-type-aware routing for leader-based stores (seed 002, section III-D).
 *
 * - Writes go to the leader the control plane published; with no leader known (or after a write
 *   to it could not connect) they fall back to round robin until a leader is published again.
 * - Reads go round robin over the healthy read pool. A member whose read EWMA (alpha 0.3)
 *   exceeds rho (2) times the median EWMA of the routable members leaves the read pool until a
 *   read of its own finds it back under 0.75 x that limit (hysteresis, so a member near the line
 *   does not flap, and the others' slow reads do not bring it back); a
 *   small probe share of reads (0.5%) still reaches ejected members, so their EWMA can recover
 *   and they can return. A member that was down (out of the routable set) is judged anew when it
 *   comes back.
 */
import { performance } from 'node:perf_hooks';
import { OP_WRITE, type PolicySettings } from '../server/protocol.js';
import { failureSampleMs, returned, rotateInto, routable, type ClusterView, type Policy } from './types.js';

/** Read samples a member needs before it can be judged an outlier. */
const MIN_SAMPLES = 5;
/** An ejected member rejoins the read pool below this share of the ejection limit. */
const REJOIN = 0.75;

export class HybridPolicy implements Policy {
  readonly name = 'hybrid';
  readonly leaderWrites = true;
  private nodes: number[] = [];
  private pool: number[] = [];
  private ejected: number[] = [];
  private leader = -1;
  private leaderSuspect = false;
  private readEwmaMs: Float64Array = new Float64Array(0);
  private readSamples: Int32Array = new Int32Array(0);
  /** performance.now() when each member last came back (its reads begun before are not counted). */
  private backAt: Float64Array = new Float64Array(0);
  private isEjected: Uint8Array = new Uint8Array(0);
  private scratch: Float64Array = new Float64Array(0);
  private nextRead = 0;
  private nextWrite = 0;
  /** `placeable`'s limit, worked out for one ticket node at one judgement (`judge` counts them). */
  private placeLimit = Infinity;
  private placeLimitOwn = -2;
  private placeLimitAt = -1;
  private judgements = 0;

  constructor(private readonly settings: PolicySettings) {}

  update(view: ClusterView): void {
    const size = view.weights.length;
    if (this.readEwmaMs.length !== size) {
      this.readEwmaMs = new Float64Array(size).fill(Number.NaN);
      this.readSamples = new Int32Array(size);
      this.backAt = new Float64Array(size);
      this.isEjected = new Uint8Array(size);
      this.scratch = new Float64Array(size);
    }
    const before = this.nodes;
    this.nodes = routable(view);
    // A member back from being down (unhealthy, or held after refusing connections) is judged
    // anew: the EWMA its failed reads left would keep it out of the pool long after it is well,
    // and only the probe share of reads could wear it down (seconds at hundreds of reads a
    // second, minutes at a few). Runs at a membership change, not a request.
    const now = performance.now();
    for (const node of returned(before, this.nodes)) {
      this.readEwmaMs[node] = Number.NaN;
      this.readSamples[node] = 0;
      this.isEjected[node] = 0;
      this.backAt[node] = now;
    }
    this.leader = view.leader;
    // A new publication supersedes what this thread suspected of the old one.
    this.leaderSuspect = false;
    this.judge();
  }

  /** Whether `node` is currently out of the read pool (for tests and stats). */
  ejectedNow(node: number): boolean {
    return this.isEjected[node] === 1;
  }

  /**
   * A client re-placed by its ticket goes to a member whose reads are not slow: under the limit
   * the read pool is judged by (rho x the median EWMA), the median taken without `own` (the
   * ticket's node: its failing reads must not move the line as it fails and then leaves).
   */
  placeable(node: number, own: number): boolean {
    if (own !== this.placeLimitOwn || this.placeLimitAt !== this.judgements) {
      this.placeLimit = this.limit(own);
      this.placeLimitOwn = own;
      this.placeLimitAt = this.judgements;
    }
    return this.readSamples[node]! < MIN_SAMPLES || !(this.readEwmaMs[node]! > this.placeLimit);
  }

  /** rho x the median read EWMA of the routable members judged so far, but `skip` (Infinity below two). */
  private limit(skip: number): number {
    // Median of the measured EWMAs, by insertion sort into a scratch array: no allocation.
    const sorted = this.scratch;
    let m = 0;
    for (const node of this.nodes) {
      if (node === skip || this.readSamples[node]! < MIN_SAMPLES) continue;
      const e = this.readEwmaMs[node]!;
      let j = m++;
      while (j > 0 && sorted[j - 1]! > e) {
        sorted[j] = sorted[j - 1]!;
        j--;
      }
      sorted[j] = e;
    }
    if (m < 2) return Infinity;
    const mid = m >> 1;
    return this.settings.rho * (m % 2 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2);
  }

  pick(_key: string, op: number, out: Int32Array, takeTurn = true): number {
    const nodes = this.nodes;
    if (nodes.length === 0) return 0;
    if (op === OP_WRITE) {
      if (this.leader >= 0 && !this.leaderSuspect) {
        out[0] = this.leader;
        const start = this.nextWrite;
        this.nextWrite = (start + 1) % nodes.length;
        return rotateInto(nodes, start, out, 1, this.leader);
      }
      const start = this.nextWrite;
      this.nextWrite = (start + 1) % nodes.length;
      return rotateInto(nodes, start, out, 0);
    }
    const pool = this.pool.length > 0 ? this.pool : nodes;
    let primary: number;
    let next = this.nextRead;
    if (this.ejected.length > 0 && this.pool.length > 0 && Math.random() < this.settings.probeShare) {
      primary = this.ejected[(Math.random() * this.ejected.length) | 0]!;
    } else {
      const start = this.nextRead;
      next = (start + 1) % pool.length;
      // A ticket holder's read (placed by its own turn) does not move the rotation.
      if (takeTurn) this.nextRead = next;
      primary = pool[start % pool.length]!;
    }
    out[0] = primary;
    // Failover: the rest of the pool, then the ejected members.
    let count = rotateInto(pool, next, out, 1, primary);
    if (pool !== nodes) for (const node of this.ejected) if (node !== primary) out[count++] = node;
    return count;
  }

  observe(node: number, latencyMs: number, ok: boolean, op: number, startedAt?: number): void {
    if (op === OP_WRITE) return;
    // Sent before the member came back (it hung while down, and answered once it ran again): it
    // measured the outage, which the member was forgiven on its return.
    if (startedAt !== undefined && startedAt < this.backAt[node]!) return;
    const previous = this.readEwmaMs[node]!;
    const sample = ok ? latencyMs : failureSampleMs(previous, latencyMs);
    this.readEwmaMs[node] = Number.isNaN(previous) ? sample : this.settings.ewmaAlpha * sample + (1 - this.settings.ewmaAlpha) * previous;
    this.readSamples[node]!++;
    this.judge(node);
  }

  leaderUnreachable(node: number): void {
    if (node === this.leader) this.leaderSuspect = true;
  }

  /**
   * Recomputes the read pool: out goes every member above rho times the median EWMA. `observed`:
   * the member whose read was just counted (-1 for none: a membership change).
   */
  private judge(observed = -1): void {
    this.judgements++;
    const limit = this.limit(-1);
    let changed = false;
    for (const node of this.nodes) {
      const ewma = this.readEwmaMs[node]!;
      const judged = this.readSamples[node]! >= MIN_SAMPLES;
      // Hysteresis: out above rho x median, back in only below REJOIN x that. Without it a
      // member near the line flaps in and out, taking a third of the reads each time it is in.
      // An ejected member comes back only on a read of its own (a probe) under that line: not
      // because another member's slow read moved the median up for a moment (on a noisy
      // machine a slow follower then came back, for a third of the reads, again and again).
      const out = judged && (this.isEjected[node] === 1 ? node !== observed || ewma > limit * REJOIN : ewma > limit) ? 1 : 0;
      if (this.isEjected[node] !== out) {
        this.isEjected[node] = out;
        changed = true;
      }
    }
    if (changed || this.pool.length + this.ejected.length !== this.nodes.length) {
      this.pool = this.nodes.filter((n) => this.isEjected[n] === 0);
      this.ejected = this.nodes.filter((n) => this.isEjected[n] === 1);
    }
  }
}
