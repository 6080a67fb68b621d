/**
 * Seed 002's tables, reproduced through Lakefront against a real etcd cluster on loopback.
 *
 *   node dist/bench/etcd.js [--quick] [--trials 3] [--seconds 10] [--members 3] [--workers 128]
 *       [--mixes 80/20,50/50] [--policies round_robin,hybrid,boltzmann] [--no-failover]
 *
 * Workload as in the paper (IV-B): closed loop, 128 workers, 1,000 keys, 256-byte values, 80/20
 * or 50/50 read/write (reads are linearizable `range`, writes `put`). Conditions: healthy, and
 * one follower delayed 8 +/- 2 ms by the fault-injection shim (bench/lib/shim.ts). Policies are
 * separate Lakefront instances over the same cluster, run interleaved. A failover phase kills the
 * leader under a write loop and reports recovery time and failed requests.
 */
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { startLakefrontOver, type Contender } from './lib/contenders.js';
import { closedLoop, type ClosedLoopResult, type Operation } from './lib/closedloop.js';
import { EtcdCluster, b64 } from './lib/etcd-cluster.js';
import { ROOT, pause } from './lib/procs.js';
import { fmt, machine, median, table, updateSection, writeResult } from './lib/report.js';
import { DelayShim } from './lib/shim.js';

const { values } = parseArgs({
  options: {
    quick: { type: 'boolean', default: false },
    trials: { type: 'string' },
    seconds: { type: 'string' },
    members: { type: 'string', default: '3' },
    workers: { type: 'string', default: '128' },
    mixes: { type: 'string', default: '80/20,50/50' },
    policies: { type: 'string', default: 'round_robin,hybrid,boltzmann' },
    threads: { type: 'string', default: '1' },
    'no-failover': { type: 'boolean', default: false },
    'no-write': { type: 'boolean', default: false },
    section: { type: 'string' },
  },
});
const quick = values.quick!;
const trials = Number(values.trials ?? (quick ? 1 : 3));
const seconds = Number(values.seconds ?? (quick ? 3 : 10));
const size = Number(values.members);
const workers = Number(values.workers);
const mixes = values.mixes!.split(',').map((m) => Number(m.split('/')[0]) / 100);
const policies = values.policies!.split(',');
const threads = Number(values.threads);
const KEYS = 1000;
const VALUE = b64('v'.repeat(256));
const keys = Array.from({ length: KEYS }, (_, i) => b64(`key-${String(i).padStart(4, '0')}`));

function operations(readShare: number): () => Operation {
  const reads = keys.map((k) => JSON.stringify({ key: k }));
  const writes = keys.map((k) => JSON.stringify({ key: k, value: VALUE }));
  return () => {
    const i = (Math.random() * KEYS) | 0;
    return Math.random() < readShare ? { kind: 'read', path: '/v3/kv/range', body: reads[i]! } : { kind: 'write', path: '/v3/kv/put', body: writes[i]! };
  };
}

interface Sample {
  readonly readP50: number;
  readonly readP99: number;
  readonly writeP50: number;
  readonly writeP99: number;
  readonly tput: number;
  readonly toSlowPct: number;
  readonly failed: number;
}

function sample(r: ClosedLoopResult, slow: string | null): Sample {
  const totalReads = Object.values(r.servedBy).reduce((s, x) => s + x.reads, 0);
  return {
    readP50: r.read.p50Us / 1000,
    readP99: r.read.p99Us / 1000,
    writeP50: r.write.p50Us / 1000,
    writeP99: r.write.p99Us / 1000,
    tput: r.opsPerSecond,
    toSlowPct: slow && totalReads ? ((r.servedBy[slow]?.reads ?? 0) / totalReads) * 100 : Number.NaN,
    failed: r.failed,
  };
}

/**
 * Kills the leader under an open loop of writes (one every 5 ms, each to its own key, whatever
 * earlier ones do) and reports when the first write issued after the kill succeeded and how many
 * issued after it failed. A closed loop would measure only etcd's request timeout: every writer
 * ends up waiting on a write sent into the election.
 */
