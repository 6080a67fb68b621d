/**
 * A closed-loop driver like the paper's benchmark client (seed 002, IV-B): W workers, each
 * sending its next operation as soon as the last one answered, for a fixed time. Reads and
 * writes are timed apart (HDR, microseconds), and every answer's serving node is counted from
 * Lakefront's `x-lakefront-served-by`.
 */
import hdr from 'hdr-histogram-js';
import { Pool } from 'undici';

export interface Operation {
  readonly kind: 'read' | 'write';
  readonly path: string;
  readonly body: string;
}

export interface ClosedLoopOptions {
  readonly workers: number;
  readonly seconds: number;
  readonly next: () => Operation;
}

export interface Timing {
  readonly count: number;
  readonly p50Us: number;
  readonly p99Us: number;
}

export interface ClosedLoopResult {
  readonly seconds: number;
  readonly ops: number;
  readonly opsPerSecond: number;
  readonly failed: number;
  readonly read: Timing;
  readonly write: Timing;
  /** Per serving node: reads and writes it answered. */
  readonly servedBy: Record<string, { reads: number; writes: number }>;
}

function timing(h: hdr.Histogram): Timing {
  return { count: h.totalCount, p50Us: h.totalCount ? h.getValueAtPercentile(50) : 0, p99Us: h.totalCount ? h.getValueAtPercentile(99) : 0 };
}

export async function closedLoop(url: string, options: ClosedLoopOptions): Promise<ClosedLoopResult> {
  const pool = new Pool(url, { connections: options.workers, pipelining: 1 });
  const build = () => hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: 3 });
  const reads = build();
  const writes = build();
  const servedBy: Record<string, { reads: number; writes: number }> = {};
  let ok = 0;
  let failed = 0;
  const started = performance.now();
  const deadline = started + options.seconds * 1000;
  await Promise.all(
    Array.from({ length: options.workers }, async () => {
      while (performance.now() < deadline) {
        const op = options.next();
        const t0 = performance.now();
        try {
          const res = await pool.request({ path: op.path, method: 'POST', headers: { 'content-type': 'application/json' }, body: op.body });
          await res.body.dump();
          const us = Math.max(1, Math.round((performance.now() - t0) * 1000));
          if (res.statusCode !== 200) {
            failed++;
            continue;
          }
          ok++;
          (op.kind === 'read' ? reads : writes).recordValue(us);
          const node = String(res.headers['x-lakefront-served-by'] ?? '?');
          const tally = (servedBy[node] ??= { reads: 0, writes: 0 });
          if (op.kind === 'read') tally.reads++;
          else tally.writes++;
        } catch {
          failed++;
        }
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  await pool.close();
  return { seconds, ops: ok, opsPerSecond: ok / seconds, failed, read: timing(reads), write: timing(writes), servedBy };
}
