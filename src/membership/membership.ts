/**
 * Membership and health: which configured nodes are routable, and with what weight.
 *
 * Runs on the control plane (the main thread). It polls `GET <url>/health` on every member each
 * `intervalMs` with a `timeoutMs` deadline; a member that fails to answer 2xx is unhealthy and
 * carries weight 0 (out of every ranking, nobody else renumbered) until a later probe succeeds.
 * Capacity is kept apart from health: a slow node is de-preferred by a lower weight, not removed.
 */
import { EventEmitter } from 'node:events';
import { performance } from 'node:perf_hooks';
import { ConfigError, quoted } from '../errors.js';
import { quantiseWeight, type NodeInfo } from '../hashing/rendezvous.js';
import { PollLoop } from './poll.js';
import { probeStatus } from './probe.js';

/** A region's name (a node's, the front door's): 1-64 letters, digits, '.', '_' or '-'. */
export const REGION_NAME = /^[A-Za-z0-9._-]{1,64}$/;

export interface MemberConfig {
  readonly id: string;
  readonly url: string;
  /** The node's region, for region-aware quorums on replicated routes. */
  readonly region?: string;
  /**
   * Its capacity, 0-2, quantised to the nearest of 0.25, 0.5, 1, 1.5 and 2, 0 only for 0
   * (default 1): a node of weight 2 wins about twice the boards of one of weight 1; 0 takes none
   * (a drain), healthy or not. `setCapacity` changes it at run time.
   */
  readonly weight?: number;
}

export interface MembershipOptions {
  readonly members: readonly MemberConfig[];
  /** Poll interval, milliseconds. Default 1000. */
  readonly intervalMs?: number;
  /** Per-probe deadline, milliseconds. Default 500. */
  readonly timeoutMs?: number;
  /** Path probed on every member. Default `/health`. */
  readonly healthPath?: string;
  readonly fetch?: typeof globalThis.fetch;
}

export const DEFAULT_HEALTH_INTERVAL_MS = 1000;
export const DEFAULT_HEALTH_TIMEOUT_MS = 500;

/** `id=url,...`, as `--nodes` and a configuration file's string list take it (each part trimmed). */
export function parseMemberList(text: string, what: string): MemberConfig[] {
  const members: MemberConfig[] = [];
  const parts = text.split(',');
  for (const [i, part] of parts.entries()) {
    const entry = part.trim();
    if (entry === '') continue;
    const eq = entry.indexOf('=');
    // Named by its place, not shown: an entry without its id is a URL, maybe with a password
    // (and a comma inside one splits it into entries).
    if (eq <= 0 || eq === entry.length - 1) throw new ConfigError(`${what}: bad entry ${i + 1} of ${parts.length} (want id=url; not shown, as it may hold a password)`);
    const id = entry.slice(0, eq).trim();
    // A URL with no id before it, split at its query's '=' (`http://h:1/?token=...`).
    if (id.includes('://')) throw new ConfigError(`${what}: bad entry ${i + 1} of ${parts.length} (it starts with a URL: want id=url; not shown, as it may hold a password)`);
    members.push({ id, url: entry.slice(eq + 1).trim() });
  }
  if (members.length === 0) throw new ConfigError(`${what}: no nodes in ${JSON.stringify(text)}`);
  return validateMembers(members, what);
}

/**
 * A node URL that parsed, as an error line shows it: scheme, host, port and path, never a query
 * or fragment (`?token=...`). Credentials never get this far (refused before, unshown).
 */
function shownUrl(url: URL): string {
  return quoted(`${url.protocol}//${url.host}${url.pathname === '/' ? '' : url.pathname}${url.search ? '?***' : ''}${url.hash ? '#***' : ''}`);
}

/**
 * Checks a member list: non-empty ids, unique ids, absolute http(s) URLs without credentials,
 * path, query or fragment. Returns the members with URLs normalised to their origin. Throws
 * ConfigError naming the first bad value.
 */
