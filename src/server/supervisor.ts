/**
 * The control plane: runs on the main thread and never sits on the request path.
 *
 * It owns configuration, health polling (one Membership per cluster), the membership table (its
 * only writer), and the data-plane workers: it spawns them on one port (SO_REUSEPORT), replaces
 * one that dies while the others keep serving, answers their `/stats` requests by merging every
 * worker's histograms, and drains them on stop.
 */
import type { AffinitySettings } from '../affinity/tickets.js';
import { EventEmitter } from 'node:events';
import { Buffer } from 'node:buffer';
import { accessSync, closeSync, constants, fstatSync, fsyncSync, lstatSync, openSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, type Stats } from 'node:fs';
import { dirname } from 'node:path';
import { createServer } from 'node:net';
import { performance } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';
import { ConfigError, jsonProblem } from '../errors.js';
import { openAccessLog } from './access-log.js';
import { ALREADY_EJECTED, ALREADY_OUT, Membership, type EjectionPolicy, type EjectVerdict, type MemberConfig } from '../membership/membership.js';
import { FLAG_ENABLED, FLAG_HEALTHY, FLAG_LEADER, FLAG_WARMING, TableWriter, type NodeRow } from '../membership/table.js';
import { C_HINTS_EXPIRED, C_HINTS_LOST, CounterSlot, addTotals, counterBytes, endedTotals, readTotals, totalsById, type TotalsById } from '../metrics/counters.js';
import { mergeSummaries } from '../metrics/histograms.js';
import { Router } from '../router/router.js';
import { EtcdLeaderProbe } from '../membership/leader.js';
import { quorumProblem, reloadProblem, sharesKeys, versionLane, type QuorumSettings, type ReplicatedShape } from '../replication/quorum.js';
import { HeldHints, keyHash, keyOfWrite, type HeldRows } from '../replication/hints.js';
import type { ClusterSpec, DataPlaneSettings, MainMessage, NodeSpec, OperationRules, PolicyName, PolicySettings, RouteSpec, SavedHint, WorkerInit, WorkerMessage } from './protocol.js';
import { OWN_PATHS } from './protocol.js';
import { DEFAULT_EJECT_MAX_PERCENT, DEFAULT_EJECT_MS, DEFAULT_UNREACHABLE_HOLD_MS, DEFAULT_WORKER_YOUNG_MB, MAX_EJECT_MS } from './settings.js';

export interface ClusterConfig {
  readonly name: string;
  readonly members: readonly MemberConfig[];
  readonly healthPath?: string;
  /** How the cluster's leader is found; none for leaderless clusters. */
  readonly leader?: 'etcd' | null;
  readonly leaderIntervalMs?: number;
  readonly policySettings?: Partial<PolicySettings>;
}

export interface RouteConfig {
  readonly pattern: string;
  readonly cluster: string;
  readonly policy: PolicyName;
  readonly keyHeader: string | null;
  readonly operations?: OperationRules | null;
  readonly hedge?: boolean;
  readonly failoverUnsent?: boolean;
  readonly affinity?: AffinitySettings | null;
  /** Replicated route (seed 003): fan-out to the key's replicas, answered by quorum. */
  readonly quorum?: QuorumSettings | null;
}

export const DEFAULT_POLICY_SETTINGS: PolicySettings = { ewmaAlpha: 0.3, temperatureMs: 1, rho: 2, probeShare: 0.005 };

/**
 * FrontDoor's `ejection` event: a worker reported `failures` attempts in a row at a node failed,
 * and the verdict (Membership.eject): ejected for `holdMs`, or kept in for `reason`.
 */
export type EjectionEvent = { readonly cluster: string; readonly node: string; readonly failures: number; readonly code: string } & EjectVerdict;

export interface FrontDoorConfig {
  readonly host: string;
  readonly port: number;
  readonly threads: number;
  readonly clusters: readonly ClusterConfig[];
  readonly routes: readonly RouteConfig[];
  readonly healthIntervalMs: number;
  readonly healthTimeoutMs: number;
  /**
   * How long a node an attempt could not reach (connection refused, or not made in time, or its
   * name not found) stays out of every ranking before a passing health probe may bring it back.
   * Default 3000 (seed 004: "marks an unreachable follower as failed for three seconds").
   */
  readonly unreachableHoldMs?: number;
  /**
   * Passive health: a node ejected after `settings.ejectAfter` failed attempts in a row is out
   * of every ranking this long, times its ejections in a row (at most five minutes, or this if
   * longer), then until a probe passes. Default 30,000.
   */
  readonly ejectMs?: number;
  /** At most this share of a cluster's nodes out by ejection at once (one always may be). Default 10. */
  readonly ejectMaxPercent?: number;
  readonly settings: DataPlaneSettings;
  readonly fetch?: typeof globalThis.fetch;
  /** The front door's own region (`local_quorum` on replicated routes). */
  readonly region?: string | null;
  /**
   * Where a stopping front door saves its replicated routes' hints, and a starting one takes them
   * back from (then deletes the file). Null: hints are dropped at a stop (and counted).
   */
  readonly hintsFile?: string | null;
  /** Where every worker writes its access log lines (a path, or `-`: standard output). Null: none. */
  readonly accessLog?: string | null;
  /** V8's young generation a worker thread may grow to, in MiB (1-1024). Default 12 (settings.ts). */
  readonly workerYoungMb?: number;
}

/** Appends `items` to the list `map` holds under `key` (made if absent). */
function appendTo<K, V>(map: Map<K, V[]>, key: K, items: readonly V[]): void {
  const list = map.get(key);
  if (list === undefined) map.set(key, [...items]);
  else list.push(...items);
}

const WORKER_URL = new URL('../../workers/data-plane.js', import.meta.url);

/** FrontDoor.doorId: one a front door in this process. */
let nextDoorId = 1;

/** How long past `drainTimeoutMs` a draining worker has to close its pools and end. */
const STUCK_GRACE_MS = 5_000;
/** How long a reload waits for the old workers to close their listening sockets (a stuck one never says it has). */
const UNLISTEN_WAIT_MS = 1_000;
/** How long the control plane waits for workers' histograms when answering `/stats`. */
const COLLECT_TIMEOUT_MS = 1_000;
/** How long `/stats` waits for a draining predecessor's workers to flush their counts. */
const PREDECESSOR_COLLECT_MS = 100;
/** Exit codes from workers/data-plane.ts. */
const EXIT_CONFIG = 78;

/**
 * The process's one version lane (replicated routes' VersionClock): every worker of every front
 * door in the process, those of a configuration still draining after a reload too, stamps
 * versions in one order.
 */
const VERSION_LANE = versionLane();

/** A configuration's replicated routes, as a reload compares them (quorum.ts `sharesKeys`). */
/** Whether two replicated routes are alike in all a reload compares. */
function sameShape(a: ReplicatedShape, b: ReplicatedShape): boolean {
  const [p, q] = [a.quorum, b.quorum];
  return a.pattern === b.pattern && a.cluster === b.cluster && a.keyHeader === b.keyHeader && p.n === q.n && p.w === q.w && p.r === q.r && p.consistency === q.consistency;
}

function replicatedShapes(routes: readonly RouteConfig[]): ReplicatedShape[] {
  const out: ReplicatedShape[] = [];
  for (const r of routes) if (r.quorum) out.push({ pattern: r.pattern, cluster: r.cluster, keyHeader: r.keyHeader, quorum: r.quorum });
  return out;
}

interface WorkerHandle {
  readonly slot: number;
  worker: Worker;
  /** Deaths within the current window, for crash-loop backoff. */
  deaths: number[];
  /** What its drain's `drained` message said. */
  drained?: { readonly abandoned: number; readonly hints: number };
  /** Called when its drain has closed its listening socket (`unlistened`). */
  unlistened?: () => void;
  /** Spawned to replace a worker that died (not at start, where a failure fails the start). */
  readonly replacement: boolean;
}

interface Collection {
  readonly encoded: (string | null)[][];
  readonly waiting: Set<number>;
  readonly done: () => void;
}

