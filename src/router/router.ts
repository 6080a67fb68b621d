/**
 * The in-process router: ranking, hedging and failover for callers that embed routing in their
 * own HTTP layer. The multi-threaded front door runs the same `Exchange` in its workers over
 * undici; this class drives it with `fetch`.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { BOARD_HEADER, isIdempotentPath } from '../contract.js';
import { ErrorCodes } from '../errors.js';
import { rank, type NodeInfo } from '../hashing/rendezvous.js';
import { Exchange, isUnsent, type AttemptHandle, type ExchangeCounters, type ExchangeDriver } from '../forward/exchange.js';
import { HedgeBudget } from '../forward/budget.js';
import { LatencyWindow } from '../forward/latency.js';
import { MAX_TIMER_MS, type Membership } from '../membership/membership.js';
import { C_FAILOVERS, C_HEDGES, C_HEDGES_DENIED, C_HEDGE_WINS, C_REQUESTS, type CounterSlot } from '../metrics/counters.js';

export const DEFAULT_HEDGE_DELAY_MS = 250;
export const DEFAULT_HEDGE_PERCENTILE = 95;
export const DEFAULT_REQUEST_TIMEOUT_MS = 10_000;
export const DEFAULT_HEDGE_BUDGET_PERCENT = 5;

export interface RouterOptions {
  readonly membership: Membership;
  /** Hedge delay before a node has 8 latency samples of its own. Default 250. */
  readonly hedgeDelayMs?: number;
  /** Percentile of a node's own window that triggers a hedge. Default 95. */
  readonly hedgeAfterPercentile?: number;
  /** An attempt that takes longer counts as failed. Default 10,000. */
  readonly requestTimeoutMs?: number;
  /** Hedges may not exceed this share of retryable requests. Default 5; 100: no budget. */
  readonly hedgeBudgetPercent?: number;
  readonly fetch?: typeof globalThis.fetch;
}

export interface ForwardResult {
  readonly status: number;
  readonly body: string;
  /** Id of the node that answered; `""` when none did. */
  readonly servedBy: string;
  readonly hedged: boolean;
  /** Node ids attempted, in the order they were tried. */
  readonly attempted: readonly string[];
  /** Duration of the answering attempt (or of the whole exchange when none answered). */
  readonly latencyMs: number;
}

export interface RouterCounters {
  readonly requests: number;
  readonly hedges: number;
  readonly hedgeWins: number;
  readonly failovers: number;
}

/** @internal How the front door makes `router.counters` report the whole process. */
export interface SharedCounters {
  readonly slot: CounterSlot;
  readonly totals: () => RouterCounters;
}

interface ForwardContext {
  readonly nodes: NodeInfo[];
  readonly path: string;
  readonly body: string;
  readonly headers: Record<string, string>;
  readonly startedAt: number;
  resolve(result: ForwardResult): void;
}

export class Router {
  readonly membership: Membership;
  readonly latency = new LatencyWindow();
  readonly hedgeDelayMs: number;
  readonly hedgeAfterPercentile: number;
  readonly requestTimeoutMs: number;
  private readonly fetchImpl: typeof globalThis.fetch;
  private readonly local = { requests: 0, hedges: 0, hedgeWins: 0, failovers: 0 };
  private readonly shared: SharedCounters | undefined;
  private readonly driver: ExchangeDriver;
  private readonly budget: HedgeBudget;
  /** What `counters` returns: one object, its fields read when read. */
  private readonly liveCounters: RouterCounters;

