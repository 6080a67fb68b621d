/**
 * Thread tuning: Lakefront at several worker-thread counts, the same load, interleaved; prints a
 * table and recommends a count for this machine.
 *
 *   node dist/bench/threads.js [--threads 1,2,3,4] [--quick] [--repeats 3] [--seconds 5]
 *       [--workload post256] [--connections 64]
 */
import { cpus } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startLakefront, startUpstream, type Contender } from './lib/contenders.js';
import { WORKLOADS, runLoad, warmUp } from './lib/load.js';
import { ROOT, pause, totalCpuSeconds } from './lib/procs.js';
import { fmt, machine, median, spread, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    threads: { type: 'string', default: '1,2,3,4' },
    quick: { type: 'boolean', default: false },
    repeats: { type: 'string' },
    seconds: { type: 'string' },
    workload: { type: 'string', default: 'post256' },
    connections: { type: 'string', default: '64' },
    'no-write': { type: 'boolean', default: false },
  },
});
const quick = values.quick!;
const counts = (quick ? '1,2' : values.threads!).split(',').map(Number);
const repeats = Number(values.repeats ?? process.env.BENCH_REPEATS ?? 3);
const seconds = Number(values.seconds ?? process.env.BENCH_SECONDS ?? (quick ? 2 : 5));
const workload = WORKLOADS[values.workload!];
if (!workload) throw new Error(`unknown workload ${values.workload}`);
const connections = Number(values.connections);

async function main(): Promise<void> {
  const upstream = await startUpstream();
  const contenders: { threads: number; c: Contender }[] = [];
  try {
    for (const threads of counts) contenders.push({ threads, c: await startLakefront(upstream, { threads }) });
    for (const { c } of contenders) await warmUp(c.url, workload!, connections);
    const samples = new Map<number, { rps: number; p99: number; cpu: number; failed: number }[]>();
    for (let r = 0; r < repeats; r++) {
      for (const { threads, c } of contenders) {
        await pause(300);
        const cpu0 = totalCpuSeconds(c.proc!);
        const res = await runLoad(c.url, workload!, connections, seconds);
        const cpu = ((totalCpuSeconds(c.proc!) - cpu0) * 1e6) / res.ok;
        const failed = res.non2xx + res.errors + res.timeouts;
        const list = samples.get(threads) ?? [];
        list.push({ rps: res.rps, p99: res.p99Us, cpu, failed });
        samples.set(threads, list);
        process.stdout.write(`threads ${threads} run ${r + 1}/${repeats}: ${fmt(res.rps)} req/s  p99 ${fmt(res.p99Us)} us  cpu ${fmt(cpu, 1)} us/req  failed ${failed}\n`);
      }
    }
    const rows = counts.map((threads) => {
      const s = samples.get(threads)!;
      const [lo, hi] = spread(s.map((x) => x.rps));
      return { threads, rps: median(s.map((x) => x.rps)), lo, hi, p99: median(s.map((x) => x.p99)), cpu: median(s.map((x) => x.cpu)), failed: s.reduce((n, x) => n + x.failed, 0) };
    });
    const best = Math.max(...rows.map((r) => r.rps));
    // The fewest threads within 5% of the best throughput: more threads than that only add contention.
    const pick = rows.filter((r) => r.rps >= best * 0.95).sort((a, b) => a.threads - b.threads)[0]!;
    const info = machine();
    const command = `node dist/bench/threads.js ${process.argv.slice(2).join(' ')}`.trim();
    const body = [
      `Machine: ${info.cpu} (${cpus().length} cores), ${info.memory}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
      `Command: \`${command}\` (${workload!.description}, ${connections} connections, ${repeats} interleaved repeats of ${seconds} s; the load generator shares the machine; req/s and CPU us/req count requests served (2xx), failed the rest and connection errors).`,
      '',
      table(['threads', 'req/s (median)', 'spread', 'p99 us', 'CPU us/req', 'failed'], rows.map((r) => [String(r.threads), fmt(r.rps), `${fmt(r.lo)}-${fmt(r.hi)}`, fmt(r.p99), fmt(r.cpu, 1), String(r.failed)])),
      '',
      `Recommendation for this machine: \`--threads ${pick.threads}\` (the fewest threads within 5% of the best median throughput).`,
    ].join('\n');
    process.stdout.write(`\n${body}\n`);
    if (!values['no-write']) {
      const section = quick ? 'threads-quick' : 'threads';
      updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
      writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, rows, recommendation: pick.threads });
    }
  } finally {
    for (const { c } of contenders) await c.proc?.stop();
    await upstream.proc.stop();
  }
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
