/**
 * One request on a replicated route (seed 003): fanned out to the key's replicas, answered once
 * enough of them have answered (quorum.ts), with stand-ins for replicas that are down (sloppy
 * quorum, hints.ts) and read repair.
 *
 * Targets: the first `n` nodes of the key's preference list are its replicas (its homes). Each
 * one the membership table shows healthy is a target; each one it shows down is covered by a
 * healthy node past the first `n` (a stand-in: the next one on the ring, or for the region-aware
 * levels the next one in the covered replica's region if there is one), when sloppy quorums are
 * on. A write is sent to every target once: the replicas get it with its version, a stand-in
 * also with the id of the replica it covers (`x-lakefront-hint-for`), and the front door keeps a
 * hint to hand the write to that replica when it is back. A write to a target that fails (never
 * sent, a reset, a timeout, a 5xx) goes to a stand-in as well, for the replica it was for: a
 * second copy of a versioned write is the same write (a replica keeps the highest version it is
 * sent; its own copy, if it took it, and the hint's are one), so unlike a bare write it may be
 * sent again (Cassandra keeps hints for timed-out replicas too). A read goes to the replicas that can be reached, to stand-ins for the
 * ones that are down only while those cannot make its quorum, and, when one fails, to a further
 * node; and while a hint for the key waits for one of its replicas (that replica missed a write
 * to it a stand-in took), to every node past them it can reach, and then it waits for all its
 * targets (hints are told apart by replica and a hash of the key: now and then one that waits
 * for a replica of the key, but for another key, passes for the key's own; see HeldHints). A
 * write's stand-in counts in the region of the replica it covers when it is there too; else, and
 * for a read's, only toward a majority of all (`countsIn`).
 *
 * What counts: a write's 2xx; a read's 200, or 404 (no value, or a deletion), from one of the
 * key's replicas, or from a node past them only with a version. A 5xx and a transport failure
 * are failures; any other answer (a 4xx, a 3xx) is a refusal, which does not count.
 *
 * Before anything is sent, a request whose targets could not meet its quorum even if all
 * answered is refused: 503, nothing written. After:
 * - the answer is the write's acknowledgement that completes its quorum, or the newest of a
 *   read's answers (highest `x-lakefront-version`), once enough have come;
 * - if that can no longer happen: the replicas' own refusal when nothing counted and (for a
 *   write) nothing failed (every replica says the request is wrong), else 502 naming each
 *   target's outcome (a write may be applied on the replicas that acknowledged: no rollback),
 *   or 503 when provably nothing was sent.
 * When every target of a read has answered, each replica (not a stand-in) whose value was older
 * is sent the newest (read repair): a PUT of its body, or a DELETE for a deletion, with its
 * version.
 *
 * Attempts are not cancelled when the answer is out: the write still lands on every target, and
 * the read's stragglers feed read repair. Each ends by the request timeout at the latest.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { ErrorCodes } from '../errors.js';
import { isUnsent, type AttemptHandle } from '../forward/exchange.js';
import type { HeaderFields } from '../forward/fields.js';
import { UpstreamRequest, type AttemptSink } from '../forward/upstream.js';
import { HintStore, keyHash, type HandoffHost, type Reservation } from './hints.js';
import { HINT_HEADER, Requirement, VERSION_HEADER, compareVersions, type QuorumSettings, type VersionClock } from './quorum.js';
import { OP_READ, OP_WRITE } from '../server/protocol.js';

/** What a replicated route needs of its cluster (the worker's ClusterRuntime). */
export interface ReplicaHost extends HandoffHost {
  readonly ids: readonly string[];
  readonly size: number;
  /** The key's preference list over the members, healthy or not, at most `limit`; returns how many. */
  membersFor(key: string, out: Int32Array, limit: number): number;
  /** Region index per node (nodes without a region share one). */
  readonly regionOf: Int32Array;
  /** Region index of the front door's region, or -1 (none, or no node in it). */
  readonly localRegion: number;
  /** A region's name by index ('' for the nodes without one). */
  regionName(index: number): string;
  readonly regionCount: number;
  /**
   * Whether any worker of the front door may hold a hint for `node` and the key of hash `key`
   * (hints.ts `keyHash`, `HeldHints.any`): never false when one does.
   */
  hintsHeldFor(node: number, key: number): boolean;
  readonly clock: VersionClock;
  replicaCounted(event: 'repair' | 'standIn' | 'failure'): void;
}

