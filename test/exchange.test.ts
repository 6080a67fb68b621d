import assert from 'node:assert/strict';
import { EventEmitter, once } from 'node:events';
import { describe, it } from 'node:test';
import { ErrorCodes } from '../src/errors.js';
import { performance } from 'node:perf_hooks';
import { HedgeBudget, WAIT_CAPACITY } from '../src/forward/budget.js';
import { Exchange, retryAfterSeconds, type ExchangeDriver } from '../src/forward/exchange.js';
import { HeaderFields } from '../src/forward/fields.js';

interface Started {
  node: number;
  ordinal: number;
  aborted: boolean;
}

/** A driver whose transport is the test itself: attempts end when the test says so. */
class ScriptedDriver extends EventEmitter implements ExchangeDriver {
  readonly started: Started[] = [];
  readonly tally = { hedges: 0, hedgeWins: 0, failovers: 0 };
  readonly counters = {
    hedge: () => void this.tally.hedges++,
    hedgeDenied: () => void this.denied++,
    hedgeWin: () => void this.tally.hedgeWins++,
    failover: () => void this.tally.failovers++,
  };
  settledWith: Exchange | null = null;
  denied = 0;
  /** What the hedge budget answers. */
  budgetAllows = true;
  allowHedge(_fromList: boolean): boolean {
    return this.budgetAllows;
  }
  /** What the budget says before arming (a token is there). */
  affordable = true;
  hedgeAffordable(): boolean {
    return this.affordable;
  }
  /** Exchanges the driver was asked to keep waiting for a token, and when each was due. */
  readonly waits: { exchange: Exchange; dueAt: number }[] = [];
  hedgeWait(exchange: Exchange, dueAt: number): boolean {
    this.waits.push({ exchange, dueAt });
    return true;
  }
  hedgeMayWait(): boolean {
    return true;
  }
  readonly outcomes: boolean[] = [];
  hedgeOutcome(won: boolean): void {
    this.outcomes.push(won);
  }
  constructor(readonly delayMs = 5) {
    super();
  }
  startAttempt(_exchange: Exchange, node: number, ordinal: number) {
    const record: Started = { node, ordinal, aborted: false };
    this.started.push(record);
    this.emit('start', record);
    return { abort: () => void (record.aborted = true) };
  }
  hedgeDelayMs(): number {
    return this.delayMs;
  }
  settle(exchange: Exchange): void {
    assert.equal(this.settledWith, null, 'settled twice');
    this.settledWith = exchange;
    this.emit('settled', exchange);
  }
}

function exchangeOver(driver: ScriptedDriver, nodes: number[], retryable: boolean): Exchange {
  const ex = new Exchange(driver, nodes.length);
  nodes.forEach((n, i) => (ex.candidates[i] = n));
  ex.count = nodes.length;
  ex.retryable = retryable;
  ex.hedgeEnabled = retryable;
  return ex;
}

const body = Buffer.from('ok');

/**
 * Mocked timers and a performance.now() that moves with them (the budget's due times are
 * performance.now() times): `tick(ms)` advances both.
 */
function fakeClock(t: { mock: { timers: { enable(o: { apis: 'setTimeout'[] }): void; tick(ms: number): void }; method: (...a: never[]) => unknown } }): (ms: number) => void {
  let now = 1_000;
  t.mock.timers.enable({ apis: ['setTimeout'] });
  (t.mock.method as unknown as (o: object, m: string, f: () => number) => void)(performance, 'now', () => now);
  return (ms: number) => {
    // A millisecond at a time, so each timer runs at its own time.
    for (let i = 0; i < ms; i++) {
      now += 1;
      t.mock.timers.tick(1);
    }
  };
}