async function failover(cluster: EtcdCluster, policy: string): Promise<{ recoveryMs: number; failed: number; writes: number }> {
  const lf = await startLakefrontOver(cluster.nodeList, policy, threads);
  try {
    const old = await cluster.leader();
    const results: { issuedAt: number; ok: boolean }[] = [];
    const inflight: Promise<void>[] = [];
    let n = 0;
    const timer = setInterval(() => {
      const issuedAt = performance.now();
      const body = JSON.stringify({ key: b64(`failover-${policy}-${n++}`), value: VALUE });
      inflight.push(
        fetch(`${lf.url}/v3/kv/put`, { method: 'POST', body }).then(
          async (res) => {
            await res.arrayBuffer();
            results.push({ issuedAt, ok: res.status === 200 });
          },
          () => void results.push({ issuedAt, ok: false }),
        ),
      );
    }, 5);
    await pause(1_000);
    const killedAt = performance.now();
    await cluster.kill(old);
    await pause(5_000);
    clearInterval(timer);
    await Promise.all(inflight);
    await cluster.restart(old);
    const after = results.filter((r) => r.issuedAt > killedAt).sort((a, b) => a.issuedAt - b.issuedAt);
    const firstOk = after.find((r) => r.ok);
    return { recoveryMs: firstOk ? firstOk.issuedAt - killedAt : Number.NaN, failed: after.filter((r) => !r.ok).length, writes: after.length };
  } finally {
    await lf.proc?.stop();
  }
}

async function main(): Promise<void> {
  const cluster = await EtcdCluster.start({ size, heartbeatMs: 100, electionMs: 1000 });
  const started: Contender[] = [];
  const shims: DelayShim[] = [];
  try {
    // Load the keyspace.
    const loader = await startLakefrontOver(cluster.nodeList, 'hybrid', threads);
    started.push(loader);
    await Promise.all(keys.map((k) => fetch(`${loader.url}/v3/kv/put`, { method: 'POST', body: JSON.stringify({ key: k, value: VALUE }) }).then((r) => r.arrayBuffer())));
    const leader = await cluster.leader();
    const slow = cluster.members.find((m) => m.name !== leader)!;
    const shim = await DelayShim.start({ targetPort: slow.clientPort, delayMs: 8, jitterMs: 2 });
    shims.push(shim);
    const degradedNodes = cluster.members.map((m) => `${m.name}=${m === slow ? shim.url : m.clientUrl}`).join(',');
    const instances = new Map<string, Contender>();
    for (const condition of ['healthy', 'degraded']) {
      for (const policy of policies) {
        const c = await startLakefrontOver(condition === 'healthy' ? cluster.nodeList : degradedNodes, policy, threads);
        started.push(c);
        instances.set(`${condition}/${policy}`, c);
      }
    }
    const samples = new Map<string, Sample[]>();
    for (let trial = 0; trial < trials; trial++) {
      for (const condition of ['healthy', 'degraded']) {
        for (const readShare of mixes) {
          for (const policy of policies) {
            const c = instances.get(`${condition}/${policy}`)!;
            await pause(500);
            const r = await closedLoop(c.url, { workers, seconds, next: operations(readShare) });
            const s = sample(r, condition === 'degraded' ? slow.name : null);
            const key = `${condition}|${Math.round(readShare * 100)}/${Math.round((1 - readShare) * 100)}|${policy}`;
            (samples.get(key) ?? samples.set(key, []).get(key)!).push(s);
            process.stdout.write(
              `trial ${trial + 1}/${trials} ${key.padEnd(30)} read p50 ${fmt(s.readP50, 2)} p99 ${fmt(s.readP99, 2)} ms  write p50 ${fmt(s.writeP50, 2)} p99 ${fmt(s.writeP99, 2)} ms  ${fmt(s.tput)} ops/s  to slow ${fmt(s.toSlowPct, 2)}%  failed ${s.failed}\n`,
            );
          }
        }
      }
    }
    const leaderNow = await cluster.leader();
    for (const c of started) await c.proc?.stop();
    started.length = 0;
    const failovers: Record<string, { recoveryMs: number; failed: number; writes: number }> = {};
    if (!values['no-failover']) {
      for (const policy of ['round_robin', 'hybrid']) {
        failovers[policy] = await failover(cluster, policy);
        process.stdout.write(`failover ${policy}: first successful write issued ${fmt(failovers[policy]!.recoveryMs)} ms after the kill; ${failovers[policy]!.failed} of ${failovers[policy]!.writes} writes issued after it failed\n`);
      }
    }
    report(samples, failovers, slow.name, leaderNow);
  } finally {
    for (const c of started) await c.proc?.stop();
    for (const s of shims) await s.close();
    await cluster.stop();
  }
}

/**
 * The paper's figures (round_robin -> hybrid), by cluster size, condition and mix: Table II (3
 * nodes, healthy), Table III (3 nodes, a delayed follower), Table IV (5 nodes, healthy, 80/20).
 * Keys are the starts of the metric names in the tables below.
 */
