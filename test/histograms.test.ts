/**
 * Latency histograms: what a worker records, encodes and the control plane merges into /stats'
 * per-node summaries (HDR, three significant digits, microseconds).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import hdr from 'hdr-histogram-js';
import { NodeHistograms, countsIndex, mergeSummaries } from '../src/metrics/histograms.js';

/** HDR with three significant digits: a value read back is within 0.1% of the one recorded. */
function near(actual: number, expected: number, what: string): void {
  assert.ok(Math.abs(actual - expected) <= expected / 1000 + 1, `${what}: ${actual}, expected about ${expected}`);
}

/** hdr-histogram-js's own histogram with the workers' layout (1 us .. one minute, three digits). */
function libraryHistogram(bits: 32 | 64): hdr.Histogram {
  return hdr.build({ useWebAssembly: false, bitBucketSize: bits, lowestDiscernibleValue: 1, highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: 3, autoResize: false });
}

/** A small deterministic generator (xorshift32), so a failure can be run again. */
function generator(seed: number): () => number {
  let x = seed;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 2 ** 32;
  };
}

describe('latency histograms', () => {
  it("counts every value at the library's own index", () => {
    const library = libraryHistogram(32) as unknown as { countsArrayIndex(value: number): number };
    // Every value up to 2^17 (the exact cells and the first buckets), then every bucket's edges.
    for (let us = 1; us <= 2 ** 17; us++) assert.equal(countsIndex(us), library.countsArrayIndex(us), `at ${us}`);
    for (let p = 17; p < 26; p++) {
      for (const us of [2 ** p - 1, 2 ** p, 2 ** p + 1, 3 * 2 ** (p - 1)]) assert.equal(countsIndex(us), library.countsArrayIndex(us), `at ${us}`);
    }
    assert.equal(countsIndex(60_000_000), library.countsArrayIndex(60_000_000));
  });

  it("encodes exactly what the library's own recording encodes, fractions and clamped values included", () => {
    const random = generator(0x9e3779b9);
    const ours = new NodeHistograms(1);
    const theirs = libraryHistogram(32);
    try {
      for (let i = 0; i < 50_000; i++) {
        // Log-uniform over 0.01 us .. 10^9 us: below, across and above the range.
        const us = 10 ** (random() * 11 - 2);
        ours.record(0, us);
        theirs.recordValue(us < 1 ? 1 : us > 60_000_000 ? 60_000_000 : us);
      }
      assert.equal(ours.encode()[0], hdr.encodeIntoCompressedBase64(theirs));
    } finally {
      ours.destroy();
      theirs.destroy();
    }
  });

  it('encodes each node from its own counts every time, and counts nothing for a value that is not a number', () => {
    const ours = new NodeHistograms(2);
    const first = libraryHistogram(32);
    const second = libraryHistogram(32);
    try {
      // Node 0's cells, then node 1's (other cells, emptier), then node 0's again with more:
      // each encoding must hold that node's counts only (one scratch histogram serves them all).
      for (const us of [3, 3, 700, 2049.5, 90_000]) {
        ours.record(0, us);
        first.recordValue(us);
      }
      ours.record(1, 12);
      ours.record(0, Number.NaN);
      const [zero, one] = ours.encode();
      assert.equal(zero, hdr.encodeIntoCompressedBase64(first));
      second.recordValue(12);
      assert.equal(one, hdr.encodeIntoCompressedBase64(second));
      ours.record(0, 5);
      first.recordValue(5);
      assert.equal(ours.encode()[0], hdr.encodeIntoCompressedBase64(first));
    } finally {
      ours.destroy();
      first.destroy();
      second.destroy();
    }
  });

  it('merges counts past 2^32 a cell without wrapping', () => {
    // A thread's encoding with 5 billion answers in one cell (months of a busy front door).
    const big = libraryHistogram(64);
    big.recordValueWithCount(500, 5e9);
    const encoded = hdr.encodeIntoCompressedBase64(big);
    big.destroy();
    const [summary] = mergeSummaries([[encoded], [encoded]], 1);
    assert.equal(summary!.count, 1e10);
    near(summary!.p50, 500, 'p50');
  });

  it('encodes a cell counted past 2^32 in a worker', () => {
    const h = new NodeHistograms(1);
    try {
      // 5 billion records would take minutes: the count is set as they would have left it.
      (h as unknown as { counts: Float64Array }).counts[countsIndex(500)] = 5e9;
      h.record(0, 500);
      h.record(0, 9000);
      const [summary] = mergeSummaries([h.encode()], 1);
      assert.equal(summary!.count, 5e9 + 2);
      near(summary!.p50, 500, 'p50');
      near(summary!.max, 9000, 'max');
    } finally {
      h.destroy();
    }
  });

  it("merges two threads' histograms per node into percentiles of all their values", () => {
    const a = new NodeHistograms(2);
    const b = new NodeHistograms(2);
    try {
      for (let us = 1; us <= 1000; us++) a.record(0, us);
      for (let us = 1001; us <= 2000; us++) b.record(0, us);
      b.record(1, 700);
      const [first, second] = mergeSummaries([a.encode(), b.encode()], 2);
      assert.equal(first!.count, 2000);
      near(first!.p50, 1000, 'p50');
      near(first!.p95, 1900, 'p95');
      near(first!.p99, 1980, 'p99');
      near(first!.p999, 1998, 'p99.9');
      near(first!.max, 2000, 'max');
      // Node 1 recorded on one thread only; the other thread has nothing for it.
      assert.equal(second!.count, 1);
      near(second!.p50, 700, 'node 1 p50');
    } finally {
      a.destroy();
      b.destroy();
    }
  });

  it('encodes nothing for a node no value was recorded for, and summarises it as zeros', () => {
    const h = new NodeHistograms(2);
    try {
      h.record(1, 5);
      const encoded = h.encode();
      assert.equal(encoded[0], null);
      assert.equal(typeof encoded[1], 'string');
      assert.deepEqual(mergeSummaries([encoded], 2)[0], { count: 0, p50: 0, p95: 0, p99: 0, p999: 0, max: 0 });
    } finally {
      h.destroy();
    }
  });

  it('clamps values to 1 us .. one minute', () => {
    const h = new NodeHistograms(1);
    try {
      h.record(0, 0.2);
      h.record(0, 1e12);
      const [summary] = mergeSummaries([h.encode()], 1);
      assert.equal(summary!.count, 2);
      near(summary!.p50, 1, 'the smallest');
      near(summary!.max, 60_000_000, 'the largest');
    } finally {
      h.destroy();
    }
  });
});
