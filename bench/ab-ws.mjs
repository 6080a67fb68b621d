#!/usr/bin/env node
// Side-by-side CPU of two builds of Lakefront on WebSocket tunnels, split into user and system
// time, with nginx-2w beside them:
//   node bench/ab-ws.mjs OLD_ROOT NEW_ROOT [THREADS=2] [RUNS=4]
// Each ROOT is a checkout with a compiled dist/ (e.g. `git archive REV | tar -x -C .ab/old`, a
// node_modules link and `npx tsc -p .`). One set of echo nodes; each build started once, warmed
// for 1 s, then RUNS rounds of 4 s each per build (and nginx): 64 sockets, each a closed loop of
// 64-byte text messages, as bench/websocket.ts. Prints us a round trip: user + system = total.
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';
import WebSocket from 'ws';

const [oldRoot, newRoot] = process.argv.slice(2, 4).map((p) => resolve(p));
const threads = Number(process.argv[4] ?? 2);
const runs = Number(process.argv[5] ?? 4);
if (!oldRoot || !newRoot) {
  process.stderr.write('usage: node bench/ab-ws.mjs OLD_ROOT NEW_ROOT [THREADS] [RUNS]\n');
  process.exit(2);
}
const before = await import(`${oldRoot}/dist/bench/lib/contenders.js`);
const after = await import(`${newRoot}/dist/bench/lib/contenders.js`);

/** User and system CPU seconds of a set of PIDs. */
function cpu(pids) {
  let user = 0;
  let system = 0;
  for (const pid of pids) {
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      user += Number(fields[11]) / 100;
      system += Number(fields[12]) / 100;
    } catch {
      // gone
    }
  }
  return [user, system];
}

async function load(url, seconds) {
  const base = url.replace('http:', 'ws:');
  const clients = await Promise.all(
    Array.from({ length: 64 }, (_, i) => new Promise((ok, fail) => {
      const ws = new WebSocket(`${base}/rpc/live`, { headers: { 'x-lakefront-board': `ws-bench-${i}` }, perMessageDeflate: false });
      ws.once('open', () => ok(ws));
      ws.once('error', fail);
    })),
  );
  const message = 'x'.repeat(64);
  let trips = 0;
  let running = true;
  setTimeout(() => (running = false), seconds * 1000);
  await Promise.all(clients.map((ws) => new Promise((done) => {
    ws.on('message', () => {
      trips++;
      if (running) ws.send(message);
      else done();
    });
    ws.send(message);
  })));
  for (const ws of clients) ws.terminate();
  return trips;
}

const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const upstream = await after.startUpstream({ websocket: true });
const contenders = [await before.startLakefront(upstream, { threads, name: 'old' }), await after.startLakefront(upstream, { threads, name: 'new' })];
const nginx = await after.startNginx(upstream, 2);
if (typeof nginx === 'string') process.stdout.write(`skip nginx-2w: ${nginx}\n`);
else contenders.push(nginx);
try {
  for (const c of contenders) await load(c.url, 1);
  const results = new Map(contenders.map((c) => [c.name, []]));
  for (let r = 0; r < runs; r++) {
    for (const c of contenders) {
      const [u0, s0] = cpu(c.proc.pids());
      const trips = await load(c.url, 4);
      const [u1, s1] = cpu(c.proc.pids());
      results.get(c.name).push({ user: ((u1 - u0) * 1e6) / trips, system: ((s1 - s0) * 1e6) / trips, rate: trips / 4 });
    }
  }
  for (const [name, rs] of results) {
    const each = rs.map((x) => `${x.user.toFixed(1)}+${x.system.toFixed(1)}=${(x.user + x.system).toFixed(1)}`).join(', ');
    process.stdout.write(`${name.padEnd(9)} ${each}  median user ${median(rs.map((x) => x.user)).toFixed(2)}, total ${median(rs.map((x) => x.user + x.system)).toFixed(2)} us, ${Math.round(median(rs.map((x) => x.rate)))} round trips/s\n`);
  }
} finally {
  for (const c of contenders) await c.proc.stop();
  await upstream.proc.stop();
}
