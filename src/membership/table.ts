/**
 * The membership table: routing state shared by every data-plane worker, in one
 * SharedArrayBuffer that only the main thread writes.
 *
 * ```
 *  Int32 index         field
 *  ------------------  ----------------------------------------------------------------
 *  0                   generation: a seqlock, odd while the writer is mid-update
 *  1                   node count (fixed at start-up)
 *  2                   layout version (LAYOUT_VERSION)
 *  3 .. 15             reserved                     (the header fills one 64-byte line)
 *  16 + 16*n + 0       node n: weight in thousandths (quantised; 0 = never routed to)
 *  16 + 16*n + 1       node n: flags (FLAG_*)
 *  16 + 16*n + 2       node n: region index (-1 = none)
 *  16 + 16*n + 3       node n: cluster index
 *  16 + 16*n + 4 .. 15 reserved                     (one 64-byte line per node)
 * ```
 *
 * Node ids, URLs and cluster names never change after start-up; they travel to workers once, in
 * `workerData`. A worker compares the generation on each request (one plain load) and re-reads
 * the rows only when it moved, so rankings are rebuilt once per membership change, not per
 * request.
 *
 * Concurrency note: the writer bumps the generation to odd, writes rows, bumps it to even. A
 * reader that sees an odd generation, or a different one after reading, retries. Rows are Int32
 * and written with Atomics.store, so no single field can tear.
 */

export const LAYOUT_VERSION = 1;
export const HEADER_INTS = 16;
export const ROW_INTS = 16;

export const H_GENERATION = 0;
export const H_NODE_COUNT = 1;
export const H_VERSION = 2;

export const R_WEIGHT_MILLI = 0;
export const R_FLAGS = 1;
export const R_REGION = 2;
export const R_CLUSTER = 3;

/** The node answers its health check. */
export const FLAG_HEALTHY = 1;
/** The operator has not disabled or drained the node. */
export const FLAG_ENABLED = 2;
/** The node is its cluster's detected leader. */
export const FLAG_LEADER = 8;
/**
 * The node came back into the rankings (a probe passed after it was out) less than `--eject-ms`
 * ago: its caches may be cold, and its hedge losers run to their answers (see ClusterRuntime).
 */
export const FLAG_WARMING = 16;

/** One node's published state, as a worker sees it. */
export interface NodeRow {
  weight: number;
  flags: number;
  region: number;
  cluster: number;
}

export function tableBytes(nodeCount: number): number {
  return (HEADER_INTS + ROW_INTS * nodeCount) * 4;
}

/** Main-thread side: the only writer. */
export class TableWriter {
  readonly buffer: SharedArrayBuffer;
  private readonly ints: Int32Array;
  readonly nodeCount: number;

  constructor(nodeCount: number) {
    this.nodeCount = nodeCount;
    this.buffer = new SharedArrayBuffer(tableBytes(nodeCount));
    this.ints = new Int32Array(this.buffer);
    Atomics.store(this.ints, H_NODE_COUNT, nodeCount);
    Atomics.store(this.ints, H_VERSION, LAYOUT_VERSION);
  }

  get generation(): number {
    return Atomics.load(this.ints, H_GENERATION);
  }

  /** Publishes every row at once; workers see all of it or none of it. */
  publish(rows: readonly NodeRow[]): void {
    if (rows.length !== this.nodeCount) throw new RangeError(`expected ${this.nodeCount} rows, got ${rows.length}`);
    const ints = this.ints;
    Atomics.add(ints, H_GENERATION, 1); // odd: mid-update
    for (let n = 0; n < rows.length; n++) {
      const row = rows[n]!;
      const base = HEADER_INTS + ROW_INTS * n;
      Atomics.store(ints, base + R_WEIGHT_MILLI, Math.round(row.weight * 1000));
      Atomics.store(ints, base + R_FLAGS, row.flags);
      Atomics.store(ints, base + R_REGION, row.region);
      Atomics.store(ints, base + R_CLUSTER, row.cluster);
    }
    Atomics.add(ints, H_GENERATION, 1); // even: consistent
  }
}

/** Worker side: read-only view. */
export class TableReader {
  private readonly ints: Int32Array;
  readonly nodeCount: number;

  constructor(buffer: SharedArrayBuffer) {
    this.ints = new Int32Array(buffer);
    if (Atomics.load(this.ints, H_VERSION) !== LAYOUT_VERSION) {
      throw new Error('membership table layout version mismatch');
    }
    this.nodeCount = Atomics.load(this.ints, H_NODE_COUNT);
  }

  /**
   * The current generation; compare against the last one read to detect a change. Asked on every
   * request, so a plain read, not `Atomics.load` (a call into a builtin that TurboFan does not
   * inline: about 100 instructions a request). An aligned Int32Array element of shared memory
   * never tears (ECMAScript's memory model), and a plain read may see a new generation a moment
   * later than an atomic one would; `read` then takes the rows under the seqlock, atomically.
   */
  generation(): number {
    return this.ints[H_GENERATION]!;
  }

  /**
   * Reads every row consistently into `out` (which must hold `nodeCount` rows) and returns the
   * generation it read. Spins only while the writer is mid-update, which takes microseconds.
   */
  read(out: NodeRow[]): number {
    const ints = this.ints;
    for (;;) {
      const before = Atomics.load(ints, H_GENERATION);
      if ((before & 1) === 1) continue;
      for (let n = 0; n < this.nodeCount; n++) {
        const base = HEADER_INTS + ROW_INTS * n;
        const row = out[n]!;
        row.weight = Atomics.load(ints, base + R_WEIGHT_MILLI) / 1000;
        row.flags = Atomics.load(ints, base + R_FLAGS);
        row.region = Atomics.load(ints, base + R_REGION);
        row.cluster = Atomics.load(ints, base + R_CLUSTER);
      }
      if (Atomics.load(ints, H_GENERATION) === before) return before;
    }
  }

}