export function validateMembers(members: readonly MemberConfig[], what = 'nodes'): MemberConfig[] {
  if (!Array.isArray(members) || members.length === 0) throw new ConfigError(`${what}: at least one node is required`);
  const seen = new Set<string>();
  return members.map((member) => {
    const id = member?.id;
    // No control or format characters either: the id goes out in every answer's
    // x-lakefront-served-by header (where a control character makes the answer invalid) and into
    // the logs (where a bidirectional override rewrites what the line shows).
    if (typeof id !== 'string' || id.length === 0 || /[\s,=\p{Cc}\p{Cf}]/u.test(id)) {
      throw new ConfigError(`${what}: bad node id ${quoted(id)} (non-empty, no spaces, commas, '=', control or format characters)`);
    }
    if (seen.has(id)) throw new ConfigError(`${what}: duplicate node id "${id}"`);
    seen.add(id);
    if (typeof member.url !== 'string' || member.url.trim() === '') throw new ConfigError(`${what}: node "${id}" has no url (http(s)://host:port)`);
    let url: URL;
    try {
      url = new URL(member.url);
    } catch {
      // Not shown: what does not parse cannot be told apart from a password in it.
      throw new ConfigError(`${what}: bad URL for node "${id}" (not a URL of the form http(s)://host:port, the port 1-65535; not shown, as it may hold a password)`);
    }
    // Never echoed: it would print the password into the log.
    if (url.username || url.password) throw new ConfigError(`${what}: the URL for node "${id}" carries credentials, which are not supported`);
    // No path either: the front door sends the client's path as it is, so a base path would be
    // honoured by health probes and Router.forward but not by the front door.
    if ((url.protocol !== 'http:' && url.protocol !== 'https:') || url.search || url.hash || url.pathname !== '/') {
      throw new ConfigError(`${what}: bad URL ${shownUrl(url)} for node "${id}" (http(s)://host:port only, no path)`);
    }
    // The URL parser takes port 0; nothing can be reached there.
    if (url.port === '0') throw new ConfigError(`${what}: bad URL ${shownUrl(url)} for node "${id}" (port 0 cannot be reached)`);
    const region = member.region;
    if (region !== undefined && (typeof region !== 'string' || !REGION_NAME.test(region))) {
      throw new ConfigError(`${what}: bad region ${JSON.stringify(region)} for node "${id}" (1-64 letters, digits, '.', '_' or '-')`);
    }
    const weight = member.weight;
    if (weight !== undefined && !(typeof weight === 'number' && weight >= 0 && weight <= 2)) {
      throw new ConfigError(`${what}: bad weight ${JSON.stringify(weight)} for node "${id}" (a number 0-2, quantised to the nearest of 0.25, 0.5, 1, 1.5 and 2; 0 takes no boards)`);
    }
    return { id, url: url.origin, ...(region !== undefined ? { region } : {}), ...(weight !== undefined ? { weight } : {}) };
  });
}

interface MemberState {
  readonly config: MemberConfig;
  healthy: boolean;
  capacity: number;
  /** performance.now() before which no probe may bring it back (`markUnhealthy`'s hold). */
  heldUntil: number;
  /** Out by an ejection (`eject`), and not yet back: its hold, then a passing probe. */
  ejected: boolean;
  /** performance.now() when it last came back from an ejection (0: never). */
  backAt: number;
  /** performance.now() when it last came back into the rankings, for whatever reason it was out (0: never). */
  returnedAt: number;
  /** Ejections in a row: each one's hold is the base times this many (see `eject`). */
  streak: number;
  /** Ejections since start, for /stats. */
  ejections: number;
}

/** How `eject` decides (the CLI's `--eject-ms` and `--eject-max-percent`). */
export interface EjectionPolicy {
  /** The first ejection's hold; the n-th in a row holds n times as long. */
  readonly baseMs: number;
  /** No hold longer than this. */
  readonly maxMs: number;
  /** At most this share of the members out by ejection at once (at least one may always be). */
  readonly maxPercent: number;
}

/** `eject`'s reasons for leaving a member as it is because it is out already (nothing to say). */
export const ALREADY_EJECTED = 'already ejected';
export const ALREADY_OUT = 'already out of the ranking';

/** Why `eject` left a member in, or how long it holds it out. */
export type EjectVerdict =
  | { readonly ejected: true; readonly holdMs: number; readonly streak: number }
  | { readonly ejected: false; readonly reason: string };

export class Membership extends EventEmitter {
  readonly intervalMs: number;
  readonly timeoutMs: number;
  private readonly members: MemberConfig[];
  private readonly states: Map<string, MemberState>;
  /** The caller's own fetch, if given (else probe.ts's node:http request). */
  private readonly fetchImpl: typeof globalThis.fetch | null;
  private readonly healthPath: string;
  private readonly loop: PollLoop;
  private probing: Promise<void> | null = null;

