import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { describe, it } from 'node:test';
import { EARLY_MS, HedgeClock, type HedgeTimed } from '../src/forward/hedge-clock.js';

/** A trigger that notes when it fired (on the mocked clock). */
class Trigger implements HedgeTimed {
  hedgeSlot = -1;
  firedAt = -1;
  constructor(
    readonly name: string,
    private readonly clock: { now: number },
    private readonly fired: Trigger[],
  ) {}
  onHedgeTimer(): void {
    assert.equal(this.hedgeSlot, -1, 'the clock lets go of a trigger before it fires');
    this.firedAt = this.clock.now;
    this.fired.push(this);
  }
}

/**
 * Node's setTimeout mocked and performance.now() moved with it, a tenth of a millisecond at a
 * time: `advance(ms)`.
 */
function mockedTime(t: { mock: { timers: { enable(o: { apis: 'setTimeout'[] }): void; tick(ms: number): void }; method: (...a: never[]) => unknown } }) {
  const state = { now: 10_000 };
  t.mock.timers.enable({ apis: ['setTimeout'] });
  (t.mock.method as unknown as (o: object, m: string, f: () => number) => void)(performance, 'now', () => state.now);
  let sub = 0;
  const advance = (ms: number): void => {
    for (let i = 0; i < Math.round(ms * 10); i++) {
      state.now = Math.round((state.now + 0.1) * 10) / 10;
      // The mocked timers count whole milliseconds, as Node's do.
      if (++sub === 10) {
        sub = 0;
        t.mock.timers.tick(1);
      }
    }
  };
  return { state, advance };
}

/** A small deterministic generator (the same draws every run). */
function lcg(seed: number): () => number {
  let x = seed >>> 0;
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0;
    return x / 2 ** 32;
  };
}

/**
 * Fired in the order they came due: a trigger fired at a later wake than another was due after
 * it (one due sooner would have fired at that wake). Triggers fired at one wake may be in any order.
 */
function assertDueOrder(fired: Trigger[], due: Map<Trigger, number>): void {
  let before = -Infinity;
  let groupMax = -Infinity;
  let groupAt = Number.NaN;
  for (const trigger of fired) {
    if (trigger.firedAt !== groupAt) {
      before = Math.max(before, groupMax);
      groupMax = -Infinity;
      groupAt = trigger.firedAt;
    }
    const at = due.get(trigger)!;
    assert.ok(at > before, `${trigger.name} (due ${at}) fired at a wake after one that fired a trigger due at ${before}`);
    groupMax = Math.max(groupMax, at);
  }
}

