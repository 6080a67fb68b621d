// The latency tail straight to a bench node and through Lakefront, under the hedging bench's load
// (bench/hedging.ts: open loop, 2,000 req/s, boards over 1,024 keys). Build first (npm run build).
//   node bench/tail-probe.mjs direct|lakefront|floor [seconds] [stall-probability] [lakefront flags...]
// (floor: bench/floor-proxy.ts at 2 threads, the least a uWS + Node proxy does, for the design's own tail)
// e.g. `node bench/tail-probe.mjs direct 10 0`, `node bench/tail-probe.mjs lakefront 10 0 --hedge-mode off`.
// Prints the client's p50/p99/p99.9 (microseconds); through Lakefront also each node's latency
// from /stats (cumulative since start-up: a 2 s warm-up run first, but a short run still weighs
// the first seconds heavily).
// Environment: TAIL_NODE_FLAGS, node flags for the front's process alone (e.g. "--trace-gc");
// TAIL_FRONT_OUT=1 prints what the front wrote (its GC trace, say) after the figures;
// TAIL_TIMELINE=MS prints, for each MS-millisecond stretch of the measured run that had one, how
// many requests took over 5 ms and the slowest (when the slow ones came: together, or spread);
// TAIL_THREADS=1 prints the front's threads over the measured run: CPU, time waiting to run, and
// context switches (/proc/PID/task);
// TAIL_PACER: the load generator, `native` by default (bench/native/openloop.c, built with cc:
// requests leave within tens of microseconds of their schedule), `timer` for Node's 1 ms timer (the
// figures before the twenty-fifth session), `worker` for Node with a worker thread's timed waits
// (bench/lib/openloop.ts).
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';

/** Each thread of a process: its name, CPU and run-queue wait (schedstat), context switches. */
function threadStats(pid) {
  const threads = new Map();
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      const dir = `/proc/${pid}/task/${tid}`;
      const [cpuNs, waitNs] = readFileSync(`${dir}/schedstat`, 'utf8').split(' ').map(Number);
      const status = readFileSync(`${dir}/status`, 'utf8');
      const field = (name) => Number(status.match(new RegExp(`^${name}:\\s+(\\d+)`, 'm'))?.[1] ?? 0);
      threads.set(tid, { name: readFileSync(`${dir}/comm`, 'utf8').trim(), cpuNs, waitNs, voluntary: field('voluntary_ctxt_switches'), involuntary: field('nonvoluntary_ctxt_switches') });
    } catch {
      // A thread that ended meanwhile.
    }
  }
  return threads;
}

const [mode = 'lakefront', seconds = '10', stallP = '0.02', ...flags] = process.argv.slice(2);
const { startUpstream } = await import('../dist/bench/lib/contenders.js');
const { openLoop, spreadBoards } = await import('../dist/bench/lib/openloop.js');
const upstream = await startUpstream({ stallMs: 50, stallP: Number(stallP) });
let front = null;
let out = '';
try {
  let url = `http://127.0.0.1:${upstream.ports[0]}`;
  if (mode === 'lakefront' || mode === 'floor') {
    const nodes = upstream.ports.map((port, i) => `node-${i}=http://127.0.0.1:${port}`).join(',');
    const args =
      mode === 'floor'
        ? [new URL('../dist/bench/floor-proxy.js', import.meta.url).pathname, '--nodes', nodes, '--port', '0', '--threads', '2']
        : [new URL('../dist/src/cli.js', import.meta.url).pathname, '--nodes', nodes, '--port', '0', '--host', '127.0.0.1', ...(flags.length > 0 ? flags : ['--hedge-mode', 'percentile'])];
    const nodeFlags = (process.env.TAIL_NODE_FLAGS ?? '').split(' ').filter((f) => f !== '');
    front = spawn(process.execPath, [...nodeFlags, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
    out = '';
    front.stdout.on('data', (d) => (out += d));
    front.stderr.on('data', (d) => (out += d));
    const started = () => out.match(/http:\/\/127\.0\.0\.1:\d+/)?.[0] ?? out.match(/"port":(\d+)/)?.[1];
    for (let i = 0; i < 100 && started() === undefined; i++) await new Promise((resolve) => setTimeout(resolve, 100));
    const found = started();
    if (found === undefined) throw new Error(`${mode} did not start: ${out}`);
    url = found.startsWith('http') ? found : `http://127.0.0.1:${found}`;
  } else if (mode !== 'direct') throw new Error(`mode: direct, lakefront or floor, not ${mode}`);
  const boards = spreadBoards();
  const load = (secs, onLatency) => openLoop(url, { rate: 2000, seconds: secs, path: '/rpc/query.execute', headers: (i) => ({ 'x-lakefront-board': boards[i % boards.length] }), onLatency, pacer: process.env.TAIL_PACER ?? 'native' });
  await load(2);
  const threadsBefore = front !== null && process.env.TAIL_THREADS === '1' ? threadStats(front.pid) : null;
  const stretchMs = Number(process.env.TAIL_TIMELINE ?? 0);
  const stretches = new Map();
  const result = await load(
    Number(seconds),
    stretchMs > 0
      ? (dueMs, us) => {
          if (us <= 5000) return;
          const at = Math.floor(dueMs / stretchMs);
          const s = stretches.get(at) ?? { slow: 0, max: 0 };
          s.slow++;
          s.max = Math.max(s.max, us);
          stretches.set(at, s);
        }
      : undefined,
  );
  console.log(`${mode} ${flags.join(' ')}, stalls ${stallP}: client p50 ${result.p50Us} us, p99 ${result.p99Us} us, p99.9 ${result.p999Us} us (sent late: p50 ${result.lateP50Us} us, p99 ${result.lateP99Us} us)`);
  if (threadsBefore !== null) {
    const after = threadStats(front.pid);
    const rows = [...after.entries()].map(([tid, a]) => {
      const b = threadsBefore.get(tid) ?? { name: a.name, cpuNs: 0, voluntary: 0, involuntary: 0, waitNs: 0 };
      return `${a.name} ${tid}: cpu ${((a.cpuNs - b.cpuNs) / 1e6).toFixed(1)} ms, run-queue wait ${((a.waitNs - b.waitNs) / 1e6).toFixed(1)} ms, switches ${a.voluntary - b.voluntary} voluntary ${a.involuntary - b.involuntary} involuntary`;
    });
    console.log(`  the front's threads over the measured run (${result.sent} requests):\n    ${rows.join('\n    ')}`);
  }
  if (mode === 'lakefront') {
    const stats = await (await fetch(`${url}/stats`)).json();
    for (const [id, node] of Object.entries(stats.nodes)) console.log(`  ${id}: ${JSON.stringify(node.latencyUs)}`);
  }
  if (stretchMs > 0) {
    const rows = [...stretches.entries()].sort((a, b) => a[0] - b[0]);
    console.log(`over 5 ms, by ${stretchMs} ms stretch (start ms: count, slowest us): ${rows.map(([at, s]) => `${at * stretchMs}: ${s.slow}, ${s.max}`).join('; ')}`);
  }
  if (process.env.TAIL_FRONT_OUT === '1') console.log(out);
} finally {
  front?.kill('SIGTERM');
  await upstream.proc.stop();
}