describe('Exchange', () => {
  it('answers 503 NO_HEALTHY_NODE with no candidate', () => {
    const driver = new ScriptedDriver();
    const ex = exchangeOver(driver, [], true);
    ex.begin();
    assert.equal(driver.settledWith, ex);
    assert.equal(ex.failure?.code, ErrorCodes.NO_HEALTHY_NODE);
    assert.equal(ex.failure?.status, 503);
    assert.equal(driver.started.length, 0);
  });

  it('a primary that answers in time is the only attempt', () => {
    const driver = new ScriptedDriver(1_000);
    const ex = exchangeOver(driver, [2, 0, 1], true);
    ex.begin();
    ex.answered(0, 200, null, body, 3);
    assert.equal(ex.servedBy, 2);
    assert.equal(ex.hedged, false);
    assert.deepEqual(driver.started.map((s) => s.node), [2]);
    assert.deepEqual(driver.tally, { hedges: 0, hedgeWins: 0, failovers: 0 });
  });

  it('hedges to the runner-up when the primary is late; the hedge wins and the primary is aborted', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(5);
    const ex = exchangeOver(driver, [1, 2, 0], true);
    ex.begin();
    t.mock.timers.tick(4);
    assert.equal(driver.started.length, 1, 'not before the trigger');
    t.mock.timers.tick(1);
    const hedge = driver.started[1]!;
    assert.equal(hedge.node, 2);
    assert.equal(ex.hedged, true);
    ex.answered(1, 200, null, body, 4);
    assert.equal(ex.servedBy, 2);
    assert.equal(driver.started[0]!.aborted, true, 'the loser is aborted');
    assert.deepEqual(driver.tally, { hedges: 1, hedgeWins: 1, failovers: 0 });
    assert.deepEqual(driver.outcomes, [true], 'the budget hears the hedge won');
    // A late report from the aborted loser changes nothing.
    ex.answered(0, 200, null, body, 50);
    assert.equal(ex.servedBy, 2);
  });

  it('when the primary beats its own hedge, the hedge is aborted and is no win', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(5);
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    t.mock.timers.tick(5);
    ex.answered(0, 200, null, body, 7);
    assert.equal(ex.servedBy, 0);
    assert.equal(driver.started[1]!.aborted, true);
    assert.deepEqual(driver.tally, { hedges: 1, hedgeWins: 0, failovers: 0 });
    assert.deepEqual(driver.outcomes, [false], 'the budget hears the hedge lost');
  });

  it('does not hedge when the hedge budget is spent: it waits for a token, due one trigger later', (t) => {
    const tick = fakeClock(t);
    const driver = new ScriptedDriver(5);
    driver.budgetAllows = false;
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    const fired = performance.now() + 5;
    tick(1_000);
    assert.equal(driver.started.length, 1);
    assert.equal(ex.hedged, false);
    assert.deepEqual(driver.waits, [{ exchange: ex, dueAt: fired + 5 }], 'due at twice its trigger');
    assert.equal(driver.denied, 0, 'not denied yet: it may still get a token');
    ex.answered(0, 200, null, body, 900);
    assert.equal(ex.servedBy, 0);
  });

  it('with no list to wait on (the budget has shrunk), a hedge the budget refuses is denied at its trigger', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(5);
    driver.budgetAllows = false;
    driver.hedgeMayWait = () => false;
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    t.mock.timers.tick(5);
    assert.deepEqual(driver.waits, []);
    assert.equal(driver.started.length, 1);
    assert.equal(driver.denied, 0, 'counted when it settles');
    ex.answered(0, 200, null, body, 40);
    assert.equal(driver.denied, 1);
  });

  it('arms no hedge while the budget holds no token', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(5);
    driver.affordable = false;
    const ex = exchangeOver(driver, [0, 1], true);
    const before = performance.now();
    ex.begin();
    t.mock.timers.tick(1_000);
    assert.equal(driver.started.length, 1);
    assert.equal(driver.denied, 0, 'nothing was due: no timer was set');
    assert.equal(ex.hedged, false);
    assert.equal(driver.waits.length, 1, 'it waits for a token instead');
    const { dueAt } = driver.waits[0]!;
    assert.ok(dueAt >= before + 10 && dueAt <= performance.now() + 10, `due at twice its trigger: ${dueAt - before}`);
    ex.answered(0, 200, null, body, 900);
    assert.deepEqual(driver.outcomes, []);
    assert.equal(ex.wantsHedge, false, 'answered: a token would be wasted on it');
  });

  it('fires at most one hedge', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(2);
    const ex = exchangeOver(driver, [0, 1, 2, 3], true);
    ex.begin();
    t.mock.timers.tick(2);
    t.mock.timers.tick(1_000);
    assert.equal(driver.started.length, 2);
    ex.answered(1, 200, null, body, 1);
  });

  it('a bare write gets one attempt: no hedge however slow, and a failure is reported as unknown', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(1);
    const ex = exchangeOver(driver, [0, 1, 2], false);
    ex.begin();
    t.mock.timers.tick(60_000);
    assert.equal(driver.started.length, 1);
    ex.failed(0, new Error('ECONNRESET'));
    assert.equal(driver.started.length, 1, 'never failed over');
    assert.equal(ex.failure?.code, ErrorCodes.OUTCOME_UNKNOWN);
    assert.equal(ex.failure?.status, 502);
    assert.deepEqual(driver.tally, { hedges: 0, hedgeWins: 0, failovers: 0 });
  });

  it('a bare write that provably never left (connection refused) is answered 503 NOT_SENT, not resent', () => {
    const driver = new ScriptedDriver(1_000);
    const ex = exchangeOver(driver, [0, 1, 2], false);
    ex.begin();
    ex.failed(0, Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }));
    assert.equal(driver.started.length, 1, 'never failed over (the route does not allow it)');
    assert.equal(ex.failure?.code, ErrorCodes.NOT_SENT);
    assert.equal(ex.failure?.status, 503);
  });

  it('a bare write relays a 503 answer rather than retrying it', () => {
    const driver = new ScriptedDriver(1_000);
    const ex = exchangeOver(driver, [0, 1], false);
    ex.begin();
    ex.answered(0, 503, null, body, 1);
    assert.equal(ex.failure, null);
    assert.equal(ex.status, 503);
    assert.equal(driver.started.length, 1);
  });

  it('a retryable request fails over down the ranking in order, then answers 502', () => {
    const driver = new ScriptedDriver(1_000);
    const ex = exchangeOver(driver, [3, 1, 0, 2], true);
    ex.begin();
    ex.failed(0, new Error('refused'));
    ex.answered(1, 503, null, body, 1); // gateway failure: counts as failed
    ex.failed(2, new Error('timeout'));
    ex.answered(3, 502, null, body, 1);
    assert.deepEqual(driver.started.map((s) => s.node), [3, 1, 0, 2]);
    assert.equal(ex.failure?.code, ErrorCodes.ALL_CANDIDATES_FAILED);
    assert.equal(ex.failure?.status, 502);
    assert.equal(driver.tally.failovers, 3);
  });

  it('a retryable request every node failed, some of them shedding load (503 with a Retry-After), is answered 503 with the soonest one', () => {
    const shed = (wait: string) => HeaderFields.fromRaw([Buffer.from('retry-after'), Buffer.from(wait)]);
    const driver = new ScriptedDriver(1_000);
    const ex = exchangeOver(driver, [0, 1, 2, 3], true);
    ex.begin();
    ex.answered(0, 503, shed('30'), body, 1);
    ex.failed(1, new Error('refused'));
    ex.answered(2, 503, shed(new Date(Date.now() + 12_000).toUTCString()), body, 1);
    ex.answered(3, 503, shed('soon'), body, 1); // not a Retry-After: a plain 503
    assert.equal(ex.failure?.code, ErrorCodes.NODES_SHEDDING);
    assert.equal(ex.failure?.status, 503);
    assert.ok(ex.retryAfter >= 11 && ex.retryAfter <= 12, `the HTTP-date's ${ex.retryAfter} s, sooner than 30`);
    assert.deepEqual(ex.reasons?.slice(0, 1), ['answered 503, retry after 30 s']);
    // None said when: the seed's 502.
    const plain = exchangeOver(new ScriptedDriver(1_000), [0, 1], true);
    plain.begin();
    plain.answered(0, 503, shed('soon'), body, 1);
    plain.answered(1, 503, null, body, 1);
    assert.equal(plain.failure?.code, ErrorCodes.ALL_CANDIDATES_FAILED);
    assert.equal(plain.retryAfter, -1);
  });

  it('reads a Retry-After as delay-seconds or an HTTP-date, at most a day', () => {
    const now = Date.parse('Tue, 01 Dec 2026 04:00:00 GMT');
    assert.equal(retryAfterSeconds('5', now), 5);
    assert.equal(retryAfterSeconds(' 0 ', now), 0);
    assert.equal(retryAfterSeconds('Tue, 01 Dec 2026 04:01:30 GMT', now), 90);
    assert.equal(retryAfterSeconds('Tue, 01 Dec 2026 03:00:00 GMT', now), 0, 'a date past is now');
    assert.equal(retryAfterSeconds('9999999', now), 86_400);
    // The obsolete forms RFC 9110 asks recipients to take: asctime is in GMT, whatever the zone here.
    assert.equal(retryAfterSeconds('Tuesday, 01-Dec-26 04:01:00 GMT', now), 60);
    assert.equal(retryAfterSeconds('Tue Dec  1 04:02:00 2026', now), 120);
    for (const bad of ['', '-1', '1.5', 'soon', '12 s', '2026-12-01', 'Jan 2026', 'Thu 1', 'Tue, 01 Dec 2026 04:01:30 PST', 'Tue, 1 Dec 2026 04:01:30 GMT']) assert.equal(retryAfterSeconds(bad, now), -1, bad);
  });

  it('a retryable request that fails over is answered by the next node', () => {
    const driver = new ScriptedDriver(1_000);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    ex.failed(0, new Error('reset'));
    ex.answered(1, 200, null, body, 2);
    assert.equal(ex.servedBy, 1);
    assert.equal(ex.hedged, false);
    assert.equal(driver.tally.failovers, 1);
  });

  it('does not fail over while a hedge is still racing', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(2);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    t.mock.timers.tick(2);
    ex.failed(0, new Error('reset'));
    assert.equal(driver.started.length, 2, 'waits for the running hedge');
    ex.answered(1, 200, null, body, 2);
    assert.equal(ex.servedBy, 1);
    assert.equal(driver.tally.failovers, 0);
  });

  it('fails over at once when the hedge fails while the primary it raced hangs', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(2);
    const ex = exchangeOver(driver, [0, 1, 2, 3], true);
    ex.begin();
    t.mock.timers.tick(2);
    assert.equal(driver.started.length, 2, 'hedged');
    // The hedge fails; the primary, already past its trigger, is still running.
    ex.failed(1, new Error('reset'));
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1, 2], 'the next node is tried now');
    assert.equal(driver.started[0]!.aborted, false, 'the primary keeps racing');
    assert.equal(driver.tally.failovers, 1);
    // So is the one after it, if that fails too.
    ex.answered(2, 503, null, body, 1);
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1, 2, 3]);
    // With no candidate left, the primary is waited for, not given up on.
    ex.failed(3, new Error('reset'));
    assert.equal(driver.settledWith, null);
    ex.answered(0, 200, null, body, 40);
    assert.equal(ex.servedBy, 0);
    assert.equal(driver.tally.hedges, 1, 'failovers are no further hedges');
  });

  it('re-arms the hedge clock for the node that takes over after a failover', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(10);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    t.mock.timers.tick(6);
    ex.failed(0, new Error('reset'));
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1]);
    t.mock.timers.tick(9);
    assert.equal(driver.started.length, 2, 'the old clock was cleared');
    t.mock.timers.tick(1);
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1, 2]);
    assert.equal(ex.hedged, true);
    ex.answered(2, 200, null, body, 1);
    assert.equal(ex.servedBy, 2);
    assert.deepEqual(driver.outcomes, [true]);
    assert.equal(driver.tally.hedgeWins, 1);
  });

  it('an answer from a failover attempt is no hedge win', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(10);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    t.mock.timers.tick(10);
    assert.equal(ex.hedged, true, 'hedged to node 1');
    ex.failed(1, new Error('reset'));
    ex.failed(0, new Error('reset'));
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1, 2], 'failed over to node 2');
    ex.answered(2, 200, null, body, 1);
    assert.equal(driver.tally.hedgeWins, 0);
    assert.deepEqual(driver.outcomes, [false], 'the hedge did not answer first');
  });

  it('cancel aborts every attempt and settles nothing', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const driver = new ScriptedDriver(2);
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    t.mock.timers.tick(2);
    ex.cancel();
    assert.ok(driver.started.every((s) => s.aborted));
    ex.answered(0, 200, null, body, 1);
    assert.equal(driver.settledWith, null);
  });
});

