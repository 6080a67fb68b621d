import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { LatencyWindow } from '../src/router/index.js';
import { SampleWindow } from '../src/forward/latency.js';

describe('LatencyWindow', () => {
  it('has no percentile until a node has 8 samples', () => {
    const w = new LatencyWindow();
    for (let i = 1; i <= 7; i++) {
      w.record('a', i);
      assert.equal(w.percentile('a', 95), undefined);
    }
    w.record('a', 8);
    assert.equal(w.count('a'), 8);
    assert.equal(w.percentile('a', 95), 8);
    assert.equal(w.percentile('a', 50), 4);
    assert.equal(w.percentile('never-seen', 95), undefined);
    assert.equal(w.count('never-seen'), 0);
  });

  it('keeps the last 128 samples only', () => {
    const w = new LatencyWindow();
    for (let i = 0; i < 128; i++) w.record('a', 1000);
    for (let i = 1; i <= 128; i++) w.record('a', i);
    assert.equal(w.count('a'), 128);
    // Nearest rank: p95 of 1..128 is the 122nd value.
    assert.equal(w.percentile('a', 95), 122);
    assert.equal(w.percentile('a', 100), 128);
  });

  it('keeps nodes apart', () => {
    const w = new LatencyWindow();
    for (let i = 0; i < 10; i++) {
      w.record('fast', 1);
      w.record('slow', 100);
    }
    assert.equal(w.percentile('fast', 95), 1);
    assert.equal(w.percentile('slow', 95), 100);
  });
});

describe('SampleWindow.triggerMs (the hedge trigger)', () => {
  it('falls back below 8 samples, then follows the p95 within a few samples', () => {
    const s = new SampleWindow();
    for (let i = 0; i < 7; i++) s.record(1);
    assert.equal(s.triggerMs(95, 250), 250);
    s.record(1);
    assert.equal(s.triggerMs(95, 250), 1);
    for (let i = 0; i < 128; i++) s.record(40);
    assert.equal(s.triggerMs(95, 250), 40);
  });

  it('stays exact while samples arrive between queries (checked against a sort)', () => {
    let seed = 7;
    const random = (): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    // Values on grids from two values (ties everywhere) to a thousand (few ties): how far a sample
    // moves, and past how many equal ones, depends on it.
    for (const steps of [2, 5, 50, 1_000]) {
      const s = new SampleWindow();
      const all: number[] = [];
      for (let i = 0; i < 2_000; i++) {
        const ms = Math.round(random() * steps) / 10;
        s.record(ms);
        all.push(ms);
        if (i % 3 === 0 || i > 1_900) {
          const held = all.slice(-128).sort((a, b) => a - b);
          for (const p of [50, 95, 99, 100]) {
            const want = held.length < 8 ? 250 : held[Math.max(1, Math.ceil((p / 100) * held.length)) - 1];
            assert.equal(s.triggerMs(p, 250), want, `grid ${steps}, sample ${i}, p${p}`);
          }
          // Every rank, so the whole ordered copy is checked, not four places of it.
          if (held.length >= 8 && i % 9 === 0) {
            for (let k = 1; k <= held.length; k++) assert.equal(s.triggerMs(((k - 0.5) / held.length) * 100, 250), held[k - 1], `grid ${steps}, sample ${i}, rank ${k}`);
          }
        }
      }
    }
  });

  it('stays exact asked one percentile at every sample, as the hedge trigger is, however the latencies move', () => {
    let seed = 11;
    const random = (): number => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
    // Steady noise, a climb (every new sample the largest), a fall (every sample leaving the
    // ring one of the largest), a saw-tooth, and two values only (ties everywhere).
    const shapes: Record<string, (i: number) => number> = {
      noise: () => Math.round(random() * 1_000) / 100,
      climb: (i) => i / 10,
      fall: (i) => (5_000 - i) / 10,
      saw: (i) => (i % 300) / 10 + random(),
      ties: () => (random() < 0.9 ? 1 : 2),
    };
    for (const [shape, next] of Object.entries(shapes)) {
      for (const p of [95, 99, 100, 90]) {
        const s = new SampleWindow();
        const all: number[] = [];
        for (let i = 0; i < 1_500; i++) {
          const ms = next(i);
          s.record(ms);
          all.push(ms);
          const held = all.slice(-128).sort((a, b) => a - b);
          const want = held.length < 8 ? 250 : held[Math.max(1, Math.ceil((p / 100) * held.length)) - 1];
          assert.equal(s.triggerMs(p, 250), want, `${shape}, p${p}, sample ${i}`);
        }
      }
    }
  });

  it('asked a lower percentile later, still exact for both', () => {
    const s = new SampleWindow();
    const all: number[] = [];
    for (let i = 0; i < 600; i++) {
      const ms = (i * 7919) % 1_000;
      s.record(ms);
      all.push(ms);
      const held = all.slice(-128).sort((a, b) => a - b);
      if (held.length < 8) continue;
      const at = (p: number): number => held[Math.max(1, Math.ceil((p / 100) * held.length)) - 1]!;
      assert.equal(s.triggerMs(95, 250), at(95), `p95 at ${i}`);
      if (i >= 300) assert.equal(s.triggerMs(50, 250), at(50), `p50 at ${i}`);
    }
  });

  it('moves the one sample between the evicted and the new one down a place', () => {
    const s = new SampleWindow();
    s.record(1.0);
    s.record(1.1);
    for (let i = 0; i < 126; i++) s.record(5);
    assert.equal(s.triggerMs(0.1, 250), 1.0);
    // Evicts 1.0 (the oldest); 1.1 moves down, 1.2 takes its place.
    s.record(1.2);
    assert.equal(s.triggerMs(0.1, 250), 1.1);
    assert.equal(s.triggerMs(1, 250), 1.2);
    assert.equal(s.triggerMs(2, 250), 5);
  });

  it('ignores negative and NaN samples', () => {
    const s = new SampleWindow();
    s.record(-1);
    s.record(Number.NaN);
    assert.equal(s.count, 0);
  });
});
