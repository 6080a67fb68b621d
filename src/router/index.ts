/**
 * `lakefront/router`: deterministic cache-affinity routing, hedging and failover across a fixed
 * set of server nodes (seed 001).
 */
import { ConfigError } from '../errors.js';
import type { MemberConfig, Membership } from '../membership/membership.js';
import { validateMembers } from '../membership/membership.js';
import { DEFAULT_CLUSTER, DEFAULT_HEALTH_INTERVAL_MS, DEFAULT_HEALTH_TIMEOUT_MS, DEFAULT_HOST, RPC_ROUTE, defaultSettings, defaultThreads } from '../server/settings.js';
import { FrontDoor } from '../server/supervisor.js';
import type { Router } from './router.js';

export { Router, type RouterOptions, type ForwardResult, type RouterCounters } from './router.js';
export { Membership, type MemberConfig, type MembershipOptions } from '../membership/membership.js';
export { LatencyWindow } from '../forward/latency.js';
export { rank, score, quantiseWeight, WEIGHT_LEVELS, type NodeInfo } from '../hashing/rendezvous.js';
export { isIdempotentPath, isRetryable, IDEMPOTENT_HEADER, IDEMPOTENT_PROCEDURES } from '../contract.js';
export { LakefrontError, ConfigError, ErrorCodes } from '../errors.js';

export interface RouteOptions {
  /** `{ id, url }` per server node. */
  readonly nodes: readonly MemberConfig[];
  /** `0` asks the OS for a free port. Default 0. */
  readonly port?: number;
  /** Fallback hedge delay before a node has 8+ latency samples of its own. Default 250. */
  readonly hedgeDelayMs?: number;
  /** Hedges may not exceed this share of retryable requests, in percent (0-100). Default 5; 100: no budget. */
  readonly hedgeBudgetPercent?: number;
  /** Health-poll interval. Default 1000. */
  readonly healthIntervalMs?: number;
  /** Interface to listen on. Default `0.0.0.0`. */
  readonly host?: string;
  /** Data-plane worker threads. Default: one per core. */
  readonly threads?: number;
  /** An attempt slower than this counts as failed. Default 10,000. */
  readonly requestTimeoutMs?: number;
  /** How long `stop()` waits for in-flight requests. Default 10,000. */
  readonly drainTimeoutMs?: number;
  /** How long a node a request could not reach stays out of every ranking. Default 3,000. */
  readonly unreachableHoldMs?: number;
  /** Passive health: failed attempts in a row at a node, across all threads, that eject it (0: never). Default 5. */
  readonly ejectAfter?: number;
  /** An ejected node's first hold (then twice, three times ... in a row, up to 300,000). Default 30,000. */
  readonly ejectMs?: number;
  /** HTTP/1.1 pipelining of a loop turn's safe reads to a node, up to this many a connection (1-256; 1: none), as `--upstream-pipelining`. Default 1. */
  readonly upstreamPipelining?: number;
}

export interface RouterServer {
  readonly port: number;
  readonly url: string;
  readonly router: Router;
  readonly membership: Membership;
  /**
   * Stops the health-poll loop, then drains and closes the HTTP server. Rejects, naming it, if a
   * worker thread has not ended `drainTimeoutMs` + 5 s later (stuck in JavaScript); see
   * `FrontDoor.stop`.
   */
  stop(): Promise<void>;
  /** @internal The control plane, for operators' tooling and tests. */
  readonly frontDoor: FrontDoor;
}

/**
 * Starts the front door: probes membership once, starts the health-poll loop, and opens the HTTP
 * surface on `port`, served by `threads` worker threads.
 */
export async function route(options: RouteOptions): Promise<RouterServer> {
  const members = validateMembers(options.nodes);
  const port = options.port ?? 0;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError(`port: bad value ${port}`);
  const threads = options.threads ?? defaultThreads();
  if (!Number.isInteger(threads) || threads < 1 || threads > 256) throw new ConfigError(`threads: bad value ${threads}`);
  const host = options.host ?? DEFAULT_HOST;
  if (typeof host !== 'string' || host === '') throw new ConfigError(`host: bad value ${String(host)}`);
  // The command's ranges (config.ts), so the library and the command refuse the same values.
  const hedgeDelayMs = bounded('hedgeDelayMs', options.hedgeDelayMs, 0, 600_000, 'milliseconds');
  const healthIntervalMs = bounded('healthIntervalMs', options.healthIntervalMs, 10, 3_600_000, 'milliseconds');
  const requestTimeoutMs = bounded('requestTimeoutMs', options.requestTimeoutMs, 1, 3_600_000, 'milliseconds');
  // Also bounds the supervisor's last-resort deadline (drain + 5 s): NaN would make it fire at once.
  const drain = bounded('drainTimeoutMs', options.drainTimeoutMs, 0, 3_600_000, 'milliseconds');
  const budget = bounded('hedgeBudgetPercent', options.hedgeBudgetPercent, 0, 100, 'a percentage');
  const unreachableHoldMs = bounded('unreachableHoldMs', options.unreachableHoldMs, 0, 3_600_000, 'milliseconds');
  const ejectAfter = bounded('ejectAfter', options.ejectAfter, 0, 1000, 'failed attempts in a row');
  if (ejectAfter !== undefined && !Number.isInteger(ejectAfter)) throw new ConfigError(`ejectAfter: bad value ${ejectAfter} (a whole number)`);
  const ejectMs = bounded('ejectMs', options.ejectMs, 1, 3_600_000, 'milliseconds');
  const upstreamPipelining = bounded('upstreamPipelining', options.upstreamPipelining, 1, 256, 'requests a connection');
  if (upstreamPipelining !== undefined && !Number.isInteger(upstreamPipelining)) throw new ConfigError(`upstreamPipelining: bad value ${upstreamPipelining} (a whole number)`);
  const door = await FrontDoor.start({
    host,
    port,
    threads,
    clusters: [{ name: DEFAULT_CLUSTER, members }],
    routes: [RPC_ROUTE],
    healthIntervalMs: healthIntervalMs ?? DEFAULT_HEALTH_INTERVAL_MS,
    healthTimeoutMs: DEFAULT_HEALTH_TIMEOUT_MS,
    ...(unreachableHoldMs !== undefined ? { unreachableHoldMs } : {}),
    ...(ejectMs !== undefined ? { ejectMs } : {}),
    settings: defaultSettings({
      ...(ejectAfter !== undefined ? { ejectAfter } : {}),
      ...(hedgeDelayMs !== undefined ? { hedgeDelayMs } : {}),
      ...(budget !== undefined ? { hedgeBudgetPercent: budget } : {}),
      ...(requestTimeoutMs !== undefined ? { requestTimeoutMs } : {}),
      ...(drain !== undefined ? { drainTimeoutMs: drain } : {}),
      ...(upstreamPipelining !== undefined ? { upstreamPipelining } : {}),
    }),
  });
  return {
    port: door.port,
    url: door.url,
    router: door.router,
    membership: door.memberships[0]!,
    stop: () => door.stop(),
    frontDoor: door,
  };
}

/** An optional number option within [min, max], or a ConfigError naming it. */
function bounded(name: string, value: number | undefined, min: number, max: number, unit: string): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number' || !(value >= min && value <= max)) throw new ConfigError(`${name}: bad value ${String(value)} (${unit}, ${min}-${max})`);
  return value;
}
