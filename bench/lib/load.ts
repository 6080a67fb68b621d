/**
 * Load generation with autocannon, recording every response's latency in microseconds into an
 * HDR histogram (autocannon's own histogram holds whole milliseconds).
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import autocannon from 'autocannon';
import hdr from 'hdr-histogram-js';

export interface Workload {
  readonly name: string;
  readonly description: string;
  /** autocannon `requests` (cycled per connection). */
  readonly requests: autocannon.Request[];
}

/** `{"row":"x…x"}`: 256 bytes. */
export const BODY_256 = JSON.stringify({ row: 'x'.repeat(256 - 10) });

/**
 * Boards per workload. autocannon rebuilds a request on every send when it has a `setupRequest`
 * hook, which made the generator the bottleneck (about 30k req/s here against the bare upstream
 * instead of 70k+); so each workload is a fixed, cycled list of prebuilt requests, each with its
 * own random board.
 */
const BOARDS_PER_WORKLOAD = 64;

function randomBoard(): string {
  return `board-${(Math.random() * 1_000_000) | 0}`;
}

function withBoards(template: autocannon.Request, count = BOARDS_PER_WORKLOAD): autocannon.Request[] {
  return Array.from({ length: count }, () => ({ ...template, headers: { ...template.headers, 'x-lakefront-board': randomBoard() } }));
}

const POST_256: autocannon.Request = { method: 'POST', path: '/rpc/board.append', headers: { 'content-type': 'application/json' }, body: BODY_256 };
const GET_1K: autocannon.Request = { method: 'GET', path: '/rpc/query.execute?bytes=1024', headers: {} };
const GET_16K: autocannon.Request = { method: 'GET', path: '/rpc/query.execute?bytes=16384', headers: {} };

function mix(reads: autocannon.Request, writes: autocannon.Request, count = BOARDS_PER_WORKLOAD): autocannon.Request[] {
  const readList = withBoards(reads, count);
  const writeList = withBoards(writes, count);
  // Every fifth request is a write: 80/20.
  return readList.map((r, i) => (i % 5 === 4 ? writeList[i]! : r));
}

const GET_SMALL: autocannon.Request = { method: 'GET', path: '/rpc/query.execute', headers: {} };

/** Whole-value writes and reads of 64 keys on a replicated route (`/kv/*`, bench/ir.sh kvput). */
function keys(method: 'PUT' | 'GET'): autocannon.Request[] {
  return Array.from({ length: 64 }, (_, i) => ({
    method,
    path: `/kv/key-${i}`,
    headers: method === 'PUT' ? { 'content-type': 'application/octet-stream' } : {},
    ...(method === 'PUT' ? { body: BODY_256 } : {}),
  }));
}

export const WORKLOADS: Record<string, Workload> = {
  getsmall: { name: 'getsmall', description: 'GET 64 B (retryable reads), random boards', requests: withBoards(GET_SMALL) },
  post256: { name: 'post256', description: 'POST 256 B, random boards', requests: withBoards(POST_256) },
  get1k: { name: 'get1k', description: 'GET 1 KiB, random boards', requests: withBoards(GET_1K) },
  get16k: { name: 'get16k', description: 'GET 16 KiB, random boards', requests: withBoards(GET_16K) },
  kvput: { name: 'kvput', description: 'PUT 256 B to /kv/key-N (replicated routes)', requests: keys('PUT') },
  kvget: { name: 'kvget', description: 'GET /kv/key-N (replicated routes)', requests: keys('GET') },
  mix8020: { name: 'mix8020', description: '80% GET 1 KiB / 20% POST 256 B, random boards', requests: mix(GET_1K, POST_256, 65) },
};

export interface LoadResult {
  readonly requests: number;
  readonly ok: number;
  readonly non2xx: number;
  readonly errors: number;
  readonly timeouts: number;
  readonly seconds: number;
  readonly rps: number;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly p999Us: number;
}

