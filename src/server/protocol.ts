/**
 * The thread protocol, in one place: what a data-plane worker is given at spawn, and every
 * message that crosses between it and the control plane. Nothing here is sent per proxied
 * request; per-request state lives in shared memory (membership/table.ts, metrics/counters.ts).
 */
import type { AffinitySettings } from '../affinity/tickets.js';
import type { HeldRows } from '../replication/hints.js';
import type { QuorumSettings } from '../replication/quorum.js';

/** Operation classes a route's classifier assigns. */
export const OP_READ = 0;
export const OP_WRITE = 1;
/** A path the route does not carry (a streaming call): answered 501, never forwarded. */
export const OP_UNSUPPORTED = 2;

export type PolicyName = 'rendezvous' | 'ring' | 'round_robin' | 'boltzmann' | 'hybrid';

/** Paths the front door answers itself, for every method: no route may take them. */
export const OWN_PATHS: readonly string[] = ['/health', '/route', '/stats'];

export const POLICY_NAMES: readonly PolicyName[] = ['rendezvous', 'ring', 'round_robin', 'boltzmann', 'hybrid'];

/**
 * How a route tells reads from writes. Paths are matched exactly, or by prefix when they end in
 * `*`; a path that matches neither list takes `otherwise`.
 */
export interface OperationRules {
  readonly reads: readonly string[];
  readonly writes: readonly string[];
  /** Paths refused with 501 (streams, which a buffering proxy cannot carry). */
  readonly unsupported?: readonly string[];
  readonly otherwise: 'read' | 'write';
}

/** Knobs of the latency-aware policies (seed 002). */
export interface PolicySettings {
  /** EWMA weight of the newest sample (boltzmann, hybrid). Default 0.3. */
  readonly ewmaAlpha: number;
  /** Softmax temperature in milliseconds (boltzmann). Default 1. */
  readonly temperatureMs: number;
  /** A read pool member is an outlier above rho times the pool's median EWMA (hybrid). Default 2. */
  readonly rho: number;
  /** Share of reads still sent to ejected members so they can come back (hybrid). Default 0.005. */
  readonly probeShare: number;
}

export type HedgeMode = 'percentile' | 'fixed' | 'off';

export interface RouteSpec {
  /** uWS pattern, e.g. `/rpc/*`. */
  readonly pattern: string;
  /** Index into `WorkerInit.clusters`. */
  readonly cluster: number;
  readonly policy: PolicyName;
  /** Request header carrying the routing key; requests without it get 401. Null: no key. */
  readonly keyHeader: string | null;
  /**
   * Read/write classification by path; reads are retryable, writes get one attempt. Null: the
   * `/rpc` contract (safe methods, idempotent procedures, `x-lakefront-idempotent: 1`).
   */
  readonly operations: OperationRules | null;
  /** Whether retryable requests on this route may hedge. */
  readonly hedge: boolean;
  /**
   * Whether a write whose attempt failed before anything was sent (connection refused) may go
   * to the next candidate. Nothing reached the node, so this cannot apply a write twice.
   */
  readonly failoverUnsent: boolean;
  /** Signed affinity tickets (seed 004) pin a client to the node it was placed on. Null: none. */
  readonly affinity: AffinitySettings | null;
  /**
   * Replicated (seed 003): each request goes to the key's replicas on the cluster's ring and is
   * answered by quorum (replication/fanout.ts). Null: one node answers each request.
   */
  readonly quorum: QuorumSettings | null;
}

export interface ClusterSpec {
  readonly name: string;
  /** Global node indices (rows of the membership table), in configuration order. */
  readonly nodes: readonly number[];
  readonly policySettings: PolicySettings;
  /** Leader-probed (etcd): writes to any member wait on the leader. */
  readonly leaderBased?: boolean;
}

export interface NodeSpec {
  readonly id: string;
  readonly url: string;
  readonly cluster: number;
  /** The node's region (replicated routes' region-aware quorums), or null. */
  readonly region: string | null;
}