/** Told once when a call has its answer (or failure). */
export interface ReplicatedOwner {
  replicated(call: ReplicatedCall): void;
}

export interface ReplicatedFailure {
  readonly code: string;
  readonly status: number;
  readonly message: string;
  readonly replicas: { node: string; outcome: string; standInFor?: string }[];
}

/**
 * Request headers a replicated read does not pass on: the front door picks the newest of whole
 * values, so the replicas must answer whole (a 304 or a 206 carries no value to compare or to
 * repair with). A proxy may ignore them; the client gets a full 200.
 */
const READ_DROPS: ReadonlySet<string> = new Set(['range', 'if-range', 'if-match', 'if-none-match', 'if-modified-since', 'if-unmodified-since']);

// Target states.
const RUNNING = 0;
/** Counted toward the quorum: a write's 2xx, a read's 200 or 404. */
const COUNTED = 1;
/** Answered with a client error (or, for a write, any other status): does not count. */
const REFUSED = 2;
const FAILED = 3;
const NOT_SENT = 4;

/** One replicated route in one worker: its settings, its hints, its cluster. */
export class ReplicaSet {
  readonly hints: HintStore;
  /** Preference list entries a request looks at: its replicas and as many stand-ins, and two more. */
  readonly walk: number;

  constructor(
    readonly host: ReplicaHost,
    readonly settings: QuorumSettings,
    /** The route's key header (lower case), or null (keyed by path): read repairs carry it. */
    readonly keyHeader: string | null = null,
  ) {
    this.hints = new HintStore(host, host.size, settings.hintWindowMs, settings.maxHintBytes);
    this.walk = Math.min(host.size, 2 * settings.n + 2);
  }

  /**
   * A replicated request; `begin` starts it, and `owner` is told when it has an answer (from
   * inside `begin` when it cannot be sent).
   */
  call(owner: ReplicatedOwner, op: number, method: string, path: string, headers: string[], body: Buffer | null): ReplicatedCall {
    return new ReplicatedCall(this, owner, op, method, path, headers, body);
  }
}

export class ReplicatedCall implements AttemptSink {
  launchedAt = 0;
  /** Whether the answer (or failure) has been decided. */
  done = false;
  status = 0;
  headers: HeaderFields | null = null;
  body: Buffer | null = null;
  /** Node whose answer is relayed. */
  servedBy = -1;
  /** Targets counted when the answer was decided. */
  acks = 0;
  failure: ReplicatedFailure | null = null;

  /** Nodes the request went to so far (replicas, stand-ins, further nodes): the access log's attempts. */
  get attempts(): number {
    return this.targets.length;
  }

  private readonly list: Int32Array;
  private listCount = 0;
  /** The key `begin` was given (a write's stand-ins' hints are kept under it). */
  private key = '';
  private homes = 0;
  /** Per node: already a target of this request. */
  private readonly used: Uint8Array;
  private readonly requirement: Requirement;
  private readonly targets: number[] = [];
  /** Per target: one of the key's replicas (else a stand-in or a further node). */
  private readonly isHome: boolean[] = [];
  /** Per target: the replica a write's stand-in covers, or -1. */
  private readonly standInFor: number[] = [];
  /**
   * Per target: the region it counts in for the region-aware levels; -1 (toward a majority of all,
   * in no region) for a write's stand-in outside the region of the replica it covers (east
   * standing in for a west replica is not a west answer, nor an east replica's), and for any node
   * past the replicas a read asks: what it holds it may have held for any replica, and kept after
   * handing it back, so it is no region's answer.
   */
  private readonly countsIn: number[] = [];
  /** Per target: a write's stand-in's room for its hint, or null. */
  private readonly reservations: (Reservation | null)[] = [];
  private readonly states: number[] = [];
  private readonly handles: (AttemptHandle | null)[] = [];
  /** Reads: per target, the version it answered ('' for none). */
  private readonly versions: string[] = [];
  private readonly statuses: number[] = [];
  private running = 0;
  /**
   * A read that asked every node past its replicas (a hint for the key waits for one of them): it
   * answers once every target has, the newest of all.
   */
  private waitsForAll = false;
  /** Inside `begin`: outcomes wait for every first target to be launched. */
  private beginning = false;
  /** A read's repair has been sent (once, when every target has answered). */
  private repaired = false;
  /** The request as a replica gets it (a write with its version). */
  private readonly request: UpstreamRequest;
  /** The same with a body of its own, for hints (a client body may share a pooled slab). */
  private hinted: UpstreamRequest | null = null;
  /** A read's newest answer so far; else the first refusal. */
  private kept = -1;
  /** Inside `answered`: the write's acknowledgement being counted (the answer if it completes the quorum). */
  private deciding = -1;
  private decidingFields: HeaderFields | null = null;
  private decidingBody: Buffer | null = null;
  private keptHeaders: HeaderFields | null = null;
  private keptBody: Buffer | null = null;

