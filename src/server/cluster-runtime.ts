/**
 * A worker's per-cluster runtime: the cluster's policy, one undici pool per node, per-node latency
 * windows (the hedge trigger) and the exchange driver that ties them together.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { Exchange, type AttemptHandle, type ExchangeCounters, type ExchangeDriver } from '../forward/exchange.js';
import { HedgeBudget } from '../forward/budget.js';
import { SampleWindow } from '../forward/latency.js';
import { H1Codes, type H1Agent } from '../forward/h1.js';
import { createTransport, CUT_OFF, type AttemptObserver, type AttemptSink, type NodeTransport, type UpstreamRequest } from '../forward/upstream.js';
import { HashRing } from '../hashing/ring.js';
import { ticketTurn } from '../affinity/tickets.js';
import type { ReplicaHost } from '../replication/fanout.js';
import type { HeldHints, HintEvent } from '../replication/hints.js';
import type { VersionClock } from '../replication/quorum.js';
import { FLAG_ENABLED, FLAG_HEALTHY, FLAG_LEADER, FLAG_WARMING, type NodeRow } from '../membership/table.js';
import {
  C_FAILOVERS,
  C_HEDGES,
  C_HEDGES_DENIED,
  C_PIPELINED,
  C_PIPELINES_REFUSED,
  C_HEDGE_WINS,
  C_HINTS_DELIVERED,
  C_HINTS_LOST,
  C_HINTS_EXPIRED,
  C_HINTS_PENDING,
  C_HINTS_REFUSED,
  C_QUORUM_FAILURES,
  C_READ_REPAIRS,
  C_STAND_INS,
  N_ATTEMPTS,
  N_FAILURES,
  N_INFLIGHT,
  N_WINS,
  type CounterSlot,
} from '../metrics/counters.js';
import type { NodeHistograms } from '../metrics/histograms.js';
import { BoltzmannPolicy } from '../policies/boltzmann.js';
import { HybridPolicy } from '../policies/hybrid.js';
import { RendezvousPolicy } from '../policies/rendezvous.js';
import { RingPolicy } from '../policies/ring.js';
import { RoundRobinPolicy } from '../policies/round-robin.js';
import type { ClusterView, Policy } from '../policies/types.js';
import { isUnsent } from '../forward/exchange.js';
import { answerLines } from './relay.js';
import { OP_WRITE, type ClusterSpec, type DataPlaneSettings, type NodeSpec, type PolicyName, type PolicySettings } from './protocol.js';

/** What an exchange's context must offer the runtime. */
export interface ProxiedRequest {
  readonly upstream: UpstreamRequest;
  settled(exchange: Exchange, runtime: ClusterRuntime): void;
}

export function createPolicy(name: PolicyName, settings: PolicySettings): Policy {
  switch (name) {
    case 'rendezvous':
      return new RendezvousPolicy();
    case 'ring':
      return new RingPolicy();
    case 'round_robin':
      return new RoundRobinPolicy();
    case 'boltzmann':
      return new BoltzmannPolicy(settings);
    case 'hybrid':
      return new HybridPolicy(settings);
  }
}

interface MutableView extends ClusterView {
  leader: number;
}

/** What replicated routes need from the worker around a runtime. */
export interface ReplicationContext {
  /** The worker's version clock (one per thread: versions never repeat). */
  readonly clock: VersionClock;
  /** The front door's region, or null. */
  readonly region: string | null;
  /** Re-read the membership table if it moved (the hint handoff's ticks). */
  refresh(): void;
  /** The hints every worker holds, by replica and key. */
  readonly held: HeldHints;
}

/** What a runtime tells the control plane about its nodes (the worker posts each on). */
export interface NodeReports {
  /** An attempt could not reach the node (at most one report a node per 500 ms). */
  nodeUnreachable(globalNode: number): void;
  /** `failures` attempts in a row at the node failed, the last with `code` (`ejectAfter`). */
  nodeFailing(globalNode: number, failures: number, code: string): void;
  /** A write pinned to the published leader could not be sent to it. */
  leaderFailed(globalNode: number): void;
}

/** Minimum gap between two passive "unreachable" reports for one node. */
const UNREACHABLE_REPORT_GAP_MS = 500;

