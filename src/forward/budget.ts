/**
 * A hedge budget: hedges may not exceed a share of requests.
 *
 * Hedging at a node's own p95 fires for about 5% of requests while latency is stationary. Under
 * saturation it is not: hedges add load, load raises latency, and more requests pass their
 * trigger (measured here at 15.7% hedged, under 1% of them winning). The budget caps that loop.
 * It is a token bucket: each retryable request deposits `percent / 100` of a token, a hedge
 * spends one, and up to `burst` tokens may be saved, so a quiet front door can still hedge a
 * burst of slow requests.
 *
 * The default cap is 5%, the extra load hedging at p95 is meant to cost (Finagle's backup
 * requests cap their extra load the same way). Measured here (bench/RESULTS.md, hedging): with
 * 2% of requests stalling 50 ms, own-p95 hedging under a 5% cap cut p99 15x for 4.8% extra
 * requests; uncapped by it (10%) it fired for 6.7% of requests, and p99.9 improved 4x as well.
 *
 * The budget also follows whether hedges pay off. A hedge that loses its race is pure cost, and
 * where latency is the front door's own queueing (a saturated machine) rather than a slow node,
 * nearly all of them lose: measured at saturation here, 2.3% of hedges answered first, and
 * hedging cost 2.4 us of CPU for every request served. So the share of the budget in force is
 * the running win rate over 20%, between 10% and all of it: with a node stalling (the tail case
 * hedging is for) about 40% of hedges win and nothing changes; at saturation the budget drops
 * to a tenth and recovers within a few dozen hedges once they start winning.
 *
 * A request that finds the budget spent is not simply left unhedged. It waits on a short list,
 * in arrival order, and each new token goes to the oldest waiting request that is due.
 * A request leaves the list the moment it no longer waits for that trigger (answered, cancelled,
 * failed over to another node), so a request that was merely slow is gone by then, and one that
 * is stalled (the tail hedging is for) gets the token. Without this, on a busy machine the
 * slow-but-fine requests that pass p95 spent the budget and a stall arriving just after found it
 * empty and ran its whole 50 ms unhedged: p99.9 was not cut. Tokens come only with requests
 * (`deposit`), so that is when the list is served. Only while the whole budget is in force: when
 * it has shrunk, hedges are losing (a saturated front door), and the list would be work for
 * nothing.
 *
 * The list alone still left p99.9 near 50 ms in about one run in three here: hedging at p95 wants
 * about 5% of requests, as much as the budget gives, so tokens ran short, and a request whose
 * trigger passed while a token happened to be there spent it at once, most often on a request that
 * was merely slow (it would have answered a millisecond later) while stalls waited. So while the
 * list is in use the last `reserve` tokens (4 of the 10) are kept for it: a hedge whose trigger
 * passes spends only a token above them, and otherwise joins the list due one trigger later
 * (twice its trigger from its launch), by which time the merely slow have answered and left. The
 * list, oldest first, may spend down to the last token. (A request that starts with no token at
 * all arms no timer and waits from its start, due at twice its trigger as well.) Measured
 * (bench/RESULTS.md, hedging): p99.9 median 10.8 -> 6.5 ms over ten runs of each build side by
 * side, runs at 26 ms or more 4 -> 1, for the same extra load (19 -> 7 ms over the 16-25 runs of
 * the experiments before).
 *
 * A setting of 100% is no budget at all (`forSetting`): every request whose trigger passes is
 * hedged at once, however many do at a time and whether hedges win or not (seed 001's hedging,
 * which has no budget). A budget of 100% still capped a burst at its saved tokens: of 16 reads
 * stalled together, 6 were hedged at their trigger, 4 at twice it and 6 never.
 */
import { performance } from 'node:perf_hooks';

/**
 * While the budget is below its reserve, a hedge waits this many more of its triggers past the
 * first (1: it comes due at twice its trigger from the launch).
 */
export const LOW_BUDGET_PATIENCE = 1;

/** Share of the burst kept for requests on the waiting list (see the reserve above). */
const RESERVE_SHARE = 0.4;

/** What waits for a token: an exchange. */
export interface HedgeWaiter {
  /** Whether a hedge would still be of use (unanswered, not hedged, a candidate left). */
  readonly wantsHedge: boolean;
  /** Fire the hedge now; it spends its token through the driver (`fromList`: the list's token). */
  fireHedge(fromList: boolean): void;
  /** The list it waits on, and its place there: the budget's bookkeeping, null / -1 when none. */
  waitList: HedgeBudget | null;
  waitSlot: number;
}

/**
 * Requests that may wait for a token (a power of two). More waiting than this means the front
 * door is saturated, where hedges lose anyway; later ones are not kept.
 */
