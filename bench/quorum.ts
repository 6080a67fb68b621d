/**
 * Replicated routes (seed 003): what a quorum costs the front door. One Lakefront (2 threads) in
 * front of three nodes, three routes over them:
 *
 *   /one/*   a plain ring route, a key header, one node a request (the non-replicated path)
 *   /r1/*    replicated, n = 1 (w = r = 1): the replicated path with one replica
 *   /r3/*    replicated, n = 3, w = r = 2: every request to three replicas, answered at two
 *
 *   node dist/bench/quorum.js [--quick] [--repeats 3] [--seconds 5] [--connections 64]
 *
 * Writes are PUT 256 B, reads GET 64 B, over 64 keys. The nodes answer every request at once with
 * `x-lakefront-version: 1` (replicas in step: no read repair), so what differs is the fan-out.
 * Reported per route and operation: requests/s, latency percentiles (microseconds, every answer),
 * Lakefront's CPU per client request, and upstream requests per client request (from `/stats`),
 * medians of interleaved repeats.
 */
import type autocannon from 'autocannon';
import { cpus } from 'node:os';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startLakefrontWith, startUpstream, type Contender } from './lib/contenders.js';
import { runLoad, warmUp, type Workload } from './lib/load.js';
import { ROOT, pause, totalCpuSeconds } from './lib/procs.js';
import { fmt, machine, median, spread, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    repeats: { type: 'string' },
    seconds: { type: 'string' },
    connections: { type: 'string', default: '64' },
    'no-write': { type: 'boolean', default: false },
  },
});
const quick = values.quick!;
const repeats = Number(values.repeats ?? (quick ? 1 : 3));
const seconds = Number(values.seconds ?? (quick ? 2 : 5));
const connections = Number(values.connections);

const BODY_256 = 'x'.repeat(256);
const KEYS = 64;

function workload(route: string, op: 'PUT' | 'GET'): Workload {
  const requests: autocannon.Request[] = Array.from({ length: KEYS }, (_, i) => ({
    method: op,
    path: `/${route}/key-${i}`,
    headers: { 'x-lakefront-board': `key-${i}`, ...(op === 'PUT' ? { 'content-type': 'application/octet-stream' } : {}) },
    ...(op === 'PUT' ? { body: BODY_256 } : {}),
  }));
  return { name: `${route}-${op}`, description: `${op} /${route}/key-*`, requests };
}

const CASES = [
  { route: 'one', label: 'ring, one node', op: 'PUT' as const },
  { route: 'r1', label: 'replicated n=1', op: 'PUT' as const },
  { route: 'r3', label: 'replicated n=3 w=2', op: 'PUT' as const },
  { route: 'one', label: 'ring, one node', op: 'GET' as const },
  { route: 'r1', label: 'replicated n=1', op: 'GET' as const },
  { route: 'r3', label: 'replicated n=3 r=2', op: 'GET' as const },
];

interface Run {
  rps: number;
  p50: number;
  p99: number;
  cpu: number;
  fanout: number;
  non2xx: number;
}

async function upstreamAttempts(url: string): Promise<number> {
  const stats = (await (await fetch(`${url}/stats`)).json()) as { nodes: Record<string, { attempts: number }> };
  return Object.values(stats.nodes).reduce((sum, n) => sum + n.attempts, 0);
}

async function main(): Promise<void> {
  const upstream = await startUpstream({ version: '1' });
  let lakefront: Contender | null = null;
  try {
    const nodes = upstream.ports.map((port, i) => ({ id: `node-${i}`, url: `http://127.0.0.1:${port}` }));
    const quorum = (n: number, w: number) => ({ n, w, r: w, sloppy: false });
    const config = {
      clusters: [{ name: 'store', nodes }],
      routes: [
        { path: '/one/*', cluster: 'store', policy: 'ring', keyHeader: 'x-lakefront-board', hedge: false },
        { path: '/r1/*', cluster: 'store', quorum: quorum(1, 1) },
        { path: '/r3/*', cluster: 'store', quorum: quorum(3, 2) },
      ],
    };
    mkdirSync(join(ROOT, 'bench/out'), { recursive: true });
    const file = join(ROOT, 'bench/out/quorum-bench.json');
    writeFileSync(file, JSON.stringify(config));
    lakefront = await startLakefrontWith('lakefront-2t', ['--config', file, '--threads', '2']);
    const url = lakefront.url;
    const workloads = CASES.map((c) => workload(c.route, c.op));
    for (const w of workloads) await warmUp(url, w, connections, 1);
    const runs = CASES.map((): Run[] => []);
    for (let r = 0; r < repeats; r++) {
      for (const [i, c] of CASES.entries()) {
        await pause(300);
        const attempts0 = await upstreamAttempts(url);
        const cpu0 = totalCpuSeconds(lakefront.proc!);
        const res = await runLoad(url, workloads[i]!, connections, seconds);
        const cpu = totalCpuSeconds(lakefront.proc!) - cpu0;
        const attempts = (await upstreamAttempts(url)) - attempts0;
        const run: Run = { rps: res.rps, p50: res.p50Us, p99: res.p99Us, cpu: (cpu * 1e6) / res.requests, fanout: attempts / res.requests, non2xx: res.non2xx };
        runs[i]!.push(run);
        process.stdout.write(`${c.op} ${c.label.padEnd(20)} run ${r + 1}/${repeats}: ${fmt(run.rps)} req/s  p50 ${fmt(run.p50)} us  p99 ${fmt(run.p99)} us  cpu ${fmt(run.cpu, 1)} us/req  ${fmt(run.fanout, 2)} upstream/req${run.non2xx ? `  non-2xx ${run.non2xx}` : ''}\n`);
      }
    }
    const rows = CASES.map((c, i) => {
      const s = runs[i]!;
      const [lo, hi] = spread(s.map((x) => x.rps));
      return { op: c.op, route: c.label, rps: median(s.map((x) => x.rps)), lo, hi, p50: median(s.map((x) => x.p50)), p99: median(s.map((x) => x.p99)), cpu: median(s.map((x) => x.cpu)), fanout: median(s.map((x) => x.fanout)), non2xx: s.reduce((n, x) => n + x.non2xx, 0) };
    });
    const info = machine();
    const command = `node dist/bench/quorum.js ${process.argv.slice(2).join(' ')}`.trim();
    const body = [
      `Machine: ${info.cpu} (${cpus().length} cores), ${info.memory}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
      `Command: \`${command}\` (Lakefront at 2 threads in front of three uWS nodes that answer at once, every answer versioned alike; ${connections} connections; PUT 256 B and GET 64 B over ${KEYS} keys; ${repeats} interleaved repeats of ${seconds} s; load generator, proxy and nodes share the machine). CPU is Lakefront's per client request; upstream/req counts every attempt the nodes got (replicas, stand-ins, repairs).`,
      '',
      table(
        ['op', 'route', 'req/s (median)', 'spread', 'p50 us', 'p99 us', 'CPU us/req', 'upstream/req', 'non-2xx'],
        rows.map((r) => [r.op, r.route, fmt(r.rps), `${fmt(r.lo)}-${fmt(r.hi)}`, fmt(r.p50), fmt(r.p99), fmt(r.cpu, 1), fmt(r.fanout, 2), String(r.non2xx)]),
      ),
    ].join('\n');
    process.stdout.write(`\n${body}\n`);
    if (!values['no-write']) {
      const section = quick ? 'quorum-quick' : 'quorum';
      updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
      writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, rows });
    }
  } finally {
    await lakefront?.proc?.stop();
    await upstream.proc.stop();
  }
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
