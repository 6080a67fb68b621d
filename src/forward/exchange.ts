/**
 * One client request's journey over its candidate nodes: the primary attempt, at most one hedge,
 * and failover down the ranking. Shared by the worker data plane (the h1 client, or undici) and the
 * in-process `Router` (fetch); the transport is the driver's business.
 *
 * Rules (seed 000):
 * - The primary is the head of the ranking.
 * - A retryable request hedges to the next candidate when the current primary has not answered by
 *   its hedge trigger (its own p95, or the configured delay) and the hedge budget allows (if the
 *   budget is low then, the request waits for a token, due at twice its trigger, while it is
 *   unanswered: see budget.ts);
 *   the first good answer wins and every other attempt is cancelled.
 * - A retryable request fails over down the whole ranking when an attempt fails and no other
 *   attempt is still running, or when the newest of two racing attempts fails (the older one,
 *   past its trigger, keeps racing); when every candidate has failed it settles as
 *   `ALL_CANDIDATES_FAILED` (502), or as `NODES_SHEDDING` (503) when any of them answered 503
 *   with a `Retry-After` (it sheds load: the client is told when to come back, not to retry now).
 *   At most one hedge fires per request.
 * - A request that is not retryable gets exactly one attempt on one node: no hedge, no failover.
 *   If that attempt fails the outcome is unknown to us and it settles as `OUTCOME_UNKNOWN` (502),
 *   unless it provably sent nothing (`NOT_SENT`, 503).
 *   One exception, off unless the route asks for it (`failoverUnsent`): an attempt that provably
 *   sent nothing (connection refused) may be followed by one on the next candidate.
 *
 * An attempt *fails* when the transport errors (connect, reset, timeout) or when the node answers
 * 502, 503 or 504, which say the node could not serve rather than what the request did. Any other
 * status is an answer and is relayed as is. One exception (`ownNodeFirst`, seed 004): the first
 * candidate is the client's own node (an affinity ticket names it), and it answers 503 with a
 * `Retry-After`. The node is shedding load and says when to come back; its session is there, so
 * that is its answer, relayed, and the client stays placed on it.
 */
import { performance } from 'node:perf_hooks';
import { ErrorCodes } from '../errors.js';
import { HeaderFields } from './fields.js';
import { LOW_BUDGET_PATIENCE, type HedgeBudget, type HedgeWaiter } from './budget.js';

export interface AttemptHandle {
  /** Stop the attempt; safe to call after it finished. */
  abort(): void;
  /**
   * False only when the request provably has not left for the node (still queued for a
   * connection). Absent: it may have.
   */
  mayHaveBeenSent?(): boolean;
}

/** Counters an exchange bumps. Implementations decide where they live (shared memory, plain). */
export interface ExchangeCounters {
  hedge(): void;
  /**
   * A request came due for a hedge and got none (once a request): it left the budget's waiting
   * list unhedged after coming due there, or its hedge timer found no token and it could not wait
   * (the budget had shrunk, or the list was full). Called as the request settles, and not for
   * one hedged after all (a later primary's hedge, after a failover).
   */
  hedgeDenied(): void;
  hedgeWin(): void;
  failover(): void;
}

export interface ExchangeDriver {
  /** Start one attempt of `exchange` at cluster node `node`; it reports through the exchange. */
  startAttempt(exchange: Exchange, node: number, ordinal: number): AttemptHandle;
  /**
   * Whether a hedge may fire now (the hedge budget); spends from it when it says yes. `fromList`:
   * the budget's waiting list is handing the exchange a token (it may take the reserve).
   */
  allowHedge(fromList: boolean): boolean;
  /**
   * The hedge budget had no token for `exchange`'s hedge when it was to be armed or to fire: keep
   * it waiting for a token, due at `dueAt` (performance.now() time, 0 for now). The budget calls
   * `fireHedge(true)` when a token comes, if the exchange still wants a hedge then. False when
   * the list is full and nothing was kept.
   */
  hedgeWait(exchange: Exchange, dueAt: number): boolean;
  /**
   * Whether an exchange that finds the budget spent should wait for a token (`hedgeWait`): only
   * while hedges are paying off. At saturation they mostly lose, and waiting is work for nothing.
   */
  hedgeMayWait(): boolean;
  /**
   * Whether the hedge budget holds a token now, without spending it: a hedge timer is armed only
   * then, or when the waiting list is full (no timer for a hedge that could not fire; at
   * saturation most could not).
   */
  hedgeAffordable(): boolean;
  /** A hedged exchange was answered: by the hedge (`won`) or by the attempt it raced. */
  hedgeOutcome(won: boolean): void;
  /** Hedge trigger in milliseconds for `exchange`, whose current primary is `node`. */
  hedgeDelayMs(exchange: Exchange, node: number): number;
  /** Called exactly once when the exchange settles (answer or failure). */
  settle(exchange: Exchange): void;
  readonly counters: ExchangeCounters;
}