export const WAIT_CAPACITY = 256;
const WAIT_MASK = WAIT_CAPACITY - 1;
/** Waiting requests a deposit looks at past one not yet due (triggers differ by node). */
const SCAN_LIMIT = 32;
/** A full list is compacted only while at most this many wait (else the new one is not kept). */
const COMPACT_BELOW = (WAIT_CAPACITY * 3) / 4;
/** Weight of each new hedge outcome in the running win rate (about the last 32 hedges). */
const WIN_ALPHA = 1 / 32;
/** A win rate at or above this earns the whole budget. */
const FULL_BUDGET_WIN_RATE = 0.2;
/** The budget never shrinks below this share of itself, so hedges keep sampling their odds. */
const MIN_BUDGET_SCALE = 0.1;

export class HedgeBudget {
  /** No budget (see above): every hedge may fire; nothing below is consulted. */
  private readonly unlimited: boolean;
  private tokens: number;
  private readonly perRequest: number;
  private readonly burst: number;
  /** Running share of hedges that answered first (1 until hedges say otherwise). */
  private wins = 1;
  /** Share of the configured budget in force: follows `wins`, set when a hedge is answered. */
  private inForce = 1;
  /**
   * Waiting requests, a ring buffer oldest first (`waitSpan` slots from `waitHead`; a slot whose
   * request left is null), and when each one's hedge is due.
   */
  private readonly waiting: (HedgeWaiter | null)[] = new Array<HedgeWaiter | null>(WAIT_CAPACITY).fill(null);
  private readonly dueAt = new Float64Array(WAIT_CAPACITY);
  private waitHead = 0;
  private waitSpan = 0;
  /** Requests on the list (non-null slots). */
  private waitLive = 0;
  /** Set while `serve` walks the list: slots must not move under it. */
  private serving = false;
  /**
   * Armed when a token is left over and the oldest waiting requests are not yet due: serves the
   * list when the first of them is, even if no request comes to bring a deposit by then.
   */
  private dueTimer: NodeJS.Timeout | null = null;
  private dueTimerAt = Infinity;

  /** Tokens a hedge due at its trigger leaves for the waiting list, while the list is in use. */
  private readonly reserve: number;

  /** The budget a `--hedge-budget-percent` (`hedgeBudgetPercent`) setting asks for: 100 is none. */
  static forSetting(percent: number): HedgeBudget {
    // 0% is no hedge at all: no burst either (a full bucket of 10 hedged the first 10 slow
    // requests a thread, every one of them, however many requests came).
    return percent <= 0 ? new HedgeBudget(0, 0, 0) : new HedgeBudget(percent, undefined, undefined, percent >= 100);
  }

  constructor(percent: number, burst = 10, reserve = Math.floor(burst * RESERVE_SHARE), unlimited = false) {
    this.unlimited = unlimited;
    this.perRequest = percent / 100;
    this.burst = burst;
    this.tokens = burst;
    this.reserve = reserve;
  }

  /** Share of the configured budget in force: it follows how often hedges win. */
  get scale(): number {
    return this.inForce;
  }

  /** A retryable request arrived. */
  deposit(): void {
    if (this.unlimited) return;
    const next = this.tokens + this.perRequest * this.inForce;
    this.tokens = next > this.burst ? this.burst : next;
    if (this.waitLive > 0) this.serve();
  }

  /**
   * Whether a request that finds the budget spent should wait for a token: while the whole budget
   * is in force (hedges win often enough). Below that, hedges mostly lose and waiting is waste.
   */
  get waits(): boolean {
    return this.inForce === 1 && this.perRequest > 0 && !this.unlimited;
  }

  /** Requests waiting for a token. */
  get waitingCount(): number {
    return this.waitLive;
  }

  /**
   * The budget had no token for `waiter`'s hedge (above the reserve) when it was to be armed or
   * fired: it waits for a token, to be hedged at `dueAt` (performance.now() time; 0 for at once)
   * or when a token comes after that. One entry per waiter (a new wait replaces its old one).
   * Returns false, keeping nothing, when the list is full.
   */
  wait(waiter: HedgeWaiter, dueAt: number): boolean {
    this.drop(waiter);
    if (this.waitSpan === WAIT_CAPACITY) {
      if (this.waitLive > COMPACT_BELOW || this.serving) return false;
      this.compact();
    }
    const at = (this.waitHead + this.waitSpan) & WAIT_MASK;
    this.waiting[at] = waiter;
    this.dueAt[at] = dueAt;
    this.waitSpan++;
    this.waitLive++;
    waiter.waitList = this;
    waiter.waitSlot = at;
    // Tokens the list may spend are there already (the reserve): serve it when it comes due,
    // whether or not a request brings a deposit by then.
    if (this.tokens >= 1 && dueAt < this.dueTimerAt) this.armDueTimer(dueAt, performance.now());
    return true;
  }

