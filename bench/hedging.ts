/**
 * Hedging under tail latency ("The Tail at Scale"): three upstream nodes where each request
 * independently stalls 50 ms with probability 2%. Lakefront with no hedging, a fixed 10 ms
 * hedge, and its own-p95 hedge, each under the same open-loop load, interleaved.
 *
 *   node dist/bench/hedging.js [--quick] [--repeats 5] [--seconds 15] [--rate 2000] [--pacer timer|worker|native]
 *
 * Reports client-side p50/p99/p99.9 (microseconds, HDR) and extra upstream requests: requests
 * the nodes received (counted by the bench upstream itself) beyond the client requests Lakefront
 * answered (its /stats). The load comes from a C generator by default (`--pacer native`,
 * bench/native/openloop.c, built with the machine's `cc`: requests leave within tens of
 * microseconds of their schedule); without a C compiler, from Node with a millisecond timer (said in
 * one line). `--pacer timer` asks for that one (every figure before the twenty-fifth session),
 * `--pacer worker` for Node with a worker thread's timed waits (bench/lib/openloop.ts). Each run's
 * line shows how late requests left against the schedule (in their latency either way).
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startLakefront, startUpstream, type Contender, type Upstream } from './lib/contenders.js';
import { openLoop, pacerFor, spreadBoards, type OpenLoopResult } from './lib/openloop.js';
import { ROOT, pause } from './lib/procs.js';
import { fmt, machine, median, spread, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    repeats: { type: 'string' },
    seconds: { type: 'string' },
    rate: { type: 'string' },
    'stall-ms': { type: 'string', default: '50' },
    'stall-p': { type: 'string', default: '0.02' },
    'no-write': { type: 'boolean', default: false },
    /** Extra Lakefront flags for every mode, e.g. "--hedge-budget-percent 5". */
    extra: { type: 'string', default: '' },
    pacer: { type: 'string' },
  },
});
const quick = values.quick!;
// Five by default: p99.9 rests on about 30 requests a run, and one run in a few lands on a
// stretch where the whole machine stalls.
const repeats = Number(values.repeats ?? process.env.BENCH_REPEATS ?? 5);
const seconds = Number(values.seconds ?? process.env.BENCH_SECONDS ?? (quick ? 5 : 15));
const rate = Number(values.rate ?? 2000);
const stallMs = Number(values['stall-ms']);
const stallP = Number(values['stall-p']);
const pacer = pacerFor(values.pacer, 'hedging');

interface Stats {
  requests: number;
  hedges: number;
  hedgeWins: number;
  hedgesDenied: number;
}

async function stats(c: Contender): Promise<Stats> {
  const res = await fetch(`${c.url}/stats`);
  return (await res.json()) as Stats;
}

/** Requests the upstream nodes received (all three live in one process). */
async function received(upstream: Upstream): Promise<number> {
  const res = await fetch(`http://127.0.0.1:${upstream.ports[0]}/__received`);
  return ((await res.json()) as { received: number }).received;
}

interface Row {
  p50: number;
  p99: number;
  p999: number;
  extraPct: number;
  hedgedPct: number;
  hedgeWinPct: number;
  /** Requests that came due for a hedge and got none (the budget), in % of those served. */
  deniedPct: number;
  rps: number;
  /** Requests not answered 2xx (their latencies are in the percentiles too). */
  failed: number;
  lateP50: number;
  lateP99: number;
}

async function main(): Promise<void> {
  const upstream = await startUpstream({ stallMs, stallP });
  const modes: { name: string; args: string[] }[] = [
    { name: 'no hedging', args: ['--hedge-mode', 'off'] },
    { name: 'fixed 10 ms hedge', args: ['--hedge-mode', 'fixed', '--hedge-ms', '10'] },
    { name: 'own-p95 hedge', args: ['--hedge-mode', 'percentile', '--hedge-percentile', '95'] },
  ];
  const contenders: { name: string; c: Contender }[] = [];
  try {
    for (const mode of modes) {
      const extra = values.extra!.split(' ').filter(Boolean);
      contenders.push({ name: mode.name, c: await startLakefront(upstream, { threads: 2, extraArgs: [...mode.args, ...extra], name: mode.name }) });
    }
    const boards = spreadBoards();
    const load = (url: string, secs: number): Promise<OpenLoopResult> =>
      openLoop(url, { rate, seconds: secs, path: '/rpc/query.execute', headers: (i) => ({ 'x-lakefront-board': boards[i % boards.length]! }), pacer });
    for (const { c } of contenders) await load(c.url, 2);
    const rows: Record<string, Row[]> = {};
    for (let r = 0; r < repeats; r++) {
      for (const { name, c } of contenders) {
        await pause(300);
        const before = await stats(c);
        const receivedBefore = await received(upstream);
        const result = await load(c.url, seconds);
        const after = await stats(c);
        const served = after.requests - before.requests;
        // Counted where they land: every request the nodes received beyond one a client request.
        const extra = (await received(upstream)) - receivedBefore - served;
        const row: Row = {
          p50: result.p50Us,
          p99: result.p99Us,
          p999: result.p999Us,
          extraPct: (extra / served) * 100,
          hedgedPct: ((after.hedges - before.hedges) / served) * 100,
          hedgeWinPct: ((after.hedgeWins - before.hedgeWins) / served) * 100,
          deniedPct: ((after.hedgesDenied - before.hedgesDenied) / served) * 100,
          rps: result.ok / seconds,
          failed: result.failed,
          lateP50: result.lateP50Us,
          lateP99: result.lateP99Us,
        };
        (rows[name] ??= []).push(row);
        process.stdout.write(
          `${name.padEnd(18)} run ${r + 1}/${repeats}: p50 ${fmt(row.p50)} us  p99 ${fmt(row.p99)} us  p99.9 ${fmt(row.p999)} us  extra ${fmt(row.extraPct, 2)}%  hedged ${fmt(row.hedgedPct, 2)}%  won ${fmt(row.hedgeWinPct, 2)}%  denied ${fmt(row.deniedPct, 2)}%  ${fmt(row.rps)} req/s  failed ${result.failed}  sent late p50 ${fmt(row.lateP50)} us p99 ${fmt(row.lateP99)} us\n`,
        );
      }
    }
    report(rows);
  } finally {
    for (const { c } of contenders) await c.proc?.stop();
    await upstream.proc.stop();
  }
}