/**
 * Attempt failures that say the node could not be reached: the connection refused, or not made
 * in time, or the node's name not found (ENOTFOUND: the resolver says there is no such name now)
 * (the h1 client's codes, undici's, the kernel's, getaddrinfo's). Each is reported to the control
 * plane, which takes the node out of every ranking for `--unreachable-hold-ms` (seed 004: "the
 * edge marks an unreachable follower as failed for three seconds").
 *
 * Not a resolver that did not answer (EAI_AGAIN): that says nothing of the node, whose kept-alive
 * connections may be serving meanwhile (nor does it count toward ejection, below).
 *
 * Not an answer that is late (a request timeout): the node was reached, and a slow request (or a
 * burst the front door queued itself) would otherwise take every node it failed over to out of
 * the cluster, and a leader out of a hybrid route for a slow write. Not a reset either: a node may
 * close a kept-alive connection as a request goes out, and one that is gone refuses the next
 * connection anyway.
 */
const UNREACHABLE_CODES: ReadonlySet<string> = new Set([
  'ECONNREFUSED',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ETIMEDOUT',
  'ENOTFOUND',
  H1Codes.CONNECT_TIMEOUT,
  'UND_ERR_CONNECT_TIMEOUT',
]);

/** Whether an attempt that failed with `code` found the node unreachable (UNREACHABLE_CODES). @internal exported for tests */
export function isUnreachable(code: string): boolean {
  return UNREACHABLE_CODES.has(code);
}

/**
 * Attempt failures that are the node's, toward ejection (`ejectAfter`): no answer in time, a
 * reset, a connection refused or not made in time, the node's name not found, a response that is
 * not HTTP. Not a failure the front door made itself: an attempt it refused before sending (a
 * header value undici would not send: upstream.ts undiciRefusal), its own connections closing at
 * a stop or reload, a response over its size limit; nor a timeout of an attempt never written
 * (queued behind the front door's own connection limit); nor a resolver that did not answer
 * (EAI_AGAIN). undici's parser errors (`HPE_*`) count: the node's bytes were not HTTP.
 */
const NODE_FAILURES: ReadonlySet<string> = new Set([
  H1Codes.REFUSED,
  H1Codes.CLOSED,
  H1Codes.TIMEOUT,
  H1Codes.CONNECT_TIMEOUT,
  H1Codes.BAD_RESPONSE,
  'ECONNRESET',
  'EPIPE',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ENOTFOUND',
  'ECONNABORTED',
  'UND_ERR_SOCKET',
  'UND_ERR_HEADERS_TIMEOUT',
  'UND_ERR_BODY_TIMEOUT',
  'UND_ERR_CONNECT_TIMEOUT',
]);

/** The code of `error` if it is the node's failure (NODE_FAILURES), else null. @internal exported for tests */
export function nodeFailure(error: unknown): string | null {
  const { code, unsent } = (error ?? {}) as { code?: unknown; unsent?: unknown };
  if (typeof code !== 'string') return null;
  if (code === H1Codes.TIMEOUT && unsent === true) return null; // queued here, never written
  return NODE_FAILURES.has(code) || code.startsWith('HPE_') ? code : null;
}

export class ClusterRuntime implements ExchangeDriver, AttemptObserver, ReplicaHost {
  readonly name: string;
  readonly ids: readonly string[];
  private readonly indexById: ReadonlyMap<string, number>;
  /** Served-by and hedged lines per node, pre-encoded: see relay.ts `answerLines`. */
  readonly answerLines: Buffer[];
  /** Global node index (membership-table row) per cluster-local index. */
  readonly globalIndex: Int32Array;
  readonly windows: SampleWindow[];
  readonly counters: ExchangeCounters;
  readonly view: MutableView;
  /** Shared by every route on this cluster, in this worker. */
  readonly hedgeBudget: HedgeBudget;
  private readonly transports: NodeTransport[];
  /** A warming node's hedge losers' grace: see `update`. */
  private readonly requestTimeoutMs: number;
  private readonly policies = new Map<PolicyName, Policy>();
  /** The policies that learn from attempt outcomes (`observe`), as an array for the hot path. */
  private observers: Policy[] = [];
  private readonly policySettings: PolicySettings;
  private readonly lastUnreachableAt: Float64Array;
  /**
   * Attempts in a row per node (global index) that ended with no answer (`ejectAfter`), shared
   * by every worker thread: Atomics.add counts a failure, a plain store of 0 an answer.
   */
  private readonly failuresInRow: Int32Array;
  private readonly ejectAfter: number;
  /** A leader-probed cluster (etcd): its writes all wait on the leader. */
  private readonly leaderBased: boolean;
  /** Region index per node; nodes without a region share one. */
  readonly regionOf: Int32Array;
  /**
   * A key per node from its id (FNV-1a), which a reload does not change as it does indices:
   * the scores that re-place a ticket holder (policies/types.ts placeClient).
   */
  readonly nodeKeys: Int32Array;
  /** Region names by index ('' for the nodes without one). */
  private readonly regionNames: string[];
  readonly regionCount: number;
  readonly localRegion: number;
  /** Members by capacity, healthy or not (replicated routes): built when first asked for. */
  private members: HashRing | null = null;
  private readonly memberWeights: Float64Array;
  /** Whenever the membership table moves: the replicated routes' hint handoff. */
  readonly onUpdate: (() => void)[] = [];