  constructor(
    private readonly set: ReplicaSet,
    private readonly owner: ReplicatedOwner,
    readonly op: number,
    method: string,
    readonly path: string,
    clientHeaders: string[],
    body: Buffer | null,
  ) {
    const host = set.host;
    this.list = new Int32Array(set.walk);
    this.used = new Uint8Array(host.size);
    this.requirement = new Requirement(host.regionCount);
    // Versions and hints are the front door's to say: a client's are dropped.
    const headers: string[] = [];
    for (let i = 0; i < clientHeaders.length; i += 2) {
      const name = clientHeaders[i]!;
      if (name === VERSION_HEADER || name === HINT_HEADER || (op === OP_READ && READ_DROPS.has(name))) continue;
      headers.push(name, clientHeaders[i + 1]!);
    }
    if (op === OP_WRITE) headers.push(VERSION_HEADER, host.clock.next());
    this.request = new UpstreamRequest(method, path, headers, body);
  }

  /** Acknowledgements (a write) or answers (a read) the request needs. */
  get required(): number {
    return this.requirement.required;
  }

  /** Sends the request to the replicas of `key` (or refuses it: see the module comment). */
  begin(key: string): void {
    const { host, settings } = this.set;
    this.key = key;
    const count = (this.listCount = host.membersFor(key, this.list, this.list.length));
    const homes = (this.homes = Math.min(settings.n, count));
    const write = this.op === OP_WRITE;
    this.requirement.set(settings.consistency, write ? settings.w : settings.r, this.list, homes, host.regionOf, host.localRegion);
    for (let i = 0; i < homes; i++) this.used[this.list[i]!] = 1;
    let reachable = 0;
    for (let i = 0; i < homes; i++) {
      const node = this.list[i]!;
      if (host.isRoutable(node)) {
        this.addTarget(node, true, -1);
        reachable++;
      }
    }
    // A replica that is down is covered by a stand-in: always for a write (its hint hands the
    // write back later), for a read only while the replicas that can be reached cannot make its
    // quorum. A stand-in keeps its copy after handing it back, and a replica may have taken a
    // newer write since: beside replicas that could answer, its copy could make a stale quorum.
    if (settings.sloppy) {
      for (let i = 0; i < homes; i++) {
        const node = this.list[i]!;
        if (!host.isRoutable(node) && (write || !this.requirement.possible)) this.standIn(node);
      }
    }
    // A hint waiting for one of the key's replicas is asked after whatever the route is now: a
    // strict route holds the hints a sloppy predecessor (a reload) or a hints file handed it, and
    // the write they carry may have been acknowledged by stand-ins only.
    if (!write && this.hintWaits()) this.askPastReplicas();
    if (this.targets.length === 0 || !this.requirement.possible) {
      // Nothing is sent: give back what the stand-ins reserved.
      for (const reservation of this.reservations) if (reservation !== null) this.set.hints.release(reservation);
      this.decideFailure(ErrorCodes.QUORUM_UNAVAILABLE, 503, `${this.shortfall(homes, reachable)}: nothing was sent`);
      return;
    }
    // An attempt may fail inside `send` (and a write's stand-in be launched from there): the
    // outcome is judged once every first target is out.
    this.beginning = true;
    const first = this.targets.length;
    for (let i = 0; i < first; i++) this.launch(i);
    this.beginning = false;
    this.check();
  }