export interface DataPlaneSettings {
  /**
   * `percentile`: hedge at the node's own `hedgeAfterPercentile` (from 8 samples; before that
   * `hedgeDelayMs`). `fixed`: always at `hedgeDelayMs`. `off`: never hedge.
   */
  readonly hedgeMode: HedgeMode;
  readonly hedgeDelayMs: number;
  readonly hedgeAfterPercentile: number;
  /** Hedges may not exceed this share of retryable requests (token bucket, burst 10). Default 5. */
  readonly hedgeBudgetPercent: number;
  readonly requestTimeoutMs: number;
  readonly maxBodyBytes: number;
  /** Upstream HTTP client: the built-in h1 client, or undici. */
  readonly upstreamClient: 'h1' | 'undici';
  /** Connections per upstream node, per worker. */
  readonly upstreamConnections: number;
  /**
   * The h1 client's HTTP/1.1 pipelining: safe reads sent to one node in one loop turn share a
   * connection and a write, up to this many in flight on it. 1: none. Default 1.
   */
  readonly upstreamPipelining?: number;
  /** How long a cancelled attempt (hedge loser, client gone) may finish before its connection closes. */
  readonly cancelGraceMs: number;
  /** How long a stopping worker waits for in-flight requests. */
  readonly drainTimeoutMs: number;
  /**
   * Tell the nodes who asked: `x-forwarded-for` (the client's address appended to any the client
   * sent), `x-forwarded-proto` and `x-forwarded-host` on every request and handshake. Default off
   * (the client's own such headers pass through untouched).
   */
  readonly forwardedFor?: boolean;
  /**
   * WebSocket tunnels: a node that has sent nothing for this long is pinged, and without an
   * answer within as long again its tunnel is closed (1011 to the client, which may reconnect
   * and be placed on a live node). 0: never. Default 30000.
   */
  readonly wsPingMs?: number;
  /**
   * WebSocket tunnels: bytes that may wait either way (towards a client behind, or a node behind)
   * before the tunnel is closed with 1013; the node's socket is not read while its client is a
   * quarter of this behind (at most 1 MiB). 65536-1073741824. Default 16 MiB.
   */
  readonly wsBacklogBytes?: number;
  /**
   * Passive health: this many attempts in a row at a node fail (no answer: a timeout, a reset, a
   * refused connection, a malformed response), counted across workers, and the control plane is asked to
   * eject it (Membership.eject). 0: never. Default 5.
   */
  readonly ejectAfter?: number;
  /**
   * The largest answer relayed from a node, bytes (answers are buffered whole): a larger one is a
   * 502 `LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE`, and no other node is asked. Default 64 MiB.
   */
  readonly maxResponseBytes?: number;
}

export interface WorkerInit {
  /** This worker's counter slot (1..threads; slot 0 is the main thread). */
  readonly slot: number;
  readonly host: string;
  readonly port: number;
  readonly table: SharedArrayBuffer;
  readonly counters: SharedArrayBuffer;
  /**
   * Attempts in a row per node (global index) that ended with no answer, one Int32 a node,
   * shared by every worker (Atomics): `ejectAfter` counts across threads, as Envoy's
   * consecutive-failure counters do across its workers.
   */
  readonly failuresInRow: SharedArrayBuffer;
  /**
   * Hints held by replica and key, one row a counter slot (replication/hints.ts `HeldHints`): a
   * read in any worker asks the nodes past its key's replicas while a hint for the key waits for
   * one of them.
   */
  readonly hintsHeld: SharedArrayBuffer;
  /** After a reload: the hint rows of the front doors still draining, read until they hand their hints over. */
  readonly priorHintsHeld: readonly HeldRows[];
  readonly counterSlots: number;
  readonly nodes: readonly NodeSpec[];
  readonly clusters: readonly ClusterSpec[];
  readonly routes: readonly RouteSpec[];
  readonly settings: DataPlaneSettings;
  /** The front door's own region (`local_quorum`), or null. */
  readonly region: string | null;
  /** Random per process, added to the slot in version stamps (replication/quorum.ts). */
  readonly versionSalt: number;
  /** The last microsecond any thread of the process stamped a version with (VersionClock). */
  readonly versionLane: SharedArrayBuffer;
  /** Hints an earlier run saved, for this worker to hand over (replicated routes). */
  readonly hints: readonly SavedHint[];
  /** Where the access log goes (a path, or `-`: standard output), or null: no access log. */
  readonly accessLog: string | null;
}

