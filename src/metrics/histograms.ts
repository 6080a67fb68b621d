/**
 * Latency histograms for reporting (HDR, microseconds). Recording happens in the workers;
 * percentiles are computed off the request path by the control plane, which merges every
 * worker's encoded histograms on demand.
 *
 * The histograms are hdr-histogram-js's JavaScript ones (32-bit counts), not its WebAssembly
 * build. Building a WebAssembly histogram grows the module's memory, and growing a memory
 * detaches its old ArrayBuffer: the first detach in a thread turns off V8's guarantee that no
 * buffer is ever detached, and from then on every typed-array read and write in optimized code
 * checks for it. The worker's byte loops (parsing each answer's head, laying out its header
 * lines) cost about 16-21% more instructions that way (bench/ir.sh, GET 1 KiB); and recording
 * a value through the call into the module cost more than the JavaScript histogram's own
 * recording. A request body does the same detach (uWS detaches each body
 * chunk's ArrayBuffer after its callback), so only a thread that has seen none keeps the
 * guarantee: a front door of GETs.
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

/** One histogram per node, owned by one thread. */
export class NodeHistograms {
  private readonly histograms: hdr.Histogram[];
  private readonly dirty: Uint8Array;

  constructor(nodeCount: number) {
    this.histograms = [];
    for (let i = 0; i < nodeCount; i++) {
      this.histograms.push(
        hdr.build({ useWebAssembly: false, bitBucketSize: 32, lowestDiscernibleValue: 1, highestTrackableValue: HIGHEST_US, numberOfSignificantValueDigits: 3, autoResize: false }),
      );
    }
    this.dirty = new Uint8Array(nodeCount);
  }

  record(node: number, latencyUs: number): void {
    const value = latencyUs < 1 ? 1 : latencyUs > HIGHEST_US ? HIGHEST_US : latencyUs;
    this.histograms[node]!.recordValue(value);
    this.dirty[node] = 1;
  }

  /** Compressed base64 per node (null where nothing was recorded). */
  encode(): (string | null)[] {
    return this.histograms.map((h, i) => (this.dirty[i] ? hdr.encodeIntoCompressedBase64(h) : null));
  }

  destroy(): void {
    for (const h of this.histograms) h.destroy();
    this.histograms.length = 0;
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
      const h = hdr.decodeFromCompressedBase64(one, 32, false);
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
