// Upstream node for the soak: /health, /rpc/*, /live/* (JSON echo), /kv/* (reference ReplicaStore),
// WebSocket echo on /rpc/* and /live/*. Control: GET /__ctl?mode=normal|slow|shed&ms=N&stall=P ; GET /__stats
// usage: node upnode.mjs <id> <port>
import { createServer } from 'node:http';
import { WebSocketServer } from 'ws';
import { ReplicaStore } from '../../dist/src/replication/store.js';
const [id, portArg] = process.argv.slice(2);
const store = new ReplicaStore();
let mode = 'normal', slowMs = 0, stallPct = 0, stallMs = 50;
let requests = 0, conns = 0;
const reply = (res, st, obj, extra = {}) => { if (!res.destroyed) res.writeHead(st, { 'content-type': 'application/json', ...extra }).end(JSON.stringify(obj)); };
const server = createServer((req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const url = req.url ?? '/';
    if (url === '/health') return reply(res, 200, { ok: true, node: id });
    if (url.startsWith('/__ctl')) {
      const q = new URL(url, 'http://x').searchParams;
      if (q.has('mode')) mode = q.get('mode');
      if (q.has('ms')) slowMs = Number(q.get('ms'));
      if (q.has('stall')) stallPct = Number(q.get('stall'));
      if (q.has('stallMs')) stallMs = Number(q.get('stallMs'));
      return reply(res, 200, { id, mode, slowMs, stallPct });
    }
    if (url === '/__stats') {
      server.getConnections((e, n) => reply(res, 200, { id, requests, conns: n, ws: wss.clients.size, keys: store.entries.size, hinted: Object.fromEntries(store.hinted) }));
      return;
    }
    requests++;
    if (url.startsWith('/kv/')) {
      const a = store.handle(req.method, url, req.headers, Buffer.concat(chunks));
      if (!res.destroyed) res.writeHead(a.status, a.headers).end(a.body);
      return;
    }
    if (url.startsWith('/rpc/') || url.startsWith('/live/')) {
      if (mode === 'shed') return reply(res, 503, { error: 'shedding', node: id }, { 'retry-after': '1' });
      let delay = Number(req.headers['x-delay-ms'] ?? 0) || 0;
      if (mode === 'slow') delay += slowMs;
      if (stallPct > 0 && Math.random() * 100 < stallPct) delay += stallMs;
      const body = { node: id, method: req.method, path: url, board: req.headers['x-lakefront-board'] ?? null, bytes: Buffer.concat(chunks).length };
      if (delay > 0) setTimeout(() => reply(res, 200, body), delay); else reply(res, 200, body);
      return;
    }
    reply(res, 404, { error: 'not found', node: id });
  });
});
server.keepAliveTimeout = Number(process.env.KA_MS ?? 10000);
server.on('connection', () => conns++);
const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });
server.on('upgrade', (req, socket, head) => {
  if (!(req.url?.startsWith('/rpc/') || req.url?.startsWith('/live/'))) { socket.end('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n'); return; }
  wss.handleUpgrade(req, socket, head, (ws) => {
    ws.on('message', (d, bin) => ws.send(bin ? d : JSON.stringify({ node: id, echo: d.toString() }), { binary: bin }));
    ws.on('error', () => {});
  });
});
server.listen(Number(portArg), '127.0.0.1', () => {
  console.log(JSON.stringify({ id, port: server.address().port, pid: process.pid }));
});
process.on('SIGTERM', () => process.exit(0));
