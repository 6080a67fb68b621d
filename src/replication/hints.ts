/**
 * Hinted handoff (seed 003): a write a stand-in acknowledged for a replica that was down is kept
 * here as a hint, and handed to that replica once the membership table shows it healthy again,
 * oldest first. As Cassandra's coordinator keeps hints: the front door that coordinated the write
 * holds them (in the worker thread's memory: a restart loses them, and read repair then converges
 * what they would have).
 *
 * A hint is the write as the replica would have had it, same version: delivering it twice, or
 * after a newer write, changes nothing on a replica that keeps the highest version. It is kept
 * for `hintWindowMs`; one that the replica refuses with a client error (4xx but 408 and 429) is
 * dropped; any other answer or failure is retried on the next tick.
 *
 * Memory is bounded by `maxBytes`: a stand-in is only used once its hint's bytes are reserved
 * (`reserve`), so concurrent writes cannot overshoot the bound between choosing a stand-in and
 * its acknowledgement.
 */
import type { Buffer } from 'node:buffer';
import { performance } from 'node:perf_hooks';
import type { AttemptHandle } from '../forward/exchange.js';
import type { AttemptSink, UpstreamRequest } from '../forward/upstream.js';

/** What the store needs of its cluster. */
export interface HandoffHost {
  /** Whether the membership table shows `node` healthy and enabled. */
  isRoutable(node: number): boolean;
  /** Re-read the membership table if it changed (a tick may come with no request to do it). */
  refresh(): void;
  send(sink: AttemptSink, node: number, ordinal: number, request: UpstreamRequest): AttemptHandle;
  /**
   * A hint for replica `node` was stored (`stored`), or left this store (every other event);
   * `key` is its key's `keyHash`.
   */
  hintCounted(event: HintEvent, node: number, key: number): void;
}

/** `lost`: forgotten as the worker stopped; `saved`: handed over for saving as it stopped. */
export type HintEvent = 'stored' | 'delivered' | 'expired' | 'refused' | 'lost' | 'saved';

/** Room set aside for the hint of one stand-in's write, while the stand-in runs. */
export interface Reservation {
  /** The replica the stand-in covers. */
  readonly node: number;
  /** The write's key, and its `keyHash`. */
  readonly key: string;
  readonly hash: number;
  readonly request: UpstreamRequest;
  readonly bytes: number;
}

/** A hint as it leaves a stopping worker, or comes into a starting one. */
export interface HintRecord {
  readonly node: number;
  /** The write's key (the route's: its path without the query, or its key header's value). */
  readonly key: string;
  readonly request: UpstreamRequest;
  /** When it expires, wall clock (ms since the epoch). */
  readonly expiresAt: number;
}

const WAITING = 0;
const SENDING = 1;
const DONE = 2;

interface Hint {
  /** Let go once the hint is done (it may stay queued behind an older one a while). */
  request: UpstreamRequest | null;
  readonly key: string;
  /** `keyHash(key)`: what HeldHints counts it under, until it is done. */
  readonly hash: number;
  readonly bytes: number;
  readonly expiresAt: number;
  state: number;
}

/** Hints handed to one replica at a time, at most. */
const DELIVERIES_PER_NODE = 4;
/** While hints wait, how often the store looks again (expiry, a replica back, a failed delivery). */
export const HANDOFF_RETRY_MS = 1_000;

/** A hint's rough cost in memory: the body, the header strings and the objects around them. */
export function hintCost(request: UpstreamRequest): number {
  let bytes = 256 + (request.body?.length ?? 0) + request.path.length;
  for (const h of request.headers) bytes += h.length;
  return bytes;
}

/** Whether a replica's answer to a hint drops it: a client error, but not a timeout or a throttle. */
function refuses(status: number): boolean {
  return status >= 400 && status < 500 && status !== 408 && status !== 429;
}

class Delivery implements AttemptSink {
  launchedAt = 0;
  readonly op = 1; // OP_WRITE

  constructor(
    private readonly store: HintStore,
    readonly node: number,
    readonly hint: Hint,
  ) {}

  answered(_ordinal: number, status: number, _headers: unknown, _body: Buffer): void {
    this.store.delivered(this, status >= 200 && status < 300 ? 'delivered' : refuses(status) ? 'refused' : 'retry');
  }

  failed(): void {
    this.store.delivered(this, 'retry');
  }
}