/** `overallRate`: requests per second across all connections (open loop); default: as fast as it goes. */
export async function runLoad(url: string, workload: Workload, connections: number, seconds: number, overallRate?: number): Promise<LoadResult> {
  const histogram = hdr.build({ lowestDiscernibleValue: 1, highestTrackableValue: 120_000_000, numberOfSignificantValueDigits: 3 });
  let ok = 0;
  let non2xx = 0;
  const result = await new Promise<autocannon.Result>((resolve, reject) => {
    const instance = autocannon(
      { url, connections, duration: seconds, requests: workload.requests, timeout: 10, ...(overallRate ? { overallRate } : {}) },
      (err, res) => (err ? reject(err) : resolve(res)),
    );
    // autocannon starts a connection's first clock before the TCP connect, so the first answer
    // on each connection times the connection's setup too (at 1,024 connections, about half a
    // second: it was the whole p99.9). It counts towards throughput, not latency.
    const answered = new WeakSet<object>();
    instance.on('response', (client, statusCode, _bytes, responseTimeMs) => {
      if (statusCode >= 200 && statusCode < 300) ok++;
      else non2xx++;
      if (!answered.has(client)) {
        answered.add(client);
        return;
      }
      histogram.recordValue(Math.max(1, Math.round(responseTimeMs * 1000)));
    });
  });
  const elapsed = result.duration;
  return {
    requests: ok + non2xx,
    ok,
    non2xx,
    // autocannon counts a timeout in its errors too; here errors and timeouts are apart, as wrk's
    // are, so a failure is counted once where they are added up.
    errors: result.errors - result.timeouts,
    timeouts: result.timeouts,
    seconds: elapsed,
    rps: ok / elapsed,
    p50Us: histogram.getValueAtPercentile(50),
    p99Us: histogram.getValueAtPercentile(99),
    p999Us: histogram.getValueAtPercentile(99.9),
  };
}

/**
 * The same load from wrk (the Debian package, written in C) instead of autocannon: one wrk thread,
 * `connections` connections, the workload's prebuilt requests cycled. autocannon runs in the bench
 * process and takes as much CPU as a proxy on these two shared cores; wrk takes a fraction, so the
 * contenders' CPU a request is less inflated by the generator's competition (both are reported).
 * Latency is wrk's own, per request in microseconds (its first requests on a connection are timed
 * from their send, not from the TCP connect).
 */
export async function runWrk(url: string, workload: Workload, connections: number, seconds: number): Promise<LoadResult> {
  const dir = mkdtempSync(join(tmpdir(), 'lakefront-wrk-'));
  try {
    const script = join(dir, `${workload.name}.lua`);
    writeFileSync(script, wrkScript(workload));
    const stdout = await new Promise<string>((resolve, reject) => {
      execFile('wrk', ['-t1', `-c${connections}`, `-d${seconds}s`, '--timeout', '10s', '-s', script, url], { timeout: (seconds + 30) * 1000 }, (err, out, errOut) =>
        err ? reject(new Error(`wrk failed: ${err.message} ${errOut}`)) : resolve(out),
      );
    });
    const line = stdout.split('\n').find((l) => l.startsWith('{"wrk":'));
    if (!line) throw new Error(`wrk printed no result line: ${stdout}`);
    const r = JSON.parse(line) as { requests: number; durationUs: number; status: number; connect: number; read: number; write: number; timeout: number; p50: number; p99: number; p999: number };
    const elapsed = r.durationUs / 1e6;
    return {
      requests: r.requests,
      ok: r.requests - r.status,
      non2xx: r.status,
      errors: r.connect + r.read + r.write,
      timeouts: r.timeout,
      seconds: elapsed,
      rps: (r.requests - r.status) / elapsed,
      p50Us: r.p50,
      p99Us: r.p99,
      p999Us: r.p999,
    };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/** Whether wrk is on the PATH (`apt-get install wrk`). */
export function hasWrk(): Promise<boolean> {
  // `wrk --version` exits 1 after printing its version and usage.
  return new Promise((resolve) => execFile('wrk', ['--version'], (err, out) => resolve(!err || /^wrk /.test(out))));
}

/** A wrk script that sends the workload's requests in turn and prints one JSON line at the end. */
export function wrkScript(workload: Workload): string {
  const lua = (v: string): string => JSON.stringify(v); // ASCII only: a JSON string is a Lua string
  const requests = workload.requests.map((r) => {
    const headers = Object.entries(r.headers ?? {}).map(([k, v]) => `[${lua(k)}]=${lua(String(v))}`);
    const body = typeof r.body === 'string' ? lua(r.body) : 'nil';
    return `  wrk.format(${lua(r.method ?? 'GET')}, ${lua(r.path ?? '/')}, {${headers.join(',')}}, ${body}),`;
  });
  return `local requests
local i = 0
init = function(args)
  requests = {
${requests.join('\n')}
  }
end
request = function()
  i = i % #requests + 1
  return requests[i]
end
done = function(summary, latency, _)
  local e = summary.errors
  io.write(string.format('{"wrk":1,"requests":%d,"durationUs":%d,"status":%d,"connect":%d,"read":%d,"write":%d,"timeout":%d,"p50":%d,"p99":%d,"p999":%d}\\n',
    summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
`;
}

/** A short unrecorded run that warms connections, pools and JIT. */
export async function warmUp(url: string, workload: Workload, connections: number, seconds = 1, overallRate?: number): Promise<void> {
  await autocannon({ url, connections: Math.min(connections, 64), duration: seconds, requests: workload.requests, ...(overallRate ? { overallRate } : {}) });
}
