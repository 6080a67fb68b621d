/**
 * Passive health: how long a node that hangs on requests (its `/health` still passing) takes to
 * be ejected, and what clients see meanwhile, with ejection on (the defaults) and off.
 *
 *   node dist/bench/ejection.js [--repeats 2] [--seconds 25] [--connections 8]
 *
 * The `lakefront` command (2 threads, default settings otherwise) runs over three node:http nodes
 * in this process; one of them hangs on everything but `/health` from the first request. Closed
 * loops of `connections` keep-alive clients send, for `seconds`, either reads
 * (`POST /rpc/query.execute`, hedged) or bare writes (`POST /rpc/board.append`, sent once), each
 * request with a board of its own; `/stats` is polled every 50 ms for the node's `ejected`. Each
 * run starts a fresh front door. Reported per case: time to ejection, requests the hanging node
 * took, answers by status, and latency percentiles (medians over the repeats).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Pool, request } from 'undici';
import { ROOT, track } from './lib/procs.js';
import { fmt, machine, median, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    repeats: { type: 'string', default: '2' },
    seconds: { type: 'string', default: '25' },
    connections: { type: 'string', default: '8' },
  },
});
const repeats = Number(values.repeats);
const seconds = Number(values.seconds);
const connections = Number(values.connections);

interface Node {
  readonly id: string;
  readonly server: Server;
  hang: boolean;
  took: number;
}

async function startNode(id: string, hang: boolean): Promise<Node> {
  const node: Node = { id, server: createServer(), hang, took: 0 };
  node.server.on('request', (req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/health') return void res.end('{"ok":true}');
      node.took++;
      if (node.hang) return; // never answered: the front door's timeout closes it
      res.setHeader('content-type', 'application/json');
      res.end(`{"node":"${id}"}`);
    });
  });
  node.server.keepAliveTimeout = 60_000;
  node.server.listen(0, '127.0.0.1');
  await once(node.server, 'listening');
  return node;
}

async function startDoor(nodes: Node[], extra: string[]): Promise<{ child: ChildProcess; url: string }> {
  const list = nodes.map((n) => `${n.id}=http://127.0.0.1:${(n.server.address() as AddressInfo).port}`).join(',');
  const child = track(spawn(process.execPath, [join(ROOT, 'dist/src/cli.js'), '--nodes', list, '--port', '0', '--host', '127.0.0.1', '--threads', '2', ...extra], { cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'] }));
  child.stderr!.resume();
  let out = '';
  for await (const chunk of child.stdout!) {
    out += String(chunk);
    const match = /listening on (http:\/\/[\d.]+:\d+)/.exec(out);
    if (match) {
      child.stdout!.resume();
      return { child, url: match[1]! };
    }
  }
  throw new Error(`lakefront did not start: ${out}`);
}

interface Run {
  ejectedMs: number | null;
  took: number;
  statuses: Record<string, number>;
  p50: number;
  p99: number;
  max: number;
}

async function run(kind: 'reads' | 'writes', eject: boolean): Promise<Run> {
  const nodes = await Promise.all(['node-0', 'node-1', 'node-2'].map((id) => startNode(id, false)));
  const hanging = nodes[1]!;
  const { child, url } = await startDoor(nodes, eject ? [] : ['--eject-after', '0']);
  const pool = new Pool(url, { connections, pipelining: 1 });
  const path = kind === 'reads' ? '/rpc/query.execute' : '/rpc/board.append';
  const statuses: Record<string, number> = {};
  const latencies: number[] = [];
  let n = 0;
  let ejectedMs: number | null = null;
  hanging.hang = true;
  const started = performance.now();
  const until = started + seconds * 1000;
  const poll = setInterval(() => {
    request(`${url}/stats`)
      .then(async (res) => {
        const stats = (await res.body.json()) as { nodes: Record<string, { ejected: boolean }> };
        if (ejectedMs === null && stats.nodes[hanging.id]!.ejected) ejectedMs = performance.now() - started;
      })
      .catch(() => undefined);
  }, 50);
  await Promise.all(
    Array.from({ length: connections }, async () => {
      while (performance.now() < until) {
        const t = performance.now();
        try {
          const res = await pool.request({ path, method: 'POST', headers: { 'x-lakefront-board': `ej-${n++}`, 'content-type': 'application/json' }, body: '{}' });
          await res.body.dump();
          statuses[res.statusCode] = (statuses[res.statusCode] ?? 0) + 1;
        } catch (err) {
          const code = (err as { code?: string }).code ?? 'error';
          statuses[code] = (statuses[code] ?? 0) + 1;
        }
        latencies.push(performance.now() - t);
      }
    }),
  );
  clearInterval(poll);
  await pool.close();
  child.kill('SIGTERM');
  await once(child, 'exit');
  for (const node of nodes) {
    node.server.closeAllConnections();
    node.server.close();
  }
  latencies.sort((a, b) => a - b);
  const at = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))]!;
  return { ejectedMs, took: hanging.took, statuses, p50: at(0.5), p99: at(0.99), max: latencies.at(-1)! };
}

const cases: { kind: 'reads' | 'writes'; eject: boolean }[] = [
  { kind: 'reads', eject: true },
  { kind: 'reads', eject: false },
  { kind: 'writes', eject: true },
  { kind: 'writes', eject: false },
];
const results = new Map<string, Run[]>();
for (let r = 0; r < repeats; r++) {
  for (const c of cases) {
    const name = `${c.kind}, ${c.eject ? 'ejection on (defaults)' : '--eject-after 0'}`;
    const result = await run(c.kind, c.eject);
    console.log(`${name} run ${r + 1}/${repeats}: ejected at ${result.ejectedMs === null ? 'never' : `${fmt(result.ejectedMs)} ms`}, hanging node took ${result.took}, ${JSON.stringify(result.statuses)}, p50 ${fmt(result.p50, 1)} ms p99 ${fmt(result.p99)} ms max ${fmt(result.max)} ms`);
    results.set(name, [...(results.get(name) ?? []), result]);
  }
}

const rows = [...results].map(([name, runs]) => {
  const ejected = runs.map((r) => r.ejectedMs);
  const statuses = runs.map((r) => Object.entries(r.statuses).map(([k, v]) => `${k}: ${v}`).join(', ')).join(' / ');
  return [
    name,
    ejected.map((e) => (e === null ? 'never' : `${fmt(e / 1000, 1)} s`)).join(', '),
    runs.map((r) => String(r.took)).join(', '),
    statuses,
    fmt(median(runs.map((r) => r.p50)), 1),
    fmt(median(runs.map((r) => r.p99))),
    fmt(median(runs.map((r) => r.max))),
  ];
});
const m = machine();
const body = [
  `Machine: ${m.cpu}, ${m.memory}, ${m.os}; Node ${m.node}; commit ${m.commit}; ${new Date().toISOString()}.`,
  `Command: \`node dist/bench/ejection.js --repeats ${repeats} --seconds ${seconds} --connections ${connections}\` (the \`lakefront\` command at 2 threads over three node:http nodes, one hanging on every request but \`/health\`; ${connections} closed-loop clients for ${seconds} s a run, each request a board of its own; a fresh front door each run; per-run figures, latency medians over the runs).`,
  '',
  table(['case', 'ejected after (each run)', 'requests the hanging node took', 'answers (each run)', 'p50 ms', 'p99 ms', 'max ms'], rows),
].join('\n');
writeResult(join(ROOT, 'bench/results/ejection.json'), { machine: m, repeats, seconds, connections, results: Object.fromEntries(results) });
updateSection(join(ROOT, 'bench', 'RESULTS.md'), 'ejection', body);
console.log(body);
