/**
 * Memory with idle keep-alive client connections: opens N connections to Lakefront (default
 * 10,000), sends one proxied request on each (a GET each front sends to a node), keeps them all
 * open, and reads Lakefront's resident memory (every thread) before and after; then the same for
 * nginx (its master's resident memory and its workers' private pages: bench/lib/procs.ts).
 *
 *   node dist/bench/memory.js [--connections 10000] [--threads 2] [--quick]
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startLakefront, startNginx, startUpstream, type Contender } from './lib/contenders.js';
import { holdConnections, stillOpen } from './lib/idle.js';
import { WORKLOADS, warmUp } from './lib/load.js';
import { ROOT, pause, rssBytes } from './lib/procs.js';
import { fmt, machine, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    connections: { type: 'string' },
    threads: { type: 'string', default: '2' },
    quick: { type: 'boolean', default: false },
    'no-write': { type: 'boolean', default: false },
  },
});
const quick = values.quick!;
const target = Number(values.connections ?? (quick ? 2_000 : 10_000));
const threads = Number(values.threads);
/** Seconds of proxied load before the first reading. */
const WARM_SECONDS = quick ? 1 : 10;

/**
 * The request each connection sends: a read every front proxies (a front answering a request of
 * its own, such as Lakefront's /health, was measured against nginx proxying it), each on a board
 * of its own, as in the suite.
 */
function proxiedRead(hostname: string): (i: number) => string {
  return (i) => `GET /rpc/query.execute HTTP/1.1\r\nhost: ${hostname}\r\nx-lakefront-board: board-${i}\r\n\r\n`;
}

async function measure(c: Contender): Promise<{ before: number; after: number; open: number; seconds: number }> {
  // The proxy path warmed first (compiled, its connections to the nodes open), for both fronts, so
  // the difference is the idle client connections' and not a first request's. Long enough that a
  // worker's nursery grows as far as it will under load (with V8's own ceiling, 48 MiB, it was
  // still growing after 4 s: 8 MiB of semi-spaces at 4 s, 15 at 18; capped at 12 it stops at 8).
  await warmUp(c.url, WORKLOADS.getsmall!, 64, WARM_SECONDS);
  await pause(500);
  const before = rssBytes(c.proc!);
  const started = performance.now();
  const sockets = await holdConnections(c.url, target, proxiedRead(new URL(c.url).hostname));
  const seconds = (performance.now() - started) / 1000;
  await pause(500);
  const after = rssBytes(c.proc!);
  // Read from each socket's state now: one the front closed while others were opening counts too.
  const open = stillOpen(sockets);
  for (const s of sockets) s.destroy();
  return { before, after, open, seconds };
}

async function main(): Promise<void> {
  const upstream = await startUpstream();
  const rows: string[][] = [];
  const skipped: string[] = [];
  // Each front is stopped however its measure ends (one that failed was left running before).
  let running: Contender | null = null;
  try {
    const lakefront = (running = await startLakefront(upstream, { threads }));
    const lf = await measure(lakefront);
    running = null;
    await lakefront.proc!.stop();
    rows.push([lakefront.name, fmt(lf.before / 2 ** 20, 1), fmt(lf.after / 2 ** 20, 1), fmt((lf.after - lf.before) / target, 0), String(lf.open), fmt(lf.seconds, 1)]);
    const nginx = await startNginx(upstream, threads);
    if (typeof nginx !== 'string') {
      running = nginx;
      const ng = await measure(nginx);
      running = null;
      await nginx.proc!.stop();
      rows.push([nginx.name, fmt(ng.before / 2 ** 20, 1), fmt(ng.after / 2 ** 20, 1), fmt((ng.after - ng.before) / target, 0), String(ng.open), fmt(ng.seconds, 1)]);
    } else {
      skipped.push(`skip nginx: ${nginx}`);
      process.stdout.write(`${skipped.at(-1)}\n`);
    }
  } finally {
    await running?.proc?.stop();
    await upstream.proc.stop();
  }
  const info = machine();
  const command = `node dist/bench/memory.js ${process.argv.slice(2).join(' ')}`.trim();
  const body = [
    `Machine: ${info.cpu}, ${info.memory}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
    `Command: \`${command}\`: ${fmt(target)} client connections, each sends one \`GET /rpc/query.execute\` (proxied to a node, its own board) with keep-alive and stays open; resident memory before them read after ${WARM_SECONDS} s of proxied GETs from 64 connections (the proxy path warmed), and with them 0.5 s after the last answer (every thread; for nginx its master's VmRSS and its workers' private pages, so the pages a worker shares with its master count once); still open: connections neither closed nor reset by the front at the reading.`,
    '',
    table(['front', 'RSS before MiB', `RSS with ${fmt(target)} idle connections MiB`, 'bytes per connection', 'still open at reading', 'seconds to open all'], rows),
    ...(skipped.length > 0 ? ['', ...skipped] : []),
  ].join('\n');
  process.stdout.write(`${body}\n`);
  if (values['no-write']) return;
  const section = quick ? 'memory-quick' : 'memory';
  updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
  writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, connections: target, rows });
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