export class HintStore {
  /** Per replica, hints oldest first; entries before `heads[node]` are done. */
  private readonly queues: Hint[][];
  private readonly heads: Int32Array;
  private readonly inflight: Int32Array;
  /** Per replica: a delivery failed; wait for the next tick before trying again. */
  private readonly backoff: Uint8Array;
  /** Per replica: hints done but still queued behind the head (an older one being retried). */
  private readonly doneBehind: Int32Array;
  private bytes = 0;
  /** Bytes set aside for stand-ins still running. */
  private reserved = 0;
  /** The stand-ins still running: a stop saves their hints too (their writes may have landed). */
  private readonly reservations = new Set<Reservation>();
  private count = 0;
  private timer: NodeJS.Timeout | null = null;
  private closed = false;

  constructor(
    private readonly host: HandoffHost,
    size: number,
    private readonly windowMs: number,
    private readonly maxBytes: number,
    private readonly now: () => number = () => performance.now(),
    private readonly retryMs = HANDOFF_RETRY_MS,
  ) {
    this.queues = Array.from({ length: size }, () => []);
    this.heads = new Int32Array(size);
    this.inflight = new Int32Array(size);
    this.backoff = new Uint8Array(size);
    this.doneBehind = new Int32Array(size);
  }

  /** Hints waiting (delivering ones included). */
  get pending(): number {
    return this.count;
  }

  /** Bytes held by hints and set aside for them. */
  get bytesUsed(): number {
    return this.bytes + this.reserved;
  }

  /**
   * Sets aside room for a hint of `request` (a write to `key`) before a stand-in is sent it;
   * false when there is none (then no stand-in is used). Each reservation ends in `keep` or
   * `release`.
   */
  reserve(node: number, key: string, request: UpstreamRequest): Reservation | null {
    const bytes = hintCost(request);
    if (this.closed || this.bytes + this.reserved + bytes > this.maxBytes) return null;
    this.reserved += bytes;
    const reservation = { node, key, hash: keyHash(key), request, bytes };
    this.reservations.add(reservation);
    return reservation;
  }

  /** The stand-in did not acknowledge: its reservation is given back. */
  release(reservation: Reservation): void {
    if (this.reservations.delete(reservation)) this.reserved -= reservation.bytes;
  }

  /**
   * The stand-in acknowledged: keeps its hint, `request` (the write as the replica should have
   * had it), in the room `reserve` set aside.
   */
  keep(reservation: Reservation, request: UpstreamRequest): void {
    if (!this.reservations.delete(reservation)) return; // given back, or saved at a stop
    const bytes = reservation.bytes;
    this.reserved -= bytes;
    if (this.closed) return;
    const { node, key, hash } = reservation;
    this.queues[node]!.push({ request, key, hash, bytes, expiresAt: this.now() + this.windowMs, state: WAITING });
    this.bytes += bytes;
    this.count++;
    this.host.hintCounted('stored', node, hash);
    this.arm();
  }

  /** Hands over what can be handed over now: after a membership change, and on every tick. */
  deliver(): void {
    if (this.closed || this.count === 0) return;
    const now = this.now();
    for (let node = 0; node < this.queues.length; node++) {
      this.expire(node, now);
      if (this.backoff[node] === 0 && this.host.isRoutable(node)) this.sendMore(node);
    }
  }

  /** @internal a delivery ended. */
  delivered(delivery: Delivery, outcome: 'delivered' | 'refused' | 'retry'): void {
    if (this.closed) return; // counted as lost at close
    const { node, hint } = delivery;
    this.inflight[node]!--;
    if (outcome === 'retry') {
      // It keeps its place (the oldest first); tried again on the next tick.
      hint.state = WAITING;
      this.backoff[node] = 1;
      this.arm();
      return;
    }
    this.drop(node, hint, outcome);
    this.advance(node);
    if (this.backoff[node] === 0 && this.host.isRoutable(node)) this.sendMore(node);
  }

  /**
   * Every hint not yet handed over (being handed over included: delivering one twice changes
   * nothing), to be saved as the worker stops.
   */
  export(): HintRecord[] {
    const out: HintRecord[] = [];
    const shift = Date.now() - this.now();
    this.queues.forEach((queue, node) => {
      for (const hint of queue) if (hint.state !== DONE && hint.request !== null) out.push({ node, key: hint.key, request: hint.request, expiresAt: hint.expiresAt + shift });
    });
    // A stand-in still running may have taken the write: its replica gets it too (twice is
    // harmless, the version is the same).
    const expiresAt = Date.now() + this.windowMs;
    for (const { node, key, request } of this.reservations) out.push({ node, key, request, expiresAt });
    return out;
  }

