// The latency tail straight to a bench node and through Lakefront, under the hedging bench's load
// (bench/hedging.ts: open loop, 2,000 req/s, boards over 1,024 keys). Build first (npm run build).
//   node bench/tail-probe.mjs direct|lakefront [seconds] [stall-probability] [lakefront flags...]
// e.g. `node bench/tail-probe.mjs direct 10 0`, `node bench/tail-probe.mjs lakefront 10 0 --hedge-mode off`.
// Prints the client's p50/p99/p99.9 (microseconds); through Lakefront also each node's latency
// from /stats (cumulative since start-up: a 2 s warm-up run first, but a short run still weighs
// the first seconds heavily).
import { spawn } from 'node:child_process';

const [mode = 'lakefront', seconds = '10', stallP = '0.02', ...flags] = process.argv.slice(2);
const { startUpstream } = await import('../dist/bench/lib/contenders.js');
const { openLoop } = await import('../dist/bench/lib/openloop.js');
const upstream = await startUpstream({ stallMs: 50, stallP: Number(stallP) });
let front = null;
try {
  let url = `http://127.0.0.1:${upstream.ports[0]}`;
  if (mode === 'lakefront') {
    const nodes = upstream.ports.map((port, i) => `node-${i}=http://127.0.0.1:${port}`).join(',');
    const args = flags.length > 0 ? flags : ['--hedge-mode', 'percentile'];
    front = spawn(process.execPath, [new URL('../dist/src/cli.js', import.meta.url).pathname, '--nodes', nodes, '--port', '0', '--host', '127.0.0.1', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    front.stdout.on('data', (d) => (out += d));
    front.stderr.on('data', (d) => (out += d));
    for (let i = 0; i < 100 && !/http:\/\/127\.0\.0\.1:\d+/.test(out); i++) await new Promise((resolve) => setTimeout(resolve, 100));
    const found = out.match(/http:\/\/127\.0\.0\.1:\d+/);
    if (found === null) throw new Error(`lakefront did not start: ${out}`);
    url = found[0];
  } else if (mode !== 'direct') throw new Error(`mode: direct or lakefront, not ${mode}`);
  const boards = Array.from({ length: 1024 }, (_, i) => `board-${(i * 7919) % 100_003}`);
  const load = (secs) => openLoop(url, { rate: 2000, seconds: secs, path: '/rpc/query.execute', headers: (i) => ({ 'x-lakefront-board': boards[i % boards.length] }) });
  await load(2);
  const result = await load(Number(seconds));
  console.log(`${mode} ${flags.join(' ')}, stalls ${stallP}: client p50 ${result.p50Us} us, p99 ${result.p99Us} us, p99.9 ${result.p999Us} us`);
  if (front !== null) {
    const stats = await (await fetch(`${url}/stats`)).json();
    for (const [id, node] of Object.entries(stats.nodes)) console.log(`  ${id}: ${JSON.stringify(node.latencyUs)}`);
  }
} finally {
  front?.kill('SIGTERM');
  await upstream.proc.stop();
}