  constructor(
    spec: ClusterSpec,
    nodes: readonly NodeSpec[],
    private readonly settings: DataPlaneSettings,
    private readonly slot: CounterSlot,
    private readonly histograms: NodeHistograms,
    failuresInRow: Int32Array,
    private readonly reports: NodeReports,
    agent: H1Agent,
    private readonly replication: ReplicationContext | null = null,
  ) {
    this.name = spec.name;
    this.ids = spec.nodes.map((g) => nodes[g]!.id);
    this.indexById = new Map(this.ids.map((id, i) => [id, i]));
    this.answerLines = answerLines(this.ids);
    this.globalIndex = Int32Array.from(spec.nodes);
    const transportOptions = {
      connections: settings.upstreamConnections,
      requestTimeoutMs: settings.requestTimeoutMs,
      cancelGraceMs: settings.cancelGraceMs,
      ...(settings.maxResponseBytes !== undefined ? { maxResponseBytes: settings.maxResponseBytes } : {}),
      ...(settings.upstreamPipelining !== undefined ? { pipelining: settings.upstreamPipelining } : {}),
      pipelineCounters: { pipelined: () => slot.bump(C_PIPELINED), refused: () => slot.bump(C_PIPELINES_REFUSED) },
    };
    this.transports = spec.nodes.map((g) => createTransport(settings.upstreamClient, nodes[g]!.url, transportOptions, this, agent));
    this.requestTimeoutMs = settings.requestTimeoutMs;
    this.windows = spec.nodes.map(() => new SampleWindow());
    this.lastUnreachableAt = new Float64Array(spec.nodes.length);
    this.failuresInRow = failuresInRow;
    this.ejectAfter = settings.ejectAfter ?? 0;
    this.leaderBased = spec.leaderBased === true;
    this.hedgeBudget = HedgeBudget.forSetting(settings.hedgeBudgetPercent);
    this.view = {
      ids: this.ids,
      weights: new Float64Array(spec.nodes.length),
      flags: new Int32Array(spec.nodes.length),
      leader: -1,
    };
    this.policySettings = spec.policySettings;
    const regions = (this.regionNames = [...new Set(spec.nodes.map((g) => nodes[g]!.region ?? ''))]);
    this.regionOf = Int32Array.from(spec.nodes, (g) => regions.indexOf(nodes[g]!.region ?? ''));
    this.nodeKeys = Int32Array.from(this.ids, (id) => ticketTurn(id));
    this.regionCount = regions.length;
    // No region of its own: no replica is local (local_quorum then takes a majority of all).
    this.localRegion = replication?.region != null ? regions.indexOf(replication.region) : -1;
    this.memberWeights = new Float64Array(spec.nodes.length);
    const slotRef = slot;
    this.counters = {
      hedge: () => slotRef.bump(C_HEDGES),
      hedgeDenied: () => slotRef.bump(C_HEDGES_DENIED),
      hedgeWin: () => slotRef.bump(C_HEDGE_WINS),
      failover: () => slotRef.bump(C_FAILOVERS),
    };
  }

  get size(): number {
    return this.ids.length;
  }

  /** The cluster index of the node with this id, or -1 (ids are fixed at start-up). */
  indexOf(id: string): number {
    return this.indexById.get(id) ?? -1;
  }

  regionName(index: number): string {
    return this.regionNames[index] ?? '';
  }

  /** The index of region `name` among this cluster's nodes, or -1 (none of them is there). */
  regionIndex(name: string | null): number {
    return name === null || name === '' ? -1 : this.regionNames.indexOf(name);
  }

  /** The policy instance for `name`, one per runtime so routes sharing a policy share its state. */
  policy(name: PolicyName): Policy {
    let policy = this.policies.get(name);
    if (!policy) {
      policy = createPolicy(name, this.policySettings);
      policy.update(this.view);
      this.policies.set(name, policy);
      if (policy.observe) this.observers = [...this.observers, policy];
    }
    return policy;
  }