/**
 * Error codes that mean nothing was sent, for errors from a transport that does not say: they only
 * arise before a connection exists. (EHOSTUNREACH and ENETUNREACH are not among them: they can
 * also end a connection after a request was written.)
 */
const UNSENT_CODES: ReadonlySet<string> = new Set(['ECONNREFUSED', 'UND_ERR_CONNECT_TIMEOUT', 'ENOTFOUND', 'EAI_AGAIN', 'EADDRNOTAVAIL']);

/**
 * Whether a failed attempt provably never reached the node: its connection was refused, or it
 * never left the queue. Anything else (a reset, a timeout after writing, any error on a connection
 * that was made) may have landed.
 */
export function isUnsent(error: unknown): boolean {
  const e = error as { code?: unknown; unsent?: unknown } | null;
  if (e === null || typeof e !== 'object') return false;
  // A transport that knows (h1 marks every error) is believed; otherwise the code decides.
  if (typeof e.unsent === 'boolean') return e.unsent;
  return typeof e.code === 'string' && UNSENT_CODES.has(e.code);
}

/** Statuses that say the node could not serve: the attempt counts as failed. */
export function isGatewayFailure(status: number): boolean {
  return status === 502 || status === 503 || status === 504;
}

/**
 * A 503 with a `Retry-After`: the node is shedding load and tells the client when to come back
 * (seed 004's follower in Shed). Headers as the worker's transports give them.
 */
export function isBackOff(status: number, headers: unknown): boolean {
  return status === 503 && headers instanceof HeaderFields && headers.find('retry-after') !== null;
}

/** Longest wait a Retry-After is taken for (a day): a node's larger figure is cut to it. */
const MAX_RETRY_AFTER_S = 86_400;

/** RFC 9110 5.6.7's HTTP-date forms: IMF-fixdate, the obsolete RFC 850 form, and asctime (in GMT, unsaid). */
const IMF_FIXDATE = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} GMT$/;
const RFC850_DATE = /^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), \d{2}-(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)-\d{2} \d{2}:\d{2}:\d{2} GMT$/;
const ASCTIME_DATE = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ \d]\d \d{2}:\d{2}:\d{2} \d{4}$/;

/**
 * Seconds a `Retry-After` value asks for (RFC 9110 10.2.3: delay-seconds, or an HTTP-date in one
 * of its three forms, counted from `nowMs`), at most a day; -1 when it is neither (Date.parse
 * alone takes far more, and reads an asctime date in the local zone).
 */
export function retryAfterSeconds(value: string, nowMs: number): number {
  const text = value.trim();
  if (/^\d+$/.test(text)) return Math.min(Number(text), MAX_RETRY_AFTER_S);
  let at: number;
  if (IMF_FIXDATE.test(text) || RFC850_DATE.test(text)) at = Date.parse(text);
  else if (ASCTIME_DATE.test(text)) at = Date.parse(`${text} GMT`);
  else return -1;
  if (Number.isNaN(at)) return -1;
  return Math.min(Math.max(0, Math.ceil((at - nowMs) / 1000)), MAX_RETRY_AFTER_S);
}

/** The sooner of a wait so far (`soonest` seconds, -1: none) and a node's `seconds` (-1: none). */
export function soonerWait(soonest: number, seconds: number): number {
  return seconds >= 0 && (soonest < 0 || seconds < soonest) ? seconds : soonest;
}

export interface ExchangeFailure {
  readonly code: string;
  readonly status: number;
  readonly message: string;
}

/** Candidates an exchange holds at most (the rest of a ranking is never tried). */
export const MAX_CANDIDATES = 64;

/** An attempt whose transport has not returned its handle yet: nothing to abort through. */
const STARTING: AttemptHandle = Object.freeze({ abort(): void {} });

export class Exchange implements HedgeWaiter {
  readonly driver: ExchangeDriver;
  /** Candidate node indices, best first. Owned by the exchange. */
  readonly candidates: Int32Array;
  count = 0;
  retryable = false;
  /** Whether a hedge may fire (retryable requests only). */
  hedgeEnabled = false;
  /** A write whose attempt provably never left may go to the next candidate (nothing can land twice). */
  failoverUnsent = false;
  /**
   * The first candidate is the client's own node (an affinity ticket): its 503 with a
   * `Retry-After` (it sheds load) is relayed, not failed over.
   */
  ownNodeFirst = false;
  /** Operation class (OP_READ / OP_WRITE), for policies' feedback. */
  op = 0;
  /** Opaque per-request state for the driver (the client response, the request body ...). */
  context: unknown = null;