  constructor(options: RouterOptions, shared?: SharedCounters) {
    // Checked here, not at the first forward(): a bad option fails the construction, naming it.
    if (typeof options?.membership?.nodes !== 'function') throw new TypeError('membership must be a Membership');
    if (options.fetch !== undefined && typeof options.fetch !== 'function') throw new TypeError(`fetch must be a function, got ${typeof options.fetch}`);
    this.membership = options.membership;
    this.hedgeDelayMs = milliseconds(options.hedgeDelayMs, DEFAULT_HEDGE_DELAY_MS, 'hedgeDelayMs', 0);
    this.hedgeAfterPercentile = options.hedgeAfterPercentile ?? DEFAULT_HEDGE_PERCENTILE;
    if (!(typeof this.hedgeAfterPercentile === 'number' && this.hedgeAfterPercentile > 0 && this.hedgeAfterPercentile <= 100)) {
      throw new RangeError(`hedgeAfterPercentile must be in (0, 100], got ${String(this.hedgeAfterPercentile)}`);
    }
    // 0 would fail every attempt at once (route() and the command refuse it too).
    this.requestTimeoutMs = milliseconds(options.requestTimeoutMs, DEFAULT_REQUEST_TIMEOUT_MS, 'requestTimeoutMs', 1);
    this.fetchImpl = options.fetch ?? globalThis.fetch;
    const budgetPercent = options.hedgeBudgetPercent ?? DEFAULT_HEDGE_BUDGET_PERCENT;
    if (!(typeof budgetPercent === 'number' && budgetPercent >= 0 && budgetPercent <= 100)) throw new RangeError(`hedgeBudgetPercent must be in [0, 100], got ${String(budgetPercent)}`);
    this.budget = HedgeBudget.forSetting(budgetPercent);
    this.shared = shared;
    this.driver = this.makeDriver();
    const now = (): RouterCounters => (shared ? shared.totals() : this.local);
    this.liveCounters = Object.freeze({
      get requests() {
        return now().requests;
      },
      get hedges() {
        return now().hedges;
      },
      get hedgeWins() {
        return now().hedgeWins;
      },
      get failovers() {
        return now().failovers;
      },
    });
  }

  /**
   * Running totals, mutated as `forward` runs (seed 001): the same object each time, whose fields
   * read the counts as they are then (a copy, `{ ...router.counters }`, keeps them as they were).
   * Inside a front door they are the whole process's: this router's own counts at once, the
   * worker threads' within 100 ms (workers batch theirs; `/stats` asks them first and is exact).
   */
  get counters(): RouterCounters {
    return this.liveCounters;
  }

  /** Deterministic node preference for a board, best first (eligible nodes only). */
  route(boardId: string): NodeInfo[] {
    return rank(this.membership.nodes(), boardId);
  }

  /**
   * Sends `body` to the board's native node, hedging to the runner-up if the first has not
   * answered by its own p95 (or `hedgeDelayMs` before it has 8 samples). A non-retryable call
   * gets exactly one attempt on exactly one node. `path` is the calling code's, sent as given
   * (fetch resolves dot segments itself); the front door's checks on client paths (dot segments,
   * another route's spelling) are for requests from outside, not for it.
   */
  forward(
    boardId: string,
    path: string,
    body: string,
    retryable?: boolean,
    authorization?: string,
  ): Promise<ForwardResult> {
    // Refused before anything is counted or sent. A path is appended to the node's origin: one
    // not starting with '/' would change the authority (`.evil.example/x` after
    // `http://node-a` is another host, sent the authorization too).
    const bad =
      typeof boardId !== 'string' ? `boardId must be a string, got ${typeof boardId}`
      : typeof path !== 'string' || path.charCodeAt(0) !== 0x2f ? `path must be a string starting with "/", got ${typeof path === 'string' ? JSON.stringify(path.slice(0, 64)) : typeof path}`
      : typeof body !== 'string' ? `body must be a string, got ${typeof body}`
      : retryable !== undefined && typeof retryable !== 'boolean' ? `retryable must be a boolean, got ${typeof retryable}`
      : authorization !== undefined && typeof authorization !== 'string' ? `authorization must be a string, got ${typeof authorization}`
      : null;
    if (bad !== null) return Promise.reject(new TypeError(bad));
    // Default (seed 001): whether the path names an idempotent procedure.
    retryable ??= isIdempotentPath(path);
    const nodes = this.route(boardId);
    const headers: Record<string, string> = { 'content-type': 'application/json', [BOARD_HEADER]: boardId };
    if (authorization !== undefined) headers.authorization = authorization;
    this.bump('requests', C_REQUESTS);
    return new Promise((resolve) => {
      const exchange = new Exchange(this.driver, nodes.length);
      exchange.count = Math.min(nodes.length, exchange.candidates.length);
      for (let i = 0; i < exchange.count; i++) exchange.candidates[i] = i;
      exchange.retryable = retryable;
      exchange.hedgeEnabled = retryable;
      if (retryable) this.budget.deposit();
      const context: ForwardContext = { nodes, path, body, headers, startedAt: performance.now(), resolve };
      exchange.context = context;
      exchange.begin();
    });
  }