  /**
   * Whether a hint for this key waits for one of its replicas, in any worker (or, now and then,
   * one for another key that HeldHints cannot tell from it).
   */
  private hintWaits(): boolean {
    const host = this.set.host;
    const key = keyHash(this.key);
    for (let i = 0; i < this.homes; i++) if (host.hintsHeldFor(this.list[i]!, key)) return true;
    return false;
  }

  /**
   * A replica of the key missed a write to it a stand-in took, and has not been handed it yet:
   * that write may have been acknowledged by stand-ins and replicas that cannot answer now, so the
   * replicas that can may all hold older values (Dynamo's sloppy quorum gives no more). Every
   * node past the replicas that can be reached is asked too (a stand-in came from among them),
   * and the answer waits for all targets: the newest of them all is the answer. A node past the
   * replicas may also hold an old copy, from standing in for another write; waiting for everyone,
   * it cannot outvote a newer one.
   */
  private askPastReplicas(): void {
    const host = this.set.host;
    for (let i = this.homes; i < this.listCount; i++) {
      const node = this.list[i]!;
      if (this.used[node] !== 0 || !host.isRoutable(node)) continue;
      this.used[node] = 1;
      this.addTarget(node, false, -1, null, -1);
    }
    this.waitsForAll = true;
  }

  /** Why the targets cannot meet the quorum, for a 503 before anything is sent. */
  private shortfall(homes: number, reachable: number): string {
    const requirement = this.requirement;
    const what = this.op === OP_WRITE ? 'a write' : 'a read';
    const standIns = this.targets.length - reachable;
    const reach = `${reachable} of this key's ${homes} replica${homes === 1 ? '' : 's'} can be reached${standIns > 0 ? ` (and ${standIns} stand-in${standIns === 1 ? '' : 's'})` : ''}`;
    const scope = requirement.short;
    if (scope <= 0) return `${reach}, and ${what} needs ${requirement.required}`;
    const region = this.set.host.regionName(scope - 1);
    const place = region === '' ? 'among the replicas without a region' : `in region "${region}"`;
    return `${reach}, and ${what} needs ${requirement.need[scope]} ${place}, where ${requirement.pending[scope]} can answer`;
  }

  /**
   * Covers `home` with a healthy node past the replicas (for a write, only with room reserved
   * for its hint). Returns whether one was found.
   */
  private standIn(home: number): boolean {
    const write = this.op === OP_WRITE;
    const reservation = write ? this.set.hints.reserve(home, this.key, this.request) : null;
    if (write && reservation === null) return false;
    const node = this.fallback(this.set.host.regionOf[home]!);
    if (node < 0) {
      if (reservation !== null) this.set.hints.release(reservation);
      return false;
    }
    const region = this.set.host.regionOf[node]!;
    this.addTarget(node, false, write ? home : -1, reservation, write && region === this.set.host.regionOf[home] ? region : -1);
    return true;
  }

  /**
   * The next healthy node past the replicas not yet a target; for the region-aware levels, the
   * next one in `region` if there is one (a stand-in elsewhere may not count where it is needed).
   */
  private fallback(region: number): number {
    const host = this.set.host;
    const prefer = this.set.settings.consistency !== 'quorum';
    let first = -1;
    for (let i = this.homes; i < this.listCount; i++) {
      const node = this.list[i]!;
      if (this.used[node] !== 0 || !host.isRoutable(node)) continue;
      if (!prefer || host.regionOf[node] === region) {
        first = node;
        break;
      }
      if (first < 0) first = node;
    }
    if (first >= 0) this.used[first] = 1;
    return first;
  }

  private addTarget(node: number, home: boolean, standInFor: number, reservation: Reservation | null = null, countsIn = this.set.host.regionOf[node]!): number {
    this.targets.push(node);
    this.isHome.push(home);
    this.standInFor.push(standInFor);
    this.countsIn.push(countsIn);
    this.reservations.push(reservation);
    this.states.push(RUNNING);
    this.handles.push(null);
    this.versions.push('');
    this.statuses.push(0);
    this.running++;
    this.requirement.add(countsIn);
    return this.targets.length - 1;
  }