  /** Candidates launched so far; `candidates[0 .. launched)` were attempted, in order. */
  launched = 0;
  hedged = false;
  /** Ordinal of the hedge attempt, once fired. */
  hedgeOrdinal = -1;
  done = false;
  /** Ordinal (position in candidates) of the attempt that answered, or -1. */
  winner = -1;
  status = 0;
  headers: unknown = null;
  body: Buffer | null = null;
  failure: ExchangeFailure | null = null;
  /**
   * Per ordinal, why an attempt did not give the answer (its error, or the 502-504 it answered
   * and another node was tried for), once one has: a failure's detail. Null while none failed.
   */
  reasons: string[] | null = null;
  /** An attempt's answer was larger than the front door relays: no other node is tried for it. */
  private tooLarge = false;
  /**
   * The soonest `Retry-After` (seconds) of the nodes that answered a retryable attempt with 503
   * and one (shedding load), or -1: if every candidate fails, the client is told to come back
   * then (503, `NODES_SHEDDING`) rather than given a 502 that invites an immediate retry.
   */
  retryAfter = -1;
  /** Duration of the winning attempt, milliseconds. */
  latencyMs = 0;
  /**
   * performance.now() when the latest attempt was launched: the hedge trigger counts from it,
   * and transports may take it as the attempt's start rather than read the clock again.
   */
  launchedAt = 0;
  /** @internal the hedge budget's list this exchange waits on for a token, and its place there */
  waitList: HedgeBudget | null = null;
  /** @internal */
  waitSlot = -1;
  /**
   * It came due for a hedge and got no token. Counted in hedgesDenied when the request settles,
   * once, and only if no hedge fired after all (a later primary's, after a failover).
   */
  private dueUnhedged = false;

  private inflight = 0;
  /**
   * Per ordinal, while the transport may still report: the attempt's handle (STARTING until its
   * transport returned it); null once the attempt finished, or not launched yet. Room for two
   * from the start (a primary and its hedge or failover): a first push into an empty array grows
   * it to 17 slots, a call into the runtime every request.
   */
  private readonly attempts: (AttemptHandle | null)[] = [null, null];
  private hedgeTimer: NodeJS.Timeout | null = null;

  constructor(driver: ExchangeDriver, capacity: number) {
    this.driver = driver;
    const size = Math.min(Math.max(capacity, 1), MAX_CANDIDATES);
    this.candidates = new Int32Array(size);
  }

  /** Node index of the attempt that answered, or -1. */
  get servedBy(): number {
    return this.winner < 0 ? -1 : this.candidates[this.winner]!;
  }

  /**
   * Starts the exchange over `candidates[0 .. count)`. With no candidate it settles at once with
   * `NO_HEALTHY_NODE` (503).
   */
  begin(): void {
    if (this.count === 0) {
      this.fail(ErrorCodes.NO_HEALTHY_NODE, 503, 'no healthy node');
      return;
    }
    this.launch();
    // A transport that failed synchronously may already have failed over and armed the clock.
    if (this.hedgeTimer === null) this.armHedge();
  }

  /** Abort every attempt and settle nothing: the client went away. */
  cancel(): void {
    if (this.done) return;
    this.done = true;
    this.clearHedge();
    this.leaveWaitList();
    this.tallyDenied();
    this.abortAll(-1);
  }

  /**
   * The front door is closing before an answer came: abort every attempt and settle with a
   * failure the client can act on. A bare write that may have left for its node may have been
   * applied (502, outcome unknown); anything else (retryable, or a write still queued for a
   * connection) was not, and can be retried elsewhere (503).
   */
  shutDown(): void {
    if (this.done) return;
    let mayHaveLanded = false;
    if (!this.retryable) {
      for (let i = 0; i < this.launched; i++) {
        const handle = this.attempts[i];
        if (handle != null && (handle.mayHaveBeenSent === undefined || handle.mayHaveBeenSent())) mayHaveLanded = true;
      }
    }
    this.abortAll(-1);
    if (mayHaveLanded) {
      this.fail(ErrorCodes.OUTCOME_UNKNOWN, 502, 'the front door shut down before the node answered; the request may or may not have been applied');
    } else {
      this.fail(ErrorCodes.SHUTTING_DOWN, 503, 'the front door shut down before a node answered');
    }
  }