/** A scripted driver whose hedge decisions are a real HedgeBudget's. */
class BudgetDriver extends ScriptedDriver {
  constructor(
    readonly budget: HedgeBudget,
    delayMs: number,
  ) {
    super(delayMs);
  }
  override allowHedge(fromList: boolean): boolean {
    return this.budget.spend(fromList);
  }
  override hedgeAffordable(): boolean {
    return this.budget.affordable;
  }
  override hedgeWait(exchange: Exchange, dueAt: number): boolean {
    super.hedgeWait(exchange, dueAt);
    return this.budget.wait(exchange, dueAt);
  }
  override hedgeMayWait(): boolean {
    return this.budget.waits;
  }
}

/** A budget of `percent` with its saved tokens spent. */
function spentBudget(percent: number): HedgeBudget {
  const budget = new HedgeBudget(percent, 1);
  assert.equal(budget.spend(), true);
  assert.equal(budget.affordable, false);
  return budget;
}

describe('waiting for the hedge budget', () => {
  it('a request that found the budget spent is hedged by the next token once due and unanswered', () => {
    const budget = spentBudget(50);
    const driver = new BudgetDriver(budget, 0);
    const ex = exchangeOver(driver, [3, 1, 2], true);
    ex.begin();
    assert.equal(driver.started.length, 1, 'no token: no hedge yet');
    assert.equal(budget.waitingCount, 1);
    budget.deposit();
    assert.equal(driver.started.length, 1, 'half a token is not one');
    budget.deposit();
    assert.deepEqual(driver.started.map((s) => s.node), [3, 1], 'the token went to the waiting request');
    assert.equal(ex.hedged, true);
    assert.equal(budget.affordable, false, 'and was spent');
    assert.equal(budget.waitingCount, 0);
    ex.answered(1, 200, null, body, 2);
    assert.equal(ex.servedBy, 1);
    assert.deepEqual(driver.tally, { hedges: 1, hedgeWins: 1, failovers: 0 });
    assert.equal(driver.denied, 0, 'it got its hedge: none denied');
  });

  it('one that came due on the list and got no token is counted as denied when it leaves', () => {
    const budget = spentBudget(50);
    const driver = new BudgetDriver(budget, 0);
    const ex = exchangeOver(driver, [3, 1, 2], true);
    ex.begin();
    budget.deposit(); // half a token: not enough
    assert.equal(driver.denied, 0, 'still waiting: not denied yet');
    ex.answered(0, 200, null, body, 40);
    assert.equal(ex.hedged, false);
    assert.equal(driver.denied, 1);
    assert.equal(budget.waitingCount, 0);
  });

  it('with the list full, a request arms its timer after all, and one its trigger finds no token for is denied', (t) => {
    const tick = fakeClock(t);
    const budget = spentBudget(5);
    const fillers = Array.from({ length: WAIT_CAPACITY }, () => exchangeOver(new BudgetDriver(budget, 60_000), [0, 1], true));
    for (const f of fillers) f.begin();
    assert.equal(budget.waitingCount, WAIT_CAPACITY);
    const driver = new BudgetDriver(budget, 5);
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    assert.equal(ex.waitList, null, 'not kept');
    tick(5);
    assert.equal(driver.started.length, 1, 'still no token at its trigger');
    ex.answered(0, 200, null, body, 30);
    assert.equal(driver.denied, 1, 'and nowhere to wait: denied, not dropped silently');
  });

  it('counts a request denied once, however often it comes due without a token', (t) => {
    const tick = fakeClock(t);
    const budget = spentBudget(5);
    const driver = new BudgetDriver(budget, 5);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    tick(20);
    ex.failed(0, new Error('reset'));
    assert.equal(budget.waitingCount, 1, 'the new primary waits for its own trigger');
    tick(20);
    ex.answered(1, 200, null, body, 20);
    assert.equal(driver.denied, 1, 'came due twice unhedged (before and after failing over): counted once');
  });

  it('does not count a request denied that came due unhedged, failed over, and then got its hedge', (t) => {
    const tick = fakeClock(t);
    const budget = spentBudget(50);
    const driver = new BudgetDriver(budget, 5);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    tick(20);
    ex.failed(0, new Error('reset'));
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1], 'failed over, still unhedged');
    tick(20);
    budget.deposit();
    budget.deposit();
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1, 2], 'the new primary got a token: hedged');
    ex.answered(2, 200, null, body, 3);
    assert.equal(driver.denied, 0, 'it got a hedge after all');
  });

  it('is not hedged before its trigger, however many tokens come', () => {
    const budget = spentBudget(100);
    const driver = new BudgetDriver(budget, 60_000);
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    for (let i = 0; i < 5; i++) budget.deposit();
    assert.equal(driver.started.length, 1);
    assert.equal(budget.waitingCount, 1, 'still waiting');
    ex.answered(0, 200, null, body, 3);
    budget.deposit();
    assert.equal(budget.waitingCount, 0, 'answered: dropped from the list');
    assert.equal(driver.started.length, 1);
    assert.equal(driver.denied, 0, 'answered before its trigger: no hedge was denied');
  });

  it('passes over answered requests and gives the token to the oldest one still waiting', () => {
    const budget = spentBudget(100);
    const driver = new BudgetDriver(budget, 0);
    const answered = exchangeOver(driver, [0, 1], true);
    const stalled = exchangeOver(driver, [1, 2], true);
    const later = exchangeOver(driver, [2, 0], true);
    answered.begin();
    stalled.begin();
    later.begin();
    answered.answered(0, 200, null, body, 1);
    budget.deposit();
    assert.equal(answered.hedged, false);
    assert.equal(stalled.hedged, true, 'the oldest unanswered one');
    assert.equal(later.hedged, false, 'one token, one hedge');
    assert.equal(budget.waitingCount, 1);
    budget.deposit();
    assert.equal(later.hedged, true);
    assert.equal(budget.waitingCount, 0);
  });

  it('a hedge due while the budget was spent waits one trigger more, then fires on a token', (t) => {
    const tick = fakeClock(t);
    const budget = new HedgeBudget(100, 1);
    const driver = new BudgetDriver(budget, 5);
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    assert.equal(budget.spend(), true, 'another request spends the token meanwhile');
    tick(5);
    assert.equal(driver.started.length, 1, 'the timer found the budget spent');
    assert.equal(budget.waitingCount, 1);
    budget.deposit();
    assert.equal(ex.hedged, false, 'a token, but the request is not due again before twice its trigger');
    tick(4);
    assert.equal(ex.hedged, false);
    tick(1);
    assert.equal(ex.hedged, true, 'due: the saved token hedges it, with no further deposit');
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1]);
    assert.equal(driver.denied, 0);
  });

  it('one answered between its trigger and twice it (merely slow) takes no token and is no denial', (t) => {
    const tick = fakeClock(t);
    const budget = spentBudget(100);
    const driver = new BudgetDriver(budget, 5);
    const slow = exchangeOver(driver, [0, 1], true);
    slow.begin();
    tick(7);
    budget.deposit();
    assert.equal(slow.hedged, false);
    slow.answered(0, 200, null, body, 7);
    assert.equal(budget.affordable, true, 'the token is still there for a stall');
    assert.equal(driver.denied, 0);
  });

  it('keeps its last tokens for waiting requests: a hedge due at its trigger leaves the reserve, the list spends it', (t) => {
    const tick = fakeClock(t);
    const budget = new HedgeBudget(100, 5, 2);
    for (let i = 0; i < 3; i++) assert.equal(budget.spend(), true, 'tokens above the reserve');
    assert.equal(budget.spend(), false, 'two left: the reserve');
    assert.equal(budget.affordable, true, 'a token is there: a hedge timer is worth arming');
    const driver = new BudgetDriver(budget, 5);
    const waiter = exchangeOver(driver, [0, 1], true);
    waiter.begin();
    assert.equal(budget.waitingCount, 0, 'a timer, not the list: the list holds only the due and the tokenless');
    tick(5);
    assert.equal(waiter.hedged, false, 'at its trigger only the reserve is left');
    assert.equal(budget.waitingCount, 1, 'so it waits');
    tick(4);
    assert.equal(waiter.hedged, false);
    tick(1);
    assert.equal(waiter.hedged, true, 'due at twice its trigger, the list spends a reserved token');
    assert.equal(budget.spend(), false, 'one token left');
    for (let i = 0; i < 200; i++) budget.outcome(false);
    assert.equal(budget.waits, false, 'hedges losing: the budget has shrunk, nobody waits');
    assert.equal(budget.spend(), true, 'and nothing is kept back: the last token goes');
    assert.equal(budget.spend(), false);
  });

  it('fires one hedge for an exchange that waits twice', () => {
    const budget = spentBudget(100);
    const driver = new BudgetDriver(budget, 0);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    budget.wait(ex, 0);
    budget.deposit();
    budget.deposit();
    assert.equal(driver.tally.hedges, 1);
    assert.equal(driver.started.length, 2);
    assert.equal(budget.waitingCount, 0);
  });

  it('keeps at most WAIT_CAPACITY requests waiting', (t) => {
    fakeClock(t);
    const budget = spentBudget(5);
    const all: Exchange[] = [];
    for (let i = 0; i < WAIT_CAPACITY + 10; i++) {
      const ex = exchangeOver(new BudgetDriver(budget, 0), [0, 1], true);
      ex.begin();
      all.push(ex);
    }
    assert.equal(budget.waitingCount, WAIT_CAPACITY);
    assert.equal(all[WAIT_CAPACITY]!.waitList, null, 'the first one past the capacity is not kept');
    // Answered ones leave; the room they leave is used again, around the ring and past holes.
    for (let i = 0; i < WAIT_CAPACITY; i += 2) all[i]!.answered(0, 200, null, body, 1);
    assert.equal(budget.waitingCount, WAIT_CAPACITY / 2);
    for (let i = 0; i < WAIT_CAPACITY / 2; i++) {
      const ex = exchangeOver(new BudgetDriver(budget, 0), [0, 1], true);
      ex.begin();
      all.push(ex);
    }
    assert.equal(budget.waitingCount, WAIT_CAPACITY, 'the holes were reused');
    // Every one of them is still in its own place: each answer takes exactly one off.
    let left = WAIT_CAPACITY;
    for (const ex of all) {
      if (ex.done || ex.waitList === null) continue;
      ex.answered(0, 200, null, body, 1);
      assert.equal(budget.waitingCount, --left);
    }
    assert.equal(left, 0);
  });

  it('an answered or cancelled request leaves the list at once, holding nothing', () => {
    const budget = spentBudget(5);
    const driver = new BudgetDriver(budget, 0);
    const answered = exchangeOver(driver, [0, 1], true);
    const cancelled = exchangeOver(driver, [1, 0], true);
    answered.begin();
    cancelled.begin();
    assert.equal(budget.waitingCount, 2);
    answered.answered(0, 200, null, body, 1);
    cancelled.cancel();
    assert.equal(budget.waitingCount, 0, 'no deposit needed');
    assert.equal(answered.waitList, null);
    assert.equal(cancelled.waitList, null);
  });

  it('after a failover the hedge waits for the new primary, not the old trigger', (t) => {
    t.mock.timers.enable({ apis: ['setTimeout'] });
    const budget = new HedgeBudget(100, 1);
    const driver = new BudgetDriver(budget, 60_000);
    const ex = exchangeOver(driver, [0, 1, 2], true);
    ex.begin();
    budget.wait(ex, 0); // as if the primary's trigger had passed with the budget spent
    ex.failed(0, new Error('reset'));
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1], 'failed over to node 1');
    assert.equal(budget.waitingCount, 0, 'the wait for node 0 is over');
    budget.deposit();
    assert.equal(ex.hedged, false, 'node 1 has not reached its own trigger');
    t.mock.timers.tick(60_000);
    assert.equal(ex.hedged, true, 'its own trigger hedges it');
    assert.deepEqual(driver.started.map((s) => s.node), [0, 1, 2]);
  });

  it('looks past freed slots: requests that left the list do not count against the scan', () => {
    const budget = spentBudget(100);
    const slow = exchangeOver(new BudgetDriver(budget, 60_000), [0, 1], true);
    slow.begin();
    const gone: Exchange[] = [];
    for (let i = 0; i < 40; i++) {
      const ex = exchangeOver(new BudgetDriver(budget, 60_000), [0, 1], true);
      ex.begin();
      gone.push(ex);
    }
    const stalled = exchangeOver(new BudgetDriver(budget, 0), [1, 2], true);
    stalled.begin();
    for (const ex of gone) ex.answered(0, 200, null, body, 1);
    assert.equal(budget.waitingCount, 2);
    budget.deposit();
    assert.equal(stalled.hedged, true, 'the due one behind 40 freed slots got the token');
    assert.equal(slow.hedged, false);
  });

  it('with a token left over, a waiting request is hedged when it comes due, with no deposit then', async () => {
    const budget = spentBudget(100);
    const driver = new BudgetDriver(budget, 20);
    const ex = exchangeOver(driver, [0, 1], true);
    ex.begin();
    budget.deposit(); // a token, before the request is due
    assert.equal(ex.hedged, false);
    // Keeps the test alive (the budget's timer is unref'd) and bounds the wait.
    const deadline = setTimeout(() => assert.fail('not hedged within 2 s'), 2_000);
    try {
      const [started] = (await once(driver, 'start')) as [Started];
      assert.equal(started.node, 1);
      assert.equal(ex.hedged, true);
      assert.equal(budget.affordable, false, 'the token was spent on it');
    } finally {
      clearTimeout(deadline);
    }
  });

  it('a request not yet due does not hold back a due one behind it', () => {
    const budget = spentBudget(100);
    const slow = exchangeOver(new BudgetDriver(budget, 60_000), [0, 1], true);
    const stalled = exchangeOver(new BudgetDriver(budget, 0), [1, 2], true);
    slow.begin();
    stalled.begin();
    budget.deposit();
    assert.equal(stalled.hedged, true, 'the due one got the token');
    assert.equal(slow.hedged, false);
    assert.equal(budget.waitingCount, 1);
  });

  it('nobody waits while hedges are losing (the budget has shrunk)', () => {
    const budget = spentBudget(100);
    for (let i = 0; i < 100; i++) budget.outcome(false);
    assert.equal(budget.waits, false);
    const driver = new BudgetDriver(budget, 0);
    exchangeOver(driver, [0, 1], true).begin();
    assert.equal(budget.waitingCount, 0);
    assert.equal(driver.waits.length, 0);
    for (let i = 0; i < 100; i++) budget.outcome(true);
    assert.equal(budget.waits, true, 'winning again: requests wait again');
    exchangeOver(driver, [0, 1], true).begin();
    assert.equal(budget.waitingCount, 1);
  });

  it('never hedges a request that may not hedge', () => {
    const budget = spentBudget(100);
    const driver = new BudgetDriver(budget, 0);
    const write = exchangeOver(driver, [0, 1], false);
    write.begin();
    budget.deposit();
    assert.equal(budget.waitingCount, 0);
    assert.equal(driver.started.length, 1);
    assert.equal(budget.affordable, true, 'the token is still there');
  });
});

