/**
 * `npm run bench`: the whole suite, one part after another (throughput against the peers,
 * latency at a steady rate against them (the full run only), hedging under tail latency, thread tuning, memory with idle connections, WebSocket tunnels,
 * replicated routes, reloads and ejection (these four in the full run only), seed 002 against a
 * real etcd cluster when etcd is installed). `npm run bench:quick`
 * passes --quick to each: a short version that finishes in about two minutes.
 */
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { existsSync } from 'node:fs';
import { ETCD_BINARY } from './lib/etcd-cluster.js';
import { DIST } from './lib/procs.js';

const quick = process.argv.includes('--quick');
const parts: [string, string[]][] = quick
  ? [
      ['suite.js', ['--quick', '--repeats', '2', '--seconds', '2', '--contenders', 'direct,lakefront-2t,nginx-2w']],
      ['hedging.js', ['--quick', '--repeats', '1', '--seconds', '3']],
      ['threads.js', ['--quick', '--repeats', '1']],
      ['memory.js', ['--quick']],
      ['etcd.js', ['--quick', '--mixes', '80/20', '--seconds', '1', '--no-failover']],
    ]
  : [['suite.js', []], ['latency.js', []], ['hedging.js', []], ['threads.js', []], ['memory.js', []], ['websocket.js', []], ['quorum.js', []], ['reload.js', []], ['ejection.js', []], ['etcd.js', []], ['etcd.js', ['--workers', '16', '--no-failover', '--section', 'etcd-3-w16']],
      ['etcd.js', ['--members', '5', '--workers', '16', '--trials', '2', '--no-failover', '--section', 'etcd-5-w16']]];

const started = Date.now();
const haveEtcd = existsSync(ETCD_BINARY);
/** Parts that failed: the others still run (each writes its own section), and the run exits 1. */
const failed: string[] = [];
for (const [script, args] of parts) {
  if (script === 'etcd.js' && !haveEtcd) {
    process.stdout.write(`\n=== skip ${script}: no etcd binary (apt-get install etcd-server)\n`);
    continue;
  }
  process.stdout.write(`\n=== ${script} ${args.join(' ')}\n`);
  const partStarted = Date.now();
  const result = spawnSync(process.execPath, [join(DIST, script), ...args], { stdio: 'inherit' });
  if (result.status !== 0) {
    process.stderr.write(`${script} failed with ${result.status ?? result.signal}\n`);
    failed.push(`${script} ${args.join(' ')}`.trim());
  }
  process.stdout.write(`=== ${script}: ${((Date.now() - partStarted) / 1000).toFixed(0)} s\n`);
}
process.stdout.write(`\nbench finished in ${((Date.now() - started) / 1000).toFixed(0)} s; see bench/RESULTS.md\n`);
if (failed.length > 0) {
  process.stderr.write(`failed: ${failed.join('; ')} (its output above says why)\n`);
  process.exit(1);
}
