/**
 * The hedge triggers of one thread, on one Node timer.
 *
 * Every retryable request arms a trigger and nearly every one is disarmed unfired (the primary
 * answers first: 95% of them at a node's own p95). A Node timer per request paid for that with a
 * `Timeout` object, an async id, a lookup of its duration's list, often a new list and a native
 * call to move the loop's timer, and as much again to clear it: 1.2-1.8 us of CPU a proxied GET
 * (`bench/ab-cpu.sh`, hedging on against off). Here a trigger is a place in a binary heap of due
 * times (a Float64Array beside the waiters, each waiter holding its own place): arming and
 * disarming allocate nothing and touch no timer. One Node timer per thread wakes for the soonest
 * trigger; it is moved only when a trigger comes due sooner than it (new triggers mostly come due
 * after the ones already waiting) or at a wake.
 *
 * When a trigger fires: at the first wake at or after `dueAt - EARLY_MS`. Node's timers count
 * whole milliseconds of the event loop's clock, read when the loop turn began, so a wake asked for
 * in d ms comes up to about a millisecond early or late; a trigger within `EARLY_MS` of its due
 * time fires at that wake rather than a millisecond after it (`bench/timer-granularity.mjs`
 * measures where they fire).
 */
import { performance } from 'node:perf_hooks';

/** What waits on the clock: its place in the heap (-1: not waiting), and what to do when due. */
export interface HedgeTimed {
  hedgeSlot: number;
  onHedgeTimer(): void;
}

/** A trigger due within this many milliseconds of a wake fires at it. */
export const EARLY_MS = 0.5;
/**
 * A wake this many milliseconds overdue when a trigger is armed is taken as lost (a stalled loop,
 * or a timer a test's mocked clock dropped) and asked for again.
 */
const OVERDUE_MS = 5;

export class HedgeClock {
  private items: (HedgeTimed | null)[] = [];
  private dues = new Float64Array(64);
  private size = 0;
  private timer: NodeJS.Timeout | null = null;
  /** performance.now() the pending wake was asked for (Infinity: none). */
  private wakeAt = Infinity;
  /** Inside a wake: triggers armed meanwhile wait for the wake's own scheduling. */
  private waking = false;

  /** Triggers waiting. */
  get waiting(): number {
    return this.size;
  }

  /** Arm `w`'s trigger for `dueAt` (performance.now() time); `now`: the clock as it is armed. */
  arm(w: HedgeTimed, dueAt: number, now: number): void {
    if (w.hedgeSlot >= 0) this.removeAt(w.hedgeSlot);
    if (this.size === this.dues.length) {
      const grown = new Float64Array(this.size * 2);
      grown.set(this.dues);
      this.dues = grown;
    }
    this.siftUp(this.size++, w, dueAt);
    if (!this.waking && (dueAt < this.wakeAt || this.wakeAt < now - OVERDUE_MS)) this.schedule(now);
  }

  /** `w` no longer waits (answered, failed, gone); nothing if it was not waiting. */
  disarm(w: HedgeTimed): void {
    if (w.hedgeSlot >= 0) this.removeAt(w.hedgeSlot);
  }

  private schedule(now: number): void {
    if (this.timer !== null) clearTimeout(this.timer);
    if (this.size === 0) {
      this.timer = null;
      this.wakeAt = Infinity;
      return;
    }
    const ms = Math.max(1, Math.ceil(this.dues[0]! - EARLY_MS - now));
    this.wakeAt = now + ms;
    this.timer = setTimeout(this.wake, ms);
    this.timer.unref();
  }

  private readonly wake = (): void => {
    this.timer = null;
    this.wakeAt = Infinity;
    this.waking = true;
    try {
      const limit = performance.now() + EARLY_MS;
      while (this.size > 0 && this.dues[0]! <= limit) {
        const w = this.items[0]!;
        this.removeAt(0);
        w.onHedgeTimer();
      }
    } finally {
      this.waking = false;
      if (this.size > 0 && this.timer === null) this.schedule(performance.now());
    }
  };

  /** Place `w` (due `due`) at or above slot `i`, moving later ones down. */
  private siftUp(i: number, w: HedgeTimed, due: number): void {
    const items = this.items;
    const dues = this.dues;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (dues[parent]! <= due) break;
      const moved = items[parent]!;
      items[i] = moved;
      dues[i] = dues[parent]!;
      moved.hedgeSlot = i;
      i = parent;
    }
    items[i] = w;
    dues[i] = due;
    w.hedgeSlot = i;
  }

  /** Place `w` (due `due`) at or below slot `i`, moving sooner ones up. */
  private siftDown(i: number, w: HedgeTimed, due: number): void {
    const items = this.items;
    const dues = this.dues;
    const size = this.size;
    for (;;) {
      let child = 2 * i + 1;
      if (child >= size) break;
      if (child + 1 < size && dues[child + 1]! < dues[child]!) child++;
      if (dues[child]! >= due) break;
      const moved = items[child]!;
      items[i] = moved;
      dues[i] = dues[child]!;
      moved.hedgeSlot = i;
      i = child;
    }
    items[i] = w;
    dues[i] = due;
    w.hedgeSlot = i;
  }

  private removeAt(slot: number): void {
    const items = this.items;
    const removed = items[slot]!;
    removed.hedgeSlot = -1;
    const last = --this.size;
    if (slot !== last) {
      const moved = items[last]!;
      const due = this.dues[last]!;
      if (slot > 0 && this.dues[(slot - 1) >> 1]! > due) this.siftUp(slot, moved, due);
      else this.siftDown(slot, moved, due);
    }
    // The heap keeps no exchange alive once it stops waiting.
    items[last] = null;
  }
}

/** This thread's clock (module state is per thread: each worker has its own). */
export const hedgeClock = new HedgeClock();