  /** Re-reads this cluster's rows after a membership change and rebuilds every policy. */
  update(rows: readonly NodeRow[]): void {
    const { weights, flags } = this.view;
    let leader = -1;
    for (let i = 0; i < this.size; i++) {
      const row = rows[this.globalIndex[i]!]!;
      const routable = (row.flags & (FLAG_HEALTHY | FLAG_ENABLED)) === (FLAG_HEALTHY | FLAG_ENABLED);
      weights[i] = routable ? row.weight : 0;
      flags[i] = row.flags;
      // A node back in the rankings a short while (FLAG_WARMING, for --eject-ms) may have cold
      // caches: its hedge losers run on to their answers, up to the request timeout, instead of
      // being cut after the grace (an attempt whose client left is cut as ever). Seed 000: hedging absorbs a cold
      // cache after a restart; cutting its slow reads would count them against it (ejection) and
      // may stop the rebuilds that warm it. A node that hangs is still found, by its timeouts.
      const transport = this.transports[i]!;
      transport.loserGraceMs = (row.flags & FLAG_WARMING) !== 0 ? this.requestTimeoutMs : transport.cancelGraceMs;
      if (routable && (row.flags & FLAG_LEADER) !== 0) leader = i;
    }
    this.view.leader = leader;
    for (const policy of this.policies.values()) policy.update(this.view);
    if (this.members !== null) this.members = this.buildMembers(rows);
    for (let i = 0; i < this.onUpdate.length; i++) this.onUpdate[i]!();
  }

  private buildMembers(rows: readonly NodeRow[]): HashRing {
    const weights = this.memberWeights;
    for (let i = 0; i < this.size; i++) {
      const row = rows[this.globalIndex[i]!]!;
      weights[i] = (row.flags & FLAG_ENABLED) !== 0 ? row.weight : 0;
    }
    return new HashRing(this.ids, weights);
  }

  // --- ReplicaHost (replicated routes) ---

  /** Starts the members ring (the first replicated route on this cluster asks). */
  replicate(rows: readonly NodeRow[]): void {
    this.members ??= this.buildMembers(rows);
  }

  membersFor(key: string, out: Int32Array, limit: number): number {
    return this.members === null ? 0 : this.members.preferenceInto(key, out, limit);
  }

  isRoutable(node: number): boolean {
    return this.view.weights[node]! > 0;
  }

  get clock(): VersionClock {
    return this.replication!.clock;
  }

  refresh(): void {
    this.replication?.refresh();
  }

  hintsHeldFor(node: number, key: number): boolean {
    return this.replication?.held.any(this.globalIndex[node]!, key) ?? false;
  }

  /** One attempt at `node` for anyone but an exchange (replicated fan-out, hints, repairs). */
  send(sink: AttemptSink, node: number, ordinal: number, request: UpstreamRequest): AttemptHandle {
    const g = this.globalIndex[node]!;
    this.slot.bumpNode(g, N_ATTEMPTS);
    this.slot.bumpNode(g, N_INFLIGHT);
    return this.transports[node]!.attempt(sink, ordinal, node, request);
  }

  /** The node whose answer a replicated request relayed. */
  won(node: number): void {
    this.slot.bumpNode(this.globalIndex[node]!, N_WINS);
  }

  hintCounted(event: HintEvent, node: number, key: number): void {
    // Saved (handed back as the worker stops): still held, in its row until it ends, and by the
    // control plane from its `drained` message on.
    if (event !== 'saved') this.replication?.held.add(this.globalIndex[node]!, key, event === 'stored' ? 1 : -1);
    const slot = this.slot;
    if (event === 'stored') slot.bump(C_HINTS_PENDING);
    // Handed back as the worker stops: still pending, in this slot, until the control plane has
    // them (its `drained` message) and clears it, so /stats never misses them in between.
    else if (event === 'saved') return;
    else {
      slot.drop(C_HINTS_PENDING);
      slot.bump(event === 'delivered' ? C_HINTS_DELIVERED : event === 'expired' ? C_HINTS_EXPIRED : event === 'refused' ? C_HINTS_REFUSED : C_HINTS_LOST);
    }
  }

  replicaCounted(event: 'repair' | 'standIn' | 'failure'): void {
    this.slot.bump(event === 'repair' ? C_READ_REPAIRS : event === 'standIn' ? C_STAND_INS : C_QUORUM_FAILURES);
  }

  // --- ExchangeDriver ---

  allowHedge(fromList: boolean): boolean {
    return this.hedgeBudget.spend(fromList);
  }

  hedgeAffordable(): boolean {
    return this.hedgeBudget.affordable;
  }

  hedgeWait(exchange: Exchange, dueAt: number): boolean {
    return this.hedgeBudget.wait(exchange, dueAt);
  }

  hedgeMayWait(): boolean {
    return this.hedgeBudget.waits;
  }

  hedgeOutcome(won: boolean): void {
    this.hedgeBudget.outcome(won);
  }