  /**
   * Takes a hint saved by an earlier run (see `export`); false when it has expired or there is
   * no room for it.
   */
  adopt(record: HintRecord): boolean {
    // No later than this route's window allows now.
    const expiresAt = Math.min(record.expiresAt - Date.now(), this.windowMs) + this.now();
    const bytes = hintCost(record.request);
    // Admitted once already: not held to the byte limit again (a stop's hints all come back).
    if (this.closed || expiresAt <= this.now()) return false;
    const hash = keyHash(record.key);
    // In its place by expiry (a queue is oldest first, and `expire` stops at the first hint not
    // yet due): hints kept since this worker started expire later than one taken over now may.
    const queue = this.queues[record.node]!;
    let at = queue.length;
    while (at > this.heads[record.node]! && queue[at - 1]!.expiresAt > expiresAt) at--;
    queue.splice(at, 0, { request: record.request, key: record.key, hash, bytes, expiresAt, state: WAITING });
    this.bytes += bytes;
    this.count++;
    this.host.hintCounted('stored', record.node, hash);
    this.arm();
    return true;
  }

  /**
   * Forgets every hint (the worker is stopping); returns how many were still waiting. `saved`:
   * they were exported to be saved, so not lost.
   */
  close(saved = false): number {
    this.closed = true;
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    const lost = this.count;
    this.queues.forEach((queue, node) => {
      for (const hint of queue) if (hint.state !== DONE) this.host.hintCounted(saved ? 'saved' : 'lost', node, hint.hash);
      queue.length = 0;
    });
    this.count = this.bytes = this.reserved = 0;
    this.reservations.clear();
    this.doneBehind.fill(0);
    return lost;
  }

  private sendMore(node: number): void {
    const queue = this.queues[node]!;
    // Stops at a failed delivery too: it sets the back-off, even when it fails inside `send`.
    for (let i = this.heads[node]!; i < queue.length && this.inflight[node]! < DELIVERIES_PER_NODE && this.backoff[node] === 0; i++) {
      const hint = queue[i]!;
      if (hint.state !== WAITING) continue;
      hint.state = SENDING;
      this.inflight[node]!++;
      const delivery = new Delivery(this, node, hint);
      delivery.launchedAt = performance.now();
      this.host.send(delivery, node, 0, hint.request!);
    }
  }

  /** Drops the waiting hints at the head of `node`'s queue whose window has passed. */
  private expire(node: number, now: number): void {
    const queue = this.queues[node]!;
    for (let i = this.heads[node]!; i < queue.length; i++) {
      const hint = queue[i]!;
      if (hint.expiresAt > now) break;
      if (hint.state !== WAITING) continue;
      this.drop(node, hint, 'expired');
    }
    this.advance(node);
  }

  /**
   * Moves the head past finished hints, and drops finished ones from the array once they are
   * most of it (those behind a head that keeps being retried too): amortised O(1) a hint.
   */
  private advance(node: number): void {
    let queue = this.queues[node]!;
    let head = this.heads[node]!;
    while (head < queue.length && queue[head]!.state === DONE) {
      head++;
      this.doneBehind[node]!--;
    }
    if (head === queue.length) {
      queue.length = 0;
      head = 0;
    } else if (head + this.doneBehind[node]! > 64 && (head + this.doneBehind[node]!) * 2 > queue.length) {
      queue = this.queues[node] = queue.filter((hint) => hint.state !== DONE);
      this.doneBehind[node] = 0;
      head = 0;
    }
    this.heads[node] = head;
  }

  private drop(node: number, hint: Hint, outcome: 'delivered' | 'refused' | 'expired'): void {
    hint.state = DONE;
    hint.request = null;
    this.doneBehind[node]!++;
    this.bytes -= hint.bytes;
    this.count--;
    this.host.hintCounted(outcome, node, hint.hash);
  }

  private arm(): void {
    if (this.timer !== null || this.closed) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.backoff.fill(0);
      this.host.refresh();
      this.deliver();
      if (this.count > 0) this.arm();
    }, this.retryMs).unref();
  }
}

/**
 * Buckets a HeldHints row has besides its replicas' lanes: hints counted by (replica, key),
 * hashed (`heldBucket`). 16 KiB a row, one row a thread: a read whose replica has hints waiting
 * for other keys takes one of them for its own with a chance of about (pairs waiting) / 4,096.
 */
export const HELD_BUCKETS = 4096;

/**
 * A key's hash for HeldHints (an Int32): FNV-1a over its UTF-16 code units, allocating nothing.
 * A sloppy read pays it once (about 45 ns for a 25-character key; the ring's XXH64 of the key,
 * taken inside `membersFor`, costs about as much): not worth passing the ring's out through the
 * replica host, and the control plane hashes the hints it holds with this one too.
 */