describe('HedgeBudget', () => {
  it('allows a burst, then about one hedge per 1/percent requests', () => {
    const budget = new HedgeBudget(10, 3, 0);
    let allowed = 0;
    for (let i = 0; i < 5; i++) if (budget.spend()) allowed++;
    assert.equal(allowed, 3, 'the saved burst');
    allowed = 0;
    for (let i = 0; i < 1000; i++) {
      budget.deposit();
      if (budget.spend()) allowed++;
    }
    assert.ok(allowed >= 99 && allowed <= 100, `${allowed} hedges in 1000 requests at 10%`);
  });

  it('shrinks to a tenth while hedges keep losing, and recovers as they win', () => {
    const rate = (budget: HedgeBudget): number => {
      let allowed = 0;
      for (let i = 0; i < 10_000; i++) {
        budget.deposit();
        if (budget.spend()) allowed++;
      }
      return allowed / 10_000;
    };
    const budget = new HedgeBudget(5, 1);
    budget.spend();
    assert.ok(Math.abs(rate(budget) - 0.05) < 0.002, 'full budget while hedges have not lost');
    for (let i = 0; i < 200; i++) budget.outcome(false);
    assert.ok(Math.abs(rate(budget) - 0.005) < 0.001, `a tenth: ${rate(budget)}`);
    for (let i = 0; i < 4; i++) budget.outcome(i % 2 === 0);
    assert.ok(budget.scale > 0.2 && budget.scale < 0.5, `partly back after four hedges, two of which won: ${budget.scale}`);
    for (let i = 0; i < 16; i++) budget.outcome(i % 2 === 0);
    assert.equal(budget.scale, 1, 'whole again within 20 hedges winning half the time');
    for (let i = 0; i < 200; i++) budget.outcome(i % 4 === 0);
    assert.equal(budget.scale, 1, 'a quarter of hedges winning earns the whole budget');
    assert.ok(Math.abs(rate(budget) - 0.05) < 0.002);
  });

  it('at 0% never hedges once the burst is spent', () => {
    const budget = new HedgeBudget(0, 1);
    assert.equal(budget.spend(), true);
    for (let i = 0; i < 100; i++) budget.deposit();
    assert.equal(budget.spend(), false);
  });

  it('a setting of 0% (--hedge-budget-percent 0) never hedges, not even a first burst', () => {
    const budget = HedgeBudget.forSetting(0);
    assert.equal(budget.affordable, false, 'no token: no hedge timer is armed');
    assert.equal(budget.waits, false, 'nobody waits for a token that never comes');
    for (let i = 0; i < 100; i++) {
      budget.deposit();
      assert.equal(budget.spend(false), false);
      assert.equal(budget.spend(true), false);
    }
    assert.equal(HedgeBudget.forSetting(5).spend(false), true, 'a budget above 0% keeps its burst');
  });

  it('a setting of 100% is no budget: every hedge may fire, with no requests between, none waits, losing does not shrink it', () => {
    const budget = HedgeBudget.forSetting(100);
    for (let i = 0; i < 50; i++) budget.outcome(false);
    for (let i = 0; i < 1_000; i++) {
      assert.equal(budget.affordable, true);
      assert.equal(budget.spend(false), true);
    }
    assert.equal(budget.waits, false);
  });
});