  hedgeDelayMs(_exchange: Exchange, node: number): number {
    if (this.settings.hedgeMode === 'fixed') return this.settings.hedgeDelayMs;
    return this.windows[node]!.triggerMs(this.settings.hedgeAfterPercentile, this.settings.hedgeDelayMs);
  }

  startAttempt(exchange: Exchange, node: number, ordinal: number): AttemptHandle {
    return this.send(exchange, node, ordinal, (exchange.context as ProxiedRequest).upstream);
  }

  settle(exchange: Exchange): void {
    if (exchange.winner >= 0) this.won(exchange.servedBy);
    (exchange.context as ProxiedRequest).settled(exchange, this);
  }

  // --- AttemptObserver ---

  attemptEnded(node: number, ok: boolean, latencyMs: number, error: unknown, op: number): void {
    const g = this.globalIndex[node]!;
    this.slot.dropNode(g, N_INFLIGHT);
    const observers = this.observers;
    if (latencyMs >= 0 && observers.length > 0) {
      // When it began: an attempt begun before the node came back is not held against it. (Only
      // the read policies observe: a rendezvous route's request reads no clock here.)
      const startedAt = performance.now() - latencyMs;
      for (let i = 0; i < observers.length; i++) observers[i]!.observe!(node, latencyMs, ok, op, startedAt);
    }
    if (!ok) {
      this.slot.bumpNode(g, N_FAILURES);
      if (op === OP_WRITE && node === this.view.leader && isUnsent(error)) {
        // The published leader cannot be reached: stop pinning writes to it here, now, and
        // tell the control plane, which clears it until a probe finds the leader again.
        for (const policy of this.policies.values()) policy.leaderUnreachable?.(node);
        this.reports.leaderFailed(g);
      }
      const code = (error as { code?: unknown } | null)?.code;
      if (typeof code === 'string') this.failedWith(node, code);
      // An answer (a 502, 503 or 504, given as its status) is the node there.
      if (typeof error === 'number') this.answered(g);
      else this.failing(g, op, nodeFailure(error));
      return;
    }
    if (error === null) this.answered(g);
    // A hedge loser cut off after its grace, unanswered: as a timeout of its own (Envoy reports a
    // hedge's per-try timeout so). Else hedging would hide a node that hangs: every hedged read's
    // hedge wins, and its loser counted neither way. (Cancelled for its client: neither way.)
    // Its time still feeds the latency window (how long the node took at least).
    else if (error === CUT_OFF) {
      this.slot.bumpNode(g, N_FAILURES);
      this.failing(g, op, CUT_OFF.code);
    }
    if (latencyMs >= 0) {
      this.windows[node]!.record(latencyMs);
      this.histograms.record(g, latencyMs * 1000);
    }
  }

  /**
   * An attempt at node `g` (global index) ended with no answer: `code` if it was the node's failure (null: the
   * front door's own, which counts neither way). Every `ejectAfter`-th in a row is reported for
   * ejection. Not a write on a leader-based cluster (etcd): a write sent to any member waits on
   * the leader (a follower forwards it), so a stalled leader would eject the member it went to;
   * and the leader takes the writes whatever (one that cannot be reached is cleared as such,
   * above): ejecting it would only take it off reads too.
   */
  private failing(g: number, op: number, code: string | null): void {
    if (code === null || this.ejectAfter === 0 || (op === OP_WRITE && this.leaderBased)) return;
    // Every thread counts into one row: exactly one of them sees each multiple, and reports it.
    const failures = Atomics.add(this.failuresInRow, g, 1) + 1;
    if (failures % this.ejectAfter === 0) this.reports.nodeFailing(g, failures, code);
  }

  /** The node answered: its failures in a row start again (read first: a store only after some). */
  private answered(g: number): void {
    if (this.failuresInRow[g] !== 0) Atomics.store(this.failuresInRow, g, 0);
  }

  /**
   * A request or a WebSocket handshake to `node` failed with `code`: if that says the node could
   * not be reached, the control plane hears of it (at most once a node per 500 ms).
   */
  failedWith(node: number, code: string): void {
    if (!isUnreachable(code)) return;
    const now = performance.now();
    if (now - this.lastUnreachableAt[node]! < UNREACHABLE_REPORT_GAP_MS) return;
    this.lastUnreachableAt[node] = now;
    this.reports.nodeUnreachable(this.globalIndex[node]!);
  }

  /** Closes every node's connections: after running requests (graceful), or at once. */
  async close(graceful: boolean): Promise<void> {
    await Promise.all(this.transports.map((t) => t.close(graceful)));
  }
}