  /** The transport reports a complete response for the attempt at `ordinal`. */
  answered(ordinal: number, status: number, headers: unknown, body: Buffer, latencyMs: number): void {
    if (!this.finish(ordinal)) return;
    if (this.done) return;
    if (this.retryable && isGatewayFailure(status) && !(ordinal === 0 && this.ownNodeFirst && isBackOff(status, headers))) {
      // A 503 with a Retry-After: the node sheds load, and says when to come back.
      const wait = status === 503 && headers instanceof HeaderFields ? headers.find('retry-after') : null;
      const seconds = wait === null ? -1 : retryAfterSeconds(wait, Date.now());
      this.retryAfter = soonerWait(this.retryAfter, seconds);
      (this.reasons ??= [])[ordinal] = seconds >= 0 ? `answered 503, retry after ${seconds} s` : `answered ${status}`;
      this.next(false, ordinal);
      return;
    }
    this.done = true;
    this.clearHedge();
    this.leaveWaitList();
    this.tallyDenied();
    // Before the losers hear of it: a loser killed at once (no grace) reads it (upstream.ts CUT_OFF).
    this.winner = ordinal;
    this.abortAll(ordinal);
    this.status = status;
    this.headers = headers;
    this.body = body;
    this.latencyMs = latencyMs;
    if (this.hedged) {
      const won = ordinal === this.hedgeOrdinal;
      if (won) this.driver.counters.hedgeWin();
      this.driver.hedgeOutcome(won);
    }
    this.driver.settle(this);
  }

  /** The transport reports that the attempt at `ordinal` failed (error or timeout). */
  failed(ordinal: number, error: unknown): void {
    if (!this.finish(ordinal)) return;
    if (this.done) return;
    (this.reasons ??= [])[ordinal] = describeFailure(error);
    // The same resource is as large elsewhere: another node's copy is not fetched too.
    const code = (error as { code?: unknown } | null)?.code;
    if (code === ErrorCodes.RESPONSE_TOO_LARGE || code === 'UND_ERR_RES_EXCEEDED_MAX_SIZE') this.tooLarge = true;
    const unsent = isUnsent(error);
    this.next(this.failoverUnsent && unsent, ordinal, unsent);
  }

  /**
   * After the attempt at `ordinal` failed: try the next candidate if allowed (`unsentSafe`: it
   * may, being unsent). `unsent`: the failed attempt provably never reached its node.
   */
  private next(unsentSafe: boolean, ordinal: number, unsent = false): void {
    // Another attempt is still running and may answer. If it is the newest (the hedge, or a
    // failover, that the failed primary was racing), wait for it rather than add load. If the
    // newest attempt failed, the one still running is a primary already past its trigger (it was
    // hedged): waiting on it could take the whole request timeout, so the next node is tried.
    if (this.inflight > 0) {
      const racerFailed = this.hedged && ordinal === this.launched - 1;
      if (!racerFailed || this.tooLarge || !(this.retryable || unsentSafe) || this.launched >= this.count) return;
    }
    if ((this.retryable || unsentSafe) && this.launched < this.count && !this.tooLarge) {
      this.driver.counters.failover();
      // The wait was for the failed primary's trigger; the new primary gets its own.
      this.leaveWaitList();
      this.launch();
      // The hedge clock belongs to the attempt now leading; restart it for the new one.
      this.clearHedge();
      this.armHedge();
      return;
    }
    if (this.tooLarge) {
      this.fail(ErrorCodes.RESPONSE_TOO_LARGE, 502, 'the node answered with more than the front door relays (--max-response-bytes); no other node was asked');
    } else if (this.retryable && this.retryAfter >= 0) {
      // Some node is there but shedding load: "come back later" is the answer, not a 502.
      this.fail(ErrorCodes.NODES_SHEDDING, 503, `every candidate node failed, and the nodes that answered are shedding load: retry after ${this.retryAfter} s`);
    } else if (this.retryable) {
      this.fail(ErrorCodes.ALL_CANDIDATES_FAILED, 502, 'every candidate node failed');
    } else if (unsent) {
      // Provably never sent (the connection was refused, or it never left the queue): the
      // caller can know it was not applied.
      this.fail(ErrorCodes.NOT_SENT, 503, 'the node could not be reached: the request was not sent');
    } else {
      this.fail(
        ErrorCodes.OUTCOME_UNKNOWN,
        502,
        'the single attempt failed; the request may or may not have been applied',
      );
    }
  }

  /** Marks the attempt at `ordinal` finished; false if it already was (a second report). */
  private finish(ordinal: number): boolean {
    const attempts = this.attempts;
    if (ordinal >= this.launched || attempts[ordinal] === null) return false;
    attempts[ordinal] = null;
    this.inflight--;
    return true;
  }