export class FrontDoor extends EventEmitter {
  readonly host: string;
  port = 0;
  readonly threads: number;
  readonly memberships: Membership[];
  /** Per cluster: its leader probe, or null. */
  readonly leaderProbes: (EtcdLeaderProbe | null)[];
  readonly router: Router;
  private readonly config: FrontDoorConfig;
  private readonly nodes: NodeSpec[];
  /** Global node index by cluster name and node id (`nodeIndex`): how front doors match nodes across a reload. */
  private readonly nodeKeys = new Map<string, number>();
  private readonly clusters: ClusterSpec[];
  private readonly routes: RouteSpec[];
  private readonly table: TableWriter;
  private readonly counters: SharedArrayBuffer;
  /** Failed attempts in a row per node, counted by every worker (WorkerInit.failuresInRow). */
  private readonly failuresInRow: SharedArrayBuffer;
  /** Hints held by replica and key by each worker (WorkerInit.hintsHeld); a row is zeroed as its worker ends. */
  private readonly hintsHeld: SharedArrayBuffer;
  /** Per node, its hash in `hintsHeld` (HeldHints.nodeHashes). */
  private readonly nodeHashes: Int32Array;
  /** The hint rows of the front doors before a reload, while they drain (WorkerInit.priorHintsHeld). */
  private priorHintsHeld: readonly HeldRows[] = [];
  /** This front door's in `HeldRows` (other front doors' workers read its hint rows). */
  private readonly doorId = nextDoorId++;
  /** Per worker slot, the `adopt-hints` batches posted to it and not yet taken (`hints-adopted`). */
  private readonly postedHints = new Map<number, SavedHint[][]>();
  private readonly counterSlots: number;
  private readonly workers = new Map<number, WorkerHandle>();
  private readonly collections = new Map<number, Collection>();
  private nextCollectionId = 1;
  private stopping: Promise<void> | null = null;
  /** Once a drain has begun: settles when every worker has closed its listening socket (or exited, or said nothing for UNLISTEN_WAIT_MS). */
  private listenClosed: Promise<void> = Promise.resolve();
  /** Added to each worker's slot in its version stamps (replicated routes): see VersionClock. */
  private readonly versionSalt = Math.floor(Math.random() * 1000);
  /** Hints read from the hints file, by the worker slot to take them (until it listens). */
  private readonly hintsFor = new Map<number, SavedHint[]>();
  /** Hints the stopping workers handed over, to be saved. */
  private readonly stoppedHints: SavedHint[] = [];
  /** How many hints the last stop saved to the hints file. */
  hintsSaved = 0;
  /** Started by `reload`: binds the port its predecessor's workers hold (SO_REUSEPORT). */
  private inheritsPort = false;
  /**
   * Every replicated route a configuration of this process has had, since start (a reload's
   * successor inherits them): what a reload's quorum is checked against (`reloadProblem`).
   */
  private replicatedSeen: ReplicatedShape[];
  /** This configuration's replicated routes (the same objects as in `replicatedSeen`). */
  private readonly replicated: ReplicatedShape[];
  /** The front door a `reload` is starting or has started: this one's hints go to it. */
  private successor: FrontDoor | null = null;
  /**
   * Settles once the predecessor (if any) has handed its hints over: a stop saves or passes on
   * its own hints only after that (see `drainAll`).
   */
  private predecessorDone: Promise<void> = Promise.resolve();
  /** The front door this one took over from, while it may still be draining. */
  private predecessor: FrontDoor | null = null;
  /** The counts of the front doors this one took over from that have ended (`/stats` goes on from them). */
  private carried: TotalsById | null = null;
  /** Hints handed over (a reload) or saved (a hints file) for routes or nodes no longer configured. */
  unconfiguredHints = 0;
  /** The drain's workers have ended and the hints they handed back are settled (`drainAll`). */
  private drainDone = false;
  /** Hints lost with workers that died (crashed, or cut short) while keeping them. */
  hintsLostWithWorkers = 0;
  /** A reload's successor is starting: not yet serving, nor known to anyone but this one. */
  private successorStarting = false;
  /** The drain into the successor is over: hints coming later go straight to it. */
  private handedOver = false;
  private readonly mainSlot: CounterSlot;
  /** Passive health's terms (`ejectMs`, `ejectMaxPercent`). */
  private readonly ejection: EjectionPolicy;
  /** Publishes the table again when the first node's warm-up (FLAG_WARMING) ends. */
  private warmTimer: NodeJS.Timeout | null = null;
  /** When each node's last "kept in" line was written (one a node per `ejectMs`). */
  private readonly keptInSaidAt = new Map<number, number>();
  /** Replacements waiting out their crash-loop backoff (cleared by a stop). */
  private readonly respawns = new Set<NodeJS.Timeout>();