export function keyHash(key: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < key.length; i++) h = Math.imul(h ^ key.charCodeAt(i), 0x01000193);
  return h;
}

/**
 * A node's hash for HeldHints: of its cluster's name and its id, not its index, so that the
 * buckets of front doors whose node lists differ (a reload) are the same buckets.
 */
export function nodeHash(cluster: string, id: string): number {
  return keyHash(`${cluster}\n${id}`);
}

/** The bucket of (replica, key), from their hashes: murmur3's finaliser over the two mixed. */
export function heldBucket(node: number, key: number): number {
  let h = key ^ Math.imul(node, 0x9e3779b1);
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) & (HELD_BUCKETS - 1);
}

/**
 * The key a saved hint's write was routed by, when the hint does not say (a hints file an earlier
 * version wrote): its key header's value among its headers, or its path without the query.
 * Blank when the header is not among them (a client's `connection` line may have dropped it):
 * such a hint then counts under another key, and reads of its own do not see it.
 */
export function keyOfWrite(keyHeader: string | null, path: string, headers: readonly string[]): string {
  if (keyHeader === null) {
    const query = path.indexOf('?');
    return query < 0 ? path : path.slice(0, query);
  }
  for (let i = 0; i < headers.length; i += 2) if (headers[i] === keyHeader) return headers[i + 1]!;
  return '';
}

/**
 * Another front door's hint rows (HeldHints): a reload's successor reads those of the front
 * doors still draining before it, and they read its.
 */
export interface HeldRows {
  /** Which front door's (FrontDoor.doorId). */
  readonly door: number;
  readonly buffer: SharedArrayBuffer;
  readonly slots: number;
  readonly nodes: number;
  /** Per node (global index here): its index there, or -1. */
  readonly map: Int32Array;
}

/**
 * Which replicas some thread of this front door holds hints for, and for which keys
 * (WorkerInit.hintsHeld): one row of Int32 lanes a counter slot.
 *
 *   row s (0: the control plane; 1..threads: the workers), nodes + HELD_BUCKETS lanes
 *   +--------+--------+-----+----------+----------+-----+-------------+
 *   | node 0 | node 1 | ... | node N-1 | bucket 0 | ... | bucket 4095 |
 *   +--------+--------+-----+----------+----------+-----+-------------+
 *    hints held for that replica         hints held whose (replica, key) hashes there
 *    (global index)                      (`heldBucket` of its `nodeHash` and `keyHash`)
 *
 * A hint counts once in its replica's lane and once in its bucket, both in the row of the thread
 * holding it. A read asks, for each replica of its key, whether some row has both above zero
 * (`any`): every row holding a hint for that replica and key does, so none is missed. A row may
 * also show both when the replica has hints for other keys there and some hint of that row (any
 * replica's, any key's) shares the bucket: a counting filter's false positive, and the read asks
 * past its replicas as though the hint were its key's. Never for a key none of whose replicas
 * has a hint waiting (as when only replicas were counted); for one that has, with a chance of
 * about 1 - (1 - 1/4,096)^h a replica, h the (replica, key) pairs with hints waiting in the rows
 * that hold some for it: 1 in 400 with 10, 1 in 40 with 100, 1 in 5 with 1,000, 9 in 10 with
 * 10,000 (measured the same), tending to every such read, as before buckets. A bucket counts its
 * hints: one delivered leaves it showing the others.
 *
 * A worker counts into its own row only (Atomics); row 0, the control plane's, counts the hints
 * on their way between workers (a stop's, a reload's hand-over, a hints file's until its worker
 * starts: `store`). Asking reads every row, so a read in any thread learns that a replica of its
 * key may have missed an acknowledged write to it. The control plane zeroes the row of a worker
 * that ended (`clear`): its hints went with it, or were handed back (a worker's row keeps those
 * until it ends, and row 0 has them from its `drained` message on: counted twice a moment, never
 * missed). A hint's two lanes are added to, stored and cleared together, in one row: the
 * both-in-one-row test misses none.
 *
 * After a reload the predecessors still draining keep their hints (and deliver them) until their
 * drains end, then hand them over; their workers still answer the requests on the connections
 * they keep meanwhile. So until then each side reads the other's rows too (`others`): a replica's
 * lane by its index there (`HeldRows.map`), a bucket at the same place (hashed by node id).
 */