/** A replicated route's hint as it is saved between runs (see `--hints-file`). */
export interface SavedHint {
  /** The route's pattern, e.g. `/kv/*`. */
  readonly route: string;
  /** The replica's node id. */
  readonly node: string;
  /**
   * The key the write was routed by (reads of it know the hint waits). Absent from a hints file
   * an earlier version wrote: then taken from the write (`keyOfWrite`).
   */
  readonly key?: string;
  readonly method: string;
  readonly path: string;
  /** [name, value, ...], the version among them. */
  readonly headers: readonly string[];
  readonly body: Uint8Array | null;
  /** Wall clock, ms since the epoch. */
  readonly expiresAt: number;
}

/** Worker -> main. */
export type WorkerMessage =
  | { readonly t: 'listening'; readonly port: number }
  | { readonly t: 'listen-failed'; readonly reason: string }
  | { readonly t: 'stats-request'; readonly id: number }
  | { readonly t: 'histograms'; readonly id: number; readonly encoded: (string | null)[] }
  /** An attempt could not reach the node (connection refused, or not made in time, or its name not found). */
  | { readonly t: 'node-unreachable'; readonly node: number }
  /** Passive health: `failures` attempts in a row at the node failed, the last with `code`. */
  | { readonly t: 'node-failing'; readonly node: number; readonly failures: number; readonly code: string }
  /** A write pinned to the cluster's published leader could not connect to it. */
  | { readonly t: 'leader-failed'; readonly node: number }
  /** Its drain has begun and its listening socket is closed: no new connection reaches it. */
  | { readonly t: 'unlistened' }
  | { readonly t: 'drained'; readonly abandoned: number; readonly hints: readonly SavedHint[] }
  /** The hints of an `adopt-hints` message are this worker's now (counted in its row). */
  | { readonly t: 'hints-adopted' };

/** Main -> worker. */
export type MainMessage =
  | { readonly t: 'stats-reply'; readonly id: number; readonly body: string }
  | { readonly t: 'collect'; readonly id: number }
  /**
   * Stop accepting and finish; `keepHints`: hand the pending hints over (`drained`), not drop
   * them; `lingerTunnels`: WebSocket tunnels run on until they close or the drain's deadline (a
   * reload), rather than being closed at once.
   */
  | { readonly t: 'drain'; readonly keepHints: boolean; readonly lingerTunnels: boolean }
  /** Close the WebSocket tunnels still running through a reload's drain (1001) now. */
  | { readonly t: 'close-tunnels' }
  /** Hints a predecessor handed over (a reload): this worker delivers them now. */
  | { readonly t: 'adopt-hints'; readonly hints: readonly SavedHint[] }
  /** A reload's successor's hint rows, for reads here while this front door drains; `forget-hint-rows`: no more (the reload failed). */
  | { readonly t: 'hint-rows'; readonly rows: HeldRows }
  | { readonly t: 'forget-hint-rows'; readonly door: number }
  /** Close every socket now (in-flight requests are cut) and end the thread. */
  | { readonly t: 'close-now' }
  /** Open the access log's file again (`SIGUSR1`: log rotation). */
  | { readonly t: 'reopen-log' }
  /** Fault injection: throw an uncaught exception in the worker (tests, chaos drills). */
  | { readonly t: 'crash' }
  /** Fault injection: keep the worker's thread busy in JavaScript for `ms` (a stuck thread). */
  | { readonly t: 'hang'; readonly ms: number };
