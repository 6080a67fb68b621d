// Bounded-rate mixed load against the front door (127.0.0.1 only).
// node load.mjs port=P secs=S rate=R mix=read:60,write:30,abort:10,kv:0,live:0,get:0 ws=C
import http from 'node:http';
import WebSocket from 'ws';
const A = Object.fromEntries(process.argv.slice(2).map((a) => a.split('=')));
const port = Number(A.port), secs = Number(A.secs ?? 30), rate = Number(A.rate ?? 0), wsC = Number(A.ws ?? 0);
const mix = Object.entries(Object.fromEntries((A.mix ?? 'read:1').split(',').map((p) => { const [k, v] = p.split(':'); return [k, Number(v)]; })));
const total = mix.reduce((s, [, v]) => s + v, 0);
const keep = new http.Agent({ keepAlive: true, maxSockets: 96 });
const fresh = new http.Agent({ keepAlive: false });
const S = { sent: 0, skipped: 0, status: {}, errors: {}, aborted: 0, ws: { opened: 0, closedNormal: 0, terminated: 0, earlyAbort: 0, msgs: 0, errors: {}, closeCodes: {}, unexpected: 0 }, tickets: 0 };
const bump = (o, k) => { o[k] = (o[k] ?? 0) + 1; };
let inflight = 0;
const rnd = (n) => Math.floor(Math.random() * n);
const body256 = 'x'.repeat(256);
const tickets = new Array(64).fill(null);
function pick() { let r = Math.random() * total; for (const [k, v] of mix) { if ((r -= v) < 0) return k; } return mix[0][0]; }
function send(kind) {
  let method = 'POST', path = '/rpc/query.execute', headers = { 'x-lakefront-board': `board-${rnd(1000)}` }, body = '{"q":1}', agent = keep, abortAfter = -1, slot = -1;
  if (kind === 'write') { path = '/rpc/board.append'; body = body256; }
  else if (kind === 'get') { method = 'GET'; path = '/rpc/node.stats'; body = null; }
  else if (kind === 'abort') {
    agent = fresh; if (Math.random() < 0.3) path = '/rpc/board.append';
    headers['x-delay-ms'] = String(150 + rnd(250)); abortAfter = 10 + rnd(110);
  } else if (kind === 'kv') {
    headers = {}; path = `/kv/key-${rnd(2000)}`;
    if (Math.random() < 0.5) { method = 'PUT'; body = `v${Date.now()}-${'y'.repeat(80)}`; headers['content-type'] = 'text/plain'; } else { method = 'GET'; body = null; }
  } else if (kind === 'live') {
    headers = {}; method = 'GET'; path = `/live/session-${rnd(10)}`; body = null; slot = rnd(tickets.length);
    if (tickets[slot]) headers['x-lakefront-affinity'] = tickets[slot];
  }
  if (body !== null) headers['content-length'] = Buffer.byteLength(body);
  inflight++; S.sent++;
  let done = false; const fin = () => { if (!done) { done = true; inflight--; } };
  const req = http.request({ host: '127.0.0.1', port, method, path, headers, agent }, (res) => {
    bump(S.status, `${kind}:${res.statusCode}`);
    if (slot >= 0 && res.headers['x-lakefront-affinity']) { tickets[slot] = res.headers['x-lakefront-affinity']; S.tickets++; }
    res.resume(); res.on('end', fin); res.on('error', fin); res.on('close', fin);
  });
  req.on('error', (e) => { if (abortAfter < 0) bump(S.errors, `${kind}:${e.code ?? e.message}`); fin(); });
  if (abortAfter >= 0) setTimeout(() => { if (!done) { S.aborted++; req.destroy(); fin(); } }, abortAfter);
  req.end(body ?? undefined);
}
const end = Date.now() + secs * 1000;
let acc = 0;
if (rate > 0) {
  const t = setInterval(() => {
    if (Date.now() >= end) { clearInterval(t); return; }
    acc += rate / 100;
    while (acc >= 1) { acc--; if (inflight >= 400) S.skipped++; else send(pick()); }
  }, 10);
}
// WebSocket churn: keep wsC sockets cycling.
let wsLive = 0;
function wsOne() {
  if (Date.now() >= end) return;
  wsLive++;
  const live = Math.random() < 0.3;
  const t = tickets[rnd(tickets.length)];
  const ws = live
    ? new WebSocket(`ws://127.0.0.1:${port}/live/ws`, t ? [`lakefront-affinity.${t}`] : [], { perMessageDeflate: false })
    : new WebSocket(`ws://127.0.0.1:${port}/rpc/live`, { headers: { 'x-lakefront-board': `board-${rnd(1000)}` }, perMessageDeflate: false });
  const fate = Math.random();
  let finished = false;
  const next = () => { if (finished) return; finished = true; wsLive--; setTimeout(wsOne, rnd(50)); };
  if (fate < 0.1) { setTimeout(() => { S.ws.earlyAbort++; ws.terminate(); next(); }, 1 + rnd(5)); }
  let n = 1 + rnd(5);
  ws.on('open', () => { S.ws.opened++; ws.send(`m${n}`); });
  ws.on('message', (m) => {
    if (String(m).startsWith('{"t":"affinity"')) return;
    S.ws.msgs++;
    if (--n > 0) { ws.send(`m${n}`); return; }
    setTimeout(() => {
      if (fate < 0.3) { S.ws.terminated++; ws.terminate(); next(); } else { S.ws.closedNormal++; ws.close(1000); }
    }, 200 + rnd(1800));
  });
  ws.on('error', (e) => { bump(S.ws.errors, String(e.message).slice(0, 60)); });
  ws.on('unexpected-response', (req, res) => { bump(S.ws.errors, `http ${res.statusCode}`); S.ws.unexpected++; res.resume(); ws.terminate(); });
  ws.on('close', (code) => { bump(S.ws.closeCodes, code); next(); });
}
for (let i = 0; i < wsC; i++) setTimeout(wsOne, rnd(1000));
const fin = setInterval(() => {
  if (Date.now() < end + 3000 && (inflight > 0 || wsLive > 0 || Date.now() < end)) return;
  clearInterval(fin);
  S.leftInflight = inflight; S.leftWs = wsLive;
  keep.destroy(); fresh.destroy();
  console.log(JSON.stringify(S));
  process.exit(0);
}, 200);
