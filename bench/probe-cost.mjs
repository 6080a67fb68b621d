// What a control-plane probe costs the main thread: fetch, undici's request, node:http's get and
// the front door's own probeStatus (src/membership/probe.ts, on node:http since the twenty-eighth
// session), each against a node:http server in the same process (its share is in every figure),
// 2,000 probes after 300 to warm, three rounds. Needs the build (npm run build).
//   node bench/probe-cost.mjs
import { createServer, get, Agent as HttpAgent } from 'node:http';
import { request, Agent } from 'undici';
import { probeStatus } from '../dist/src/membership/probe.js';
const srv = createServer((q, r) => { r.setHeader('content-type', 'application/json'); r.end('{"ok":true}'); }).listen(0, '127.0.0.1');
await new Promise((r) => srv.once('listening', r));
const url = `http://127.0.0.1:${srv.address().port}/health`;
const agent = new Agent({ keepAliveTimeout: 10_000 });
const httpAgent = new HttpAgent({ keepAlive: true });
const kinds = {
  fetch: async () => { const res = await fetch(url, { signal: AbortSignal.timeout(500) }); await res.arrayBuffer(); return res.status; },
  undici: async () => { const res = await request(url, { dispatcher: agent, headersTimeout: 500, bodyTimeout: 500 }); await res.body.dump(); return res.statusCode; },
  http: () => new Promise((resolve, reject) => { const q = get(url, { agent: httpAgent, timeout: 500 }, (res) => { res.resume(); res.on('end', () => resolve(res.statusCode)); }); q.on('error', reject); }),
  probeStatus: () => probeStatus(url, 500),
};
for (let round = 0; round < 3; round++) for (const [name, fn] of Object.entries(kinds)) {
  for (let i = 0; i < 300; i++) await fn();
  const c0 = process.cpuUsage(); const t0 = performance.now();
  const N = 2000;
  for (let i = 0; i < N; i++) await fn();
  const c = process.cpuUsage(c0);
  console.log(name, ((c.user + c.system) / N).toFixed(1), 'us CPU a probe (client+server in one process)', ((performance.now() - t0) * 1000 / N).toFixed(0), 'us wall');
}
srv.close(); await agent.close(); httpAgent.destroy();