  private launch(ordinal: number): void {
    if (this.handles[ordinal] !== null || this.states[ordinal] !== RUNNING) return;
    const host = this.set.host;
    const covered = this.standInFor[ordinal]!;
    let request = this.request;
    if (covered >= 0) request = new UpstreamRequest(request.method, request.path, [...request.headers, HINT_HEADER, host.ids[covered]!], request.body);
    if (!this.isHome[ordinal]) host.replicaCounted('standIn');
    this.launchedAt = performance.now();
    const handle = host.send(this, this.targets[ordinal]!, ordinal, request);
    // A failure inside `send` has already ended the attempt: keep no handle to abort.
    if (this.states[ordinal] === RUNNING) this.handles[ordinal] = handle;
  }

  answered(ordinal: number, status: number, headers: unknown, body: Buffer): void {
    if (this.states[ordinal] !== RUNNING) return;
    this.running--;
    const write = this.op === OP_WRITE;
    const fields = headers as HeaderFields;
    const region = this.countsIn[ordinal]!;
    this.statuses[ordinal] = status;
    // A read's version, when it has a value to compare (200), or a deletion's (404).
    const version = !write && (status === 200 || status === 404) ? (fields.find(VERSION_HEADER) ?? '') : '';
    let state: number;
    if (status >= 500) state = FAILED;
    else if (write) state = status >= 200 && status < 300 ? COUNTED : REFUSED;
    else if (status !== 200 && status !== 404) state = REFUSED;
    // A node past the replicas holds only what it stood in for: without a version it knows
    // nothing about the key, and its 404 must not pass for a replica's.
    else state = this.isHome[ordinal] || version !== '' ? COUNTED : FAILED;
    this.states[ordinal] = state;
    this.requirement.settle(region, state === COUNTED);
    const reservation = this.reservations[ordinal]!;
    if (reservation !== null) {
      if (state === COUNTED) this.set.hints.keep(reservation, this.hintRequest());
      else this.set.hints.release(reservation);
    }
    if (state === FAILED) {
      if (!write) this.retryRead();
      else this.coverFailed(ordinal);
    } else if (state === COUNTED && write) {
      // An acknowledgement: if it completes the quorum, it is the answer, relayed from here (its
      // fields and body are valid during this call): nothing to copy.
      this.deciding = ordinal;
      this.decidingFields = fields;
      this.decidingBody = body;
    } else if (state === COUNTED) {
      this.versions[ordinal] = version;
      const kept = this.kept;
      // A read's newest answer.
      if (kept < 0 || this.states[kept] !== COUNTED || compareVersions(version, this.versions[kept]!) > 0) this.keep(ordinal, fields, body);
    } else if (this.kept < 0) {
      this.keep(ordinal, fields, body); // the first refusal: the answer if nothing counts
    }
    this.check();
    if (this.deciding >= 0) {
      // Written by now (or not the answer): the transport's buffers are not kept.
      if (this.headers === this.decidingFields) {
        this.headers = null;
        this.body = null;
      }
      this.deciding = -1;
      this.decidingFields = null;
      this.decidingBody = null;
    }
  }

  failed(ordinal: number, error: unknown): void {
    if (this.states[ordinal] !== RUNNING) return;
    this.running--;
    const unsent = isUnsent(error);
    this.states[ordinal] = unsent ? NOT_SENT : FAILED;
    const region = this.countsIn[ordinal]!;
    this.requirement.settle(region, false);
    const reservation = this.reservations[ordinal]!;
    if (reservation !== null) this.set.hints.release(reservation);
    if (this.op === OP_READ) this.retryRead();
    else this.coverFailed(ordinal);
    this.check();
  }

  /**
   * A write's target failed (before or after sending, or with a 5xx): with sloppy quorums, a
   * stand-in takes the write for the replica it was for, with a hint (see the top); also once
   * the answer is out (the replica still gets the write, by its hint), but not once a target has
   * refused the write (it would reach that replica by a hint the others had refused).
   */
  private coverFailed(ordinal: number): void {
    // A target that refused it (a 4xx: the write is wrong) is not outvoted by stand-ins.
    if (!this.set.settings.sloppy || this.countState(REFUSED) > 0) return;
    const covered = this.standInFor[ordinal]!;
    if (this.standIn(covered >= 0 ? covered : this.targets[ordinal]!)) this.launch(this.targets.length - 1);
  }

