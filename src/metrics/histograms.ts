/**
 * Latency histograms for reporting (HDR, microseconds). Recording happens in the workers;
 * percentiles are computed off the request path by the control plane, which merges every
 * worker's encoded histograms on demand.
 *
 * The workers count values in HDR's layout themselves (see NodeHistograms) and use
 * hdr-histogram-js only to encode, and its JavaScript build, not its WebAssembly one. Building a
 * WebAssembly histogram grows the module's memory, and growing a memory detaches its old
 * ArrayBuffer: the first detach in a thread turns off V8's guarantee that no buffer is ever
 * detached, and from then on every typed-array read and write in optimized code checks for it.
 * The worker's byte loops (parsing each answer's head, laying out its header lines) cost about
 * 16-21% more instructions that way (bench/ir.sh, GET 1 KiB). A request body does the same
 * detach (uWS detaches each body chunk's ArrayBuffer after its callback), so only a thread that
 * has seen none keeps the guarantee: a front door of GETs.
 */
import hdr from 'hdr-histogram-js';

/** Values above this (one minute) are clamped: an attempt cannot run that long anyway. */
const HIGHEST_US = 60_000_000;

export interface LatencySummaryUs {
  count: number;
  p50: number;
  p95: number;
  p99: number;
  p999: number;
  max: number;
}

/** The library's JavaScript histogram for these values, with 64-bit counts. */
function build(): hdr.Histogram {
  return hdr.build({ useWebAssembly: false, bitBucketSize: 64, lowestDiscernibleValue: 1, highestTrackableValue: HIGHEST_US, numberOfSignificantValueDigits: 3, autoResize: false });
}

/**
 * HDR's layout for these histograms (1 us .. one minute, three significant digits), read from one
 * the library built, so the index a value is counted at is the library's own: values below 2048
 * counted one by one, then each power of two in 1,024 steps.
 */
const LAYOUT = build();
const { subBucketHalfCountMagnitude: HALF_MAGNITUDE, subBucketHalfCount: HALF_COUNT, countsArrayLength: LENGTH, unitMagnitude: UNIT_MAGNITUDE } = LAYOUT as unknown as {
  subBucketHalfCountMagnitude: number;
  subBucketHalfCount: number;
  countsArrayLength: number;
  unitMagnitude: number;
};
LAYOUT.destroy();
if (UNIT_MAGNITUDE !== 0 || HIGHEST_US >= 2 ** 31) throw new Error('histogram layout: whole microseconds below 2^31 expected');

/** The counts index of `us` (a whole number, 1 .. HIGHEST_US), as hdr-histogram-js's countsArrayIndex computes it. */
export function countsIndex(us: number): number {
  const bucket = Math.max(31 - Math.clz32(us) - HALF_MAGNITUDE, 0);
  return ((bucket + 1) << HALF_MAGNITUDE) + (us >>> bucket) - HALF_COUNT;
}

/**
 * What hdr-histogram-js's JavaScript histograms offer beyond their declared type, and its decoder
 * uses to fill one from counts (the tests compare the encodings with its own recording's).
 */
interface CellAccess {
  setCountAtIndex(index: number, count: number): void;
  /** Totals, maximum and minimum recomputed from the counts (the library's spelling). */
  establishInternalTackingValues(): void;
}

/**
 * One histogram per node, owned by one thread. A value is counted in HDR's layout with integer
 * arithmetic (hdr-histogram-js's own recording computes the index with two calls of Math.pow
 * and one of Math.log2: about 700 instructions a request, bench/ir.sh); the library's histogram
 * is filled from the counts only when /stats asks for the encoding, off the request path.
 * Counts are doubles, exact to 2^53: 32-bit ones wrap to zero at 2^32 answers in one cell
 * (months of a busy front door, its answers' times bunched), as the library's 32-bit histograms
 * did, silently, and the control plane's merge of every thread's (it decodes into 64-bit ones).
 */
export class NodeHistograms {
  /** `LENGTH` counts per node, node after node. */
  private readonly counts: Float64Array;
  private readonly dirty: Uint8Array;
  /** Filled from `counts` to encode one node (made at the first encoding). */
  private scratch: hdr.Histogram | null = null;

  constructor(nodeCount: number) {
    this.counts = new Float64Array(nodeCount * LENGTH);
    this.dirty = new Uint8Array(nodeCount);
  }

  record(node: number, latencyUs: number): void {
    // Not a number: nothing to count (the library counted it in no cell either).
    if (latencyUs !== latencyUs) return;
    // Clamped, then whole: the library counts a fraction where its whole part goes.
    const us = latencyUs < 1 ? 1 : latencyUs > HIGHEST_US ? HIGHEST_US : Math.floor(latencyUs);
    this.counts[node * LENGTH + countsIndex(us)]++;
    this.dirty[node] = 1;
  }

  /** Compressed base64 per node (null where nothing was recorded). */
  encode(): (string | null)[] {
    const out: (string | null)[] = [];
    for (let n = 0; n < this.dirty.length; n++) {
      if (this.dirty[n] === 0) {
        out.push(null);
        continue;
      }
      const h = (this.scratch ??= build());
      h.reset();
      // Filled as the library's own decoder fills one: each cell's count, then its totals, maximum
      // and minimum from the counts (recording a count a cell costs the library's index arithmetic
      // again: 2-10x slower, and /stats asks every worker for every node).
      const cells = h as unknown as CellAccess;
      const base = n * LENGTH;
      for (let i = 0; i < LENGTH; i++) {
        const count = this.counts[base + i]!;
        if (count !== 0) cells.setCountAtIndex(i, count);
      }
      cells.establishInternalTackingValues();
      out.push(hdr.encodeIntoCompressedBase64(h));
    }
    return out;
  }

  destroy(): void {
    this.scratch?.destroy();
    this.scratch = null;
  }
}

/** Merges encoded per-node histograms from several threads and summarises each node. */
export function mergeSummaries(perThread: readonly (readonly (string | null)[])[], nodeCount: number): LatencySummaryUs[] {
  const out: LatencySummaryUs[] = [];
  for (let n = 0; n < nodeCount; n++) {
    let merged: hdr.Histogram | null = null;
    for (const encoded of perThread) {
      const one = encoded[n];
      if (!one) continue;
      const h = hdr.decodeFromCompressedBase64(one, 64, false);
      if (merged === null) merged = h;
      else merged.add(h);
    }
    out.push(summarise(merged));
  }
  return out;
}

function summarise(h: hdr.Histogram | null): LatencySummaryUs {
  if (h === null || h.totalCount === 0) return { count: 0, p50: 0, p95: 0, p99: 0, p999: 0, max: 0 };
  return {
    count: h.totalCount,
    p50: h.getValueAtPercentile(50),
    p95: h.getValueAtPercentile(95),
    p99: h.getValueAtPercentile(99),
    p999: h.getValueAtPercentile(99.9),
    max: h.maxValue,
  };
}