describe('HedgeClock', () => {
  it('fires each trigger once, soonest first, never more than EARLY_MS before it is due nor a whole millisecond after', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    const random = lcg(7);
    const due = new Map<Trigger, number>();
    // Armed at different times with different delays, so the heap is not armed in due order.
    for (let i = 0; i < 200; i++) {
      const trigger = new Trigger(`t${i}`, state, fired);
      const at = state.now + 0.2 + random() * 40;
      due.set(trigger, at);
      clock.arm(trigger, at, state.now);
      if (i % 10 === 9) advance(0.3);
    }
    advance(60);
    assert.equal(fired.length, 200, 'every trigger fired');
    assert.equal(new Set(fired).size, 200, 'each once');
    assert.equal(clock.waiting, 0);
    for (const trigger of fired) {
      const late = trigger.firedAt - due.get(trigger)!;
      assert.ok(late >= -EARLY_MS - 1e-9, `${trigger.name} fired ${-late} ms early`);
      assert.ok(late < 1.5, `${trigger.name} fired ${late} ms late`);
    }
    assertDueOrder(fired, due);
  });

  it('a disarmed trigger never fires; the others still do, at their time', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    const random = lcg(11);
    const triggers: Trigger[] = [];
    const due = new Map<Trigger, number>();
    for (let i = 0; i < 3_000; i++) {
      const trigger = new Trigger(`t${i}`, state, fired);
      triggers.push(trigger);
      due.set(trigger, state.now + 1 + random() * 20);
      clock.arm(trigger, due.get(trigger)!, state.now);
    }
    // Every third one is answered before its trigger: out of the middle of the heap, in no order.
    const disarmed = new Set(triggers.filter((_, i) => i % 3 === 1));
    for (const trigger of [...disarmed].sort(() => random() - 0.5)) {
      clock.disarm(trigger);
      assert.equal(trigger.hedgeSlot, -1);
    }
    // Disarming twice, or one never armed, changes nothing.
    clock.disarm([...disarmed][0]!);
    clock.disarm(new Trigger('never armed', state, fired));
    assert.equal(clock.waiting, 2_000);
    advance(25);
    assert.equal(fired.length, 2_000);
    assertDueOrder(fired, due);
    for (const trigger of fired) {
      assert.ok(!disarmed.has(trigger), `${trigger.name} was disarmed and fired`);
      // Each at its time: what moved to fill a disarmed one's place kept the heap in order.
      const late = trigger.firedAt - due.get(trigger)!;
      assert.ok(late >= -EARLY_MS - 1e-9 && late < 1.5, `${trigger.name} fired ${late} ms from its due time`);
    }
  });

  it('arming a waiting trigger again moves it: it fires once, at its new time', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    const trigger = new Trigger('moved', state, fired);
    clock.arm(trigger, state.now + 5, state.now);
    clock.arm(trigger, state.now + 12, state.now);
    assert.equal(clock.waiting, 1);
    advance(10);
    assert.equal(fired.length, 0, 'not at its first time');
    advance(5);
    assert.equal(fired.length, 1);
    assert.ok(trigger.firedAt >= 10_012 - EARLY_MS && trigger.firedAt < 10_013.5, `fired at ${trigger.firedAt}`);
  });

  it('a trigger due sooner than the pending wake moves the wake forward', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    const late = new Trigger('late', state, fired);
    const soon = new Trigger('soon', state, fired);
    clock.arm(late, state.now + 50, state.now);
    clock.arm(soon, state.now + 3, state.now);
    advance(4);
    assert.deepEqual(fired, [soon], 'the sooner one did not wait for the later wake');
    advance(50);
    assert.deepEqual(fired, [soon, late]);
  });

  it('a trigger armed by a trigger as it fires waits its turn: the wake is asked for the soonest', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    const later = new Trigger('later', state, fired);
    const first = new Trigger('first', state, fired);
    // As an exchange whose hedge fails over re-arms: a trigger armed inside the wake.
    first.onHedgeTimer = function (this: Trigger) {
      Trigger.prototype.onHedgeTimer.call(this);
      clock.arm(later, state.now + 30, state.now);
    };
    const sooner = new Trigger('sooner', state, fired);
    clock.arm(first, state.now + 2, state.now);
    clock.arm(sooner, state.now + 20, state.now);
    advance(3);
    assert.deepEqual(fired, [first]);
    advance(19);
    assert.deepEqual(fired, [first, sooner], 'the one due sooner did not wait for the one armed in the wake');
    advance(12);
    assert.deepEqual(fired, [first, sooner, later]);
  });

  it('asks for its wake again when the one it waits for is long overdue (a timer that never came)', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    // A wake asked for with the real timers, which the mocked ones below never run.
    t.mock.timers.reset();
    const stranded = new Trigger('stranded', state, fired);
    clock.arm(stranded, state.now + 2, state.now);
    t.mock.timers.enable({ apis: ['setTimeout'] });
    state.now += 10;
    const next = new Trigger('next', state, fired);
    clock.arm(next, state.now + 2, state.now);
    advance(3);
    assert.deepEqual(fired.map((f) => f.name), ['stranded', 'next']);
  });

  it('holds no trigger once it has fired or been disarmed', (t) => {
    const { state, advance } = mockedTime(t);
    const clock = new HedgeClock();
    const fired: Trigger[] = [];
    for (let i = 0; i < 100; i++) clock.arm(new Trigger(`t${i}`, state, fired), state.now + 1 + (i % 7), state.now);
    const kept = new Trigger('kept', state, fired);
    clock.arm(kept, state.now + 2, state.now);
    clock.disarm(kept);
    advance(10);
    assert.equal(fired.length, 100);
    const items = (clock as unknown as { items: (HedgeTimed | null)[] }).items;
    assert.ok(items.every((item) => item === null), 'every slot let go of its trigger');
  });
});
