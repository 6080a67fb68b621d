/**
 * One request on a replicated route (seed 003): fanned out to the key's replicas, answered once
 * enough of them have answered (quorum.ts), with stand-ins for replicas that are down (sloppy
 * quorum, hints.ts) and read repair.
 *
 * Targets: the first `n` nodes of the key's preference list are its replicas. Each one the
 * membership table shows healthy is a target; each one it shows down is covered by the next
 * healthy node past the first `n` (a stand-in), when sloppy quorums are on. A write is sent to
 * every target once: the replicas get it with its version, a stand-in also with the id of the
 * replica it covers (`x-lakefront-hint-for`), and the front door keeps a hint to hand the write
 * to that replica when it is back. A write to a target that provably never left (connection
 * refused) goes to the next stand-in instead; one that may have reached its node is never sent
 * to another. A read goes to the same targets and, on any failure, to the next healthy node.
 *
 * Before anything is sent, a request whose targets could not meet its quorum even if all
 * answered is refused: 503, nothing written. After:
 * - a write is answered with the first acknowledgement (2xx) once enough have come; if that can
 *   no longer happen, 502 naming each replica's outcome (the write may be applied on the ones
 *   that acknowledged: no rollback), or the replicas' own refusal when every answer was a 4xx,
 *   or 503 when provably nothing was sent;
 * - a read is answered with the newest of the answers (highest `x-lakefront-version`) once
 *   enough have come. When every target has answered, a replica whose value was older is sent
 *   the newest (read repair): a PUT of its body, or a DELETE for a deletion, with its version.
 *
 * Attempts are not cancelled when the answer is out: the write still lands on every target, and
 * the read's stragglers feed read repair. Each ends by the request timeout at the latest.
 */
import { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import { ErrorCodes } from '../errors.js';
import { isGatewayFailure, isUnsent, type AttemptHandle } from '../forward/exchange.js';
import type { HeaderFields } from '../forward/fields.js';
import { UpstreamRequest, type AttemptSink } from '../forward/upstream.js';
import { HintStore, type HandoffHost } from './hints.js';
import { HINT_HEADER, Requirement, VERSION_HEADER, compareVersions, type QuorumSettings, type VersionClock } from './quorum.js';

const OP_READ = 0;
const OP_WRITE = 1;

/** What a replicated route needs of its cluster (the worker's ClusterRuntime). */
export interface ReplicaHost extends HandoffHost {
  readonly ids: readonly string[];
  readonly size: number;
  /** The key's preference list over the members, healthy or not; returns how many. */
  membersFor(key: string, out: Int32Array): number;
  /** Region index per node (nodes without a region share one). */
  readonly regionOf: Int32Array;
  /** Region index of the front door's region, or -1 when no node is in it. */
  readonly localRegion: number;
  readonly regionCount: number;
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

// Target states.
const RUNNING = 0;
/** Counted: a write's 2xx, a read's answer (anything but 502/503/504). */
const COUNTED = 1;
/** A write answered with anything but 2xx (or a gateway failure). */
const REFUSED = 2;
const FAILED = 3;
const NOT_SENT = 4;

/** One replicated route in one worker: its settings, its hints, its cluster. */
export class ReplicaSet {
  readonly hints: HintStore;

  constructor(
    readonly host: ReplicaHost,
    readonly settings: QuorumSettings,
  ) {
    this.hints = new HintStore(host, host.size, settings.hintWindowMs, settings.maxHintBytes);
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
  /** Targets counted when the answer was decided, and how many were needed. */
  acks = 0;
  failure: ReplicatedFailure | null = null;

  private readonly list: Int32Array;
  private listCount = 0;
  private nextFallback = 0;
  private readonly requirement: Requirement;
  private readonly targets: number[] = [];
  /** Per target: the replica it stands in for, or -1. */
  private readonly standInFor: number[] = [];
  private readonly states: number[] = [];
  private readonly handles: (AttemptHandle | null)[] = [];
  /** Reads: per target, the version it answered ('' for none) and its status. */
  private readonly versions: string[] = [];
  private readonly statuses: number[] = [];
  private running = 0;
  /** The request as a replica gets it (a write with its version). */
  private readonly request: UpstreamRequest;
  private readonly version: string;
  /** A read's newest answer so far (its target), or a write's first refusal. */
  private kept = -1;
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
    this.list = new Int32Array(host.size);
    this.requirement = new Requirement(host.regionCount);
    // Versions and hints are the front door's to say: a client's are dropped.
    const headers: string[] = [];
    for (let i = 0; i < clientHeaders.length; i += 2) {
      const name = clientHeaders[i]!;
      if (name !== VERSION_HEADER && name !== HINT_HEADER) headers.push(name, clientHeaders[i + 1]!);
    }
    this.version = op === OP_WRITE ? host.clock.next() : '';
    if (op === OP_WRITE) headers.push(VERSION_HEADER, this.version);
    this.request = new UpstreamRequest(method, path, headers, body);
  }

  /** Acknowledgements (a write) or answers (a read) the request needs. */
  get required(): number {
    return this.requirement.required;
  }

  /** Sends the request to the replicas of `key` (or refuses it: see the module comment). */
  begin(key: string): void {
    const { host, settings } = this.set;
    const count = (this.listCount = host.membersFor(key, this.list));
    const homes = Math.min(settings.n, count);
    this.nextFallback = homes;
    const write = this.op === OP_WRITE;
    this.requirement.set(settings.consistency, write ? settings.w : settings.r, this.list, homes, host.regionOf, host.localRegion);
    for (let i = 0; i < homes; i++) {
      const node = this.list[i]!;
      if (host.isRoutable(node)) this.addTarget(node, -1);
      else if (settings.sloppy) this.standIn(node);
    }
    if (!this.requirement.possible) {
      this.decideFailure(
        ErrorCodes.QUORUM_UNAVAILABLE,
        503,
        `${this.targets.length} of this key's ${homes} replicas can be reached (stand-ins included) and ${this.op === OP_WRITE ? 'a write' : 'a read'} needs ${this.requirement.required}: nothing was sent`,
      );
      return;
    }
    for (let i = 0; i < this.targets.length; i++) this.launch(i);
  }

  /**
   * Covers `home` with the next healthy node past the replicas: for a write, only if a hint for
   * it can be kept. Returns whether a stand-in was found.
   */
  private standIn(home: number): boolean {
    const write = this.op === OP_WRITE;
    if (write && !this.set.hints.hasRoom(this.request)) return false;
    const host = this.set.host;
    while (this.nextFallback < this.listCount) {
      const node = this.list[this.nextFallback++]!;
      if (!host.isRoutable(node)) continue;
      this.addTarget(node, write ? home : -1);
      return true;
    }
    return false;
  }

  private addTarget(node: number, standInFor: number): number {
    this.targets.push(node);
    this.standInFor.push(standInFor);
    this.states.push(RUNNING);
    this.handles.push(null);
    this.versions.push('');
    this.statuses.push(0);
    this.requirement.add(this.set.host.regionOf[node]!);
    return this.targets.length - 1;
  }

  private launch(ordinal: number): void {
    const covered = this.standInFor[ordinal]!;
    let request = this.request;
    if (covered >= 0) {
      request = new UpstreamRequest(request.method, request.path, [...request.headers, HINT_HEADER, this.set.host.ids[covered]!], request.body);
      this.set.host.replicaCounted('standIn');
    }
    this.running++;
    this.launchedAt = performance.now();
    this.handles[ordinal] = this.set.host.send(this, this.targets[ordinal]!, ordinal, request);
  }

  answered(ordinal: number, status: number, headers: unknown, body: Buffer): void {
    if (this.states[ordinal] !== RUNNING) return;
    this.running--;
    const fields = headers as HeaderFields;
    const region = this.set.host.regionOf[this.targets[ordinal]!]!;
    this.statuses[ordinal] = status;
    if (isGatewayFailure(status)) {
      this.states[ordinal] = FAILED;
      this.requirement.settle(region, false);
      if (this.op === OP_READ) this.retryRead();
    } else if (this.op === OP_WRITE) {
      const ok = status >= 200 && status < 300;
      this.states[ordinal] = ok ? COUNTED : REFUSED;
      this.requirement.settle(region, ok);
      const covered = this.standInFor[ordinal]!;
      if (ok && covered >= 0) this.set.hints.keep(covered, this.request);
      // The first acknowledgement is the answer; failing that, the first refusal.
      if (this.kept < 0 || (ok && this.states[this.kept] !== COUNTED)) this.keep(ordinal, fields, body);
    } else {
      this.states[ordinal] = COUNTED;
      this.requirement.settle(region, true);
      const version = status === 200 || status === 404 ? (fields.find(VERSION_HEADER) ?? '') : '';
      this.versions[ordinal] = version;
      if (this.kept < 0 || compareVersions(version, this.versions[this.kept]!) > 0) this.keep(ordinal, fields, body);
    }
    this.check();
  }

  failed(ordinal: number, error: unknown): void {
    if (this.states[ordinal] !== RUNNING) return;
    this.running--;
    const unsent = isUnsent(error);
    this.states[ordinal] = unsent ? NOT_SENT : FAILED;
    this.requirement.settle(this.set.host.regionOf[this.targets[ordinal]!]!, false);
    if (this.op === OP_READ) this.retryRead();
    else if (unsent && this.set.settings.sloppy) {
      // Nothing reached the node: the write may go to a stand-in for the replica it was for.
      const covered = this.standInFor[ordinal]! >= 0 ? this.standInFor[ordinal]! : this.targets[ordinal]!;
      if (this.standIn(covered)) this.launch(this.targets.length - 1);
    }
    this.check();
  }

  /** The front door is shutting down with this call unanswered. */
  shutDown(): void {
    if (this.done) return;
    let mayHaveLanded = false;
    for (let i = 0; i < this.states.length; i++) {
      if (this.states[i] !== NOT_SENT && (this.handles[i]?.mayHaveBeenSent?.() ?? true)) mayHaveLanded = true;
    }
    if (this.op === OP_WRITE && mayHaveLanded) {
      this.decideFailure(ErrorCodes.OUTCOME_UNKNOWN, 502, 'the front door shut down before enough replicas acknowledged; the write may be applied on some');
    } else {
      this.decideFailure(ErrorCodes.SHUTTING_DOWN, 503, 'the front door shut down before enough replicas answered');
    }
  }

  /** A read lost a target: ask the next healthy node, if the quorum still needs one. */
  private retryRead(): void {
    if (this.done || this.requirement.possible) return;
    const host = this.set.host;
    while (this.nextFallback < this.listCount) {
      const node = this.list[this.nextFallback++]!;
      if (!host.isRoutable(node)) continue;
      this.launch(this.addTarget(node, -1));
      if (this.requirement.possible) return;
    }
  }

  private keep(ordinal: number, fields: HeaderFields, body: Buffer): void {
    this.kept = ordinal;
    this.keptHeaders = fields.clone();
    this.keptBody = Buffer.from(body);
  }

  private check(): void {
    if (!this.done) {
      if (this.requirement.met) this.decideAnswer();
      else if (!this.requirement.possible && !this.mayAllRefuse()) this.decideShortfall();
    }
    if (this.running === 0 && this.op === OP_READ) this.repair();
  }

  private counted(): number {
    let n = 0;
    for (let i = 0; i < this.states.length; i++) if (this.states[i] === COUNTED) n++;
    return n;
  }

  private decideAnswer(): void {
    this.done = true;
    this.acks = this.counted();
    this.servedBy = this.targets[this.kept]!;
    this.status = this.statuses[this.kept]!;
    this.headers = this.keptHeaders;
    this.body = this.keptBody;
    this.owner.replicated(this);
  }

  /**
   * A write that some replicas refused (4xx) and none acknowledged or failed: if the rest refuse
   * it too, their refusal is the answer, so wait for them.
   */
  private mayAllRefuse(): boolean {
    return this.op === OP_WRITE && this.running > 0 && this.countState(REFUSED) > 0 && this.countState(COUNTED) === 0 && this.countState(FAILED) === 0;
  }

  private decideShortfall(): void {
    const write = this.op === OP_WRITE;
    const counted = this.countState(COUNTED);
    const refused = this.countState(REFUSED);
    const sent = this.countState(NOT_SENT) < this.states.length;
    if (write && counted === 0 && refused > 0 && this.countState(FAILED) === 0) {
      // Every replica that got the write refused it (a 4xx): their answer is the answer.
      this.decideAnswer();
      return;
    }
    const required = this.requirement.required;
    if (!sent) {
      this.decideFailure(ErrorCodes.NOT_SENT, 503, `no replica of this key could be reached: nothing was ${write ? 'written' : 'read'}`);
    } else if (write) {
      this.decideFailure(ErrorCodes.QUORUM_FAILED, 502, `${counted} of the ${required} acknowledgements the write needs came back; it may be applied on the replicas that acknowledged`);
    } else {
      this.decideFailure(ErrorCodes.QUORUM_FAILED, 502, `${counted} of the ${required} answers the read needs came back`);
    }
  }

  private countState(state: number): number {
    let n = 0;
    for (let i = 0; i < this.states.length; i++) if (this.states[i] === state) n++;
    return n;
  }

  private decideFailure(code: string, status: number, message: string): void {
    this.done = true;
    this.acks = this.counted();
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
        return 'no answer yet';
      case COUNTED:
        return this.op === OP_WRITE ? `acknowledged ${this.statuses[i]}` : `answered ${this.statuses[i]}`;
      case REFUSED:
        return `refused ${this.statuses[i]}`;
      case NOT_SENT:
        return 'not sent (unreachable)';
      default:
        return this.statuses[i]! > 0 ? `failed ${this.statuses[i]}` : 'failed';
    }
  }

  /**
   * Every target has answered: send the newest value to the replicas that answered an older one.
   * Only a full answer (200, or 404 for a deletion) with a version is a value to repair with.
   */
  private repair(): void {
    const newest = this.kept;
    if (newest < 0 || this.request.method === 'HEAD') return;
    const version = this.versions[newest]!;
    const status = this.statuses[newest]!;
    if (version === '' || (status !== 200 && status !== 404)) return;
    const fields = this.keptHeaders!;
    if (status === 200 && (fields.find('content-encoding') !== null || fields.find('content-range') !== null)) return;
    let repair: UpstreamRequest | null = null;
    for (let i = 0; i < this.targets.length; i++) {
      if (this.states[i] !== COUNTED || (this.statuses[i] !== 200 && this.statuses[i] !== 404)) continue;
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
    const auth = this.request.headers.indexOf('authorization');
    if (auth >= 0 && auth % 2 === 0) headers.push('authorization', this.request.headers[auth + 1]!);
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
