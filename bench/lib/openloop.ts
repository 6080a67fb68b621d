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
 * (the `timer` pacer, this function's default) sends in bursts a millisecond or more apart, each
 * request up to a tick late, and that lateness is in every latency it reports (measured: 0.58 ms
 * at the median, 1.2 ms at p99, at 2,000 req/s on an idle two-vCPU machine). The `worker` pacer
 * keeps the schedule closer: a worker thread sleeps to each due time with `Atomics.wait` (a
 * condition variable's timed wait, finer than a millisecond) and wakes this thread with a
 * message, which sends every request due by then (0.14 ms late at the median, 0.5-0.7 at p99 when
 * idle). It takes the p50 through Lakefront from about 1.2 to 0.5 ms but not the p99 (a second
 * thread to wake for each request, on two vCPUs: bench/RESULTS.md, "Twenty-fourth session").
 * The `native` pacer is a whole generator in C (bench/native/openloop.c, wrk2's idea): one
 * thread, an epoll loop, a timerfd armed at each due time, the requests' bytes written out
 * beforehand, so requests leave 70-80 us late at the median, and the generator spends about half
 * the CPU a request the Node one does while the load runs (at 2,000 req/s to a bench node, 36-41
 * us against 73-115, most of it the wake-ups a request costs at that rate; 10-17 us more before
 * and after, writing the requests out and reading the report: `node bench/generator-cpu.mjs
 * native|timer`). Straight to a bench node at
 * 2,000 req/s it measures p50 0.12-0.14 ms and p99 0.3-0.6 ms where the timer pacer, in the same
 * minutes, measures 0.87-1.03 and 2.0-2.9 ms: most of what the Node pacers reported was the
 * generator's own time. The hedging
 * bench and bench/tail-probe.mjs use it by default (twenty-fifth session on). Whichever paces,
 * the lateness is counted (the latency runs from the due time) and reported on its own
 * (`lateP50Us`, `lateP99Us`).
 */
import { execFile, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import hdr from 'hdr-histogram-js';
import { Pool } from 'undici';
import { ROOT } from './procs.js';

export type Pacer = 'worker' | 'timer' | 'native';

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
  if (options.pacer === 'native') return nativeOpenLoop(url, options);
  const pool = new Pool(url, { connections: options.connections ?? 256, pipelining: 1 });
  const { histogram, late } = histograms();
  const total = Math.round(options.rate * options.seconds);
  const intervalMs = 1000 / options.rate;
  let sent = 0;
  let ok = 0;
  let failed = 0;
  let settled = 0;
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
  return summary(sent, ok, failed, histogram, late);
}

/** Latencies (microseconds, three digits) and lateness (two digits), up to two minutes. */
function histograms(): { histogram: hdr.Histogram; late: hdr.Histogram } {
  return {
    histogram: hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 120_000_000, numberOfSignificantValueDigits: 3 }),
    late: hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 120_000_000, numberOfSignificantValueDigits: 2 }),
  };
}

