/**
 * Rolling latency windows that set the hedge trigger: a node's own recent p95.
 */

/** Samples kept per node. */
export const WINDOW_SIZE = 128;
/** Samples a node needs before its own percentile is trusted over the configured fallback. */
export const MIN_SAMPLES = 8;

/**
 * One node's ring of the last {@link WINDOW_SIZE} samples, in milliseconds, and the same samples
 * in order, so a percentile is one array read.
 *
 * The ordered copy is built by a sort the first time a percentile is asked for, then kept in
 * step by each new sample: binary searches find the evicted sample's place and the new one's, and
 * the samples between them shift one slot (about 90 ns here, against 550 ns a request for
 * re-sorting 128 samples every 8th). A window nobody asks (a node serving only bare writes)
 * never pays for the order.
 */
export class SampleWindow {
  private readonly samples = new Float64Array(WINDOW_SIZE);
  private readonly sorted = new Float64Array(WINDOW_SIZE);
  private next = 0;
  private held = 0;
  private sortedValid = false;

  record(ms: number): void {
    if (!(ms >= 0)) return;
    const full = this.held === WINDOW_SIZE;
    const evicted = this.samples[this.next]!;
    this.samples[this.next] = ms;
    this.next = (this.next + 1) % WINDOW_SIZE;
    if (!full) this.held++;
    if (this.sortedValid) this.reorder(full, evicted, ms);
  }

  get count(): number {
    return this.held;
  }

  /** Exact nearest-rank percentile of the held samples; `undefined` below {@link MIN_SAMPLES}. */
  percentile(p: number): number | undefined {
    if (this.held < MIN_SAMPLES) return undefined;
    return this.pick(p);
  }

  /**
   * The hedge trigger for this node: its p-th percentile (exact, over the held samples) once it
   * has {@link MIN_SAMPLES} samples, else `fallbackMs`.
   */
  triggerMs(p: number, fallbackMs: number): number {
    if (this.held < MIN_SAMPLES) return fallbackMs;
    return this.pick(p);
  }

  /**
   * Keeps `sorted` in order: the samples between the evicted one's place and the new one's shift
   * one slot, with one `copyWithin`, or none when the two places meet. (`copyWithin` is a call
   * into the runtime: taking the evicted sample out and making room for the new one apart cost
   * two; a loop in JavaScript instead cost more than both, `bench/ir.sh`.)
   */
  private reorder(full: boolean, evicted: number, added: number): void {
    const s = this.sorted;
    if (!full) {
      // The ring is filling: the first held - 1 samples are in order; `added` joins them, after
      // any equal one.
      const n = this.held - 1;
      const at = placeOf(s, 0, n, added, true);
      if (at < n) s.copyWithin(at + 1, at, n);
      s[at] = added;
      return;
    }
    const out = placeOf(s, 0, WINDOW_SIZE, evicted, false);
    if (added > evicted) {
      // The samples after the evicted one and below `added` move down one.
      const before = placeOf(s, out + 1, WINDOW_SIZE, added, false);
      if (before > out + 1) s.copyWithin(out, out + 1, before);
      s[before - 1] = added;
    } else {
      // The samples from `added`'s place up to the evicted one move up one.
      const at = placeOf(s, 0, out, added, true);
      if (at < out) s.copyWithin(at + 1, at, out);
      s[at] = added;
    }
  }

  private pick(p: number): number {
    if (!this.sortedValid) {
      const view = this.sorted.subarray(0, this.held);
      view.set(this.samples.subarray(0, this.held));
      view.sort();
      this.sortedValid = true;
    }
    const clamped = Math.min(100, Math.max(0, p));
    const rankIndex = Math.max(1, Math.ceil((clamped / 100) * this.held));
    return this.sorted[rankIndex - 1]!;
  }
}

/**
 * Per-node latency tracking used to set the hedge delay: hedging at a node's own recent p95 keeps
 * roughly 5% of requests hedged in steady state.
 */
export class LatencyWindow {
  private readonly windows = new Map<string, SampleWindow>();

  /** Appends a sample (milliseconds) to the node's 128-entry sliding window. */
  record(nodeId: string, ms: number): void {
    this.windowFor(nodeId).record(ms);
  }

  /** `undefined` until the node has 8 or more samples. `p` is in percent (95 for p95). */
  percentile(nodeId: string, p: number): number | undefined {
    return this.windows.get(nodeId)?.percentile(p);
  }

  /** Samples currently held for a node. */
  count(nodeId: string): number {
    return this.windows.get(nodeId)?.count ?? 0;
  }

  /** The node's window, created on first use: lets a hot path skip the map lookup. */
  windowFor(nodeId: string): SampleWindow {
    let window = this.windows.get(nodeId);
    if (window === undefined) {
      window = new SampleWindow();
      this.windows.set(nodeId, window);
    }
    return window;
  }
}

/**
 * The first index in `s[from, to)` (sorted) whose sample is above `value` (`after`), or not below
 * it; `to` if none is.
 */
function placeOf(s: Float64Array, from: number, to: number, value: number, after: boolean): number {
  let lo = from;
  let hi = to;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    const v = s[mid]!;
    if (v < value || (after && v === value)) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
