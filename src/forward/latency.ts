/**
 * Rolling latency windows that set the hedge trigger: a node's own recent p95.
 */

/** Samples kept per node. */
export const WINDOW_SIZE = 128;
/** Samples a node needs before its own percentile is trusted over the configured fallback. */
export const MIN_SAMPLES = 8;
/**
 * How many new samples may arrive before a cached percentile is recomputed on the hot path.
 * Sorting 128 samples costs a few microseconds; doing it every 8th sample keeps the trigger
 * within a few samples of exact at an eighth of the cost.
 */
const REFRESH_EVERY = 8;

/** One node's ring of the last {@link WINDOW_SIZE} samples, in milliseconds. */
export class SampleWindow {
  private readonly samples = new Float64Array(WINDOW_SIZE);
  private readonly sorted = new Float64Array(WINDOW_SIZE);
  private next = 0;
  private held = 0;
  private sinceSort = 0;
  private sortedValid = false;
  private cachedP = NaN;
  private cachedValue = NaN;

  record(ms: number): void {
    if (!(ms >= 0)) return;
    this.samples[this.next] = ms;
    this.next = (this.next + 1) % WINDOW_SIZE;
    if (this.held < WINDOW_SIZE) this.held++;
    this.sinceSort++;
    this.sortedValid = false;
  }

  get count(): number {
    return this.held;
  }

  /** Exact nearest-rank percentile of the held samples; `undefined` below {@link MIN_SAMPLES}. */
  percentile(p: number): number | undefined {
    if (this.held < MIN_SAMPLES) return undefined;
    if (!this.sortedValid) this.sort();
    return this.pick(p);
  }

  /**
   * The hedge trigger for this node: its p-th percentile once it has {@link MIN_SAMPLES}
   * samples, else `fallbackMs`. Recomputed at most every {@link REFRESH_EVERY} samples.
   */
  triggerMs(p: number, fallbackMs: number): number {
    if (this.held < MIN_SAMPLES) return fallbackMs;
    if (p !== this.cachedP || this.sinceSort >= REFRESH_EVERY || Number.isNaN(this.cachedValue)) {
      this.sort();
      this.cachedP = p;
      this.cachedValue = this.pick(p);
    }
    return this.cachedValue;
  }

  private sort(): void {
    const view = this.sorted.subarray(0, this.held);
    view.set(this.samples.subarray(0, this.held));
    view.sort();
    this.sortedValid = true;
    this.sinceSort = 0;
  }

  private pick(p: number): number {
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
