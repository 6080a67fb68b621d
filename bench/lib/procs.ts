/**
 * Processes the bench starts and stops itself (no systemd here): the upstream, Lakefront, the
 * Node baseline and peer proxies. Each is stopped by its own PID; CPU time is read from /proc.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const DIST = fileURLToPath(new URL('..', import.meta.url)); // dist/bench/
export const ROOT = fileURLToPath(new URL('../../..', import.meta.url)); // repository root

export interface Proc {
  readonly name: string;
  readonly child: ChildProcess;
  /** PIDs whose CPU counts towards this process (a master and its workers, say). */
  pids(): number[];
  stop(): Promise<void>;
}

const CLK_TCK = 100; // USER_HZ on Linux

/** CPU seconds (user + system, all threads) consumed so far by `pid`. */
export function cpuSeconds(pid: number): number {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    // fields[11] = utime, fields[12] = stime (after pid and comm were cut off)
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch {
    return 0;
  }
}

export function totalCpuSeconds(proc: Proc): number {
  return proc.pids().reduce((sum, pid) => sum + cpuSeconds(pid), 0);
}

/** A `/proc/PID/{status,smaps_rollup}` field in bytes (`kB` lines), or null when unreadable. */
function procKb(pid: number, file: string, field: string): number | null {
  try {
    const match = readFileSync(`/proc/${pid}/${file}`, 'utf8').match(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm'));
    return match ? Number(match[1]) * 1024 : null;
  } catch {
    return null; // gone
  }
}

/**
 * Resident memory of a process tree in bytes, each page once: the first PID's resident set (every
 * thread), and of each further PID (an nginx worker forked from its master) only its private pages.
 * A forked worker's resident set is mostly pages it still shares with its master (the binary,
 * libraries, the heap as it was at the fork): summing VmRSS counted those once a process, so an
 * nginx with two workers was charged about three times its shared pages. A PID whose
 * smaps_rollup cannot be read counts its whole VmRSS (the old, larger figure).
 */
export function rssBytes(proc: Proc): number {
  let total = 0;
  proc.pids().forEach((pid, i) => {
    if (i === 0) {
      total += procKb(pid, 'status', 'VmRSS') ?? 0;
      return;
    }
    const clean = procKb(pid, 'smaps_rollup', 'Private_Clean');
    const dirty = procKb(pid, 'smaps_rollup', 'Private_Dirty');
    total += clean !== null && dirty !== null ? clean + dirty : procKb(pid, 'status', 'VmRSS') ?? 0;
  });
  return total;
}

/** Direct children of `pid` (all threads' children lists). */
export function childPids(pid: number): number[] {
  const out: number[] = [];
  try {
    for (const task of readdirSync(`/proc/${pid}/task`)) {
      const text = readFileSync(`/proc/${pid}/task/${task}/children`, 'utf8').trim();
      if (text) out.push(...text.split(' ').map(Number));
    }
  } catch {
    // gone
  }
  return out;
}

/** Spawns `command` and resolves with it once a stdout line parses as JSON (its ready line). */
export async function spawnReady(name: string, command: string, args: string[], env: NodeJS.ProcessEnv = {}): Promise<{ proc: Proc; ready: Record<string, unknown> }> {
  const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, ...env } });
  let stderr = '';
  child.stderr!.on('data', (c: Buffer) => (stderr += c.toString()));
  let buffered = '';
  const ready = await new Promise<Record<string, unknown>>((resolve, reject) => {
    const onData = (chunk: Buffer): void => {
      buffered += chunk.toString();
      for (const line of buffered.split('\n')) {
        const trimmed = line.trim();
        if (!trimmed.startsWith('{')) continue;
        try {
          const parsed = JSON.parse(trimmed) as Record<string, unknown>;
          child.stdout!.off('data', onData);
          resolve(parsed);
          return;
        } catch {
          // not the ready line
        }
      }
    };
    child.stdout!.on('data', onData);
    child.once('exit', (code) => reject(new Error(`${name} exited with ${code} before it was ready: ${stderr.trim()}`)));
  });
  child.stdout!.resume();
  return { proc: wrap(name, child, () => [child.pid!]), ready };
}

/** Children still running; an interrupted bench stops them rather than leaving them behind. */
const live = new Set<ChildProcess>();
let trapped = false;

/** Registers a child so Ctrl-C or SIGTERM on the bench stops it too (by its PID). */
export function track(child: ChildProcess): ChildProcess {
  live.add(child);
  child.once('exit', () => live.delete(child));
  if (!trapped) {
    trapped = true;
    for (const signal of ['SIGINT', 'SIGTERM'] as const) {
      process.once(signal, () => {
        for (const c of live) c.kill('SIGKILL');
        process.exit(130);
      });
    }
  }
  return child;
}

export function wrap(name: string, child: ChildProcess, pids: () => number[], cleanup?: () => void): Proc {
  track(child);
  return {
    name,
    child,
    pids,
    async stop() {
      if (child.exitCode === null && child.signalCode === null) {
        const exited = once(child, 'exit');
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 15_000);
        await exited;
        clearTimeout(timer);
      }
      cleanup?.();
    },
  };
}

/** The first of `candidates` that exists, or null. */
export function findBinary(...candidates: string[]): string | null {
  for (const path of candidates) if (existsSync(path)) return path;
  return null;
}

/** Resolves after `ms`: the bench (never the tests) paces warm-ups and settle time with it. */
export function pause(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}
