/**
 * Replicated routes (seed 003): the quorum rules and the version stamps, kept free of I/O so they
 * can be tested alone.
 *
 * A key's replicas are its preference list on the cluster's ring: the first `n` distinct members
 * clockwise from the key (membership, not health: a replica that is down is still the key's home,
 * covered meanwhile by a stand-in further along the ring). A write counts once enough replicas
 * have acknowledged it, a read once enough have answered:
 *
 * - `quorum`: `w` acknowledgements of a write, `r` answers to a read, from any region (defaults:
 *   a majority of `n` each, so that w + r > n and every read quorum meets the latest write's);
 * - `local_quorum`: a majority of the key's replicas in the front door's own region (when none of
 *   them is there, a majority of all `n`);
 * - `each_quorum`: a majority of the key's replicas in every region that holds one.
 *
 * A stand-in counts in its own region. Nodes without a region count as one more region.
 */
import { performance } from 'node:perf_hooks';

export type Consistency = 'quorum' | 'local_quorum' | 'each_quorum';

export const CONSISTENCY_LEVELS: readonly Consistency[] = ['quorum', 'local_quorum', 'each_quorum'];

export interface QuorumSettings {
  /** Replicas per key. */
  readonly n: number;
  /** Acknowledgements a write needs (consistency `quorum`). */
  readonly w: number;
  /** Answers a read needs (consistency `quorum`). */
  readonly r: number;
  readonly consistency: Consistency;
  /** Whether a replica that is down is covered by a stand-in with a hint (sloppy quorum). */
  readonly sloppy: boolean;
  /** How long a hint is kept for its replica to come back, milliseconds. */
  readonly hintWindowMs: number;
  /** Bytes of hints one worker thread keeps for the route; past them, no stand-ins are used. */
  readonly maxHintBytes: number;
}

export const DEFAULT_HINT_WINDOW_MS = 3 * 3_600_000;
export const DEFAULT_MAX_HINT_BYTES = 64 * 1024 * 1024;

/** Header carrying a write's version to the replicas, and a stored value's version back. */
export const VERSION_HEADER = 'x-lakefront-version';
/** Header on a stand-in's write: the id of the replica it covers. */
export const HINT_HEADER = 'x-lakefront-hint-for';
/** Response header: `acks/required` when a replicated request was answered. */
export const ACKS_HEADER = 'x-lakefront-acks';

export function majority(count: number): number {
  return (count >> 1) + 1;
}

/**
 * What is wrong with `settings` for a cluster of `size` nodes, or null: the checks the
 * configuration file makes, for settings given in code.
 */
export function quorumProblem(settings: QuorumSettings, size: number): string | null {
  const { n, w, r } = settings;
  if (!Number.isInteger(n) || n < 1 || n > size) return `n must be a whole number in 1..${size} (the cluster's nodes), got ${n}`;
  if (!Number.isInteger(w) || w < 1 || w > n) return `w must be a whole number in 1..${n}, got ${w}`;
  if (!Number.isInteger(r) || r < 1 || r > n) return `r must be a whole number in 1..${n}, got ${r}`;
  if (settings.consistency === 'quorum' && w + r <= n) return `w + r must exceed n (${w} + ${r} <= ${n}): a read could miss the latest acknowledged write`;
  if (!CONSISTENCY_LEVELS.includes(settings.consistency)) return `unknown consistency ${JSON.stringify(settings.consistency)} (known: ${CONSISTENCY_LEVELS.join(', ')})`;
  if (settings.sloppy && settings.maxHintBytes <= 0) return 'maxHintBytes 0 keeps no hints, so no stand-in could be used: set "sloppy": false instead';
  return null;
}

/**
 * Why a reload may not take keys a replicated route placed under `before` to a route with
 * `after` (null: it may; seed 003: changing N/W/R at runtime must keep the nodes in agreement).
 * `before` is any configuration since start whose keys the new route may share (not only the
 * last: a reload through a plain route and back must not forget), so data acknowledged under its
 * `w` is still on as few replicas as that (read repair mends only the keys it reads): a read
 * quorum may not shrink, nor the replica count (the keys' replicas would move away from their
 * data) or the consistency level change, short of a restart. `draining`: `before` is a front
 * door still draining, whose workers read with `before.r` what the new ones write with `after.w`,
 * so those must meet as well. Raising `r`, or `w` within that, is taken.
 */