function summary(sent: number, ok: number, failed: number, histogram: hdr.Histogram, late: hdr.Histogram): OpenLoopResult {
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

const NATIVE_SOURCE = join(ROOT, 'bench', 'native', 'openloop.c');
const NATIVE_BINARY = join(ROOT, 'dist', 'bench', 'native', 'openloop');

/**
 * The native generator's binary (bench/native/openloop.c), compiled with the system's `cc` when
 * missing or older than its source. Throws one line saying what to install when there is no `cc`.
 */
export function nativeGenerator(): string {
  const built = statSync(NATIVE_BINARY, { throwIfNoEntry: false });
  if (built !== undefined && built.mtimeMs >= statSync(NATIVE_SOURCE).mtimeMs) return NATIVE_BINARY;
  mkdirSync(join(ROOT, 'dist', 'bench', 'native'), { recursive: true });
  // Built beside it and renamed over it: a run starting meanwhile never finds half a binary.
  const building = `${NATIVE_BINARY}.${process.pid}`;
  try {
    execFileSync('cc', ['-O2', '-Wall', '-o', building, NATIVE_SOURCE], { stdio: ['ignore', 'ignore', 'pipe'] });
    renameSync(building, NATIVE_BINARY);
  } catch (error) {
    rmSync(building, { force: true });
    const code = (error as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new Error('the native pacer needs a C compiler as cc (apt-get install gcc)');
    throw new Error(`cc could not build ${NATIVE_SOURCE}: ${String((error as { stderr?: Buffer }).stderr ?? error)}`);
  }
  return NATIVE_BINARY;
}

/**
 * The pacer a bench was asked for (`--pacer`), checked; by default the native generator where it
 * can be built, else Node's timer, said in a line (`bench` names who says it), not silently.
 */
export function pacerFor(asked: string | undefined, bench: string): Pacer {
  if (asked === undefined) {
    try {
      nativeGenerator();
      return 'native';
    } catch (error) {
      process.stdout.write(`${bench}: the native load generator is not there (${(error as Error).message}); Node's timer paces the load instead\n`);
      return 'timer';
    }
  }
  if (asked !== 'native' && asked !== 'timer' && asked !== 'worker') throw new Error(`--pacer: native, timer or worker, not ${asked}`);
  return asked;
}

/**
 * The `native` pacer: the whole generator is a C program (bench/native/openloop.c), one thread
 * with an epoll loop and a timerfd armed at each due time, so requests leave tens of microseconds
 * after their due time (the timerfd's wake-up: 70-80 us at the median here), for about half the
 * CPU a request of the Node generators (above). The requests' bytes are written out here first
 * (one HTTP/1.1 request each, `host` and any body's `content-length` added); its answers must
 * carry a content-length.
 */
async function nativeOpenLoop(url: string, options: OpenLoopOptions): Promise<OpenLoopResult> {
  const binary = nativeGenerator();
  const target = new URL(url);
  if (target.protocol !== 'http:' || target.hostname !== '127.0.0.1') throw new Error(`the native pacer takes http://127.0.0.1:PORT, not ${url}`);
  const total = Math.round(options.rate * options.seconds);
  const method = options.method ?? 'GET';
  const body = options.body === undefined ? null : Buffer.from(options.body);
  const parts: Buffer[] = [Buffer.alloc(4)];
  parts[0]!.writeUInt32LE(total);
  for (let i = 0; i < total; i++) {
    let head = `${method} ${options.path} HTTP/1.1\r\nhost: ${target.host}\r\n`;
    for (const [name, value] of Object.entries(options.headers(i))) head += `${name}: ${value}\r\n`;
    if (body !== null) head += `content-length: ${body.length}\r\n`;
    const request = body === null ? Buffer.from(`${head}\r\n`) : Buffer.concat([Buffer.from(`${head}\r\n`), body]);
    const length = Buffer.alloc(4);
    length.writeUInt32LE(request.length);
    parts.push(length, request);
  }
  const dir = mkdtempSync(join(tmpdir(), 'lakefront-openloop-'));
  try {
    const file = join(dir, 'requests');
    writeFileSync(file, Buffer.concat(parts));
    const connections = options.connections ?? 256;
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile(binary, [target.hostname, target.port || '80', String(options.rate), String(options.seconds), String(connections), file], { maxBuffer: 64 * 1024 * 1024 }, (error, out, err) => {
        if (error) reject(new Error(`native generator: ${err.trim() || (error.signal ? `killed by ${error.signal}` : error.message)}`));
        else resolve(out);
      });
    });
    const { histogram, late } = histograms();
    const lines = stdout.split('\n');
    const done = lines[total]?.split(' ');
    if (done?.[0] !== 'done') throw new Error(`native generator: ${total} requests asked, its report ends otherwise`);
    for (let i = 0; i < total; i++) {
      const [due, us, lateUs] = lines[i]!.split(' ').map(Number) as [number, number, number, number];
      histogram.recordValue(Math.max(1, us));
      late.recordValue(Math.max(1, lateUs));
      options.onLatency?.(due / 1000, Math.max(1, us));
    }
    return summary(Number(done[1]), Number(done[2]), Number(done[3]), histogram, late);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** The hedging bench's boards: 1,024 keys spread over the ranking (bench/hedging.ts, bench/tail-probe.mjs). */
export function spreadBoards(): string[] {
  return Array.from({ length: 1024 }, (_, i) => `board-${(i * 7919) % 100_003}`);
}