  /** The front door is shutting down with this call unanswered. */
  shutDown(): void {
    if (this.done) return;
    let mayHaveLanded = false;
    for (let i = 0; i < this.states.length; i++) {
      const handle = this.handles[i]!;
      if (this.states[i] === NOT_SENT || (this.states[i] === RUNNING && handle === null)) continue;
      if (handle === null || handle.mayHaveBeenSent === undefined || handle.mayHaveBeenSent()) mayHaveLanded = true;
    }
    if (this.op === OP_WRITE && mayHaveLanded) {
      this.decideFailure(ErrorCodes.OUTCOME_UNKNOWN, 502, 'the front door shut down before enough replicas acknowledged; the write may be applied on some');
    } else {
      this.decideFailure(ErrorCodes.SHUTTING_DOWN, 503, 'the front door shut down before enough replicas answered');
    }
  }

  /**
   * A read lost a target: while the quorum needs more, ask further nodes (with sloppy quorums; a
   * strict route reads its replicas only). They count toward a majority of all, never a region's
   * (see `countsIn`): so a region-aware level short in a region asks no one else.
   */
  private retryRead(): void {
    if (!this.set.settings.sloppy) return;
    const host = this.set.host;
    for (let i = this.homes; i < this.listCount && !this.done && !this.requirement.possible; i++) {
      const node = this.list[i]!;
      if (this.used[node] !== 0 || !host.isRoutable(node) || !this.requirement.helps(-1)) continue;
      this.used[node] = 1;
      const ordinal = this.addTarget(node, false, -1, null, -1);
      if (!this.beginning) this.launch(ordinal);
    }
  }

  private hintRequest(): UpstreamRequest {
    if (this.hinted === null) {
      const { method, path, headers, body } = this.request;
      let own: Buffer | null = null;
      if (body !== null) {
        own = Buffer.allocUnsafeSlow(body.length);
        body.copy(own);
      }
      this.hinted = new UpstreamRequest(method, path, headers, own);
    }
    return this.hinted;
  }

  private keep(ordinal: number, fields: HeaderFields, body: Buffer): void {
    this.kept = ordinal;
    this.keptHeaders = fields.clone();
    this.keptBody = Buffer.from(body);
  }

  private check(): void {
    if (this.beginning) return;
    // Targets added inside `begin` (a read's further nodes) go out before anything is decided.
    for (let i = 0; i < this.targets.length && !this.done; i++) if (this.handles[i] === null && this.states[i] === RUNNING) this.launch(i);
    if (!this.done) {
      if (this.requirement.met && (!this.waitsForAll || this.running === 0)) this.decideAnswer();
      else if (!this.requirement.possible && !this.mayAllRefuse()) this.decideShortfall();
    }
    if (this.running === 0 && this.op === OP_READ && !this.repaired) {
      this.repaired = true;
      this.repair();
    }
  }

  private countState(state: number): number {
    let n = 0;
    for (let i = 0; i < this.states.length; i++) if (this.states[i] === state) n++;
    return n;
  }

  /**
   * Nothing counted and some targets refused: if the rest refuse too, their refusal is the answer,
   * so wait for them. (A failed write may have landed: not then.)
   */
  private mayAllRefuse(): boolean {
    return this.running > 0 && this.refusalStands();
  }

  private refusalStands(): boolean {
    return this.countState(REFUSED) > 0 && this.countState(COUNTED) === 0 && (this.op === OP_READ || this.countState(FAILED) === 0);
  }

  private decideAnswer(): void {
    this.done = true;
    this.acks = this.countState(COUNTED);
    const from = this.deciding >= 0 ? this.deciding : this.kept;
    this.servedBy = this.targets[from]!;
    this.status = this.statuses[from]!;
    this.headers = this.deciding >= 0 ? this.decidingFields : this.keptHeaders;
    this.body = this.deciding >= 0 ? this.decidingBody : this.keptBody;
    this.owner.replicated(this);
  }

  private decideShortfall(): void {
    if (this.refusalStands()) {
      // Every target that answered refused the request (a 4xx): their answer is the answer.
      this.decideAnswer();
      return;
    }
    const write = this.op === OP_WRITE;
    const counted = this.countState(COUNTED);
    const required = this.requirement.required;
    if (this.countState(NOT_SENT) === this.states.length) {
      this.decideFailure(ErrorCodes.NOT_SENT, 503, `no replica of this key could be reached: nothing was ${write ? 'written' : 'read'}`);
    } else if (write) {
      this.decideFailure(ErrorCodes.QUORUM_FAILED, 502, `${counted} of the ${required} acknowledgements the write needs came back; it may be applied on the replicas that acknowledged`);
    } else {
      this.decideFailure(ErrorCodes.QUORUM_FAILED, 502, `${counted} of the ${required} answers the read needs came back`);
    }
  }

