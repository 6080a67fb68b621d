/**
 * Latency histograms for reporting (HDR, microseconds). Recording happens in the workers on WASM
 * histograms (~30-85 ns a value); percentiles are computed off the request path by the control
 * plane, which merges every worker's encoded histograms on demand.
 *
 * WASM histograms are never garbage-collected: a worker creates one per node at start-up and
 * destroys them when it stops.
 */
import hdr from 'hdr-histogram-js';

await hdr.initWebAssembly();

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

/** One WASM histogram per node, owned by one thread. */
export class NodeHistograms {
  private readonly histograms: hdr.Histogram[];
  private readonly dirty: Uint8Array;

  constructor(nodeCount: number) {
    this.histograms = [];
    for (let i = 0; i < nodeCount; i++) {
      this.histograms.push(
        hdr.build({ useWebAssembly: true, lowestDiscernibleValue: 1, highestTrackableValue: HIGHEST_US, numberOfSignificantValueDigits: 3, autoResize: false }),
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