  private launch(): void {
    this.launchedAt = performance.now();
    const ordinal = this.launched++;
    this.inflight++;
    if (ordinal < this.attempts.length) this.attempts[ordinal] = STARTING;
    else this.attempts.push(STARTING);
    const handle = this.driver.startAttempt(this, this.candidates[ordinal]!, ordinal);
    // A transport may report synchronously (dispatch on a closed pool): keep no stale handle.
    if (this.attempts[ordinal] === STARTING) this.attempts[ordinal] = handle;
  }

  /** Whether a hedge would still be of use: unanswered, not hedged yet, a candidate left. */
  get wantsHedge(): boolean {
    return this.hedgeEnabled && !this.done && !this.hedged && this.launched < this.count;
  }

  /**
   * Off the hedge budget's list (if on it): nothing to wait for any more, nothing kept alive.
   * One that came due there and got no token was denied a hedge (counted when it settles).
   */
  private leaveWaitList(): void {
    if (this.waitList === null) return;
    const dueAt = this.waitList.drop(this);
    if (dueAt >= 0 && performance.now() >= dueAt) this.dueUnhedged = true;
  }

  /** On settling: a request that came due for a hedge and never got one is counted, once. */
  private tallyDenied(): void {
    if (this.dueUnhedged && !this.hedged) this.driver.counters.hedgeDenied();
  }

  private armHedge(): void {
    if (!this.wantsHedge) return;
    const delay = this.driver.hedgeDelayMs(this, this.candidates[this.launched - 1]!);
    // No token at all now: no timer (at saturation most would fire into a spent budget). The
    // exchange waits for a token instead, due at twice its trigger (the budget is low: see
    // budget.ts), and is hedged if one comes once it is due and still unanswered. A full list
    // keeps nothing: then the timer is armed after all, to try the budget again at the trigger.
    if (!this.driver.hedgeAffordable()) {
      if (!this.driver.hedgeMayWait()) return;
      if (this.driver.hedgeWait(this, this.launchedAt + (1 + LOW_BUDGET_PATIENCE) * delay)) return;
    }
    this.hedgeTimer = setTimeout(onHedgeTimer, delay, this);
  }

  /** @internal the hedge timer fired */
  onHedgeTimer(): void {
    this.hedgeTimer = null;
    this.fireHedge(false);
  }

  /**
   * Hedge now if the budget allows: the timer at the trigger, or the budget's list handing a
   * waiting exchange a token (`fromList`).
   */
  fireHedge(fromList: boolean): void {
    this.clearHedge();
    this.leaveWaitList();
    if (!this.wantsHedge) return;
    if (!this.driver.allowHedge(fromList)) {
      // The budget is low: the hedge waits one trigger more for a token (see budget.ts). With no
      // list to wait on (the budget has shrunk, or the list is full) it is denied now.
      const node = this.candidates[this.launched - 1]!;
      if (!this.driver.hedgeMayWait() || !this.driver.hedgeWait(this, performance.now() + LOW_BUDGET_PATIENCE * this.driver.hedgeDelayMs(this, node))) {
        this.dueUnhedged = true;
      }
      return;
    }
    this.hedged = true;
    this.hedgeOrdinal = this.launched;
    this.driver.counters.hedge();
    this.launch();
  }

  private clearHedge(): void {
    if (this.hedgeTimer !== null) {
      clearTimeout(this.hedgeTimer);
      this.hedgeTimer = null;
    }
  }

  private abortAll(except: number): void {
    for (let i = 0; i < this.launched; i++) {
      const handle = this.attempts[i];
      if (i === except || handle === null) continue;
      this.finish(i);
      handle.abort();
    }
  }

  private fail(code: string, status: number, message: string): void {
    this.done = true;
    this.clearHedge();
    this.leaveWaitList();
    this.tallyDenied();
    this.failure = { code, status, message };
    this.status = status;
    this.driver.settle(this);
  }
}

/**
 * An attempt's failure as a 502 tells the client: the front door's own errors with their message;
 * any other only by its code (ECONNRESET, UND_ERR_HEADERS_TIMEOUT): the system's messages name
 * the node's address, which is not the client's business.
 */
export function describeFailure(error: unknown): string {
  const { code, message } = (typeof error === 'object' && error !== null ? error : {}) as { code?: unknown; message?: unknown };
  if (typeof code !== 'string') return 'failed (no error code)';
  return code.startsWith('LF_ERR_') && typeof message === 'string' && message !== '' ? `${code}: ${message}` : code;
}

function onHedgeTimer(exchange: Exchange): void {
  exchange.onHedgeTimer();
}
