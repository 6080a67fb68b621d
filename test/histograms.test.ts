/**
 * Latency histograms: what a worker records, encodes and the control plane merges into /stats'
 * per-node summaries (HDR, three significant digits, microseconds).
 */
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { NodeHistograms, mergeSummaries } from '../src/metrics/histograms.js';

/** HDR with three significant digits: a value read back is within 0.1% of the one recorded. */
function near(actual: number, expected: number, what: string): void {
  assert.ok(Math.abs(actual - expected) <= expected / 1000 + 1, `${what}: ${actual}, expected about ${expected}`);
}

describe('latency histograms', () => {
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