function report(rows: Record<string, Row[]>): void {
  const info = machine();
  const base = median(rows['no hedging']!.map((r) => r.p99));
  const lines: string[][] = [];
  for (const [name, samples] of Object.entries(rows)) {
    const p99 = median(samples.map((s) => s.p99));
    const [lo, hi] = spread(samples.map((s) => s.p99));
    // p99.9 rests on the slowest 0.1% of a run (about 30 requests at the defaults): it moves a
    // lot between runs, so its spread is shown too.
    const [lo9, hi9] = spread(samples.map((s) => s.p999));
    const [loX, hiX] = spread(samples.map((s) => s.extraPct));
    lines.push([
      name,
      fmt(median(samples.map((s) => s.p50))),
      `${fmt(p99)} (${fmt(lo)}-${fmt(hi)})`,
      `${fmt(median(samples.map((s) => s.p999)))} (${fmt(lo9)}-${fmt(hi9)})`,
      `${fmt(base / p99, 1)}x`,
      `${fmt(median(samples.map((s) => s.extraPct)), 2)}% (${fmt(loX, 2)}-${fmt(hiX, 2)}%)`,
      `${fmt(median(samples.map((s) => s.hedgeWinPct)), 2)}%`,
      String(samples.reduce((n, s) => n + s.failed, 0)),
    ]);
  }
  const command = `node dist/bench/hedging.js ${process.argv.slice(2).join(' ')}`.trim();
  const all = Object.values(rows).flat();
  const late = `requests left ${fmt(median(all.map((r) => r.lateP50)))} us late at the median, ${fmt(median(all.map((r) => r.lateP99)))} at p99 (medians over runs), and that is in their latency`;
  const pacing =
    pacer === 'native'
      ? `the load from a C generator (\`--pacer native\`, bench/native/openloop.c: an epoll loop, a timerfd at each due time); ${late}`
      : pacer === 'worker'
      ? `the schedule kept by a worker thread's timed waits (\`--pacer worker\`); ${late}`
      : `the schedule kept by a 1 ms timer; requests left ${fmt(median(all.map((r) => r.lateP50)))} us late at the median, ${fmt(median(all.map((r) => r.lateP99)))} at p99, and that is in their latency`;
  const body = [
    `Machine: ${info.cpu}, ${info.memory}, ${info.os}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
    `Command: \`${command}\`. Three upstream nodes; each request stalls ${stallMs} ms with probability ${stallP * 100}%. Lakefront at 2 threads per mode; open-loop load of ${rate} req/s (bench/lib/openloop.ts: fixed schedule, latency from each request's scheduled time; ${pacing}) of GET \`/rpc/query.execute\` (retryable) over 1,024 boards, ${seconds} s per run, ${repeats} interleaved repeats, medians (spread min-max). Extra upstream requests: what the nodes received (their own count) beyond the client requests answered. Failed: requests of all runs not answered 2xx (a connection error, a timeout or another status; their latencies are in the percentiles).`,
    '',
    table(['mode', 'p50 us', 'p99 us', 'p99.9 us', 'p99 cut vs none', 'extra upstream requests', 'answered by the hedge', 'failed'], lines),
  ].join('\n');
  process.stdout.write(`\n${body}\n`);
  if (values['no-write']) return;
  const section = quick ? 'hedging-quick' : 'hedging';
  updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
  writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, settings: { rate, seconds, repeats, stallMs, stallP, pacer }, runs: rows });
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
