/**
 * Sends exactly N requests of a bench workload (16 connections) and prints a JSON summary: the
 * fixed-count load bench/ir.sh counts instructions over.
 *
 *   node dist/bench/count.js URL N [workload]
 */
import autocannon from 'autocannon';
import { WORKLOADS } from './lib/load.js';

const [url, count, name] = [process.argv[2], Number(process.argv[3]), process.argv[4] ?? 'post256'];
const workload = WORKLOADS[name];
if (!url || !(count > 0) || !workload) {
  process.stderr.write(`usage: node dist/bench/count.js URL N [${Object.keys(WORKLOADS).join('|')}]\n`);
  process.exit(2);
}
const result = await autocannon({ url, connections: 16, amount: count, requests: workload.requests, timeout: 60 });
process.stdout.write(`${JSON.stringify({ total: result.requests.total, non2xx: result.non2xx, errors: result.errors, timeouts: result.timeouts })}\n`);