  private bump(name: keyof Router['local'], field: number): void {
    if (this.shared) this.shared.slot.bump(field);
    else this.local[name]++;
  }

  private makeDriver(): ExchangeDriver {
    const router = this;
    const counters: ExchangeCounters = {
      hedge: () => router.bump('hedges', C_HEDGES),
      hedgeDenied: () => router.shared?.slot.bump(C_HEDGES_DENIED),
      hedgeWin: () => router.bump('hedgeWins', C_HEDGE_WINS),
      failover: () => router.bump('failovers', C_FAILOVERS),
    };
    return {
      counters,
      allowHedge: (fromList: boolean) => router.budget.spend(fromList),
      hedgeAffordable: () => router.budget.affordable,
      hedgeWait: (exchange: Exchange, dueAt: number) => router.budget.wait(exchange, dueAt),
      hedgeMayWait: () => router.budget.waits,
      hedgeOutcome: (won: boolean) => router.budget.outcome(won),
      hedgeDelayMs(exchange: Exchange, node: number): number {
        const id = (exchange.context as ForwardContext).nodes[node]!.id;
        return router.latency.windowFor(id).triggerMs(router.hedgeAfterPercentile, router.hedgeDelayMs);
      },
      startAttempt(exchange: Exchange, node: number, ordinal: number): AttemptHandle {
        const ctx = exchange.context as ForwardContext;
        const target = ctx.nodes[node]!;
        const controller = new AbortController();
        const timer = setTimeout(() => controller.abort(new Error('request timeout')), router.requestTimeoutMs);
        const started = exchange.launchedAt;
        router
          // A node's redirect is its answer, relayed as it is: a proxy does not follow it.
          .fetchImpl(target.url + ctx.path, { method: 'POST', headers: ctx.headers, body: ctx.body, signal: controller.signal, redirect: 'manual' })
          .then(async (res) => {
            const buf = Buffer.from(await res.arrayBuffer());
            clearTimeout(timer);
            const ms = performance.now() - started;
            if (res.status < 500) router.latency.record(target.id, ms);
            exchange.answered(ordinal, res.status, null, buf, ms);
          })
          .catch((err: unknown) => {
            clearTimeout(timer);
            // fetch wraps the socket's error in its `cause`; only a connection refused or never
            // made (a name not resolved, no local address) proves that nothing was sent: any
            // other error may have come after the request was written.
            const cause = (err as { cause?: unknown }).cause;
            exchange.failed(ordinal, isUnsent(cause) ? cause : err);
          });
        return { abort: () => controller.abort() };
      },
      settle(exchange: Exchange): void {
        const ctx = exchange.context as ForwardContext;
        const attempted: string[] = [];
        for (let i = 0; i < exchange.launched; i++) attempted.push(ctx.nodes[exchange.candidates[i]!]!.id);
        if (exchange.failure) {
          ctx.resolve({
            status: exchange.failure.status,
            body: JSON.stringify({ error: exchange.failure.message, code: exchange.failure.code, attempted }),
            servedBy: '',
            hedged: exchange.hedged,
            attempted,
            latencyMs: performance.now() - ctx.startedAt,
          });
          return;
        }
        ctx.resolve({
          status: exchange.status,
          body: exchange.body!.toString('utf8'),
          servedBy: ctx.nodes[exchange.servedBy]!.id,
          hedged: exchange.hedged,
          attempted,
          latencyMs: exchange.latencyMs,
        });
      },
    };
  }

}

/** A delay option in [min, MAX_TIMER_MS] milliseconds (a Node timer takes no longer one). */
function milliseconds(value: number | undefined, fallback: number, name: string, min: number): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !(value >= min && value <= MAX_TIMER_MS)) throw new RangeError(`${name} must be a number of milliseconds in [${min}, ${MAX_TIMER_MS}], got ${String(value)}`);
  return value;
}

export { ErrorCodes };