export class HeldHints {
  private readonly lanes: Int32Array;
  private readonly nodes: number;
  /** Lanes a row. */
  private readonly width: number;
  private readonly own: number;
  private others: { readonly rows: HeldRows; readonly lanes: Int32Array; readonly width: number }[] = [];

  constructor(
    buffer: SharedArrayBuffer,
    private readonly slots: number,
    /** Per node (global index), its `nodeHash`. */
    private readonly nodeHashes: Int32Array,
    slot: number,
    others: readonly HeldRows[] = [],
  ) {
    this.nodes = nodeHashes.length;
    this.width = HeldHints.width(this.nodes);
    this.lanes = new Int32Array(buffer, 0, slots * this.width);
    this.own = slot * this.width;
    for (const rows of others) this.read(rows);
  }

  /** Reads another front door's rows too. */
  read(rows: HeldRows): void {
    const width = HeldHints.width(rows.nodes);
    this.others = [...this.others.filter((o) => o.rows.door !== rows.door), { rows, lanes: new Int32Array(rows.buffer, 0, rows.slots * width), width }];
  }

  /** Stops reading front door `door`'s rows. */
  forget(door: number): void {
    this.others = this.others.filter((o) => o.rows.door !== door);
  }

  /** Each node's `nodeHash` (`nodes` by global index; `cluster` indexes `clusters`). */
  static nodeHashes(nodes: readonly { readonly cluster: number; readonly id: string }[], clusters: readonly { readonly name: string }[]): Int32Array {
    return Int32Array.from(nodes, (node) => nodeHash(clusters[node.cluster]!.name, node.id));
  }

  /** Lanes a row: one a node, then the buckets. */
  static width(nodes: number): number {
    return nodes + HELD_BUCKETS;
  }

  static bytes(slots: number, nodes: number): number {
    return 4 * slots * HeldHints.width(nodes);
  }

  /** Zeroes `slot`'s row (its worker ended). */
  static clear(buffer: SharedArrayBuffer, nodes: number, slot: number): void {
    const width = HeldHints.width(nodes);
    const lanes = new Int32Array(buffer, 4 * slot * width, width);
    for (let i = 0; i < width; i++) Atomics.store(lanes, i, 0);
  }

  /** Counts one hint in `counts`, a row's lanes (`width`), for `store`. */
  static count(counts: Int32Array, node: number, nodeHash: number, key: number): void {
    counts[node]!++;
    counts[counts.length - HELD_BUCKETS + heldBucket(nodeHash, key)]!++;
  }

  /**
   * Sets row 0 (the control plane's) to `counts` (`count`). Lane by lane: a hint it gains or
   * loses is also counted in a worker's row meanwhile (see the class comment), and the lanes of
   * the others are written their own value again, never a passing zero.
   */
  static store(buffer: SharedArrayBuffer, counts: Int32Array): void {
    const lanes = new Int32Array(buffer, 0, counts.length);
    for (let i = 0; i < counts.length; i++) Atomics.store(lanes, i, counts[i]!);
  }

  /** A hint for `node` (global index) and the key of hash `key` was held (1) or let go (-1). */
  add(node: number, key: number, delta: number): void {
    Atomics.add(this.lanes, this.own + node, delta);
    Atomics.add(this.lanes, this.own + this.nodes + heldBucket(this.nodeHashes[node]!, key), delta);
  }

  /**
   * Whether some thread may hold a hint for `node` and the key of hash `key` (those of the other
   * front doors read included): false for certain when none does, true now and then when only
   * other keys' do (see the class comment). Plain reads (every replicated read asks, and
   * `Atomics.load` is a call each): an aligned Int32 is read whole, and a hint is counted
   * (Atomics.add) before its write is acknowledged, so a read the client sends after that
   * acknowledgement comes later than the count.
   */
  any(node: number, key: number): boolean {
    const bucket = heldBucket(this.nodeHashes[node]!, key);
    const { lanes, width } = this;
    const at = this.nodes + bucket;
    for (let row = 0, end = this.slots * width; row < end; row += width) if (lanes[row + node]! > 0 && lanes[row + at]! > 0) return true;
    const others = this.others;
    for (let o = 0; o < others.length; o++) {
      const { rows, lanes: theirs, width: theirWidth } = others[o]!;
      const there = rows.map[node]!;
      if (there < 0) continue;
      const theirAt = rows.nodes + bucket;
      for (let row = 0, end = rows.slots * theirWidth; row < end; row += theirWidth) if (theirs[row + there]! > 0 && theirs[row + theirAt]! > 0) return true;
    }
    return false;
  }
}
