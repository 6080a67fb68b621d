/**
 * An open-loop load generator: requests leave on a fixed schedule whether or not earlier ones
 * have answered, and each latency is measured from the request's scheduled time, so a stall is
 * never hidden by the generator waiting for it (no coordinated omission).
 *
 * autocannon's `overallRate` is not this: each connection sends back to back until it has used
 * its per-second quota, then pauses until the next second, so load arrives in bursts and a
 * connection held by a slow response sends fewer requests. Measured here, that doubled the p50
 * of any setup whose slow answers came back sooner (hedging).
 *
 * Keeping the schedule: a Node timer counts whole milliseconds, so a `setTimeout(tick, 1)` loop
 * (the `timer` pacer, the default) sends in bursts a millisecond or more apart, each request up
 * to a tick late, and that lateness is in every latency it reports (measured: 0.58 ms at the
 * median, 1.2 ms at p99, at 2,000 req/s on an idle two-vCPU machine). The `worker` pacer keeps the
 * schedule closer: a worker thread sleeps to each due time with `Atomics.wait` (a condition
 * variable's timed wait, finer than a millisecond) and wakes this thread with a message, which
 * sends every request due by then (0.14 ms late at the median, 0.5-0.7 at p99 when idle). It
 * takes the p50 through Lakefront from about 1.2 to 0.5 ms but not the p99 (a second thread to
 * wake for each request, on two vCPUs shared with the system measured: bench/RESULTS.md,
 * "Twenty-fourth session"), so the timer stays the default and the benches' figures comparable
 * with earlier ones. Either way the lateness is counted (the latency runs from the due time) and
 * reported on its own (`lateP50Us`, `lateP99Us`).
 */
import { Worker } from 'node:worker_threads';
import hdr from 'hdr-histogram-js';
import { Pool } from 'undici';

export type Pacer = 'worker' | 'timer';

export interface OpenLoopOptions {
  readonly rate: number;
  readonly seconds: number;
  readonly method?: 'GET' | 'POST';
  readonly path: string;
  /** Headers for the i-th request. */
  readonly headers: (i: number) => Record<string, string>;
  readonly body?: string;
  /** Client connections (enough that a request never waits for one). Default 256. */
  readonly connections?: number;
  /** Told each request's latency (microseconds) and when it was due (ms after the start): a timeline. */
  readonly onLatency?: (dueMs: number, us: number) => void;
  /** What wakes the generator for the next due request (see above). Default `timer`. */
  readonly pacer?: Pacer;
}

export interface OpenLoopResult {
  readonly sent: number;
  readonly ok: number;
  readonly failed: number;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly p999Us: number;
  readonly maxUs: number;
  /** How late requests left against their schedule (microseconds): the generator's own share of every latency. */
  readonly lateP50Us: number;
  readonly lateP99Us: number;
}

/**
 * The worker pacer's thread: sleeps to each due time (absolute milliseconds, `timeOrigin` +
 * `now()`, which every thread shares) and posts a wake-up. CommonJS text, run with `eval`.
 */
const PACER_SOURCE = `
const { parentPort, workerData } = require('node:worker_threads');
const { start, intervalMs, total } = workerData;
const cell = new Int32Array(new SharedArrayBuffer(4));
for (let i = 0; i < total; i++) {
  const wait = start + i * intervalMs - (performance.timeOrigin + performance.now());
  if (wait > 0) Atomics.wait(cell, 0, 0, wait);
  parentPort.postMessage(i);
}
`;

/** Absolute milliseconds, comparable across threads. */
const clock = (): number => performance.timeOrigin + performance.now();

export async function openLoop(url: string, options: OpenLoopOptions): Promise<OpenLoopResult> {
  const pool = new Pool(url, { connections: options.connections ?? 256, pipelining: 1 });
  const histogram = hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 120_000_000, numberOfSignificantValueDigits: 3 });
  const total = Math.round(options.rate * options.seconds);
  const intervalMs = 1000 / options.rate;
  let sent = 0;
  let ok = 0;
  let failed = 0;
  let settled = 0;
  const late = hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 120_000_000, numberOfSignificantValueDigits: 2 });
  const pacer = options.pacer ?? 'timer';
  // The worker pacer's first due time is far enough ahead for its thread to have started.
  const start = clock() + (pacer === 'worker' ? 250 : 0);
  let worker: Worker | null = null;
  await new Promise<void>((resolve, reject) => {
    const fire = (i: number, now: number): void => {
      const due = start + i * intervalMs;
      late.recordValue(Math.max(1, Math.round((now - due) * 1000)));
      pool
        .request({ path: options.path, method: options.method ?? 'GET', headers: options.headers(i), body: options.body ?? null })
        .then(async (res) => {
          await res.body.dump();
          if (res.statusCode >= 200 && res.statusCode < 300) ok++;
          else failed++;
        })
        .catch(() => failed++)
        .finally(() => {
          const us = Math.max(1, Math.round((clock() - due) * 1000));
          histogram.recordValue(us);
          options.onLatency?.(due - start, us);
          if (++settled === total) resolve();
        });
    };
    /** Sends every request due by now, and at least the first `atLeast` (the pacer's word for it). */
    const catchUp = (atLeast = 0): void => {
      const now = clock();
      const due = Math.min(total, Math.max(atLeast, now < start ? 0 : Math.floor((now - start) / intervalMs) + 1));
      while (sent < due) fire(sent++, now);
    };
    if (pacer === 'timer') {
      const tick = (): void => {
        catchUp();
        if (sent < total) setTimeout(tick, 1);
      };
      tick();
    } else {
      worker = new Worker(PACER_SOURCE, { eval: true, workerData: { start, intervalMs, total } });
      // The pacer's own clock decides what is due (the two threads' clocks could differ by a
      // hair), and whatever is left when it ends leaves then.
      worker.on('message', (i: number) => catchUp(i + 1));
      worker.on('error', reject);
      worker.on('exit', () => catchUp(total));
    }
  });
  await (worker as Worker | null)?.terminate();
  await pool.close();
  return {
    sent,
    ok,
    failed,
    p50Us: histogram.getValueAtPercentile(50),
    p99Us: histogram.getValueAtPercentile(99),
    p999Us: histogram.getValueAtPercentile(99.9),
    maxUs: histogram.maxValue,
    lateP50Us: late.getValueAtPercentile(50),
    lateP99Us: late.getValueAtPercentile(99),
  };
}

/** The hedging bench's boards: 1,024 keys spread over the ranking (bench/hedging.ts, bench/tail-probe.mjs). */
export function spreadBoards(): string[] {
  return Array.from({ length: 1024 }, (_, i) => `board-${(i * 7919) % 100_003}`);
}
