/**
 * WebSocket tunnels: echo round trips through Lakefront against the echo node directly and
 * nginx (2 workers, `hash $http_x_lakefront_board consistent` as in the suite).
 *
 *   node dist/bench/websocket.js [--quick] [--repeats 3] [--seconds 5] [--sockets 64] [--bytes 64]
 *
 * Each of `sockets` clients (the `ws` package, in this process) sends a text message of `bytes`,
 * waits for its echo and sends the next (a closed loop), each on its own board. Round trips per
 * second, latency percentiles (microseconds, every round trip), and Lakefront's CPU per round trip
 * (two messages through the tunnel, one each way), medians of interleaved repeats.
 */
import { cpus } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import WebSocket from 'ws';
import { direct, startLakefront, startNginx, startUpstream, type Contender } from './lib/contenders.js';
import { ROOT, pause, totalCpuSeconds } from './lib/procs.js';
import { fmt, machine, median, spread, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    repeats: { type: 'string' },
    seconds: { type: 'string' },
    sockets: { type: 'string', default: '64' },
    bytes: { type: 'string', default: '64' },
    'no-write': { type: 'boolean', default: false },
  },
});
const quick = values.quick!;
const repeats = Number(values.repeats ?? (quick ? 1 : 3));
const seconds = Number(values.seconds ?? (quick ? 2 : 5));
const sockets = Number(values.sockets);
const bytes = Number(values.bytes);

interface Run {
  trips: number;
  rate: number;
  p50: number;
  p99: number;
  p999: number;
  cpu: number;
}

function percentile(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** Opens `sockets` tunnels, runs the closed loop for `seconds`, closes them. */
async function load(contender: Contender, seconds: number): Promise<Omit<Run, 'cpu'> & { cpuSeconds: number }> {
  const base = contender.url.replace('http:', 'ws:');
  const clients = await Promise.all(
    Array.from({ length: sockets }, async (_, i) => {
      const ws = new WebSocket(`${base}/rpc/live`, { headers: { 'x-lakefront-board': `ws-bench-${i}` }, perMessageDeflate: false });
      await new Promise<void>((resolve, reject) => {
        ws.once('open', () => resolve());
        ws.once('error', reject);
      });
      return ws;
    }),
  );
  const message = 'x'.repeat(bytes);
  const samples: number[] = [];
  let running = true;
  const cpu0 = contender.proc ? totalCpuSeconds(contender.proc) : 0;
  const started = performance.now();
  const loops = clients.map(
    (ws) =>
      new Promise<void>((resolve) => {
        let sentAt = 0;
        ws.on('message', () => {
          samples.push((performance.now() - sentAt) * 1000);
          if (!running) {
            resolve();
            return;
          }
          sentAt = performance.now();
          ws.send(message);
        });
        ws.once('close', () => resolve());
        sentAt = performance.now();
        ws.send(message);
      }),
  );
  await pause(seconds * 1000);
  running = false;
  await Promise.all(loops);
  const elapsed = (performance.now() - started) / 1000;
  const cpuSeconds = contender.proc ? totalCpuSeconds(contender.proc) - cpu0 : 0;
  await Promise.all(
    clients.map(
      (ws) =>
        new Promise<void>((resolve) => {
          ws.once('close', () => resolve());
          ws.close(1000);
        }),
    ),
  );
  const sorted = Float64Array.from(samples).sort();
  return { trips: samples.length, rate: samples.length / elapsed, p50: percentile(sorted, 50), p99: percentile(sorted, 99), p999: percentile(sorted, 99.9), cpuSeconds };
}

async function main(): Promise<void> {
  const upstream = await startUpstream({ websocket: true });
  const contenders: Contender[] = [direct(upstream)];
  try {
    contenders.push(await startLakefront(upstream, { threads: 1 }), await startLakefront(upstream, { threads: 2 }));
    // nginx proxies WebSocket as an upgraded connection (its config maps the Upgrade header).
    const nginx = await startNginx(upstream, 2);
    if (typeof nginx === 'string') process.stdout.write(`skip nginx-2w: ${nginx}\n`);
    else contenders.push(nginx);
    for (const c of contenders) await load(c, 1); // warm-up: JIT, connections
    const runs = new Map<string, Run[]>();
    for (let r = 0; r < repeats; r++) {
      for (const c of contenders) {
        await pause(300);
        const res = await load(c, seconds);
        const run: Run = { ...res, cpu: c.proc ? (res.cpuSeconds * 1e6) / res.trips : Number.NaN };
        (runs.get(c.name) ?? runs.set(c.name, []).get(c.name)!).push(run);
        process.stdout.write(`${c.name.padEnd(14)} run ${r + 1}/${repeats}: ${fmt(run.rate)} round trips/s  p50 ${fmt(run.p50)} us  p99 ${fmt(run.p99)} us  cpu ${fmt(run.cpu, 1)} us/round trip\n`);
      }
    }
    const directRate = median(runs.get('direct')!.map((x) => x.rate));
    const rows = contenders.map((c) => {
      const s = runs.get(c.name)!;
      const [lo, hi] = spread(s.map((x) => x.rate));
      const rate = median(s.map((x) => x.rate));
      return { name: c.name, rate, lo, hi, ratio: rate / directRate, p50: median(s.map((x) => x.p50)), p99: median(s.map((x) => x.p99)), p999: median(s.map((x) => x.p999)), cpu: median(s.map((x) => x.cpu)) };
    });
    const info = machine();
    const command = `node dist/bench/websocket.js ${process.argv.slice(2).join(' ')}`.trim();
    const body = [
      `Machine: ${info.cpu} (${cpus().length} cores), ${info.memory}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
      `Command: \`${command}\` (${sockets} WebSockets, each a closed loop of ${bytes}-byte text messages echoed by the node; ${repeats} interleaved repeats of ${seconds} s; the clients (\`ws\`, one Node thread) and the echo nodes (uWS, one thread) share the machine). A round trip is two messages through the tunnel; CPU is Lakefront's per round trip.`,
      '',
      table(
        ['contender', 'round trips/s (median)', 'spread', 'vs direct', 'p50 us', 'p99 us', 'p99.9 us', 'CPU us/round trip'],
        rows.map((r) => [r.name, fmt(r.rate), `${fmt(r.lo)}-${fmt(r.hi)}`, `${fmt(r.ratio, 2)}x`, fmt(r.p50), fmt(r.p99), fmt(r.p999), fmt(r.cpu, 1)]),
      ),
    ].join('\n');
    process.stdout.write(`\n${body}\n`);
    if (!values['no-write']) {
      const section = quick ? 'websocket-quick' : 'websocket';
      updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
      writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, rows });
    }
  } finally {
    for (const c of contenders) await c.proc?.stop();
    await upstream.proc.stop();
  }
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