export function reloadProblem(before: QuorumSettings, after: QuorumSettings, draining: boolean): string | null {
  if (after.n !== before.n) return `n: a reload keeps ${before.n}, got ${after.n} (each key's replicas would change, away from its data; restart to change it)`;
  if (after.consistency !== before.consistency) return `consistency: a reload keeps ${before.consistency}, got ${after.consistency} (restart to change it)`;
  if (before.consistency !== 'quorum') return null;
  if (after.r < before.r) return `r: a reload may raise it, not lower it (${before.r} -> ${after.r}): writes acknowledged under an earlier w may be on too few replicas for a read of ${after.r} to meet (restart to lower it)`;
  if (draining && before.r + after.w <= after.n) return `w: ${after.w} is too few while the draining workers read with r ${before.r} (${before.r} + ${after.w} <= ${after.n})`;
  return null;
}

/** What a reload compares of a replicated route: where its keys live, and its quorum. */
export interface ReplicatedShape {
  readonly pattern: string;
  /** The cluster's name. */
  readonly cluster: string;
  readonly keyHeader: string | null;
  readonly quorum: QuorumSettings;
}

/**
 * Whether two replicated routes may place the same keys: on one cluster, keyed by the same
 * header, or by paths both patterns take (`/kv/*` and `/*`, not `/a/*` and `/b/*`).
 */
export function sharesKeys(a: ReplicatedShape, b: ReplicatedShape): boolean {
  if (a.cluster !== b.cluster) return false;
  if (a.keyHeader !== null && a.keyHeader === b.keyHeader) return true;
  const prefix = (p: string): string => (p.endsWith('*') ? p.slice(0, -1) : p);
  const [pa, pb] = [prefix(a.pattern), prefix(b.pattern)];
  const [wa, wb] = [pa !== a.pattern, pb !== b.pattern];
  if (wa && wb) return pa.startsWith(pb) || pb.startsWith(pa);
  if (wa) return pb.startsWith(pa);
  if (wb) return pa.startsWith(pb);
  return pa === pb;
}

/**
 * What one request needs: `need[s]` answers from scope `s`, where scope 0 is every region and
 * scope 1 + g is region g. Built per request from the key's replicas (their regions vary by key).
 */
export class Requirement {
  /** Per scope: answers still needed (<= 0: met). */
  readonly need: Int32Array;
  /** Per scope: targets still running that could count there. */
  readonly pending: Int32Array;
  /** Total needed, for the `acks/required` header. */
  required = 0;

  constructor(regions: number) {
    this.need = new Int32Array(regions + 1);
    this.pending = new Int32Array(regions + 1);
  }

  /**
   * Fills the needs for a key whose home replicas are `homes[0..count)`, given each node's
   * region index (`regionOf[node]`; nodes without a region share one index of their own) and the
   * front door's (`local`, -1 when no node is in its region).
   */
  set(consistency: Consistency, wanted: number, homes: Int32Array, count: number, regionOf: Int32Array, local: number): void {
    const need = this.need;
    need.fill(0);
    if (consistency === 'quorum') {
      need[0] = this.required = wanted;
      return;
    }
    // Replicas per region among the key's homes.
    for (let i = 0; i < count; i++) need[1 + regionOf[homes[i]!]!]!++;
    if (consistency === 'local_quorum') {
      const here = local >= 0 ? need[1 + local]! : 0;
      need.fill(0);
      if (here > 0) need[1 + local] = this.required = majority(here);
      else need[0] = this.required = majority(count);
      return;
    }
    // each_quorum: a majority in every region holding one of the key's replicas.
    this.required = 0;
    for (let s = 1; s < need.length; s++) {
      if (need[s]! > 0) {
        need[s] = majority(need[s]!);
        this.required += need[s]!;
      }
    }
  }

  /** A target that counts in region `region` starts (-1: it counts in no region, only in all). */
  add(region: number): void {
    this.pending[0]!++;
    if (region >= 0) this.pending[1 + region]!++;
  }

