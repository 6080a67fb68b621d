/**
 * Rolling latency windows that set the hedge trigger: a node's own recent p95.
 */

/** Samples kept per node. */
export const WINDOW_SIZE = 128;
/** Samples a node needs before its own percentile is trusted over the configured fallback. */
export const MIN_SAMPLES = 8;

/** Samples kept above the largest rank asked for, so a few leaving do not force a rebuild. */
const TOP_SLACK = 8;

/**
 * One node's ring of the last {@link WINDOW_SIZE} samples, in milliseconds, and beside it the
 * largest few of them in order: a high percentile (the hedge trigger's p95: the 7th largest of
 * 128) is one array read.
 *
 * The list (`top`) holds the `topCount` largest samples of the ring, largest first, each with the
 * ring slot it came from; every sample outside it is no larger than its smallest. A new sample at
 * least that smallest one joins it (the smallest leaves when it is full); a smaller one stays
 * outside; an evicted sample leaves it if it was in it. When fewer than the rank asked for are
 * left, the list is rebuilt from the ring. Its room grows to the largest rank ever asked for,
 * plus a slack. At p95 (room 15), per sample that is a compare and, one time in five or ten, a
 * shift of at most 15 doubles in JavaScript; a rebuild every 300-400 samples of steady latencies,
 * every 9 while they fall steadily (each sample leaving is one of the largest). Keeping all 128
 * in order instead took two binary searches and a `copyWithin` (a call into the runtime) a
 * sample: in callgrind about 385 instructions a GET against about 200 this way, and 120 against
 * 20-30 ns a sample and trigger in a loop (RESULTS.md, "Twenty-second session"). A window nobody
 * asks (a node serving only bare writes) never keeps a list.
 */
export class SampleWindow {
  private readonly samples = new Float64Array(WINDOW_SIZE);
  private next = 0;
  private held = 0;
  /** The largest samples, largest first (`topCount` of them); null until a percentile is asked. */
  private top: Float64Array | null = null;
  /** The ring slot of each sample in `top`. */
  private topSlot = new Int32Array(0);
  /** Per ring slot, 1 while its sample is in `top`. */
  private readonly inTop = new Uint8Array(WINDOW_SIZE);
  private topCount = 0;

  record(ms: number): void {
    // Not a duration: negative, NaN, or Infinity (a trigger of Infinity fires a timer after 1 ms).
    if (!(ms >= 0 && ms < Infinity)) return;
    const slot = this.next;
    // The slot's old sample leaves the ring (and the list, if it was in it).
    if (this.inTop[slot] === 1) this.dropTop(slot);
    this.samples[slot] = ms;
    this.next = (slot + 1) % WINDOW_SIZE;
    if (this.held < WINDOW_SIZE) this.held++;
    const top = this.top;
    if (top === null) return;
    const m = this.topCount;
    // It joins the list if it is no smaller than the list's smallest (everything outside is no
    // larger than that), or if the list holds every other sample and has room.
    if ((m > 0 && ms >= top[m - 1]!) || (m === this.held - 1 && m < top.length)) this.joinTop(slot, ms);
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

  private pick(p: number): number {
    const clamped = Math.min(100, Math.max(0, p));
    const rank = Math.max(1, Math.ceil((clamped / 100) * this.held));
    // The rank-th smallest is the k-th largest.
    const k = this.held - rank + 1;
    if (this.top === null || k > this.topCount) this.rebuild(k);
    return this.top![k - 1]!;
  }

  /** `slot`'s sample (`ms`) joins the list, after any equal one; the smallest leaves a full list. */
  private joinTop(slot: number, ms: number): void {
    const top = this.top!;
    const slots = this.topSlot;
    let i = this.topCount;
    if (i === top.length) {
      i--;
      this.inTop[slots[i]!] = 0;
    } else this.topCount++;
    while (i > 0 && top[i - 1]! < ms) {
      top[i] = top[i - 1]!;
      slots[i] = slots[i - 1]!;
      i--;
    }
    top[i] = ms;
    slots[i] = slot;
    this.inTop[slot] = 1;
  }

  /**
   * The sample of ring slot `slot` leaves the list. (Were it not found there, the list would lose
   * its smallest instead: still the largest of the ring, one fewer.)
   */
  private dropTop(slot: number): void {
    const top = this.top!;
    const slots = this.topSlot;
    const last = --this.topCount;
    let i = 0;
    while (i <= last && slots[i] !== slot) i++;
    for (; i < last; i++) {
      top[i] = top[i + 1]!;
      slots[i] = slots[i + 1]!;
    }
    this.inTop[slot] = 0;
  }

  /** The list anew from the ring, with room for at least `k` (and the slack). */
  private rebuild(k: number): void {
    const room = Math.min(WINDOW_SIZE, Math.max(k + TOP_SLACK, this.top === null ? 0 : this.top.length));
    if (this.top === null || this.top.length < room) {
      this.top = new Float64Array(room);
      this.topSlot = new Int32Array(room);
    }
    this.inTop.fill(0);
    this.topCount = 0;
    const top = this.top;
    for (let slot = 0; slot < this.held; slot++) {
      const ms = this.samples[slot]!;
      if (this.topCount < room || ms > top[this.topCount - 1]!) this.joinTop(slot, ms);
    }
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
