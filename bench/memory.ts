/**
 * Memory with idle keep-alive client connections: opens N connections to Lakefront (default
 * 10,000), sends one request on each, keeps them all open, and reads Lakefront's resident memory
 * (every thread) before and after.
 *
 *   node dist/bench/memory.js [--connections 10000] [--threads 2] [--quick]
 */
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startLakefront, startNginx, startUpstream, type Contender } from './lib/contenders.js';
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

/** Opens `count` connections, each answered once; resolves with the sockets, all still open. */
async function holdConnections(url: string, count: number): Promise<Socket[]> {
  const { port, hostname } = new URL(url);
  const sockets: Socket[] = [];
  const request = `GET /health HTTP/1.1\r\nhost: ${hostname}\r\n\r\n`;
  const batch = 500;
  for (let i = 0; i < count; i += batch) {
    const opened = Array.from({ length: Math.min(batch, count - i) }, () => {
      return new Promise<Socket>((resolve, reject) => {
        const socket = connect(Number(port), hostname);
        socket.once('error', reject);
        socket.once('connect', () => socket.write(request));
        socket.once('data', () => resolve(socket));
      });
    });
    sockets.push(...(await Promise.all(opened)));
  }
  return sockets;
}

async function measure(c: Contender): Promise<{ before: number; after: number; open: number; seconds: number }> {
  await pause(500);
  const before = rssBytes(c.proc!);
  const started = performance.now();
  const sockets = await holdConnections(c.url, target);
  const seconds = (performance.now() - started) / 1000;
  let closed = 0;
  for (const s of sockets) s.once('close', () => closed++);
  await pause(500);
  const after = rssBytes(c.proc!);
  const open = sockets.length - closed;
  for (const s of sockets) s.destroy();
  return { before, after, open, seconds };
}

async function main(): Promise<void> {
  const upstream = await startUpstream();
  const rows: string[][] = [];
  const skipped: string[] = [];
  try {
    const lakefront = await startLakefront(upstream, { threads });
    const lf = await measure(lakefront);
    await lakefront.proc!.stop();
    rows.push([lakefront.name, fmt(lf.before / 2 ** 20, 1), fmt(lf.after / 2 ** 20, 1), fmt((lf.after - lf.before) / target, 0), String(lf.open), fmt(lf.seconds, 1)]);
    const nginx = await startNginx(upstream, threads);
    if (typeof nginx !== 'string') {
      const ng = await measure(nginx);
      await nginx.proc!.stop();
      rows.push([nginx.name, fmt(ng.before / 2 ** 20, 1), fmt(ng.after / 2 ** 20, 1), fmt((ng.after - ng.before) / target, 0), String(ng.open), fmt(ng.seconds, 1)]);
    } else {
      skipped.push(`skip nginx: ${nginx}`);
      process.stdout.write(`${skipped.at(-1)}\n`);
    }
  } finally {
    await upstream.proc.stop();
  }
  const info = machine();
  const command = `node dist/bench/memory.js ${process.argv.slice(2).join(' ')}`.trim();
  const body = [
    `Machine: ${info.cpu}, ${info.memory}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
    `Command: \`${command}\`: ${fmt(target)} client connections, each sends one \`GET /health\` with keep-alive and stays open; resident memory (VmRSS, every thread and process) read 0.5 s after the last answer.`,
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
