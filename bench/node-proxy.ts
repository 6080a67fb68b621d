/**
 * The Node baseline: a plain `node:http` server proxying through undici `request()`, the way a
 * typical Node reverse proxy is written. It picks the upstream by the same rendezvous ranking, so
 * the comparison isolates the server and upstream-client machinery.
 *
 *   node dist/bench/node-proxy.js --port 0 --nodes a=http://...,b=http://...
 *
 * Prints `{"port":N}` once listening.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { parseArgs } from 'node:util';
import { Pool } from 'undici';
import { RendezvousRanker } from '../src/hashing/rendezvous.js';

const { values } = parseArgs({ options: { port: { type: 'string', default: '0' }, nodes: { type: 'string' } } });
const nodes = values.nodes!.split(',').map((entry) => {
  const eq = entry.indexOf('=');
  return { id: entry.slice(0, eq), url: entry.slice(eq + 1) };
});
const pools = nodes.map((n) => new Pool(n.url, { connections: 64, pipelining: 1 }));
const ranker = new RendezvousRanker(nodes.map((n) => n.id), nodes.map(() => 1));
const ranking = new Int32Array(nodes.length);
const HOP = new Set(['connection', 'keep-alive', 'transfer-encoding', 'upgrade', 'te', 'trailer', 'host', 'content-length', 'expect', 'proxy-connection']);

const server = createServer((req, res) => {
  const board = req.headers['x-lakefront-board'];
  if (typeof board !== 'string' || board === '') {
    res.writeHead(401, { 'content-type': 'application/json' }).end('{"error":"missing x-lakefront-board header"}');
    return;
  }
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    ranker.rankInto(board, ranking);
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && typeof v === 'string') headers[k] = v;
    pools[ranking[0]!]!
      .request({ path: req.url!, method: req.method as 'POST', headers, body: chunks.length ? Buffer.concat(chunks) : null })
      .then(async (up) => {
        const body = Buffer.from(await up.body.arrayBuffer());
        const out: Record<string, string> = {};
        for (const [k, v] of Object.entries(up.headers)) if (!HOP.has(k) && k !== 'date' && typeof v === 'string') out[k] = v;
        res.writeHead(up.statusCode, out).end(body);
      })
      .catch(() => {
        if (!res.headersSent) res.writeHead(502, { 'content-type': 'application/json' }).end('{"error":"upstream failed"}');
      });
  });
});
server.keepAliveTimeout = 60_000;
server.listen(Number(values.port), '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);
});