  constructor(options: MembershipOptions) {
    super();
    this.members = validateMembers(options.members);
    this.intervalMs = positive(options.intervalMs, DEFAULT_HEALTH_INTERVAL_MS, 'intervalMs');
    // Whole milliseconds: AbortSignal.timeout throws on a fraction, and every probe would fail.
    this.timeoutMs = Math.ceil(positive(options.timeoutMs, DEFAULT_HEALTH_TIMEOUT_MS, 'timeoutMs'));
    this.healthPath = options.healthPath ?? '/health';
    this.fetchImpl = options.fetch ?? null;
    // Members start healthy: a front door that has not probed yet should try, and failover
    // covers a node that turns out to be down.
    this.states = new Map(this.members.map((config) => [config.id, { config, healthy: true, capacity: config.weight ?? 1, heldUntil: 0, ejected: false, backAt: 0, returnedAt: 0, streak: 0, ejections: 0 }]));
    this.loop = new PollLoop(this.intervalMs, () =>
      this.probeOnce().catch((err: unknown) => {
        this.emit('error', err);
      }),
    );
  }

  /** Every configured member with its current weight (0 when unhealthy). */
  nodes(): NodeInfo[] {
    return this.members.map((config) => {
      const state = this.states.get(config.id)!;
      return { id: config.id, url: config.url, weight: state.healthy ? quantiseWeight(state.capacity) : 0 };
    });
  }

  /**
   * A member's weight from its capacity alone, healthy or not: its share of a ring that places
   * replicas by membership (a replica that is down still owns its keys).
   */
  capacityWeight(id: string): number {
    const state = this.states.get(id);
    return state === undefined ? 0 : quantiseWeight(state.capacity);
  }

  /** Every configured member, healthy or not. */
  all(): readonly MemberConfig[] {
    return this.members;
  }

  /** Ids currently marked healthy, in configuration order. */
  healthyIds(): string[] {
    return this.members.filter((m) => this.states.get(m.id)!.healthy).map((m) => m.id);
  }

  isHealthy(id: string): boolean {
    return this.states.get(id)?.healthy ?? false;
  }

  /**
   * Hits `GET /health` on every member once, in parallel, each with `timeoutMs`. Each verdict is
   * applied as it arrives (a 'change' for each member that changed), so a member that does not
   * answer delays nobody else's.
   */
  probeOnce(): Promise<void> {
    // Overlapping rounds would race each other's verdicts: join the one under way.
    if (this.probing) return this.probing;
    this.probing = Promise.all(this.members.map((m) => this.probe(m).then((healthy) => this.probed(m.id, healthy)))).then(
      () => {
        this.probing = null;
      },
      (err) => {
        this.probing = null;
        throw err;
      },
    );
    return this.probing;
  }

  /** Starts the `intervalMs` poll loop (idempotent). */
  start(): void {
    this.loop.start();
  }

  /** Stops the poll loop (idempotent). */
  stop(): void {
    this.loop.stop();
  }

  /** Feeds a capacity signal in; quantised at `nodes()` time. */
  setCapacity(id: string, capacity: number): void {
    const state = this.stateOf(id);
    if (!Number.isFinite(capacity)) throw new RangeError(`capacity for "${id}" must be a finite number`);
    const before = quantiseWeight(state.capacity);
    state.capacity = capacity;
    if (quantiseWeight(capacity) !== before && state.healthy) this.emit('change');
  }

  /**
   * Marks a member unhealthy now, outside the poll cadence. The next good probe restores it, but
   * none before `holdMs` has passed (a later mark can extend the hold, never shorten it).
   */
  markUnhealthy(id: string, holdMs = 0): void {
    const state = this.stateOf(id);
    if (!(Number.isFinite(holdMs) && holdMs >= 0)) throw new RangeError(`holdMs must be a non-negative number, got ${holdMs}`);
    state.heldUntil = Math.max(state.heldUntil, performance.now() + holdMs);
    this.verdict(id, false);
  }

  /**
   * Passive health (Envoy's outlier ejection): requests keep failing on a member that may still
   * pass its probe (one that hangs on requests, say), so it is taken out of every ranking for
   * `baseMs` times its ejections in a row (at most `maxMs`), then until a probe passes. The
   * streak starts again once a member has stayed in for `baseMs` since it came back.
   *
   * Refused, changing nothing, while it would put more than `maxPercent`% of the members out by
   * ejection at once (one always may be), or would leave no member routable: a request that waits
   * for a failing node may still be answered; one with no node to go to cannot be.
   */
  eject(id: string, policy: EjectionPolicy): EjectVerdict {
    const state = this.stateOf(id);
    const now = performance.now();
    if (state.ejected) return { ejected: false, reason: ALREADY_EJECTED };
    if (!state.healthy) return { ejected: false, reason: ALREADY_OUT };
    let out = 0;
    let routable = 0;
    for (const other of this.states.values()) {
      if (other.ejected) out++;
      if (other !== state && other.healthy && quantiseWeight(other.capacity) > 0) routable++;
    }
    const allowed = Math.max(1, Math.floor((this.members.length * policy.maxPercent) / 100));
    if (out >= allowed) return { ejected: false, reason: `${out} of ${this.members.length} members already out by ejection, and at most ${policy.maxPercent}% (at least one) may be at once` };
    if (routable === 0) return { ejected: false, reason: 'it is the last routable member' };
    state.streak = state.backAt > 0 && now - state.backAt < policy.baseMs ? state.streak + 1 : 1;
    const holdMs = Math.min(policy.maxMs, policy.baseMs * state.streak);
    state.ejected = true;
    state.ejections++;
    this.markUnhealthy(id, holdMs);
    return { ejected: true, holdMs, streak: state.streak };
  }

