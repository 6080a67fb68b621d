/**
 * What each front door adds to a request at a steady rate: open-loop load (a fixed schedule,
 * latency from each request's due time) at a rate well below saturation, every contender in
 * front of the same three upstream nodes, interleaved, medians of the repeats. The suite measures
 * the most each serves; this measures the time a request spends in each when none is busy, the
 * figure a client sees on most days.
 *
 *   node dist/bench/latency.js [--contenders direct,lakefront-2t,nginx-2w,haproxy-2t]
 *       [--workloads get1k,post256] [--rates 2000] [--seconds 10] [--repeats 3] [--pacer native|timer|worker]
 *       [--no-write] [--quick]
 *
 * The load comes from the C generator (bench/native/openloop.c, built with `cc`; without one, from
 * Node's timer, said in a line): its requests leave 70-80 us after their due time at the median,
 * where Node's timer added about 0.9 ms to every latency (bench/lib/openloop.ts). Boards spread
 * over 1,024 keys (bench/hedging.ts's). Writes bench/results/latency.json and the `latency`
 * section of bench/RESULTS.md.
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startContenders, startUpstream, type Contender } from './lib/contenders.js';
import { BODY_256 } from './lib/load.js';
import { openLoop, pacerFor, spreadBoards, type OpenLoopResult } from './lib/openloop.js';
import { ROOT, pause, totalCpuSeconds } from './lib/procs.js';
import { fmt, machine, median, spread, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    contenders: { type: 'string' },
    workloads: { type: 'string' },
    rates: { type: 'string' },
    seconds: { type: 'string' },
    repeats: { type: 'string' },
    pacer: { type: 'string' },
    'no-write': { type: 'boolean', default: false },
  },
});
const quick = values.quick!;
const contenderNames = (values.contenders ?? (quick ? 'direct,lakefront-2t,nginx-2w' : 'direct,lakefront-2t,nginx-2w,haproxy-2t')).split(',');
const rates = (values.rates ?? '2000').split(',').map(Number);
const seconds = Number(values.seconds ?? (quick ? 3 : 10));
const repeats = Number(values.repeats ?? (quick ? 1 : 3));
for (const [what, n] of [...rates.map((r) => ['--rates', r] as const), ['--seconds', seconds] as const, ['--repeats', repeats] as const]) {
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${what}: numbers above 0, not ${String(n)}`);
}

interface Workload {
  readonly method: 'GET' | 'POST';
  readonly path: string;
  readonly body?: string;
}

const WORKLOADS: Record<string, Workload> = {
  /** GET 1 KiB, a read (retryable). */
  get1k: { method: 'GET', path: '/rpc/query.execute?bytes=1024' },
  /** POST 256 B, a bare write (sent once). */
  post256: { method: 'POST', path: '/rpc/board.append', body: BODY_256 },
};
const workloadNames = (values.workloads ?? 'get1k,post256').split(',');
for (const name of workloadNames) if (!WORKLOADS[name]) throw new Error(`--workloads: ${Object.keys(WORKLOADS).join(', ')}, not ${name}`);

const pacer = pacerFor(values.pacer, 'latency');

/** A run's latencies, and the contender's process CPU over the requests served, 2xx (NaN for `direct`). */
interface Sample extends OpenLoopResult {
  readonly cpuUsPerRequest: number;
}