  /** A target that counts in region `region` (-1: none) ended: answered (`counts`) or not. */
  settle(region: number, counts: boolean): void {
    this.pending[0]!--;
    if (region >= 0) this.pending[1 + region]!--;
    if (counts) {
      this.need[0]!--;
      if (region >= 0) this.need[1 + region]!--;
    }
  }

  get met(): boolean {
    const need = this.need;
    for (let s = 0; s < need.length; s++) if (need[s]! > 0) return false;
    return true;
  }

  /** Whether one more target in `region` could count toward a need still short of targets. */
  helps(region: number): boolean {
    const { need, pending } = this;
    return need[0]! > pending[0]! || need[1 + region]! > pending[1 + region]!;
  }

  /** Whether the targets still running could meet every need. */
  get possible(): boolean {
    return this.short < 0;
  }

  /** The first scope whose need its running targets cannot meet (0: all; 1 + g: region g), or -1. */
  get short(): number {
    const { need, pending } = this;
    for (let s = 0; s < need.length; s++) if (need[s]! > pending[s]!) return s;
    return -1;
  }
}

/**
 * Versions are decimal integers below 2^63 (an int64 for the replicas): the wall clock in
 * microseconds times 1000, plus a stamp of the thread: the process's random salt plus the
 * thread's slot, modulo 1000. The microseconds are `performance.timeOrigin + performance.now()`
 * (the same clock in every thread, measured here: no thread saw another's stamp from later),
 * kept inside `Date.now()`'s millisecond, so that a wall clock stepped since start is followed.
 *
 * Strictly increasing across every thread of the process (`lane`: the last microsecond stamped,
 * shared by them all), even when the wall clock steps back: a write that starts after another
 * was acknowledged gets the higher version, so a replica that keeps the highest it is sent (last
 * write wins) keeps the later one. (Each thread's own microseconds did not line up with another
 * thread's: with 4 threads, 56-140 of 1,500 writes made one after another lost to the write
 * before.) Two front doors stamp the same version only for writes in the same microsecond whose
 * thread stamps collide; their clocks order their writes to one key, so keep them in sync (NTP).
 */
export class VersionClock {
  private readonly suffix: string;

  constructor(
    stamp: number,
    private readonly lane: BigInt64Array = new BigInt64Array(versionLane()),
    private readonly nowMs: () => number = Date.now,
    private readonly fineMs: () => number = () => performance.timeOrigin + performance.now(),
  ) {
    if (!Number.isInteger(stamp) || stamp < 0) throw new RangeError(`version clock stamp ${stamp} is not a whole number >= 0`);
    this.suffix = String(stamp % 1000).padStart(3, '0');
  }

  next(): string {
    const wall = Math.floor(this.nowMs());
    const fine = this.fineMs();
    const now = BigInt(Math.floor((fine < wall ? wall : fine >= wall + 1 ? wall + 0.999 : fine) * 1000));
    const lane = this.lane;
    for (;;) {
      const last = Atomics.load(lane, 0);
      const us = now > last ? now : last + 1n;
      if (Atomics.compareExchange(lane, 0, last, us) === last) return `${us}${this.suffix}`;
    }
  }
}

/** A lane for VersionClock, to be shared by every thread of a process. */
export function versionLane(): SharedArrayBuffer {
  return new SharedArrayBuffer(8);
}

/** Whether `text` is a version: 1-19 decimal digits. */
function isVersion(text: string): boolean {
  const n = text.length;
  if (n === 0 || n > 19) return false;
  for (let i = 0; i < n; i++) {
    const c = text.charCodeAt(i);
    if (c < 48 || c > 57) return false;
  }
  return true;
}

/**
 * Orders two version texts as integers: negative when `a` is older. A missing or malformed
 * version ('' or anything but 1-19 digits) is older than any version.
 */
export function compareVersions(a: string, b: string): number {
  const va = isVersion(a) ? a.replace(/^0+(?=\d)/, '') : '';
  const vb = isVersion(b) ? b.replace(/^0+(?=\d)/, '') : '';
  if (va.length !== vb.length) return va.length - vb.length;
  return va < vb ? -1 : va > vb ? 1 : 0;
}
