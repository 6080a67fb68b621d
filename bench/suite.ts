/**
 * The throughput suite: every contender in front of the same three upstream nodes, the same load,
 * interleaved (A B C A B C ...), medians of the repeats.
 *
 *   node dist/bench/suite.js [--quick] [--repeats 3] [--seconds 5] [--prewarm 2] [--warm 1]
 *       [--contenders direct,lakefront-1t,lakefront-2t,node-proxy,nginx-1w,nginx-2w,haproxy-1t,haproxy-2t]
 *       (also floor-1t, floor-2t: the least a uWS + Node proxy does, bench/floor-proxy.ts; lakefront-pipe-1t,
 *       lakefront-pipe-2t: Lakefront with --upstream-pipelining 8; floor-pipe-1t, floor-pipe-2t: the floor
 *       with --pipelining; none in the default set)
 *       [--workloads post256,get1k,get16k,mix8020] [--connections 64,1024] [--no-write]
 *       [--generator autocannon|wrk] [--section NAME]
 *
 * Settings may also come from the environment: BENCH_REPEATS, BENCH_SECONDS, BENCH_CONTENDERS,
 * BENCH_WORKLOADS, BENCH_CONNECTIONS, BENCH_GENERATOR. The load comes from autocannon in this process
 * (the default) or from wrk (`--generator wrk`, a C generator in its own process that leaves the
 * contenders more of the two cores: see `runWrk`). Writes bench/results/suite.json, bench/results/suite.svg and
 * the generated section of bench/RESULTS.md.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startContenders, startUpstream, type Contender } from './lib/contenders.js';
import { WORKLOADS, hasWrk, runLoad, runWrk, warmUp, type LoadResult } from './lib/load.js';
import { ROOT, pause, totalCpuSeconds } from './lib/procs.js';
import { fmt, machine, median, spread, svgChart, table, updateSection, writeResult, type ChartGroup } from './lib/report.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    repeats: { type: 'string' },
    seconds: { type: 'string' },
    prewarm: { type: 'string' },
    warm: { type: 'string' },
    contenders: { type: 'string' },
    workloads: { type: 'string' },
    connections: { type: 'string' },
    'no-write': { type: 'boolean', default: false },
    section: { type: 'string' },
    generator: { type: 'string' },
  },
});
const env = process.env;
const quick = values.quick!;
const repeats = Number(values.repeats ?? env.BENCH_REPEATS ?? 3);
const seconds = Number(values.seconds ?? env.BENCH_SECONDS ?? (quick ? 3 : 5));
/**
 * Seconds of each workload every contender serves once, unrecorded, before anything is measured.
 * A JIT-compiled front door reaches its steady code only after its hot paths have run for a
 * while (measured: V8 was still deoptimising and recompiling Lakefront's request path 5-12 s in,
 * and the first measured run of the first workload cost up to 4 us a request more than the next
 * two); servers in C need none of it, and lose nothing by it.
 */
const prewarm = Number(values.prewarm ?? env.BENCH_PREWARM ?? (quick ? 0 : 2));
/** Seconds of load each contender serves, unrecorded, before each workload's first measured run. */
const warm = Number(values.warm ?? (quick ? 0.5 : 1));
if (!(warm > 0)) throw new Error(`--warm: bad value ${values.warm} (seconds, above 0)`);
const contenderNames = (values.contenders ?? env.BENCH_CONTENDERS ?? 'direct,lakefront-1t,lakefront-2t,node-proxy,nginx-1w,nginx-2w,haproxy-1t,haproxy-2t').split(',');
const workloadNames = (values.workloads ?? env.BENCH_WORKLOADS ?? (quick ? 'post256,get1k' : 'post256,get1k,get16k,mix8020')).split(',');
const connectionCounts = (values.connections ?? env.BENCH_CONNECTIONS ?? (quick ? '64' : '64,1024')).split(',').map(Number);
const section = values.section ?? (quick ? 'suite-quick' : 'suite');
const generator = values.generator ?? env.BENCH_GENERATOR ?? 'autocannon';
if (generator !== 'autocannon' && generator !== 'wrk') throw new Error(`unknown generator ${generator}; known: autocannon, wrk`);

for (const name of workloadNames) if (!WORKLOADS[name]) throw new Error(`unknown workload ${name}; known: ${Object.keys(WORKLOADS).join(', ')}`);

interface Sample extends LoadResult {
  readonly cpuUsPerRequest: number;
}

async function main(): Promise<void> {
  if (generator === 'wrk' && !(await hasWrk())) throw new Error('--generator wrk: wrk is not installed (apt-get install -y wrk)');
  const upstream = await startUpstream();
  const contenders: Contender[] = [];
  const skipped: string[] = [];
  try {
    await startContenders(contenderNames, upstream, contenders, skipped, { clientConnections: Math.max(...connectionCounts) });
    const results: Record<string, Record<string, Sample[]>> = {};
    if (prewarm > 0) {
      for (const c of contenders) for (const workloadName of workloadNames) await warmUp(c.url, WORKLOADS[workloadName]!, 64, prewarm);
    }
    for (const workloadName of workloadNames) {
      const workload = WORKLOADS[workloadName]!;
      for (const connections of connectionCounts) {
        const key = `${workloadName} c${connections}`;
        results[key] = {};
        for (const c of contenders) {
          results[key]![c.name] = [];
          await warmUp(c.url, workload, connections, warm);
        }
        for (let r = 0; r < repeats; r++) {
          for (const c of contenders) {
            await pause(300); // let the previous run's sockets close
            const cpuBefore = c.proc ? totalCpuSeconds(c.proc) : 0;
            const result = generator === 'wrk' ? await runWrk(c.url, workload, connections, seconds) : await runLoad(c.url, workload, connections, seconds);
            const cpuAfter = c.proc ? totalCpuSeconds(c.proc) : 0;
            // Over the requests served (2xx): a failed answer is no request served, however cheap.
            const cpuUsPerRequest = c.proc && result.ok > 0 ? ((cpuAfter - cpuBefore) * 1e6) / result.ok : Number.NaN;
            results[key]![c.name]!.push({ ...result, cpuUsPerRequest });
            process.stdout.write(
              `${key.padEnd(16)} ${c.name.padEnd(14)} run ${r + 1}/${repeats}: ${fmt(result.rps).padStart(7)} req/s  p50 ${fmt(result.p50Us)} us  p99 ${fmt(result.p99Us)} us  cpu ${fmt(cpuUsPerRequest, 1)} us/req  non2xx ${result.non2xx} errors ${result.errors} timeouts ${result.timeouts}\n`,
            );
          }
        }
      }
    }
    report(results, contenders, skipped);
  } finally {
    for (const c of contenders) await c.proc?.stop();
    await upstream.proc.stop();
  }
}