  private decideFailure(code: string, status: number, message: string): void {
    this.done = true;
    this.acks = this.countState(COUNTED);
    const ids = this.set.host.ids;
    const replicas = this.targets.map((node, i) => {
      const covered = this.standInFor[i]!;
      return { node: ids[node]!, outcome: this.outcomeOf(i), ...(covered >= 0 ? { standInFor: ids[covered]! } : {}) };
    });
    this.failure = { code, status, message, replicas };
    this.set.host.replicaCounted('failure');
    this.owner.replicated(this);
  }

  private outcomeOf(i: number): string {
    switch (this.states[i]) {
      case RUNNING:
        return this.handles[i] === null ? 'not sent' : 'no answer yet';
      case COUNTED:
        return this.op === OP_WRITE ? `acknowledged ${this.statuses[i]}` : `answered ${this.statuses[i]}`;
      case REFUSED:
        return `refused ${this.statuses[i]}`;
      case NOT_SENT:
        return 'not sent (unreachable)';
      default:
        // A node past the replicas whose read answer had no version: it holds nothing of the key.
        if (!this.isHome[i] && this.op === OP_READ && (this.statuses[i] === 200 || this.statuses[i] === 404)) return `no copy (${this.statuses[i]} without a version)`;
        return this.statuses[i]! > 0 ? `failed ${this.statuses[i]}` : 'failed (no answer: a timeout or a connection error)';
    }
  }

  /**
   * Every target has answered: send the newest value to the replicas that answered an older one.
   * Only a full answer (200, or 404 for a deletion) with a version is a value to repair with, and
   * only the key's replicas are repaired (a node past them would keep a copy later writes miss).
   */
  private repair(): void {
    const newest = this.kept;
    if (newest < 0 || this.states[newest] !== COUNTED || this.request.method === 'HEAD') return;
    const version = this.versions[newest]!;
    const status = this.statuses[newest]!;
    if (version === '') return;
    const fields = this.keptHeaders!;
    if (status === 200 && (fields.find('content-encoding') !== null || fields.find('content-range') !== null)) return;
    let repair: UpstreamRequest | null = null;
    for (let i = 0; i < this.targets.length; i++) {
      if (!this.isHome[i] || this.states[i] !== COUNTED) continue;
      if (compareVersions(this.versions[i]!, version) >= 0) continue;
      repair ??= this.repairRequest(status, version);
      this.set.host.replicaCounted('repair');
      REPAIR_SINK.launchedAt = performance.now();
      this.set.host.send(REPAIR_SINK, this.targets[i]!, 0, repair);
    }
  }

  private repairRequest(status: number, version: string): UpstreamRequest {
    const headers: string[] = [VERSION_HEADER, version];
    const type = this.keptHeaders!.find('content-type');
    if (status === 200 && type !== null) headers.push('content-type', type);
    // A node that checks who writes checks repairs too: the reader's credentials go with them.
    // On a route keyed by a header, the key is that header's value: the repair must name it, or
    // a node keying its values by it cannot tell which key the value is for.
    const client = this.request.headers;
    const keyHeader = this.set.keyHeader;
    let auth = false;
    let keyed = keyHeader === null;
    for (let i = 0; i < client.length && !(auth && keyed); i += 2) {
      const name = client[i]!;
      if (!auth && name === 'authorization') {
        headers.push('authorization', client[i + 1]!);
        auth = true;
      } else if (!keyed && name === keyHeader) {
        headers.push(keyHeader, client[i + 1]!);
        keyed = true;
      }
    }
    return status === 200 ? new UpstreamRequest('PUT', this.path, headers, this.keptBody) : new UpstreamRequest('DELETE', this.path, headers, null);
  }
}

/**
 * Read repairs are sent and forgotten: their outcome shows in the node's attempt counters. An
 * attempt reads `launchedAt` as it is made, so one sink serves them all.
 */
const REPAIR_SINK: AttemptSink & { launchedAt: number } = {
  launchedAt: 0,
  op: OP_WRITE,
  answered(): void {},
  failed(): void {},
};
