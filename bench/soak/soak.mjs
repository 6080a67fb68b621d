// A soak: about 17 minutes of mixed traffic in nine phases, with faults, and after each phase an
// idle pause and a sample of what must come back to its baseline (RSS, file descriptors,
// threads, the proxy's connections to each node, inflight, open tunnels, pending hints).
//   npm run build && node bench/soak/soak.mjs [OUTDIR]     (default bench/out/soak)
// Environment: IDLE_S (20), FINAL_IDLE_S (60), ONLY=P4,P5 (some phases), LF_CLI (the front door's
// cli.js; default this checkout's dist). Nine upstream nodes (upnode.mjs) and the load (load.mjs)
// run as processes of their own on 127.0.0.1; everything is stopped by PID at the end. Writes
// samples.jsonl, timeline.jsonl (every 5 s), load.jsonl, soak.log and Lakefront's output to
// OUTDIR, and prints the samples as a table. (Written by a helper's audit, 2026-12-01; see
// bench/RESULTS.md, "Soak".)
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import { fileURLToPath } from 'node:url';
const HERE = fileURLToPath(new URL('.', import.meta.url));
const OUT = process.argv[2] ?? fileURLToPath(new URL('../out/soak', import.meta.url));
const IDLE = Number(process.env.IDLE_S ?? 20) * 1000;
const LF_CLI = process.env.LF_CLI ?? fileURLToPath(new URL('../../dist/src/cli.js', import.meta.url));
fs.mkdirSync(OUT, { recursive: true });
const log = (...a) => { const l = `[${new Date().toISOString().slice(11, 19)}] ${a.join(' ')}`; console.log(l); fs.appendFileSync(`${OUT}/soak.log`, l + '\n'); };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const IDS = ['b1', 'b2', 'b3', 'f1', 'f2', 's1', 's2', 's3', 's4'];
const nodes = {};  // id -> { port, proc }
function startNode(id, port = 0) {
  return new Promise((resolve) => {
    const p = spawn('node', [`${HERE}upnode.mjs`, id, String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
    p.stdout.once('data', (d) => { const j = JSON.parse(String(d).split('\n')[0]); nodes[id] = { port: j.port, proc: p }; log(`node ${id} up port ${j.port} pid ${p.pid}`); resolve(); });
  });
}
async function killNode(id, sig = 'SIGKILL') { const n = nodes[id]; log(`node ${id} ${sig} pid ${n.proc.pid}`); n.proc.kill(sig); await new Promise((r) => n.proc.once('exit', r)); }
async function restartNode(id) { await startNode(id, nodes[id].port); }
async function ctl(id, q) { try { const r = await fetch(`http://127.0.0.1:${nodes[id].port}/__ctl?${q}`); log(`ctl ${id} ${q} -> ${r.status}`); } catch (e) { log(`ctl ${id} failed ${e.message}`); } }
async function upStats(id) { try { return await (await fetch(`http://127.0.0.1:${nodes[id].port}/__stats`, { signal: AbortSignal.timeout(2000) })).json(); } catch { return null; } }

let lf, lfPort;
function startLF() {
  return new Promise((resolve) => {
    const out = fs.openSync(`${OUT}/lf.err`, 'a');
    lf = spawn('node', [LF_CLI, '--config', `${OUT}/lf.json`, '--port', '0', '--host', '127.0.0.1', '--threads', '2', '--affinity-keys-file', `${OUT}/keys`], { stdio: ['ignore', 'pipe', out] });
    lf.stdout.on('data', (d) => {
      fs.appendFileSync(`${OUT}/lf.out`, d);
      const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(String(d));
      if (m && !lfPort) { lfPort = Number(m[1]); log(`lakefront pid ${lf.pid} port ${lfPort}`); resolve(); }
    });
    lf.on('exit', (c, s) => log(`lakefront exited ${c} ${s}`));
  });
}
function procInfo(pid) {
  const st = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const g = (k) => Number((new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(st) ?? [])[1]);
  return { rssKiB: g('VmRSS'), hwmKiB: g('VmHWM'), threads: g('Threads'), fds: fs.readdirSync(`/proc/${pid}/fd`).length };
}
function sockets(pid) {
  const txt = execFileSync('ss', ['-tanp', 'exclude', 'time-wait'], { encoding: 'utf8', maxBuffer: 256 << 20 });
  const portToId = Object.fromEntries(Object.entries(nodes).map(([id, n]) => [String(n.port), id]));
  const up = {}; const states = {}; let client = 0, listen = 0;
  for (const line of txt.split('\n')) {
    if (!line.includes(`pid=${pid},`)) continue;
    const f = line.trim().split(/\s+/); const state = f[0]; const local = f[3], peer = f[4];
    const pport = peer.split(':').pop(), lport = local.split(':').pop();
    if (state === 'LISTEN') { listen++; continue; }
    states[state] = (states[state] ?? 0) + 1;
    if (portToId[pport]) { const k = portToId[pport]; up[k] = up[k] ?? {}; up[k][state] = (up[k][state] ?? 0) + 1; }
    else if (lport === String(lfPort)) client++;
  }
  return { up, states, client, listen };
}
async function stats() { try { return await (await fetch(`http://127.0.0.1:${lfPort}/stats`, { signal: AbortSignal.timeout(3000) })).json(); } catch (e) { return { error: e.message }; } }
async function sample(label) {
  const p = procInfo(lf.pid), so = sockets(lf.pid), s = await stats();
  const ups = {}; for (const id of IDS) ups[id] = await upStats(id);
  const inflight = s.nodes ? Object.fromEntries(Object.entries(s.nodes).map(([k, v]) => [k, v.inflight])) : null;
  const rec = { t: Date.now(), label, ...p, sockets: so, inflight, websockets: s.websockets, hints: s.quorum?.hints, quorum: s.quorum, requests: s.requests, hedges: s.hedges, hedgeWins: s.hedgeWins, failovers: s.failovers, rejected: s.rejected, hedgesDenied: s.hedgesDenied, healthy: s.healthy, nodeStats: s.nodes, upstream: ups };
  fs.appendFileSync(`${OUT}/samples.jsonl`, JSON.stringify(rec) + '\n');
  const upc = Object.fromEntries(IDS.map((id) => [id, Object.values(so.up[id] ?? {}).reduce((a, b) => a + b, 0)]));
  const infl = inflight ? Object.values(inflight).reduce((a, b) => a + b, 0) : 'n/a';
  log(`SAMPLE ${label}: rss=${(p.rssKiB / 1024).toFixed(1)}MiB fds=${p.fds} thr=${p.threads} upconns=${JSON.stringify(upc)} states=${JSON.stringify(so.states)} client=${so.client} inflight=${infl} ws=${s.websockets} hints=${JSON.stringify(s.quorum?.hints)} req=${s.requests} hedges=${s.hedges}/${s.hedgeWins} fo=${s.failovers} rej=${s.rejected} upWs=${IDS.map((i) => ups[i]?.ws).join(',')} upConns=${IDS.map((i) => ups[i]?.conns).join(',')}`);
  return rec;
}
let tl;
function timeline(phase) {
  clearInterval(tl);
  tl = setInterval(async () => {
    try { const p = procInfo(lf.pid); const s = await stats(); fs.appendFileSync(`${OUT}/timeline.jsonl`, JSON.stringify({ t: Date.now(), phase, ...p, ws: s.websockets, hints: s.quorum?.hints?.pending, req: s.requests, inflight: s.nodes ? Object.values(s.nodes).reduce((a, v) => a + v.inflight, 0) : null, healthy: s.healthy }) + '\n'); } catch {}
  }, 5000);
}
function load(args, tag) {
  return new Promise((resolve) => {
    const p = spawn('node', [`${HERE}load.mjs`, `port=${lfPort}`, ...args], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = ''; p.stdout.on('data', (d) => (out += d));
    p.on('exit', () => { fs.appendFileSync(`${OUT}/load.jsonl`, JSON.stringify({ tag, args, result: out.trim() }) + '\n'); log(`load ${tag} done: ${out.trim().slice(0, 1500)}`); resolve(); });
  });
}
const at = (s, fn) => sleep(s * 1000).then(fn);
const ALL = 'mix=read:40,write:20,abort:8,kv:20,live:10,get:2';
const phases = [
  ['P1-hedged-reads+writes', async () => { for (const b of ['b1', 'b2', 'b3']) await ctl(b, 'stall=2&stallMs=50'); await load(['secs=80', 'rate=2500', 'mix=read:65,write:30,get:5'], 'P1'); }],
  ['P2-client-aborts', async () => { await load(['secs=80', 'rate=2000', 'mix=read:50,write:25,abort:25'], 'P2'); }],
  ['P3-upstream-faults', async () => {
    await Promise.all([load(['secs=100', 'rate=2500', 'mix=read:60,write:30,abort:10'], 'P3'),
      at(10, () => ctl('b2', 'mode=slow&ms=400')), at(40, () => ctl('b2', 'mode=normal')),
      at(40, () => ctl('b3', 'mode=shed')), at(65, () => ctl('b3', 'mode=normal')),
      at(65, () => killNode('b1')).then(() => at(20, () => restartNode('b1')))]);
  }],
  ['P4-websocket+affinity', async () => {
    await Promise.all([load(['secs=90', 'rate=1500', 'mix=live:40,read:40,write:20', 'ws=150'], 'P4'),
      at(30, () => killNode('f1')).then(() => at(25, () => restartNode('f1'))),
      at(60, () => ctl('f2', 'mode=shed')), at(70, () => ctl('f2', 'mode=normal'))]);
  }],
  ['P5-kv-quorum-replica-down', async () => {
    await Promise.all([load(['secs=90', 'rate=2000', 'mix=kv:70,read:30'], 'P5'),
      at(15, () => killNode('s2')).then(() => at(40, () => restartNode('s2')))]);
  }],
  ['P6-reloads', async () => {
    await Promise.all([load(['secs=80', 'rate=2000', ALL, 'ws=80'], 'P6'),
      at(20, () => { log('SIGHUP'); lf.kill('SIGHUP'); }), at(50, () => { log('SIGHUP'); lf.kill('SIGHUP'); })]);
  }],
  ...[7, 8, 9].map((i) => [`P${i}-mixed${i === 8 ? '-clean' : '-faults'}`, async () => {
    const jobs = [load(['secs=90', 'rate=2500', ALL, 'ws=100'], `P${i}`)];
    if (i !== 8) jobs.push(at(10, () => ctl('b2', 'mode=slow&ms=300')), at(30, () => ctl('b2', 'mode=normal')),
      at(30, () => ctl('b3', 'mode=shed')), at(45, () => ctl('b3', 'mode=normal')),
      at(20, () => killNode('s3')).then(() => at(30, () => restartNode('s3'))),
      at(45, () => killNode('b1')).then(() => at(15, () => restartNode('b1'))),
      at(50, () => killNode('f2')).then(() => at(15, () => restartNode('f2'))),
      at(60, () => { log('SIGHUP'); lf.kill('SIGHUP'); }));
    await Promise.all(jobs);
  }]),
];
(async () => {
  for (const id of IDS) await startNode(id);
  const mk = (ids) => ids.map((id) => ({ id, url: `http://127.0.0.1:${nodes[id].port}` }));
  fs.writeFileSync(`${OUT}/lf.json`, JSON.stringify({ clusters: [{ name: 'boards', nodes: mk(['b1', 'b2', 'b3']) }, { name: 'followers', nodes: mk(['f1', 'f2']) }, { name: 'store', nodes: mk(['s1', 's2', 's3', 's4']) }],
    routes: [{ path: '/rpc/*', cluster: 'boards', policy: 'rendezvous', keyHeader: 'x-lakefront-board' },
      { path: '/live/*', cluster: 'followers', policy: 'round_robin', keyHeader: null, affinity: { app: 'boards', ttlSeconds: 3600, generation: 1 } },
      { path: '/kv/*', cluster: 'store', quorum: { n: 3, w: 2, r: 2 } }] }, null, 1));
  fs.writeFileSync(`${OUT}/keys`, 'soak-test-key-0123456789abcdefghijklmnopqrstuvwxyz\n', { mode: 0o600 });
  await startLF();
  timeline('start');
  await sleep(IDLE); await sample('P0-baseline');
  const only = process.env.ONLY ? process.env.ONLY.split(',') : null;
  for (const [name, fn] of phases) {
    if (only && !only.some((o) => name.startsWith(o))) continue;
    log(`=== ${name} start`); timeline(name);
    await fn();
    timeline(`${name}-idle`); log(`=== ${name} done; idle ${IDLE / 1000}s`);
    await sleep(IDLE); await sample(name);
  }
  await sleep(Number(process.env.FINAL_IDLE_S ?? 60) * 1000); await sample('final-long-idle');
  clearInterval(tl);
  log('stopping lakefront (SIGTERM)'); lf.kill('SIGTERM');
  await new Promise((r) => { const t = setTimeout(r, 15000); lf.once('exit', () => { clearTimeout(t); r(); }); });
  for (const id of IDS) nodes[id].proc.kill('SIGTERM');
  printTable();
  log('done'); process.exit(0);
})();

/** The idle samples as a table (the RESULTS section's). */
function printTable() {
  const rows = fs.readFileSync(`${OUT}/samples.jsonl`, 'utf8').trim().split('\n').map((l) => JSON.parse(l));
  const lines = ['| sample | RSS MiB | fds | threads | connections to b1..s4 | inflight | tunnels | hints pending / delivered / lost | requests | hedges / wins | failovers |', `|${' --- |'.repeat(11)}`];
  for (const r of rows) {
    const conns = IDS.map((id) => Object.values(r.sockets.up[id] ?? {}).reduce((a, b) => a + b, 0)).join(' ');
    const inflight = r.inflight ? Object.values(r.inflight).reduce((a, b) => a + b, 0) : '-';
    const h = r.hints ?? {};
    lines.push(`| ${r.label} | ${(r.rssKiB / 1024).toFixed(1)} | ${r.fds} | ${r.threads} | ${conns} | ${inflight} | ${r.websockets} | ${h.pending} / ${h.delivered} / ${h.lost} | ${r.requests} | ${r.hedges} / ${r.hedgeWins} | ${r.failovers} |`);
  }
  console.log(`\n${lines.join('\n')}`);
}
