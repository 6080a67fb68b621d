/**
 * The one selection interface every routing policy implements. A policy only chooses: queueing,
 * hedging, failover and retries live once, in forward/exchange.ts.
 */

/** A cluster's routing state as published in the membership table; indices are cluster-local. */
export interface ClusterView {
  readonly ids: readonly string[];
  /** Routable weight per node: 0 excludes the node (unhealthy, disabled). */
  readonly weights: Float64Array;
  /** FLAG_* bits per node (membership/table.ts). */
  readonly flags: Int32Array;
}

export interface Policy {
  readonly name: string;
  /** Rebuild cached state from the cluster's view: called once per membership change. */
  update(view: ClusterView): void;
  /**
   * Writes candidate node indices into `out`, best first (primary, then hedge and failover
   * order), never repeating a node, and returns how many. `key` is the request's routing key;
   * `op` its operation class (OP_READ / OP_WRITE).
   */
  pick(key: string, op: number, out: Int32Array): number;
  /** Feedback after an attempt ends (latency in milliseconds). */
  observe?(node: number, latencyMs: number, ok: boolean, op: number): void;
}