async function main(): Promise<void> {
  const upstream = await startUpstream();
  const contenders: Contender[] = [];
  const skipped: string[] = [];
  const boards = spreadBoards();
  try {
    await startContenders(contenderNames, upstream, contenders, skipped);
    const load = (c: Contender, workload: Workload, rate: number, secs: number): Promise<OpenLoopResult> =>
      openLoop(c.url, {
        rate,
        seconds: secs,
        method: workload.method,
        path: workload.path,
        ...(workload.body === undefined ? {} : { body: workload.body }),
        headers: (i): Record<string, string> => (workload.body === undefined ? { 'x-lakefront-board': boards[i % boards.length]! } : { 'content-type': 'application/json', 'x-lakefront-board': boards[i % boards.length]! }),
        pacer,
      });
    const results: Record<string, Record<string, Sample[]>> = {};
    for (const workloadName of workloadNames) {
      const workload = WORKLOADS[workloadName]!;
      for (const rate of rates) {
        const key = `${workloadName} at ${rate} req/s`;
        results[key] = {};
        // Warm each one's JIT and connections on this workload first, unrecorded.
        for (const c of contenders) await load(c, workload, rate, 2);
        for (let r = 0; r < repeats; r++) {
          for (const c of contenders) {
            await pause(300);
            const cpuBefore = c.proc ? totalCpuSeconds(c.proc) : 0;
            const result = await load(c, workload, rate, seconds);
            const cpuUsPerRequest = c.proc ? ((totalCpuSeconds(c.proc) - cpuBefore) * 1e6) / result.ok : Number.NaN;
            (results[key]![c.name] ??= []).push({ ...result, cpuUsPerRequest });
            process.stdout.write(
              `${key.padEnd(22)} ${c.name.padEnd(14)} run ${r + 1}/${repeats}: p50 ${fmt(result.p50Us)} us  p99 ${fmt(result.p99Us)} us  p99.9 ${fmt(result.p999Us)} us  cpu ${fmt(cpuUsPerRequest, 1)} us/req  failed ${result.failed}  sent late p50 ${fmt(result.lateP50Us)} us p99 ${fmt(result.lateP99Us)} us\n`,
            );
          }
        }
      }
    }
    report(results, skipped);
  } finally {
    for (const c of contenders) await c.proc?.stop();
    await upstream.proc.stop();
  }
}

function report(results: Record<string, Record<string, Sample[]>>, skipped: string[]): void {
  const info = machine();
  const sections: string[] = [];
  for (const [key, byContender] of Object.entries(results)) {
    const base = byContender.direct;
    const baseP50 = base ? median(base.map((r) => r.p50Us)) : Number.NaN;
    const baseP99 = base ? median(base.map((r) => r.p99Us)) : Number.NaN;
    const rows = Object.entries(byContender).map(([name, runs]) => {
      const p50 = median(runs.map((r) => r.p50Us));
      const p99 = median(runs.map((r) => r.p99Us));
      const [lo50, hi50] = spread(runs.map((r) => r.p50Us));
      const [lo99, hi99] = spread(runs.map((r) => r.p99Us));
      const added = (v: number, b: number): string => (base && name !== 'direct' ? `${v >= b ? '+' : ''}${fmt(v - b)}` : '-');
      return [
        name,
        `${fmt(p50)} (${fmt(lo50)}-${fmt(hi50)})`,
        `${fmt(p99)} (${fmt(lo99)}-${fmt(hi99)})`,
        fmt(median(runs.map((r) => r.p999Us))),
        added(p50, baseP50),
        added(p99, baseP99),
        name === 'direct' ? '-' : fmt(median(runs.map((r) => r.cpuUsPerRequest)), 1),
        String(runs.reduce((n, r) => n + r.failed, 0)),
      ];
    });
    sections.push(`#### ${key}\n\n${table(['contender', 'p50 us (runs)', 'p99 us (runs)', 'p99.9 us', 'added at p50 us', 'added at p99 us', 'CPU us/req', 'failed'], rows)}`);
  }
  const all = Object.values(results).flatMap((byContender) => Object.values(byContender).flat());
  const command = `node dist/bench/latency.js ${process.argv.slice(2).join(' ')}`.trim();
  const body = [
    `Machine: ${info.cpu}, ${info.memory}, ${info.os}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
    `Command: \`${command}\`. Open-loop load (fixed schedule, latency from each request's due time) from ${pacer === 'native' ? 'the C generator (bench/native/openloop.c)' : `Node (\`--pacer ${pacer}\`)`}: requests left ${fmt(median(all.map((r) => r.lateP50Us)))} us late at the median, ${fmt(median(all.map((r) => r.lateP99Us)))} at p99 (medians over runs), in their latency. Three upstream nodes, boards over 1,024 keys, ${seconds} s per run after a 2 s warm-up, ${repeats} interleaved repeats, medians (runs: min-max). Added: the contender's median less the upstream's own (\`direct\`). CPU us/req: the contender's process CPU (all threads, all processes) over the requests served (2xx), at this rate.${skipped.length > 0 ? ` Skipped: ${skipped.join('; ')}.` : ''}`,
    '',
    sections.join('\n\n'),
  ].join('\n');
  process.stdout.write(`\n${body}\n`);
  if (values['no-write']) return;
  const section = quick ? 'latency-quick' : 'latency';
  updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
  writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, settings: { rates, seconds, repeats, pacer, workloads: workloadNames }, runs: results });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
