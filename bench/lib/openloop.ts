/**
 * An open-loop load generator: requests leave on a fixed schedule whether or not earlier ones
 * have answered, and each latency is measured from the request's scheduled time, so a stall is
 * never hidden by the generator waiting for it (no coordinated omission).
 *
 * autocannon's `overallRate` is not this: each connection sends back to back until it has used
 * its per-second quota, then pauses until the next second, so load arrives in bursts and a
 * connection held by a slow response sends fewer requests. Measured here, that doubled the p50
 * of any setup whose slow answers came back sooner (hedging).
 */
import hdr from 'hdr-histogram-js';
import { Pool } from 'undici';

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
}

export interface OpenLoopResult {
  readonly sent: number;
  readonly ok: number;
  readonly failed: number;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly p999Us: number;
  readonly maxUs: number;
}

export async function openLoop(url: string, options: OpenLoopOptions): Promise<OpenLoopResult> {
  const pool = new Pool(url, { connections: options.connections ?? 256, pipelining: 1 });
  const histogram = hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 120_000_000, numberOfSignificantValueDigits: 3 });
  const total = Math.round(options.rate * options.seconds);
  const intervalMs = 1000 / options.rate;
  let sent = 0;
  let ok = 0;
  let failed = 0;
  let settled = 0;
  const start = performance.now();
  await new Promise<void>((resolve) => {
    const fire = (i: number): void => {
      const due = start + i * intervalMs;
      pool
        .request({ path: options.path, method: options.method ?? 'GET', headers: options.headers(i), body: options.body ?? null })
        .then(async (res) => {
          await res.body.dump();
          if (res.statusCode >= 200 && res.statusCode < 300) ok++;
          else failed++;
        })
        .catch(() => failed++)
        .finally(() => {
          const us = Math.max(1, Math.round((performance.now() - due) * 1000));
          histogram.recordValue(us);
          options.onLatency?.(due - start, us);
          if (++settled === total) resolve();
        });
    };
    const tick = (): void => {
      const due = Math.min(total, Math.floor((performance.now() - start) / intervalMs) + 1);
      while (sent < due) fire(sent++);
      if (sent < total) setTimeout(tick, 1);
    };
    tick();
  });
  await pool.close();
  return {
    sent,
    ok,
    failed,
    p50Us: histogram.getValueAtPercentile(50),
    p99Us: histogram.getValueAtPercentile(99),
    p999Us: histogram.getValueAtPercentile(99.9),
    maxUs: histogram.maxValue,
  };
}

/** The hedging bench's boards: 1,024 keys spread over the ranking (bench/hedging.ts, bench/tail-probe.mjs). */
export function spreadBoards(): string[] {
  return Array.from({ length: 1024 }, (_, i) => `board-${(i * 7919) % 100_003}`);
}