  private constructor(config: FrontDoorConfig) {
    super();
    const hold = config.unreachableHoldMs;
    if (hold !== undefined && !(typeof hold === 'number' && hold >= 0 && hold <= 3_600_000)) {
      throw new ConfigError(`unreachableHoldMs: bad value ${String(hold)} (milliseconds, 0-3600000)`);
    }
    const { ejectMs = DEFAULT_EJECT_MS, ejectMaxPercent = DEFAULT_EJECT_MAX_PERCENT } = config;
    const maxResponse = config.settings.maxResponseBytes;
    if (maxResponse !== undefined && !(Number.isInteger(maxResponse) && maxResponse >= 1024 && maxResponse <= 1024 * 1024 * 1024)) {
      throw new ConfigError(`maxResponseBytes: bad value ${String(maxResponse)} (bytes, 1024-1073741824)`);
    }
    const wsBacklog = config.settings.wsBacklogBytes;
    if (wsBacklog !== undefined && !(Number.isInteger(wsBacklog) && wsBacklog >= 65_536 && wsBacklog <= 1024 * 1024 * 1024)) {
      throw new ConfigError(`wsBacklogBytes: bad value ${String(wsBacklog)} (bytes, 65536-1073741824)`);
    }
    const ejectAfter = config.settings.ejectAfter;
    if (ejectAfter !== undefined && !(Number.isInteger(ejectAfter) && ejectAfter >= 0 && ejectAfter <= 1000)) {
      throw new ConfigError(`ejectAfter: bad value ${String(ejectAfter)} (failed attempts in a row, 0-1000; 0: never eject)`);
    }
    if (!(typeof ejectMs === 'number' && ejectMs >= 1 && ejectMs <= 3_600_000)) throw new ConfigError(`ejectMs: bad value ${String(ejectMs)} (milliseconds, 1-3600000)`);
    if (!(typeof ejectMaxPercent === 'number' && ejectMaxPercent >= 1 && ejectMaxPercent <= 100)) {
      throw new ConfigError(`ejectMaxPercent: bad value ${String(ejectMaxPercent)} (a percentage, 1-100)`);
    }
    const young = config.workerYoungMb;
    if (young !== undefined && !(Number.isInteger(young) && young >= 1 && young <= 1024)) {
      throw new ConfigError(`workerYoungMb: bad value ${String(young)} (MiB, 1-1024)`);
    }
    this.ejection = { baseMs: ejectMs, maxMs: Math.max(MAX_EJECT_MS, ejectMs), maxPercent: ejectMaxPercent };
    this.config = config;
    this.replicated = replicatedShapes(config.routes);
    this.replicatedSeen = this.replicated;
    this.host = config.host;
    this.threads = config.threads;
    this.nodes = [];
    this.clusters = [];
    this.memberships = config.clusters.map((cluster, clusterIndex) => {
      const membership = new Membership({
        members: cluster.members,
        intervalMs: config.healthIntervalMs,
        timeoutMs: config.healthTimeoutMs,
        ...(cluster.healthPath !== undefined ? { healthPath: cluster.healthPath } : {}),
        ...(config.fetch !== undefined ? { fetch: config.fetch } : {}),
      });
      const indices: number[] = [];
      for (const member of membership.all()) {
        if (config.settings.upstreamClient === 'h1' && member.url.startsWith('https:')) {
          throw new ConfigError(`node "${member.id}": ${member.url} is https, which the built-in upstream client does not speak (use --upstream-client undici)`);
        }
        indices.push(this.nodes.length);
        this.nodeKeys.set(`${cluster.name}\n${member.id}`, this.nodes.length);
        this.nodes.push({ id: member.id, url: member.url, cluster: clusterIndex, region: member.region ?? null });
      }
      this.clusters.push({ name: cluster.name, nodes: indices, policySettings: { ...DEFAULT_POLICY_SETTINGS, ...cluster.policySettings }, leaderBased: cluster.leader === 'etcd' });
      membership.on('change', () => this.publish());
      return membership;
    });
    this.leaderProbes = config.clusters.map((cluster, i) => {
      if (cluster.leader !== 'etcd') return null;
      const probe = new EtcdLeaderProbe({
        members: this.memberships[i]!.all(),
        ...(cluster.leaderIntervalMs !== undefined ? { intervalMs: cluster.leaderIntervalMs } : {}),
        ...(config.fetch !== undefined ? { fetch: config.fetch } : {}),
      });
      probe.on('change', () => this.publish());
      // A member cut off from its peers (it knows no leader while the others do) is held out of
      // every ranking for two probe rounds, again each round it says so: its reads would be stale
      // or hang (helper-50: ~10 s of reads to a partitioned follower). Back once it names the
      // leader again and a health probe passes.
      const hold = 2 * probe.intervalMs;
      probe.on('leaderless', (ids: readonly string[]) => {
        for (const id of ids) this.memberships[i]!.markUnhealthy(id, hold);
      });
      return probe;
    });
    // A ticket names its app and node, not its cluster: two clusters' routes with one app would
    // take each other's tickets and pin a client to whichever node has the same id (helper-62).
    const appCluster = new Map<string, string>();
    for (const route of config.routes) {
      const app = route.affinity?.app;
      if (app === undefined) continue;
      const other = appCluster.get(app);
      if (other !== undefined && other !== route.cluster) {
        throw new ConfigError(`route ${route.pattern}: affinity app "${app}" is also an app of cluster "${other}"'s routes; a ticket does not name its cluster, so give each cluster's routes their own app`);
      }
      appCluster.set(app, route.cluster);
    }
    this.routes = config.routes.map((route) => {
      const cluster = config.clusters.findIndex((c) => c.name === route.cluster);
      if (cluster < 0) throw new Error(`route ${route.pattern}: unknown cluster "${route.cluster}"`);
      if (OWN_PATHS.includes(route.pattern)) throw new ConfigError(`route ${route.pattern}: the front door answers ${OWN_PATHS.join(', ')} itself`);
      // The ring places keys on members of weight above 0 only: n counts those.
      const members = config.clusters[cluster]!.members;
      const placing = members.filter((m) => m.weight !== 0).length;
      const problem = route.quorum ? quorumProblem(route.quorum, placing) : null;
      if (problem !== null) throw new ConfigError(`route ${route.pattern}: quorum: ${problem}${placing < members.length ? ` (${members.length - placing} of the cluster's nodes have weight 0 and hold no keys)` : ''}`);
      if (route.quorum?.consistency === 'each_quorum' && members.every((m) => m.region === undefined)) {
        throw new ConfigError(`route ${route.pattern}: quorum: each_quorum needs regions, and no node of cluster "${route.cluster}" has one (without them it is quorum)`);
      }
      if (route.quorum && route.policy !== 'ring') throw new ConfigError(`route ${route.pattern}: a replicated route places keys on the ring: policy "ring", not "${route.policy}"`);
      return {
        pattern: route.pattern,
        cluster,
        policy: route.policy,
        keyHeader: route.keyHeader,
        operations: route.operations ?? null,
        hedge: route.hedge ?? true,
        // An affinity route re-places a client whose node cannot be reached (seed 004).
        failoverUnsent: route.failoverUnsent ?? (route.affinity !== undefined && route.affinity !== null),
        affinity: route.affinity ?? null,
        quorum: route.quorum ?? null,
      };
    });
    this.table = new TableWriter(this.nodes.length);
    this.counterSlots = config.threads + 1;
    this.counters = new SharedArrayBuffer(counterBytes(this.counterSlots, this.nodes.length));
    this.failuresInRow = new SharedArrayBuffer(4 * this.nodes.length);
    this.hintsHeld = new SharedArrayBuffer(HeldHints.bytes(this.counterSlots, this.nodes.length));
    this.nodeHashes = HeldHints.nodeHashes(this.nodes, this.clusters);
    const mainSlot = (this.mainSlot = new CounterSlot(this.counters, 0, this.nodes.length));
    this.router = new Router(
      {
        membership: this.memberships[0]!,
        hedgeDelayMs: config.settings.hedgeDelayMs,
        hedgeAfterPercentile: config.settings.hedgeAfterPercentile,
        hedgeBudgetPercent: config.settings.hedgeBudgetPercent,
        requestTimeoutMs: config.settings.requestTimeoutMs,
        ...(config.fetch !== undefined ? { fetch: config.fetch } : {}),
      },
      { slot: mainSlot, totals: () => readTotals(this.counters, this.counterSlots, this.nodes.length) },
    );
    this.publish();
  }

  /** Probes membership once, starts health polling and the workers; resolves once all listen. */
  static async start(config: FrontDoorConfig): Promise<FrontDoor> {
    const door = new FrontDoor(config);
    await door.begin();
    return door;
  }

  private async begin(): Promise<void> {
    const config = this.config;
    if (config.hintsFile) this.takeHints(config.hintsFile);
    if (config.accessLog) {
      // Each worker opens it for itself; one that cannot is a configuration error, said now.
      try {
        const fd = openAccessLog(config.accessLog);
        if (fd !== 1) closeSync(fd);
      } catch (err) {
        throw new ConfigError(`access log ${config.accessLog}: cannot open it for appending (${(err as Error).message})`);
      }
    }
    await Promise.all([...this.memberships.map((m) => m.probeOnce()), ...this.leaderProbes.map((p) => p?.probeOnce())]);
    try {
      await this.spawnAll();
      // Stopped while starting (a reload cut short): nothing more starts.
      if (this.stopping !== null) throw new Error('the front door was stopped while starting');
    } catch (err) {
      await this.stop();
      throw err;
    }
    // The hints are the first worker's now (and saved again at the next stop).
    if (config.hintsFile) rmSync(config.hintsFile, { force: true });
    for (const membership of this.memberships) membership.start();
    for (const probe of this.leaderProbes) probe?.start();
  }

  /**
   * Replaces this front door with one running `config`, on the same address, without closing the
   * port (as nginx's reload): the new one probes its members and starts its workers beside this
   * one's (both bind the port with SO_REUSEPORT); once they all listen, this one drains (stops
   * accepting, finishes what it has in flight, lets its WebSocket tunnels run on until they close
   * or the drain's deadline, polling health meanwhile, then closes its connections) and its
   * replicated routes' pending hints go to the new one. The new one's stop closes those tunnels at
   * once. Resolves with the new front door once it serves and this one's workers have closed
   * their listening sockets (at most UNLISTEN_WAIT_MS for one stuck in JavaScript); the drain goes on behind it
   * (`drained`, which rejects if a worker is stuck).
   *
   * Rejects, changing nothing, if `config` is unusable: another host or port (0 keeps the port),
   * a replicated route's quorum changed in a way its data cannot follow (`reloadProblem`), a
   * configuration error, or workers that cannot start.
   */
  async reload(config: FrontDoorConfig): Promise<FrontDoor> {
    if (this.stopping !== null) throw new Error('the front door is stopping');
    if (this.successor !== null) throw new Error('a reload is already under way, or done: reload the front door that took over');
    if (config.host !== this.host) throw new ConfigError(`host: a reload keeps the address ${this.host}, got ${config.host} (restart to move it)`);
    if (config.port !== 0 && config.port !== this.port) throw new ConfigError(`port: a reload keeps port ${this.port}, got ${config.port} (restart to move it)`);
    // A replicated route's quorum, against every one since start that may share its keys, and
    // those of the front doors still draining.
    const drainingShapes: ReplicatedShape[] = [];
    for (let p: FrontDoor | null = this; p !== null; p = p.predecessor) drainingShapes.push(...p.replicated);
    for (const after of replicatedShapes(config.routes)) {
      for (const [earlier, stillDraining] of [[this.replicatedSeen, false], [drainingShapes, true]] as const) {
        for (const before of earlier) {
          const problem = sharesKeys(before, after) ? reloadProblem(before.quorum, after.quorum, stillDraining) : null;
          if (problem !== null) throw new ConfigError(`route ${after.pattern}: quorum: ${problem}${before.pattern === after.pattern ? '' : ` (keys route ${before.pattern} placed)`}`);
        }
      }
    }
    const next = new FrontDoor({ ...config, port: this.port });
    // One of each (a reload of the same configuration adds nothing to compare against).
    next.replicatedSeen = [...this.replicatedSeen, ...next.replicated.filter((s) => !this.replicatedSeen.some((seen) => sameShape(seen, s)))];
    next.inheritsPort = true;
    next.carryHolds(this);
    // Until their drains end, this front door and those still draining before it keep hints, and
    // their workers still answer requests on the connections they keep: each reads the other's
    // hint rows (a replicated read must know a hint waits wherever it is held).
    const draining: FrontDoor[] = [];
    for (let p: FrontDoor | null = this; p !== null; p = p.predecessor) draining.push(p);
    next.priorHintsHeld = draining.map((p) => next.rowsOf(p));
    for (const p of draining) p.readRowsOf(next);
    // Known from the start: closeNow on this one reaches a successor still starting.
    this.successor = next;
    this.successorStarting = true;
    try {
      await next.begin();
      // Stopped meanwhile: the successor must not outlive it.
      if (this.stopping !== null) throw new Error('the front door was stopped during the reload');
    } catch (err) {
      this.successorStarting = false;
      this.successor = null;
      for (const p of draining) p.readRowsOf(next, true);
      await next.stop().catch(() => undefined);
      // Workers of it that listened may have served a few requests: they stay counted here.
      this.carry(next);
      // Stopped during the reload, its workers handed their hints back for the successor: they
      // are saved (or counted lost) as a stop's are, if the drain got there first.
      if (this.drainDone) this.writeHints();
      throw err;
    }
    this.successorStarting = false;
    const handover = this.stop().then(
      () => this.handOver(),
      (err: Error) => {
        this.handOver();
        throw err;
      },
    );
    next.predecessorDone = handover.catch(() => undefined);
    next.predecessor = this;
    // Not kept once drained (a chain of reloads does not hold every earlier front door): its
    // counts are, for /stats.
    void next.predecessorDone.then(() => {
      next.carry(this);
      next.predecessor = null;
      next.priorHintsHeld = [];
      // Its hints are the successor's now (their adopt-hints messages went first): its rows, zero
      // from here on, need no more reading.
      next.readRowsOf(this, true);
    });
    this.drained = handover;
    // Rejected when a worker is stuck: whoever awaits `drained` hears of it, nobody else must.
    handover.catch(() => undefined);
    // Resolved once this one's workers accept no more: a connection made after it reaches the
    // new configuration (before, an old worker could still take it and answer from the old one).
    await this.listenClosed;
    return next;
  }

  /**
   * After `reload`: settles once this front door has drained into its successor; rejects as
   * `stop()` does (a worker thread stuck in JavaScript, which only the process's end can stop).
   */
  drained: Promise<void> = Promise.resolve();

  /** Passes every hint this front door still holds to its successor (after a reload's drain). */
  private handOver(): void {
    this.handedOver = true;
    const hints = [...this.stoppedHints, ...[...this.hintsFor.values()].flat()];
    this.stoppedHints.length = 0;
    this.hintsFor.clear();
    // The successor counts them before this one stops: a read never finds them held nowhere.
    this.successor?.takeOver(hints);
    this.countHeld();
  }

  /**
   * Counts the hints on their way (held by no worker: a stop's, those for workers not started,
   * those posted to workers not yet taken) in row 0 of `hintsHeld`, by replica and key, for reads
   * (HeldHints).
   */
  private countHeld(): void {
    const counts = new Int32Array(HeldHints.width(this.nodes.length));
    const count = (hints: readonly SavedHint[]): void => {
      for (const hint of hints) {
        const g = this.globalNodeOf(hint);
        if (g < 0) continue;
        const key = hint.key ?? keyOfWrite(this.routeOf(hint)!.keyHeader, hint.path, hint.headers);
        HeldHints.count(counts, g, this.nodeHashes[g]!, keyHash(key));
      }
    };
    count(this.stoppedHints);
    for (const share of this.hintsFor.values()) count(share);
    for (const batches of this.postedHints.values()) for (const batch of batches) count(batch);
    HeldHints.store(this.hintsHeld, counts);
  }

  /** The global index of the replica a hint is for, or -1 (its route or node not configured here). */
  private globalNodeOf(hint: SavedHint): number {
    const route = this.routeOf(hint);
    return route === undefined ? -1 : this.nodeIndex(this.clusters[route.cluster]!.name, hint.node);
  }

  /** The replicated route a hint is for, or undefined (not configured here). */
  private routeOf(hint: SavedHint): RouteSpec | undefined {
    return this.routes.find((r) => r.pattern === hint.route && r.quorum !== null);
  }

  /** The global index of node `id` of cluster `cluster`, or -1. */
  private nodeIndex(cluster: string, id: string): number {
    return this.nodeKeys.get(`${cluster}\n${id}`) ?? -1;
  }

  /**
   * Hints a predecessor handed over (`reload`): those for routes and replicas this configuration
   * still has, and not expired, go to its workers; the rest are counted (lost, or expired). A
   * front door already stopping passes them on to its own successor, or saves them with its own
   * (a hints file), or counts them lost.
   */
  private takeOver(hints: readonly SavedHint[]): void {
    const shares = this.shareHints(hints, 'the previous configuration');
    if (this.stopping !== null) {
      this.keepStopped([...shares.values()].flat());
      return;
    }
    let posted = 0;
    for (const [slot, share] of shares) {
      const handle = this.workers.get(slot);
      if (handle && handle.worker.threadId >= 0) {
        this.post(handle.worker, { t: 'adopt-hints', hints: share });
        appendTo(this.postedHints, slot, [share]);
        posted += share.length;
      }
      // Not started yet (or being replaced): it takes them when it starts.
      else appendTo(this.hintsFor, slot, share);
    }
    // On their way to the workers: pending for /stats until a collection posted after them.
    if (posted > 0) this.adopting.push({ after: this.nextCollectionId, count: posted });
    this.countHeld();
  }

  /** Hints posted to workers (`takeOver`) by the collection id that will see them counted. */
  private adopting: { after: number; count: number }[] = [];

  /**
   * Hints reaching a stopping front door (late from a worker, or from a predecessor): to the
   * successor it has handed over to, else kept with the stop's own, which the hand-over or the
   * hints file takes (or which are counted lost): again, if that has happened already.
   */
  private keepStopped(hints: readonly SavedHint[]): void {
    if (this.handedOver && this.successor !== null) {
      this.successor.takeOver(hints);
      return;
    }
    this.stoppedHints.push(...hints);
    if (this.drainDone && hints.length > 0) this.writeHints();
    this.countHeld();
  }

  /** The configuration it runs (a caller's `reload` may start from it). */
  get configuration(): FrontDoorConfig {
    return this.config;
  }

  get url(): string {
    const host = this.host === '0.0.0.0' || this.host === '::' ? '127.0.0.1' : this.host;
    // An IPv6 address goes in brackets in a URL.
    return host.includes(':') ? `http://[${host}]:${this.port}` : `http://${host}:${this.port}`;
  }

  private stopPolling(): void {
    for (const membership of this.memberships) membership.stop();
    for (const probe of this.leaderProbes) probe?.stop();
    if (this.warmTimer !== null) clearTimeout(this.warmTimer);
    this.warmTimer = null;
  }

  /**
   * Has every worker open the access log's file again (`SIGUSR1`, after a log rotation moved it),
   * those of front doors still draining after a reload too.
   */
  reopenAccessLog(): void {
    // A successor starting (a reload under way) has opened the file already too.
    const doors = new Set<FrontDoor>();
    for (let door: FrontDoor | null = this; door !== null; door = door.successor) doors.add(door);
    for (let door = this.predecessor; door !== null; door = door.predecessor) doors.add(door);
    for (const door of doors) for (const handle of door.running()) door.post(handle.worker, { t: 'reopen-log' });
  }

  /** Tells its workers still running to close their WebSocket tunnels now (1001). */
  private closeTunnels(): void {
    for (const handle of this.running()) this.post(handle.worker, { t: 'close-tunnels' });
  }

  /** Worker threads still running (after a stop: the stuck ones). */
  get liveWorkers(): number {
    return this.running().length;
  }

  /** Slots of the workers currently running. */
  get workerSlots(): number[] {
    return [...this.workers.keys()];
  }

  /**
   * Keeps the counts of a front door that has ended (a predecessor drained, or a successor that
   * failed to start) with this one's, for /stats. Added to what is carried already: a reload that
   * failed while the predecessor still drained counts as well.
   */
  private carry(ended: FrontDoor): void {
    const totals = endedTotals(ended.totals());
    if (this.carried === null) this.carried = totals;
    else addTotals(this.carried, totals);
  }

  /**
   * This front door's counts and those of the front doors it took over from (reloads): the
   * gauges (tunnels open, hints pending, attempts in flight) of those still draining too.
   */
  private totals(): TotalsById {
    const totals = totalsById(readTotals(this.counters, this.counterSlots, this.nodes.length), this.nodes.map((n) => n.id));
    // Hints its stopped workers handed back, held until the hand-over (or the hints file), and
    // those kept for workers not started (or being replaced): pending still.
    totals.hintsPending += this.stoppedHints.length;
    for (const share of this.hintsFor.values()) totals.hintsPending += share.length;
    if (this.carried !== null) addTotals(totals, this.carried);
    if (this.predecessor !== null) addTotals(totals, this.predecessor.totals());
    return totals;
  }

  /**
   * The whole process's counters and per-node latency: what `/stats` answers. Counters go on
   * across reloads; latency histograms are the serving workers' own.
   */
  async stats(): Promise<Record<string, unknown>> {
    // Asked of an old worker during a reload's drain: answered for the configuration serving
    // (the newest front door, after several reloads).
    const serving = this.serving;
    if (serving !== this) return serving.stats();
    // Draining front doors' workers add their batched counts too (the collection flushes them);
    // one that does not answer soon (stuck) is not waited for long.
    const draining: Promise<unknown>[] = [];
    for (let p = this.predecessor; p !== null; p = p.predecessor) draining.push(p.collect(PREDECESSOR_COLLECT_MS));
    const collection = this.nextCollectionId;
    const [encoded] = await Promise.all([this.collect(), ...draining]);
    const totals = this.totals();
    // Hints handed over before that collection was posted are in the workers' counts now (their
    // messages came first); later ones are still on their way.
    this.adopting = this.adopting.filter((a) => a.after > collection);
    for (const a of this.adopting) totals.hintsPending += a.count;
    const latency = mergeSummaries(encoded, this.nodes.length);
    // Made with fromEntries, not assigned: a node named `__proto__` would set the object's
    // prototype instead of appearing.
    const nodes: Record<string, unknown> = Object.fromEntries(
      this.nodes.map((node, i) => {
        const { ejections, ejected } = this.memberships[node.cluster]!.ejectionsOf(node.id);
        return [node.id, { cluster: this.clusters[node.cluster]!.name, ...totals.nodes.get(node.id), ejections, ejected, latencyUs: latency[i] }];
      }),
    );
    return {
      requests: totals.requests,
      hedges: totals.hedges,
      hedgeWins: totals.hedgeWins,
      failovers: totals.failovers,
      rejected: totals.rejected,
      hedgesDenied: totals.hedgesDenied,
      websockets: totals.websockets,
      pipelining: { pipelined: totals.pipelined, refused: totals.pipelinesRefused },
      quorum: {
        failures: totals.quorumFailures,
        standIns: totals.standIns,
        readRepairs: totals.readRepairs,
        hints: { pending: totals.hintsPending, delivered: totals.hintsDelivered, expired: totals.hintsExpired, refused: totals.hintsRefused, lost: totals.hintsLost },
      },
      healthy: this.memberships.flatMap((m) => m.healthyIds()),
      leaders: Object.fromEntries(
        this.leaderProbes.flatMap((p, i) => (p ? [[this.clusters[i]!.name, p.leader]] : [])),
      ),
      threads: this.threads,
      nodes,
    };
  }

  /**
   * Reads the hints an earlier stop saved, keeps those for routes and replicas that still exist
   * and have not expired (the rest are counted, and said), and shares them out among the
   * workers to start.
   */
  private takeHints(file: string): void {
    checkHintsPath(file);
    const dir = dirname(file);
    let dirInfo: Stats;
    try {
      dirInfo = statSync(dir);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      throw new ConfigError(`hints file ${file}: its directory ${dir} ${code === 'ENOENT' ? 'does not exist' : `cannot be read (${code ?? (err as Error).message})`} (a stop could not save the hints there)`);
    }
    if (!dirInfo.isDirectory()) throw new ConfigError(`hints file ${file}: ${dir} is not a directory (a stop could not save the hints there)`);
    try {
      accessSync(dir, constants.W_OK);
    } catch {
      throw new ConfigError(`hints file ${file}: its directory is not writable (a stop could not save the hints there)`);
    }
    for (const [slot, share] of this.shareHints(loadHints(file), `hints file ${file}`)) appendTo(this.hintsFor, slot, share);
    this.countHeld();
  }

  /**
   * Keeps the hints for routes and replicas that still exist and have not expired (the rest are
   * counted, and said), and deals them out among the worker slots, soonest to expire first (each
   * worker's queues stay in order of expiry).
   */
  private shareHints(hints: readonly SavedHint[], source: string): Map<number, SavedHint[]> {
    const now = Date.now();
    let dropped = 0;
    let slot = 0;
    const shares = new Map<number, SavedHint[]>();
    for (const hint of [...hints].sort((a, b) => a.expiresAt - b.expiresAt)) {
      if (this.globalNodeOf(hint) < 0) {
        dropped++;
        this.unconfiguredHints++;
        this.mainSlot.bump(C_HINTS_LOST);
        continue;
      }
      if (hint.expiresAt <= now) {
        this.mainSlot.bump(C_HINTS_EXPIRED);
        continue;
      }
      const target = (slot++ % this.threads) + 1;
      appendTo(shares, target, [hint]);
    }
    if (dropped > 0) process.stderr.write(`lakefront: ${source}: ${dropped} hint(s) for routes or replicas no longer configured were dropped\n`);
    return shares;
  }

  /**
   * Saves what the workers handed over, and what workers that never listened still hold. Without
   * a hints file, any handed back (for a reload that then failed) are counted lost.
   */
  private writeHints(): void {
    const file = this.config.hintsFile;
    // Handing over to a successor: it has them (and saves them at its own stop).
    if (this.successor !== null) return;
    const hints = [...[...this.hintsFor.values()].flat(), ...this.stoppedHints];
    if (!file) {
      this.mainSlot.bump(C_HINTS_LOST, hints.length);
      this.stoppedHints.length = 0;
      this.hintsFor.clear();
      return;
    }
    try {
      this.hintsSaved = saveHints(file, hints);
    } catch (err) {
      this.hintsSaved = 0;
      this.mainSlot.bump(C_HINTS_LOST, hints.length);
      // Counted once: a later write does not count (or save) them again.
      this.stoppedHints.length = 0;
      this.hintsFor.clear();
      process.stderr.write(`lakefront: hints file ${file}: ${hints.length} hint(s) could not be saved: ${(err as Error).message}\n`);
    }
  }

  /** Hints (replicated routes) forgotten as their worker stopped: see `/stats` quorum.hints.lost. */
  hintsLost(): number {
    return readTotals(this.counters, this.counterSlots, this.nodes.length).hintsLost;
  }

  /** Fault injection: makes worker `slot` throw an uncaught exception. It is then replaced. */
  crashWorker(slot: number): void {
    this.post(this.handleOf(slot).worker, { t: 'crash' });
  }

  /**
   * Fault injection: keeps worker `slot`'s thread busy in JavaScript for `ms` (a thread stuck in
   * a loop, as a bug would leave it). Its event loop answers nothing meanwhile.
   */
  hangWorker(slot: number, ms: number): void {
    this.post(this.handleOf(slot).worker, { t: 'hang', ms });
  }

  private handleOf(slot: number): WorkerHandle {
    const handle = this.workers.get(slot);
    if (!handle) throw new RangeError(`no worker in slot ${slot}`);
    return handle;
  }

  /**
   * The workers whose threads still run. One that has ended may stay listed for a moment (until
   * its exit is handled, or a drain finishes).
   */
  private running(): WorkerHandle[] {
    return [...this.workers.values()].filter((h) => h.worker.threadId >= 0);
  }

  /**
   * Stops accepting, lets in-flight requests finish (bounded by `drainTimeoutMs`), stops health
   * polling. Safe to call twice.
   *
   * Rejects, naming them, if worker threads have not ended `STUCK_GRACE_MS` after the drain
   * deadline (a thread stuck in JavaScript never reads the drain message). They are left running:
   * Node cannot end a thread that holds uWS sockets without aborting the whole process (as
   * `worker.terminate()` and `process.exit()` both do), so only the process's death by a signal
   * ends them cleanly. The command does that; a library caller decides.
   */
  stop(): Promise<void> {
    this.stopping ??= this.drainAll();
    return this.stopping;
  }

  /**
   * Stops without draining: every worker closes its sockets at once (in-flight requests are cut)
   * and ends. Resolves with the slots of the workers that have not ended within `timeoutMs` (stuck
   * in JavaScript); empty once every one has, and then the process may exit (nothing holds uWS
   * sockets). Starts `stop()` too, if it was not running, for the rest of the shutdown.
   */
  async closeNow(timeoutMs: number): Promise<number[]> {
    // A successor still starting (a reload under way) goes too: nobody else holds it yet.
    const starting = this.successor !== null && this.successorStarting ? this.successor.closeNow(timeoutMs) : Promise.resolve([]);
    const alive = this.running();
    // The caller of stop() (if any) sees its outcome; this one only wants the workers gone.
    this.stop().catch(() => undefined);
    // Not events.once: it rejects on an 'error' event, and an erroring worker still ends.
    const exited = Promise.all(alive.map((h) => new Promise((resolve) => h.worker.once('exit', resolve))));
    for (const handle of alive) this.post(handle.worker, { t: 'close-now' });
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)));
    try {
      await Promise.race([exited, late]);
    } finally {
      clearTimeout(timer);
    }
    const stuck = alive.filter((h) => h.worker.threadId >= 0).map((h) => h.slot).sort((a, b) => a - b);
    return [...stuck, ...(await starting)];
  }

  private async drainAll(): Promise<void> {
    // A reload's hand-over (its successor serving) lets WebSocket tunnels run on, and keeps
    // polling health meanwhile: a connection kept alive may still bring a request. A stop (a
    // reload cut short included) closes them at once, and those an earlier configuration still
    // runs through its own hand-over too.
    const handingOver = this.successor !== null && !this.successorStarting;
    if (!handingOver) {
      for (let p = this.predecessor; p !== null; p = p.predecessor) p.closeTunnels();
      this.stopPolling();
    }
    for (const timer of this.respawns) clearTimeout(timer);
    this.respawns.clear();
    const deadlineMs = this.config.settings.drainTimeoutMs + STUCK_GRACE_MS;
    const stuck: number[] = [];
    const unlistened: Promise<void>[] = [];
    const exits = [...this.workers.values()].map(
      (handle) =>
        new Promise<void>((resolve) => {
          const worker = handle.worker;
          unlistened.push(
            new Promise<void>((closed) => {
              if (worker.threadId < 0) return closed();
              // A worker stuck in JavaScript never says so: its socket is not waited for longer.
              const bound = setTimeout(closed, UNLISTEN_WAIT_MS).unref();
              handle.unlistened = () => {
                clearTimeout(bound);
                closed();
              };
              worker.once('exit', handle.unlistened);
            }),
          );
          if (worker.threadId < 0) return resolve();
          const grace = setTimeout(() => {
            stuck.push(handle.slot);
            resolve();
          }, deadlineMs);
          worker.once('exit', () => {
            clearTimeout(grace);
            resolve();
          });
          this.post(worker, { t: 'drain', keepHints: Boolean(this.config.hintsFile) || this.successor !== null, lingerTunnels: handingOver });
        }),
    );
    this.listenClosed = Promise.all(unlistened).then(() => undefined);
    await Promise.all(exits);
    this.stopPolling();
    // A predecessor still draining into this one hands its hints over first: they are saved (or
    // passed on) with this one's.
    await this.predecessorDone;
    this.drainDone = true;
    this.writeHints();
    // A stuck worker stays listed: it still runs, and holds its sockets.
    for (const [slot, handle] of this.workers) if (handle.worker.threadId < 0) this.workers.delete(slot);
    if (stuck.length > 0) {
      stuck.sort((a, b) => a - b);
      throw new Error(
        `worker thread${stuck.length > 1 ? 's' : ''} ${stuck.join(', ')} did not stop within ${deadlineMs} ms of the drain (stuck in JavaScript?); only the process's end can stop ${stuck.length > 1 ? 'them' : 'it'}`,
      );
    }
  }

  /**
   * Nodes `predecessor` holds out (an attempt could not reach them, or they were ejected) stay out
   * here until their hold ends: this door's first probe would otherwise bring back a node that
   * passes its probe but failed requests a moment ago. Their ejection counts come along too
   * (Membership.adopt). Matched by cluster name and node id; a node the new configuration gives
   * another URL (a dead machine's id pointed at its replacement) is another server, and carries
   * only its ejection count: its first probe decides.
   */
  private carryHolds(predecessor: FrontDoor): void {
    this.config.clusters.forEach((cluster, i) => {
      const before = predecessor.config.clusters.findIndex((c) => c.name === cluster.name);
      if (before < 0) return;
      const old = predecessor.memberships[before]!;
      const urls = new Map(old.all().map((m) => [m.id, m.url]));
      for (const member of this.memberships[i]!.all()) {
        const url = urls.get(member.id);
        if (url !== undefined) this.memberships[i]!.adopt(member.id, old, url === member.url);
      }
    });
    // What was adopted without a change said (a member out, a return's time: warming) reaches
    // the table now.
    this.publish();
  }

  /**
   * `owner`'s hint rows, as this front door's node indices map onto its (by cluster name and node
   * id): across a reload, each of the two reads the other's (see `reload`).
   */
  private rowsOf(owner: FrontDoor): HeldRows {
    const map = Int32Array.from(this.nodes, (node) => owner.nodeIndex(this.clusters[node.cluster]!.name, node.id));
    return { door: owner.doorId, buffer: owner.hintsHeld, slots: owner.counterSlots, nodes: owner.nodes.length, map };
  }

  /** Its running workers read `door`'s hint rows too (`forget`: no longer). */
  private readRowsOf(door: FrontDoor, forget = false): void {
    const message: MainMessage = forget ? { t: 'forget-hint-rows', door: door.doorId } : { t: 'hint-rows', rows: this.rowsOf(door) };
    for (const handle of this.running()) this.post(handle.worker, message);
  }

  private publish(): void {
    const rows: NodeRow[] = [];
    const now = performance.now();
    const warmMs = this.ejection.baseMs;
    let warmEnds = Infinity;
    this.memberships.forEach((membership, clusterIndex) => {
      // During construction the probes do not exist yet: no leader is known then anyway.
      const leader = this.leaderProbes?.[clusterIndex]?.leader ?? null;
      for (const node of membership.nodes()) {
        const healthy = membership.isHealthy(node.id);
        // Back in the rankings less than --eject-ms ago (a restart, an ejection over): warming.
        const returnedAt = membership.returnedAt(node.id);
        const warming = healthy && returnedAt > 0 && now - returnedAt < warmMs;
        if (warming) warmEnds = Math.min(warmEnds, returnedAt + warmMs);
        rows.push({
          // Capacity, healthy or not: health is in the flags (the workers zero an unhealthy
          // node's routable weight), and replicated routes place keys on members by capacity.
          weight: membership.capacityWeight(node.id),
          flags: (healthy ? FLAG_HEALTHY : 0) | FLAG_ENABLED | (node.id === leader ? FLAG_LEADER : 0) | (warming ? FLAG_WARMING : 0),
          region: -1,
          cluster: clusterIndex,
        });
      }
    });
    this.table.publish(rows);
    // Published again when the first warm-up ends (its flag cleared).
    if (this.warmTimer !== null) clearTimeout(this.warmTimer);
    this.warmTimer = warmEnds === Infinity ? null : setTimeout(() => {
      this.warmTimer = null;
      this.publish();
    }, warmEnds - now + 1).unref();
  }

  private async spawnAll(): Promise<void> {
    if (this.stopping !== null) throw new Error('the front door was stopped while starting');
    let port = this.config.port;
    const pickPort = port === 0;
    // uWS does not set SO_REUSEPORT when asked for port 0, so a free port is chosen first and
    // every worker binds it explicitly. Another process may take it in between: retry then.
    for (let tries = 0; ; tries++) {
      // A plain bind first, for a fixed port too: uWS binds with SO_REUSEPORT, so a second
      // Lakefront on the same port would otherwise start and take half of the first one's
      // connections. (A crashed worker's replacement skips this: its siblings hold the port.)
      // A successor (`reload`) binds beside its predecessor's workers, which hold the port.
      if (!this.inheritsPort) port = await bindOnce(this.host, pickPort ? 0 : port);
      try {
        this.port = port;
        await this.spawn(1);
        break;
      } catch (err) {
        if (!pickPort || tries >= 4) throw err;
      }
    }
    for (let slot = 2; slot <= this.threads; slot++) {
      // Stopped while starting (a reload cut short): no more workers.
      if (this.stopping !== null) throw new Error('the front door was stopped while starting');
      await this.spawn(slot);
    }
  }

  private spawn(slot: number, replacement = false): Promise<void> {
    const init: WorkerInit = {
      slot,
      host: this.host,
      port: this.port,
      table: this.table.buffer,
      counters: this.counters,
      failuresInRow: this.failuresInRow,
      hintsHeld: this.hintsHeld,
      priorHintsHeld: this.priorHintsHeld,
      counterSlots: this.counterSlots,
      nodes: this.nodes,
      clusters: this.clusters,
      routes: this.routes,
      settings: this.config.settings,
      region: this.config.region ?? null,
      versionSalt: this.versionSalt,
      versionLane: VERSION_LANE,
      hints: this.hintsFor.get(slot) ?? [],
      accessLog: this.config.accessLog ?? null,
    };
    const worker = new Worker(WORKER_URL, {
      workerData: init,
      stderr: false,
      stdout: false,
      resourceLimits: { maxYoungGenerationSizeMb: this.config.workerYoungMb ?? DEFAULT_WORKER_YOUNG_MB },
    });
    const previous = this.workers.get(slot);
    const handle: WorkerHandle = { slot, worker, deaths: previous?.deaths ?? [], replacement };
    this.workers.set(slot, handle);
    return new Promise<void>((resolve, reject) => {
      let listening = false;
      worker.on('message', (message: WorkerMessage) => {
        if (message.t === 'listening') {
          listening = true;
          // Stopped while it started: the drain did not reach it, so it closes now.
          if (this.stopping !== null) this.post(worker, { t: 'close-now' });
          // Its hints are its own now (saved again at its stop).
          this.hintsFor.delete(slot);
          this.countHeld();
          resolve();
          return;
        }
        if (message.t === 'listen-failed') {
          if (!listening) reject(new Error(message.reason));
          return;
        }
        this.onWorkerMessage(handle, message);
      });
      worker.on('error', (err) => {
        if (!listening) reject(err);
      });
      worker.on('exit', (code) => {
        if (!listening) reject(new Error(`worker ${slot} exited with code ${code} before listening`));
        this.onWorkerExit(handle, worker, code);
      });
    });
  }

  private onWorkerExit(handle: WorkerHandle, worker: Worker, code: number): void {
    if (this.workers.get(handle.slot)?.worker !== worker) return;
    for (const collection of this.collections.values()) {
      if (collection.waiting.delete(handle.slot) && collection.waiting.size === 0) collection.done();
    }
    // Attempts it had in flight end with it (a worker cut short by closeNow or a crash cannot
    // count them down itself), and so do the hints it still kept (a drained one kept none).
    const lost = new CounterSlot(this.counters, handle.slot, this.nodes.length).resetInflight(this.nodes.length);
    HeldHints.clear(this.hintsHeld, this.nodes.length, handle.slot);
    // Hints posted to it and not taken went with it.
    if (this.postedHints.delete(handle.slot)) this.countHeld();
    this.mainSlot.bump(C_HINTS_LOST, lost);
    this.mainSlot.flush();
    this.hintsLostWithWorkers += lost;
    if (this.stopping) {
      // (slot, requests still running at the drain's deadline, hints it handed back)
      this.emit('worker-drained', handle.slot, handle.drained?.abandoned ?? 0, handle.drained?.hints ?? 0);
      return;
    }
    this.emit('worker-exit', handle.slot, code, lost);
    // A worker of the start that could not start at all: the start fails (or retries) itself.
    // A replacement that could not (its access log's directory gone for a while, its port taken
    // while no sibling held it) is tried again, backing off: else the slot stays empty for good.
    if (code === EXIT_CONFIG && !handle.replacement) return;
    const now = Date.now();
    handle.deaths = handle.deaths.filter((t) => now - t < 10_000);
    handle.deaths.push(now);
    // Crash-looping workers back off (0, 100, 200, 400 ... up to 5000 ms) instead of spinning.
    const delay = handle.deaths.length <= 1 ? 0 : Math.min(5_000, 100 * 2 ** (handle.deaths.length - 2));
    // Not unref'd: while it waits, no worker thread may be running (one thread, or all of them
    // crashed), and nothing else keeps the process alive: it would end, with exit code 0.
    const timer = setTimeout(() => {
      this.respawns.delete(timer);
      if (this.stopping) return;
      this.spawn(handle.slot, true).then(
        () => this.emit('worker-replaced', handle.slot),
        (err: Error) => this.emit('error', err),
      );
    }, delay);
    this.respawns.add(timer);
  }

  private onWorkerMessage(handle: WorkerHandle, message: WorkerMessage): void {
    switch (message.t) {
      case 'stats-request':
        this.stats().then(
          (body) => this.post(handle.worker, { t: 'stats-reply', id: message.id, body: JSON.stringify(body) }),
          (err: Error) => this.post(handle.worker, { t: 'stats-reply', id: message.id, body: JSON.stringify({ error: err.message }) }),
        );
        break;
      case 'histograms': {
        const collection = this.collections.get(message.id);
        if (collection && collection.waiting.delete(handle.slot)) {
          collection.encoded.push(message.encoded);
          if (collection.waiting.size === 0) collection.done();
        }
        break;
      }
      case 'hints-adopted':
        this.postedHints.get(handle.slot)?.shift();
        this.countHeld();
        break;
      case 'unlistened':
        handle.unlistened?.();
        break;
      case 'drained':
        // Pending in the worker's slot until here; pending with this front door from here.
        new CounterSlot(this.counters, handle.slot, this.nodes.length).clearHintsPending();
        this.keepStopped(message.hints);
        handle.drained = { abandoned: message.abandoned, hints: message.hints.length };
        break;
      case 'node-unreachable': {
        const [door, g] = this.judging(message.node);
        const node = door?.nodes[g];
        if (node) door!.memberships[node.cluster]!.markUnhealthy(node.id, door!.config.unreachableHoldMs ?? DEFAULT_UNREACHABLE_HOLD_MS);
        break;
      }
      case 'node-failing': {
        const [door, g] = this.judging(message.node);
        door?.nodeFailing(g, message.failures, message.code);
        break;
      }
      case 'leader-failed': {
        const node = this.nodes[message.node];
        const probe = node ? this.leaderProbes[node.cluster] : null;
        if (node && probe && probe.leader === node.id) probe.clear();
        break;
      }
      default:
        break;
    }
  }

  /** The configuration serving: this one, or after reloads the newest that has started. */
  private get serving(): FrontDoor {
    let serving: FrontDoor = this;
    while (serving.successor !== null && !serving.successorStarting) serving = serving.successor;
    return serving;
  }

  /**
   * The front door whose membership judges a report about node `g` (this one's index), and the
   * node's index there: this one, or, from an old worker still draining after a reload, the one
   * serving now (the newest), which routes the new requests; null if it has no such node, or
   * gives that id another URL (what an old worker found at the old address says nothing of it).
   */
  private judging(g: number): [FrontDoor | null, number] {
    const serving = this.serving;
    const node = this.nodes[g];
    if (serving === this || node === undefined) return [this, g];
    const there = serving.nodeIndex(this.clusters[node.cluster]!.name, node.id);
    return there < 0 || serving.nodes[there]!.url !== node.url ? [null, -1] : [serving, there];
  }

  /**
   * A worker saw `failures` attempts in a row at node `g` fail: eject it (Membership.eject), and
   * say so on stderr, or why it stays in (at most one such line a node per `ejectMs`).
   */
  private nodeFailing(g: number, failures: number, code: string): void {
    const node = this.nodes[g];
    if (!node) return;
    const cluster = this.clusters[node.cluster]!.name;
    const verdict = this.memberships[node.cluster]!.eject(node.id, this.ejection);
    this.emit('ejection', { cluster, node: node.id, failures, code, ...verdict } satisfies EjectionEvent);
    const what = `lakefront: node "${node.id}" (cluster "${cluster}")`;
    const why = `${failures} attempts at it in a row failed, the last with ${code}`;
    if (verdict.ejected) {
      const streak = verdict.streak > 1 ? ` (ejection ${verdict.streak} in a row)` : '';
      process.stderr.write(`${what} ejected for ${verdict.holdMs / 1000} s${streak}, then until a health probe passes: ${why}\n`);
      return;
    }
    if (verdict.reason === ALREADY_EJECTED || verdict.reason === ALREADY_OUT) return;
    const now = performance.now();
    if (now - (this.keptInSaidAt.get(g) ?? -Infinity) < this.ejection.baseMs) return;
    this.keptInSaidAt.set(g, now);
    process.stderr.write(`${what} kept in though ${why}: ${verdict.reason}\n`);
  }

  /** Gathers every live worker's encoded histograms (or what arrived within the timeout). */
  private collect(timeoutMs = COLLECT_TIMEOUT_MS): Promise<(string | null)[][]> {
    const id = this.nextCollectionId++;
    const encoded: (string | null)[][] = [];
    const waiting = new Set(this.running().map((h) => h.slot));
    if (waiting.size === 0) return Promise.resolve(encoded);
    return new Promise((resolve) => {
      const timer = setTimeout(() => finish(), timeoutMs);
      const finish = (): void => {
        clearTimeout(timer);
        this.collections.delete(id);
        resolve(encoded);
      };
      this.collections.set(id, { encoded, waiting, done: finish });
      for (const handle of this.workers.values()) this.post(handle.worker, { t: 'collect', id });
    });
  }

  private post(worker: Worker, message: MainMessage): void {
    worker.postMessage(message);
  }
}

