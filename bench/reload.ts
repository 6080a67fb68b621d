/**
 * Reloads under load: what clients see while `SIGHUP` replaces the running configuration.
 *
 *   node dist/bench/reload.js [--reloads 10] [--interval-ms 1000] [--connections 64] [--no-write]
 *
 * The `lakefront` command (2 threads) runs from a configuration file over two of three bench
 * nodes; `connections` keep-alive clients (undici, in this process) send bare writes (POST 256 B,
 * each its own board) in closed loops: first for `reloads` intervals of `interval-ms` without
 * reloads, then as long again with the file rewritten with another pair of nodes and the process
 * sent SIGHUP at each (once the reload before it serves: a SIGHUP during a reload is coalesced
 * with the next, README). Reported per phase: answers by status, failed requests by error, writes
 * the nodes received against writes answered 200 (each write is sent once), how long from SIGHUP
 * to the new workers serving, and latency percentiles. Exits 1 if any request failed, a write was
 * not received exactly once, or a reload did not happen.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { Pool, request } from 'undici';
import { startUpstream } from './lib/contenders.js';
import { DIST, ROOT, pause, track } from './lib/procs.js';
import { fmt, machine, table, updateSection, writeResult } from './lib/report.js';

const { values } = parseArgs({
  options: {
    reloads: { type: 'string', default: '10' },
    'interval-ms': { type: 'string', default: '1000' },
    connections: { type: 'string', default: '64' },
    'no-write': { type: 'boolean', default: false },
  },
});
const reloads = Number(values.reloads);
const intervalMs = Number(values['interval-ms']);
const connections = Number(values.connections);

function percentile(sorted: Float64Array, p: number): number {
  return sorted.length === 0 ? Number.NaN : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

async function main(): Promise<void> {
  const upstream = await startUpstream();
  const dir = mkdtempSync(join(tmpdir(), 'lf-reload-bench-'));
  const file = join(dir, 'lf.json');
  const nodes = upstream.ports.map((port, i) => ({ id: `node-${i}`, url: `http://127.0.0.1:${port}` }));
  const pairs = [[0, 1], [1, 2], [0, 2]];
  const write = (pair: number[]): void =>
    writeFileSync(file, JSON.stringify({ clusters: [{ name: 'boards', nodes: pair.map((i) => nodes[i]!) }], routes: [{ path: '/rpc/*', cluster: 'boards', keyHeader: 'x-lakefront-board' }] }));
  write(pairs[0]!);
  const child = track(spawn(process.execPath, [join(DIST, '..', 'src', 'cli.js'), '--config', file, '--port', '0', '--host', '127.0.0.1', '--threads', '2'], { stdio: ['ignore', 'pipe', 'pipe'] }));
  let output = '';
  /** When each SIGHUP was sent, and when each reload said it serves. */
  const signalled: number[] = [];
  const serving: number[] = [];
  /** Settled by the next reload's end: its new workers serving, or its refusal. */
  let onReloadEnd: (() => void) | null = null;
  const reloadEnded = (): void => {
    const settle = onReloadEnd;
    onReloadEnd = null;
    settle?.();
  };
  child.stdout!.on('data', (c: Buffer) => {
    const text = c.toString();
    output += text;
    for (let i = (text.match(/SIGHUP: reloaded/g) ?? []).length; i > 0; i--) {
      serving.push(performance.now());
      reloadEnded();
    }
  });
  child.stderr!.on('data', (c: Buffer) => {
    const text = c.toString();
    output += text;
    if (/SIGHUP: .*still serving the previous configuration/.test(text)) reloadEnded();
  });
  try {
    while (!/listening on http:\/\/127\.0\.0\.1:\d+/.test(output)) await pause(20);
    const url = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(output)![1]!;
    const receivedAt = async (): Promise<number> => ((await (await request(`${nodes[0]!.url}/__received`)).body.json()) as { received: number }).received;
    const body = 'x'.repeat(256);

    /** One phase: the closed loops for `count` intervals, with a reload at each (or none). */
    const phase = async (count: number, reloading: boolean): Promise<string[]> => {
      const receivedBefore = await receivedAt();
      const doneBefore = serving.length;
      signalled.length = 0;
      const servingFrom = serving.length;
      const pool = new Pool(url, { connections });
      const statuses = new Map<string, number>();
      const latencies: number[] = [];
      let running = true;
      const started = performance.now();
      const loops = Array.from({ length: connections }, async (_, i) => {
        for (let n = 0; running; n++) {
          const sent = performance.now();
          let outcome: string;
          try {
            const reply = await pool.request({ path: '/rpc/board.append', method: 'POST', body, headers: { 'x-lakefront-board': `reload-${i}-${n}`, 'content-type': 'application/json' } });
            await reply.body.dump();
            outcome = String(reply.statusCode);
          } catch (err) {
            outcome = (err as { code?: string }).code ?? String(err);
          }
          latencies.push((performance.now() - sent) * 1000);
          statuses.set(outcome, (statuses.get(outcome) ?? 0) + 1);
        }
      });
      for (let r = 1; r <= count; r++) {
        await pause(intervalMs);
        if (!reloading) continue;
        write(pairs[r % pairs.length]!);
        // Each SIGHUP once the reload before it is done: one sent during a reload waits for it and
        // is coalesced with any other (README), so each would not be a reload of its own.
        let timer: NodeJS.Timeout | undefined;
        const ended = new Promise<void>((resolve, reject) => {
          onReloadEnd = resolve;
          timer = setTimeout(() => reject(new Error(`reload ${r}: neither served nor refused within 60 s`)), 60_000);
        });
        signalled.push(performance.now());
        child.kill('SIGHUP');
        await ended.finally(() => clearTimeout(timer));
      }
      await pause(intervalMs);
      running = false;
      await Promise.all(loops);
      const seconds = (performance.now() - started) / 1000;
      await pool.close();
      const received = (await receivedAt()) - receivedBefore;
      const done = serving.length - doneBefore;
      const answered = statuses.get('200') ?? 0;
      const total = [...statuses.values()].reduce((a, b) => a + b, 0);
      const failed = total - answered;
      if (failed > 0 || received !== answered || (reloading && done !== count)) process.exitCode = 1;
      const sorted = Float64Array.from(latencies).sort();
      // SIGHUP to the new workers serving (the old ones drain after), when none were coalesced.
      const taken = serving.slice(servingFrom);
      const takeovers = reloading && taken.length === signalled.length ? taken.map((t, i) => t - signalled[i]!).sort((a, b) => a - b) : [];
      const takeover = takeovers.length > 0 ? `${fmt(takeovers[Math.floor(takeovers.length / 2)]!)} (${fmt(takeovers[0]!)}-${fmt(takeovers[takeovers.length - 1]!)})` : '-';
      const outcomes = [...statuses].map(([k, v]) => `${k}: ${fmt(v)}`).join(', ');
      return [reloading ? `${done} of ${count}` : 'none', takeover, fmt(total), fmt(answered), fmt(failed), outcomes, fmt(received), fmt(total / seconds), fmt(percentile(sorted, 50)), fmt(percentile(sorted, 99)), fmt(percentile(sorted, 99.9)), fmt(sorted[sorted.length - 1] ?? Number.NaN)];
    };

    const steady = await phase(reloads, false);
    process.stdout.write(`steady:    ${steady.join('  ')}\n`);
    const reloaded = await phase(reloads, true);
    process.stdout.write(`reloading: ${reloaded.join('  ')}\n`);
    child.kill('SIGTERM');
    await new Promise((resolve) => child.once('exit', resolve));
    const refused = (output.match(/SIGHUP: .*still serving the previous configuration/g) ?? []).length;
    if (refused > 0) process.exitCode = 1;
    const info = machine();
    const command = `node dist/bench/reload.js ${process.argv.slice(2).join(' ')}`.trim();
    let migrate = '?';
    try {
      migrate = readFileSync('/proc/sys/net/ipv4/tcp_migrate_req', 'utf8').trim();
    } catch {
      // An older kernel: no such setting.
    }
    const resets =
      migrate === '1'
        ? 'net.ipv4.tcp_migrate_req is 1 here: connections not yet accepted by the old workers go to the new ones'
        : `net.ipv4.tcp_migrate_req is ${migrate} here: a connection not yet accepted by an old worker when it stops listening is reset (README, Reloads), so a client reconnecting at that moment may see ECONNRESET`;
    const text = [
      `Machine: ${info.cpu}, ${info.memory}; Node ${info.node}; commit ${info.commit}; ${info.date}.`,
      `Command: \`${command}\` (Lakefront at 2 threads from a configuration file over two of three bench nodes; ${connections} keep-alive clients (undici) sending bare writes, POST 256 B, each on its own board, in closed loops; ${reloads} intervals of ${intervalMs} ms without reloads, then ${reloads} more with the file naming another pair of nodes and a SIGHUP at each, sent once the reload before it serves; load generator, proxy and nodes share the machine; ${resets}${refused > 0 ? `; ${refused} reload(s) refused` : ''}).`,
      '',
      table(
        ['reloads', 'SIGHUP to serving, ms (median, range)', 'requests', 'answered 200', 'failed', 'outcomes', 'writes the nodes received', 'req/s', 'p50 us', 'p99 us', 'p99.9 us', 'max us'],
        [steady, reloaded],
      ),
    ].join('\n');
    process.stdout.write(`${text}\n`);
    if (!values['no-write']) {
      writeResult(join(ROOT, 'bench', 'results', 'reload.json'), { machine: info, command, reloads, intervalMs, connections, refused, steady, reloading: reloaded });
      updateSection(join(ROOT, 'bench', 'RESULTS.md'), 'reload', text);
    }
  } finally {
    child.kill('SIGKILL');
    await upstream.proc.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