const PAPER: Record<string, Record<string, string>> = {
  '3|healthy|80/20': { 'read p50': '9.14 -> 8.59 (-6.0%)', 'write p50': '6.22 -> 4.39 (-29.4%)', throughput: '14,536 -> 15,809 (+8.8%)' },
  '3|healthy|50/50': { 'write p50': '8.57 -> 5.89 (-31.3%)', throughput: '12,010 -> 13,650 (+13.7%)' },
  '3|degraded|80/20': {
    'read p50': '8.62 -> 8.19 (-5.0%)',
    'read p99': '47.02 -> 16.84 (-64.2%)',
    'write p50': '5.93 -> 4.68 (-21.1%)',
    'write p99': '34.31 -> 8.97 (-73.9%)',
    throughput: '8,377 -> 15,841 (+89.1%)',
    'reads to the delayed member': '~33% -> 0.5%',
  },
  '5|healthy|80/20': { 'read p50': '9.76 -> 9.41 (-3.6%)', 'write p50': '6.67 -> 4.22 (-36.7%)', throughput: '13,884 -> 14,990 (+8.0%)' },
};

function report(samples: Map<string, Sample[]>, failovers: Record<string, { recoveryMs: number; failed: number; writes: number }>, slow: string, leader: string): void {
  const info = machine();
  const command = `node dist/bench/etcd.js ${process.argv.slice(2).join(' ')}`.trim();
  const sections: string[] = [];
  const groups = [...new Set([...samples.keys()].map((k) => k.split('|').slice(0, 2).join('|')))];
  const summary: Record<string, Record<string, Record<string, number>>> = {};
  for (const group of groups) {
    const rows: string[][] = [];
    const med = (policy: string, f: (s: Sample) => number): number => median((samples.get(`${group}|${policy}`) ?? []).map(f));
    const metrics: [string, (s: Sample) => number, number][] = [
      ['read p50 (ms)', (s) => s.readP50, 2],
      ['read p99 (ms)', (s) => s.readP99, 2],
      ['write p50 (ms)', (s) => s.writeP50, 2],
      ['write p99 (ms)', (s) => s.writeP99, 2],
      ['throughput (ops/s)', (s) => s.tput, 0],
    ];
    if (group.startsWith('degraded')) metrics.push(['reads to the delayed member (%)', (s) => s.toSlowPct, 2]);
    summary[group] = {};
    for (const [name, f, digits] of metrics) {
      const values = policies.map((p) => med(p, f));
      const rr = med('round_robin', f);
      const hy = med('hybrid', f);
      const change = Number.isFinite(rr) && Number.isFinite(hy) && rr !== 0 ? `${hy >= rr ? '+' : ''}${fmt(((hy - rr) / rr) * 100, 1)}%` : '-';
      const paper = PAPER[`${size}|${group}`] ?? {};
      const paperKey = Object.keys(paper).find((k) => name.startsWith(k));
      rows.push([name, ...values.map((v) => fmt(v, digits)), change, paperKey ? paper[paperKey]! : '']);
      summary[group]![name] = Object.fromEntries(policies.map((p, i) => [p, values[i]!]));
    }
    const [condition, mix] = group.split('|');
    sections.push(`#### ${size} members, ${condition}${condition === 'degraded' ? ` (${slow} delayed 8 +/- 2 ms)` : ''}, ${mix} read/write`, '', table(['metric', ...policies, 'hybrid vs round_robin', 'paper (round_robin -> hybrid)'], rows), '');
  }
  const failoverRows = Object.entries(failovers).map(([p, f]) => [p, fmt(f.recoveryMs), `${f.failed} of ${f.writes}`]);
  const body = [
    `Machine: ${info.cpu}, ${info.memory}, ${info.os}; Node ${info.node}; etcd ${'3.4.23'}; commit ${info.commit}; ${info.date}.`,
    `Command: \`${command}\`. ${size}-member etcd cluster on loopback (data on tmpfs, heartbeat 100 ms, election 1 s; leader ${leader}); Lakefront at ${threads} thread(s) per policy; closed loop of ${workers} workers over ${KEYS} keys with 256-byte values; ${trials} interleaved trial(s) of ${seconds} s; medians.`,
    '',
    ...sections,
    failoverRows.length ? table(['leader killed under an open loop of writes (one per 5 ms)', 'first successful write issued after the kill (ms)', 'writes issued after the kill that failed'], failoverRows) : '',
  ].join('\n');
  process.stdout.write(`\n${body}\n`);
  if (values['no-write']) return;
  const section = values.section ?? (quick ? 'etcd-quick' : `etcd-${size}`);
  updateSection(join(ROOT, 'bench/RESULTS.md'), section, body);
  writeResult(join(ROOT, `bench/results/${section}.json`), { machine: info, command, summary, failovers, samples: Object.fromEntries(samples) });
}

main().catch((err: Error) => {
  process.stderr.write(`${err.stack ?? err.message}\n`);
  process.exit(1);
});