/**
 * Binds `host:port` without SO_REUSEPORT and lets go at once; resolves with the port bound (a free
 * one for 0). Fails if anything listens there, a Lakefront included, or if `host` is no address
 * of this machine (a ConfigError).
 */
function bindOnce(host: string, port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.unref();
    server.once('error', (err: NodeJS.ErrnoException) => {
      if (err.code === 'EADDRINUSE') reject(new Error(`could not listen on ${host}:${port}: the port is in use`));
      else if (err.code === 'ENOTFOUND' || err.code === 'EADDRNOTAVAIL') {
        reject(new ConfigError(`host: cannot listen on ${JSON.stringify(host)} (${err.code}: not an address of this machine)`));
      } else reject(new Error(`could not listen on ${host}:${port}: ${err.message}`));
    });
    server.listen({ port, host, exclusive: true }, () => {
      const address = server.address();
      const bound = typeof address === 'object' && address ? address.port : 0;
      server.close(() => resolve(bound));
    });
  });
}

/**
 * Reads a hints file saved at an earlier stop. One that cannot be read as hints is set aside
 * (renamed `.unreadable`) with a line on stderr: start-up goes on without them.
 */
export function loadHints(file: string): SavedHint[] {
  let text: string;
  try {
    // Whatever is at the path now (it may have changed since checkHintsPath looked): a symbolic
    // link is not followed (ELOOP), a pipe does not block the start (O_NONBLOCK), and fstat says
    // whether what was opened is a regular file.
    const fd = openSync(file, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    try {
      if (!fstatSync(fd).isFile()) throw new ConfigError(`hints file ${file}: not a regular file; the front door reads, removes and replaces it`);
      text = readFileSync(fd, 'utf8');
    } finally {
      closeSync(fd);
    }
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return [];
    if (code === 'ELOOP') throw new ConfigError(`hints file ${file}: not a regular file but a symbolic link (name the file itself)`);
    throw new ConfigError(`hints file ${file}: ${(err as Error).message}`);
  }
  let parsed: { version?: unknown; hints?: unknown };
  try {
    parsed = JSON.parse(text) as { version?: unknown; hints?: unknown };
  } catch (err) {
    // Not V8's message: it quotes the text, and a hints file holds requests' headers.
    return setAside(file, `not valid JSON (${jsonProblem(err, text)})`);
  }
  try {
    if (parsed.version !== 1 || !Array.isArray(parsed.hints)) throw new Error('not a version 1 hints file');
    return parsed.hints.map((h: Record<string, unknown>) => {
      // What goes into a request head: no line breaks, names and values in pairs.
      const line = (x: unknown): boolean => typeof x === 'string' && !/[\r\n\0]/.test(x);
      const ok =
        typeof h.route === 'string' && typeof h.node === 'string' && /^[A-Z]+$/.test(String(h.method)) && line(h.path) &&
        Array.isArray(h.headers) && h.headers.length % 2 === 0 && h.headers.every(line) && typeof h.expiresAt === 'number' &&
        (h.body === null || typeof h.body === 'string') && (h.key === undefined || typeof h.key === 'string');
      if (!ok) throw new Error('a hint of the wrong shape');
      return { ...(h as unknown as SavedHint), body: h.body === null ? null : Buffer.from(h.body as string, 'base64') };
    });
  } catch (err) {
    return setAside(file, (err as Error).message);
  }
}

/**
 * A hints file is read, set aside, removed once taken and replaced at a stop, so it must be a
 * file of its own or nothing yet: not a device (`/dev/null` renamed away, as root), a directory,
 * a pipe or a socket, and not a symbolic link (the link, not what it names, would be renamed and
 * replaced).
 */
export function checkHintsPath(file: string): void {
  // `/tmp/hints/` is a directory's name: taken as a file, a stop would write into a directory
  // that may not be there, and lose the hints.
  if (file.endsWith('/')) throw new ConfigError(`hints file ${file}: ends in "/", naming a directory; name the file`);
  let info: Stats;
  try {
    info = lstatSync(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return;
    if (code === 'ENOTDIR') throw new ConfigError(`hints file ${file}: a part of the path before its name is not a directory`);
    throw new ConfigError(`hints file ${file}: ${(err as Error).message}`);
  }
  if (info.isFile()) return;
  const kind = info.isSymbolicLink()
    ? 'a symbolic link (name the file itself)'
    : info.isDirectory()
      ? 'a directory'
      : info.isCharacterDevice() || info.isBlockDevice()
        ? 'a device'
        : info.isFIFO()
          ? 'a pipe'
          : 'a socket';
  throw new ConfigError(`hints file ${file}: not a regular file but ${kind}; the front door reads, removes and replaces it`);
}

/** A hints file that cannot be read as hints is renamed `.unreadable`, with a line on stderr. */
function setAside(file: string, why: string): SavedHint[] {
  try {
    renameSync(file, `${file}.unreadable`);
  } catch (err) {
    throw new ConfigError(`hints file ${file}: ${why}, and it cannot be set aside as ${file}.unreadable (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  process.stderr.write(`lakefront: hints file ${file} set aside as ${file}.unreadable: ${why}\n`);
  return [];
}

/** Saves hints for the next start (written whole, then renamed into place); returns how many. */
export function saveHints(file: string, hints: readonly SavedHint[]): number {
  if (hints.length === 0) {
    rmSync(file, { force: true });
    return 0;
  }
  const encoded = hints.map((h) => ({ ...h, body: h.body === null ? null : Buffer.from(h.body.buffer, h.body.byteOffset, h.body.byteLength).toString('base64') }));
  // The writes as the replicas get them, credentials included: readable by this user only.
  // A name of its own ('wx': never an existing file, which would keep its mode).
  // On disk before it replaces the last one, and the rename on disk before the stop is said to
  // have saved them (fsync of the file, then of its directory): a crash of the machine right
  // after a stop leaves the old file or the new one, whole.
  const temporary = `${file}.${process.pid}.${Math.random().toString(36).slice(2)}.tmp`;
  try {
    const fd = openSync(temporary, 'wx', 0o600);
    try {
      writeFileSync(fd, JSON.stringify({ version: 1, hints: encoded }));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    renameSync(temporary, file);
  } catch (err) {
    rmSync(temporary, { force: true });
    throw err;
  }
  const directory = openSync(dirname(file), 'r');
  try {
    fsyncSync(directory);
  } finally {
    closeSync(directory);
  }
  return hints.length;
}