  /** Ejections of `id` since start, and whether it is out by one now (its hold, then until a probe passes). */
  ejectionsOf(id: string): { readonly ejections: number; readonly ejected: boolean } {
    const state = this.stateOf(id);
    return { ejections: state.ejections, ejected: state.ejected };
  }

  /** `performance.now()` when `id` last came back into the rankings after being out (0: never). */
  returnedAt(id: string): number {
    return this.stateOf(id).returnedAt;
  }

  /** `performance.now()` before which no probe may bring `id` back (0 or past: no hold). */
  heldUntil(id: string): number {
    return this.stateOf(id).heldUntil;
  }

  /**
   * Takes over what `from` (a reload's predecessor) knows of member `id`: its hold, which keeps
   * it out until then (a time already past changes nothing), and its ejections. `sameUrl` false:
   * the id names another address here, another server, which none of that was about (its
   * unreachable hold, its ejection, its health, its warm-up): only the ejection count (/stats,
   * by node id) carries, and its first probe decides, as for a member new to the cluster.
   */
  adopt(id: string, from: Membership, sameUrl = true): void {
    const state = this.stateOf(id);
    const before = from.stateOf(id);
    state.ejections = before.ejections;
    if (!sameUrl) return;
    state.streak = before.streak;
    state.backAt = before.backAt;
    state.returnedAt = before.returnedAt;
    // Out there (down, or held), it starts out here too, without a change said (the caller
    // publishes): its first passing probe is its return, and it warms then.
    if (!before.healthy) state.healthy = false;
    const left = before.heldUntil - performance.now();
    if (left > 0) {
      this.markUnhealthy(id, left);
      state.ejected = before.ejected;
    }
    // Past its hold, it starts in as every member does, and its first probe decides.
  }

  /** Whether a hold from `markUnhealthy` still keeps the member out. */
  private held(id: string): boolean {
    return performance.now() < this.heldUntil(id);
  }

  private probed(id: string, healthy: boolean): void {
    const state = this.states.get(id)!;
    const held = this.held(id);
    // Past its ejection's hold and failing its probe: out for its health now, not the ejection
    // (no longer counted against the cap: a dead node would hold the one slot for good).
    if (!healthy && !held && state.ejected) state.ejected = false;
    this.verdict(id, healthy && !held);
  }

  private verdict(id: string, healthy: boolean): void {
    const state = this.states.get(id)!;
    if (state.healthy === healthy) return;
    state.healthy = healthy;
    if (healthy) state.returnedAt = performance.now();
    if (healthy && state.ejected) {
      state.ejected = false;
      state.backAt = state.returnedAt;
    }
    this.emit('change');
  }

  private stateOf(id: string): MemberState {
    const state = this.states.get(id);
    if (!state) throw new RangeError(`unknown member "${id}"`);
    return state;
  }

  private async probe(member: MemberConfig): Promise<boolean> {
    try {
      if (this.fetchImpl === null) {
        const status = await probeStatus(member.url + this.healthPath, this.timeoutMs);
        return status >= 200 && status < 300;
      }
      // Not followed, as without it: a 3xx is no pass (fetch follows redirects unless told).
      const res = await this.fetchImpl(member.url + this.healthPath, {
        redirect: 'manual',
        signal: AbortSignal.timeout(this.timeoutMs),
      });
      // Drain the body so the connection goes back to the pool.
      await res.arrayBuffer();
      return res.status >= 200 && res.status < 300;
    } catch {
      return false;
    }
  }
}

/**
 * The longest delay a Node timer takes: a longer one (or Infinity) fires after 1 ms (a poll loop
 * then spins; a timeout or hedge delay past it would time out or hedge every request at once).
 */
export const MAX_TIMER_MS = 2 ** 31 - 1;

function positive(value: number | undefined, fallback: number, name: string): number {
  if (value === undefined) return fallback;
  if (typeof value !== 'number' || !(value > 0 && value <= MAX_TIMER_MS)) throw new ConfigError(`${name}: must be a positive number of milliseconds, at most ${MAX_TIMER_MS}, got ${String(value)}`);
  return value;
}