function report(results: Record<string, Record<string, Sample[]>>, contenders: Contender[], skipped: string[]): void {
  const info = machine();
  const command = `node dist/bench/suite.js ${process.argv.slice(2).join(' ')}`.trim();
  const summary: Record<string, Record<string, Record<string, number | number[]>>> = {};
  const groups: ChartGroup[] = [];
  const lines: string[] = [];
  for (const [key, byContender] of Object.entries(results)) {
    summary[key] = {};
    const rows: string[][] = [];
    const nginx2 = byContender['nginx-2w'] ? median(byContender['nginx-2w'].map((s) => s.rps)) : Number.NaN;
    const nodeProxy = byContender['node-proxy'] ? median(byContender['node-proxy'].map((s) => s.rps)) : Number.NaN;
    const series = [];
    for (const c of contenders) {
      const samples = byContender[c.name]!;
      const rps = median(samples.map((s) => s.rps));
      const [lo, hi] = spread(samples.map((s) => s.rps));
      const p50 = median(samples.map((s) => s.p50Us));
      const p99 = median(samples.map((s) => s.p99Us));
      const p999 = median(samples.map((s) => s.p999Us));
      const cpu = median(samples.map((s) => s.cpuUsPerRequest));
      const [cpuLo, cpuHi] = spread(samples.map((s) => s.cpuUsPerRequest));
      const failures = samples.reduce((s, x) => s + x.non2xx + x.errors + x.timeouts, 0);
      summary[key]![c.name] = { rps, rpsMin: lo, rpsMax: hi, p50Us: p50, p99Us: p99, p999Us: p999, cpuUsPerRequest: cpu, failures, runs: samples.map((s) => Math.round(s.rps)), cpuRuns: samples.map((s) => Math.round(s.cpuUsPerRequest * 10) / 10) };
      series.push({ label: c.name, rps, p50Us: p50, p99Us: p99, p999Us: p999 });
      rows.push([
        c.name,
        fmt(rps),
        `${fmt(lo)}-${fmt(hi)}`,
        Number.isFinite(nginx2) ? `${fmt(rps / nginx2, 2)}x` : '-',
        Number.isFinite(nodeProxy) ? `${fmt(rps / nodeProxy, 2)}x` : '-',
        fmt(p50),
        fmt(p99),
        fmt(p999),
        Number.isFinite(cpu) ? `${fmt(cpu, 1)} (${fmt(cpuLo, 1)}-${fmt(cpuHi, 1)})` : fmt(cpu, 1),
        String(failures),
      ]);
    }
    groups.push({ title: key, series });
    lines.push(`#### ${key}`, '', table(['contender', 'req/s (median)', 'spread', 'vs nginx-2w', 'vs node-proxy', 'p50 us', 'p99 us', 'p99.9 us', 'CPU us/req (spread)', 'failed'], rows), '');
  }
  const out = {
    machine: info,
    command,
    settings: { generator, repeats, seconds, prewarm, warm, workloads: workloadNames, connections: connectionCounts, contenders: contenders.map((c) => c.name), skipped },
    summary,
  };
  process.stdout.write(`\n${lines.join('\n')}\n`);
  if (values['no-write']) return;
  const dir = join(ROOT, 'bench/results');
  writeResult(join(dir, `${section}.json`), out);
  writeFileSync(join(dir, `${section}.svg`), svgChart(`Lakefront bench (${section}): ${info.date.slice(0, 10)}, ${info.cpu}`, groups));
  const header = [
    `Machine: ${info.cpu}, ${info.memory}, ${info.os}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
    `Command: \`${command}\` (${repeats} interleaved repeats of ${seconds} s per contender and workload, after a one-time ${prewarm} s warm-up on each workload and a ${warm} s one before each; medians, spread = min-max of the repeats).`,
    `${generator === 'wrk' ? "Load: wrk (one thread, its own process, the workload's requests cycled), latency per request in microseconds (wrk's own)." : 'Load: autocannon in the bench process, latency per response in microseconds (HDR).'} CPU us/req = the contender's process CPU time (all threads, all processes) over requests served (2xx); failed = non-2xx answers, connection errors and timeouts.`,
    skipped.length ? `Skipped: ${skipped.join('; ')}.` : '',
    `Chart: [results/${section}.svg](results/${section}.svg); raw figures: [results/${section}.json](results/${section}.json).`,
  ].filter(Boolean);
  updateSection(join(ROOT, 'bench/RESULTS.md'), section, [...header, '', ...lines].join('\n'));
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