  /**
   * `waiter` no longer waits (answered, cancelled, failed over, hedged): its slot is freed.
   * Returns when its hedge was due (0: at once), or -1 if it was not on the list.
   */
  drop(waiter: HedgeWaiter): number {
    if (waiter.waitList !== this) return -1;
    const at = waiter.waitSlot;
    let due = -1;
    if (this.waiting[at] === waiter) {
      due = this.dueAt[at]!;
      this.waiting[at] = null;
      this.waitLive--;
      if (!this.serving) this.trimHead();
    }
    waiter.waitList = null;
    waiter.waitSlot = -1;
    return due;
  }

  /**
   * Hands tokens to the waiting requests that are due, oldest first. Looks past a request not
   * yet due (its node's trigger may be longer) at up to SCAN_LIMIT waiting requests (freed slots
   * between them do not count). With a token left and only requests not yet due, arms a timer
   * for the first of them.
   */
  private serve(): void {
    if (this.serving || this.tokens < 1) return;
    const waiting = this.waiting;
    const dueAt = this.dueAt;
    let now = -1;
    let nextDue = Infinity;
    this.serving = true;
    try {
      let looked = 0;
      for (let i = 0; i < this.waitSpan && looked < SCAN_LIMIT && this.tokens >= 1; i++) {
        const at = (this.waitHead + i) & WAIT_MASK;
        const waiter = waiting[at];
        if (waiter === undefined || waiter === null) continue;
        looked++;
        const due = dueAt[at]!;
        if (due > 0) {
          if (now < 0) now = performance.now();
          if (due > now) {
            if (due < nextDue) nextDue = due;
            continue;
          }
        }
        waiting[at] = null;
        this.waitLive--;
        waiter.waitList = null;
        waiter.waitSlot = -1;
        if (waiter.wantsHedge) waiter.fireHedge(true);
      }
    } finally {
      this.serving = false;
    }
    this.trimHead();
    if (nextDue < this.dueTimerAt && this.tokens >= 1 && this.waitLive > 0) this.armDueTimer(nextDue, now);
  }

  private armDueTimer(at: number, now: number): void {
    if (this.dueTimer !== null) clearTimeout(this.dueTimer);
    this.dueTimerAt = at;
    this.dueTimer = setTimeout(serveWhenDue, Math.max(1, Math.ceil(at - now)), this);
    this.dueTimer.unref();
  }

  /** @internal the due timer fired */
  onDueTimer(): void {
    this.dueTimer = null;
    this.dueTimerAt = Infinity;
    if (this.waitLive > 0) this.serve();
  }

  /** Frees the empty slots at the head of the list. */
  private trimHead(): void {
    const waiting = this.waiting;
    while (this.waitSpan > 0 && waiting[this.waitHead] === null) {
      this.waitHead = (this.waitHead + 1) & WAIT_MASK;
      this.waitSpan--;
    }
  }

  /** Moves the waiting requests together at the head of the list (it is full of holes). */
  private compact(): void {
    const waiting = this.waiting;
    const dueAt = this.dueAt;
    const live: HedgeWaiter[] = [];
    const due: number[] = [];
    for (let i = 0; i < this.waitSpan; i++) {
      const at = (this.waitHead + i) & WAIT_MASK;
      const waiter = waiting[at];
      if (waiter !== null && waiter !== undefined) {
        live.push(waiter);
        due.push(dueAt[at]!);
      }
      waiting[at] = null;
    }
    this.waitHead = 0;
    this.waitSpan = live.length;
    for (let i = 0; i < live.length; i++) {
      waiting[i] = live[i]!;
      dueAt[i] = due[i]!;
      live[i]!.waitSlot = i;
    }
  }

  /** Whether a token is there now (nothing spent): a hedge timer is worth arming. */
  get affordable(): boolean {
    return this.unlimited || this.tokens >= 1;
  }

  /**
   * Whether a hedge may fire now; spends a token if so. One the list hands out (`fromList`) may
   * take the last token; one due at its trigger leaves the reserve while requests may wait (else
   * it too may take the last: nobody is kept waiting then).
   */
  spend(fromList = false): boolean {
    if (this.unlimited) return true;
    const floor = fromList || !this.waits ? 1 : 1 + this.reserve;
    if (this.tokens < floor) return false;
    this.tokens -= 1;
    return true;
  }

  /** A hedged request was answered: by its hedge (`won`), or by the attempt the hedge raced. */
  outcome(won: boolean): void {
    this.wins += WIN_ALPHA * ((won ? 1 : 0) - this.wins);
    const scale = this.wins / FULL_BUDGET_WIN_RATE;
    this.inForce = scale >= 1 ? 1 : scale > MIN_BUDGET_SCALE ? scale : MIN_BUDGET_SCALE;
  }
}

function serveWhenDue(budget: HedgeBudget): void {
  budget.onDueTimer();
}
