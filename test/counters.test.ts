/**
 * Shared-memory counters: one slot per thread, summed by readers; a worker's slot batched in
 * plain memory and flushed (on a timer, and when asked before `/stats`).
 */
import assert from 'node:assert/strict';
import { describe, it, mock } from 'node:test';
import { C_HEDGES, C_HINTS_PENDING, C_REQUESTS, C_WEBSOCKETS, CounterSlot, FLUSH_MS, N_ATTEMPTS, N_INFLIGHT, addTotals, counterBytes, endedTotals, readTotals, totalsById } from '../src/metrics/counters.js';

const NODES = 3;
const SLOTS = 3;

describe('counters', () => {
  it('sums every slot; an unbatched slot shows each bump at once', () => {
    const buffer = new SharedArrayBuffer(counterBytes(SLOTS, NODES));
    const main = new CounterSlot(buffer, 0, NODES);
    const other = new CounterSlot(buffer, 2, NODES);
    main.bump(C_REQUESTS);
    other.bump(C_REQUESTS);
    other.bumpNode(1, N_ATTEMPTS);
    other.bumpNode(1, N_INFLIGHT);
    other.dropNode(1, N_INFLIGHT);
    const totals = readTotals(buffer, SLOTS, NODES);
    assert.equal(totals.requests, 2);
    assert.deepEqual(totals.nodes[1], { attempts: 1, failures: 0, inflight: 0, wins: 0 });
  });

  it('holds a batched slot\'s counts until flush(), then adds them exactly', () => {
    const buffer = new SharedArrayBuffer(counterBytes(SLOTS, NODES));
    const worker = new CounterSlot(buffer, 1, NODES, true);
    for (let i = 0; i < 1_000; i++) worker.bump(C_REQUESTS);
    worker.bump(C_HEDGES);
    worker.bumpNode(2, N_INFLIGHT);
    worker.bumpNode(2, N_INFLIGHT);
    worker.dropNode(2, N_INFLIGHT);
    assert.equal(readTotals(buffer, SLOTS, NODES).requests, 0);
    worker.flush();
    const totals = readTotals(buffer, SLOTS, NODES);
    assert.equal(totals.requests, 1_000);
    assert.equal(totals.hedges, 1);
    assert.equal(totals.nodes[2]!.inflight, 1);
    // A second flush adds nothing twice.
    worker.flush();
    assert.equal(readTotals(buffer, SLOTS, NODES).requests, 1_000);
    // In-flight counts may go below zero in a batch (ends flushed after their starts).
    worker.dropNode(2, N_INFLIGHT);
    worker.flush();
    assert.equal(readTotals(buffer, SLOTS, NODES).nodes[2]!.inflight, 0);
  });

  it('flushes a batched slot by itself within FLUSH_MS of the first bump', () => {
    mock.timers.enable({ apis: ['setTimeout'] });
    try {
      const buffer = new SharedArrayBuffer(counterBytes(SLOTS, NODES));
      const worker = new CounterSlot(buffer, 1, NODES, true);
      worker.bump(C_REQUESTS);
      mock.timers.tick(FLUSH_MS - 1);
      worker.bump(C_REQUESTS);
      assert.equal(readTotals(buffer, SLOTS, NODES).requests, 0);
      mock.timers.tick(1);
      assert.equal(readTotals(buffer, SLOTS, NODES).requests, 2);
      // The next bump after a flush arms the timer again.
      worker.bump(C_REQUESTS);
      mock.timers.tick(FLUSH_MS);
      assert.equal(readTotals(buffer, SLOTS, NODES).requests, 3);
    } finally {
      mock.timers.reset();
    }
  });

  it('carries a reload\'s counts by node id: an ended front door\'s gauges are zero, its counters kept', () => {
    const old = new SharedArrayBuffer(counterBytes(1, 2));
    const oldSlot = new CounterSlot(old, 0, 2);
    oldSlot.bump(C_REQUESTS);
    oldSlot.bump(C_WEBSOCKETS);
    oldSlot.bump(C_HINTS_PENDING);
    oldSlot.bumpNode(0, N_ATTEMPTS);
    oldSlot.bumpNode(1, N_ATTEMPTS);
    oldSlot.bumpNode(1, N_INFLIGHT);
    const ended = endedTotals(totalsById(readTotals(old, 1, 2), ['a', 'b']));
    assert.equal(ended.requests, 1);
    assert.equal(ended.websockets, 0);
    assert.equal(ended.hintsPending, 0);
    assert.deepEqual(ended.nodes.get('b'), { attempts: 1, failures: 0, inflight: 0, wins: 0 });
    // The new configuration has node b and a new c; a is kept in the totals all the same.
    const now = new SharedArrayBuffer(counterBytes(1, 2));
    const slot = new CounterSlot(now, 0, 2);
    slot.bump(C_REQUESTS);
    slot.bump(C_WEBSOCKETS);
    slot.bumpNode(0, N_ATTEMPTS);
    const totals = totalsById(readTotals(now, 1, 2), ['b', 'c']);
    addTotals(totals, ended);
    assert.equal(totals.requests, 2);
    assert.equal(totals.websockets, 1);
    assert.equal(totals.nodes.get('b')!.attempts, 2);
    assert.equal(totals.nodes.get('c')!.attempts, 0);
    assert.equal(totals.nodes.get('a')!.attempts, 1);
    // Adding does not share node records with the source.
    totals.nodes.get('a')!.attempts++;
    assert.equal(ended.nodes.get('a')!.attempts, 1);
  });
});
