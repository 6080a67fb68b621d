/** Defaults shared by the CLI and `route()`; every value here is documented in the README. */
import { availableParallelism } from 'node:os';
import { BOARD_HEADER, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_WS_BACKLOG_BYTES, DEFAULT_WS_PING_MS } from '../contract.js';
import { DEFAULT_HEALTH_INTERVAL_MS, DEFAULT_HEALTH_TIMEOUT_MS } from '../membership/membership.js';
import { DEFAULT_HEDGE_BUDGET_PERCENT, DEFAULT_HEDGE_DELAY_MS, DEFAULT_HEDGE_PERCENTILE, DEFAULT_REQUEST_TIMEOUT_MS } from '../router/router.js';
import { DEFAULT_HINT_WINDOW_MS, DEFAULT_MAX_HINT_BYTES } from '../replication/quorum.js';
import type { DataPlaneSettings } from './protocol.js';
import type { RouteConfig } from './supervisor.js';

export const DEFAULT_HOST = '0.0.0.0';
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;
export const DEFAULT_UPSTREAM_CONNECTIONS = 64;
export const DEFAULT_UPSTREAM_PIPELINING = 1;
export const DEFAULT_DRAIN_TIMEOUT_MS = 10_000;
export const DEFAULT_CANCEL_GRACE_MS = 250;
/**
 * V8's young generation (its nursery) a worker thread may grow to, in MiB (Worker
 * `resourceLimits.maxYoungGenerationSizeMb`; a semi-space a third of it). V8's own ceiling is 48
 * (16 MiB semi-spaces), and a busy worker grows towards it: 10,000 idle connections after 10 s of
 * proxied load held 123-127 MiB resident at 2 threads with 48, 114-116 with 12, for no CPU a
 * request that wrk could tell apart; 6 holds about 8 MiB less, for 1.2-2.5 us more user CPU a
 * POST (bench/RESULTS.md, "Twenty-seventh session" and "Twenty-eighth session").
 */
export const DEFAULT_WORKER_YOUNG_MB = 12;
/** Seed 004: an unreachable node is marked failed for three seconds. */
export const DEFAULT_UNREACHABLE_HOLD_MS = 3_000;
/**
 * Passive health (Membership.eject): five failed attempts in a row at a node, across workers,
 * eject it for 30 s, then 60, 90, ... up to five minutes while it keeps failing; at most one node
 * in ten out by ejection at once, and always one (Envoy's outlier detection defaults).
 */
export const DEFAULT_EJECT_AFTER = 5;
export const DEFAULT_EJECT_MS = 30_000;
export const MAX_EJECT_MS = 300_000;
export const DEFAULT_EJECT_MAX_PERCENT = 10;
export const DEFAULT_CLUSTER = 'default';

export function defaultThreads(): number {
  return availableParallelism();
}

export function defaultSettings(overrides: Partial<DataPlaneSettings> = {}): DataPlaneSettings {
  return {
    hedgeMode: overrides.hedgeMode ?? 'percentile',
    hedgeDelayMs: overrides.hedgeDelayMs ?? DEFAULT_HEDGE_DELAY_MS,
    hedgeAfterPercentile: overrides.hedgeAfterPercentile ?? DEFAULT_HEDGE_PERCENTILE,
    hedgeBudgetPercent: overrides.hedgeBudgetPercent ?? DEFAULT_HEDGE_BUDGET_PERCENT,
    requestTimeoutMs: overrides.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS,
    maxBodyBytes: overrides.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES,
    maxResponseBytes: overrides.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES,
    upstreamClient: overrides.upstreamClient ?? 'h1',
    upstreamConnections: overrides.upstreamConnections ?? DEFAULT_UPSTREAM_CONNECTIONS,
    upstreamPipelining: overrides.upstreamPipelining ?? DEFAULT_UPSTREAM_PIPELINING,
    cancelGraceMs: overrides.cancelGraceMs ?? DEFAULT_CANCEL_GRACE_MS,
    drainTimeoutMs: overrides.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS,
    forwardedFor: overrides.forwardedFor ?? false,
    ejectAfter: overrides.ejectAfter ?? DEFAULT_EJECT_AFTER,
    wsPingMs: overrides.wsPingMs ?? DEFAULT_WS_PING_MS,
    wsBacklogBytes: overrides.wsBacklogBytes ?? DEFAULT_WS_BACKLOG_BYTES,
  };
}

/** Seed 001's HTTP surface: `/rpc/*` over the default cluster, keyed by the board header. */
export const RPC_ROUTE: RouteConfig = { pattern: '/rpc/*', cluster: DEFAULT_CLUSTER, policy: 'rendezvous', keyHeader: BOARD_HEADER };

/**
 * The demo's replicated route: `/kv/<key>` on three replicas, two acknowledgements a write, two
 * answers a read (the demo nodes keep values as the reference replica does).
 */
export const DEMO_KV_ROUTE: RouteConfig = {
  pattern: '/kv/*',
  cluster: DEFAULT_CLUSTER,
  policy: 'ring',
  keyHeader: null,
  quorum: { n: 3, w: 2, r: 2, consistency: 'quorum', sloppy: true, hintWindowMs: DEFAULT_HINT_WINDOW_MS, maxHintBytes: DEFAULT_MAX_HINT_BYTES },
};

export { DEFAULT_HEALTH_INTERVAL_MS, DEFAULT_HEALTH_TIMEOUT_MS };
