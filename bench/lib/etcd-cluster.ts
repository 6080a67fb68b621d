/**
 * A real etcd cluster on loopback for tests and benches: N members started by hand (no
 * systemd), data in a temporary folder (tmpfs when there is one), stopped and removed afterwards.
 * Needs the `etcd` binary (Debian: etcd-server).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { track } from './procs.js';

export interface EtcdMember {
  readonly name: string;
  readonly clientPort: number;
  readonly peerPort: number;
  readonly clientUrl: string;
  proc: ChildProcess | null;
}

export interface EtcdStatus {
  readonly memberId: string;
  readonly leader: string;
  readonly raftTerm: number;
}

export interface EtcdClusterOptions {
  readonly size?: number;
  /** Raft heartbeat, ms. Default 50 (etcd's own default is 100). */
  readonly heartbeatMs?: number;
  /** Election timeout, ms. Default 500 (etcd's own default is 1000). */
  readonly electionMs?: number;
}

export const ETCD_BINARY = ['/usr/bin/etcd', '/usr/local/bin/etcd'].find((p) => existsSync(p)) ?? 'etcd';

async function freePort(): Promise<number> {
  const server = createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as AddressInfo).port;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

export class EtcdCluster {
  readonly members: EtcdMember[];
  private readonly dir: string;
  private readonly options: Required<EtcdClusterOptions>;
  private output = '';

  private constructor(members: EtcdMember[], dir: string, options: Required<EtcdClusterOptions>) {
    this.members = members;
    this.dir = dir;
    this.options = options;
  }

  static async start(options: EtcdClusterOptions = {}): Promise<EtcdCluster> {
    const opts = { size: options.size ?? 3, heartbeatMs: options.heartbeatMs ?? 50, electionMs: options.electionMs ?? 500 };
    const root = existsSync('/dev/shm') ? '/dev/shm' : tmpdir();
    const dir = mkdtempSync(join(root, 'lakefront-etcd-'));
    const members: EtcdMember[] = [];
    for (let i = 1; i <= opts.size; i++) {
      const clientPort = await freePort();
      const peerPort = await freePort();
      members.push({ name: `etcd-${i}`, clientPort, peerPort, clientUrl: `http://127.0.0.1:${clientPort}`, proc: null });
    }
    const cluster = new EtcdCluster(members, dir, opts);
    for (const m of members) cluster.launch(m, 'new');
    try {
      await cluster.waitHealthy();
    } catch (err) {
      await cluster.stop();
      throw err;
    }
    return cluster;
  }

  /** `id=url,...` for Lakefront's --etcd. */
  get nodeList(): string {
    return this.members.map((m) => `${m.name}=${m.clientUrl}`).join(',');
  }

  member(name: string): EtcdMember {
    const m = this.members.find((x) => x.name === name);
    if (!m) throw new Error(`no member ${name}`);
    return m;
  }

  async status(name: string): Promise<EtcdStatus> {
    const res = await fetch(`${this.member(name).clientUrl}/v3/maintenance/status`, { method: 'POST', body: '{}', signal: AbortSignal.timeout(1_000) });
    const body = (await res.json()) as { header: { member_id: string }; leader: string; raftTerm: string };
    return { memberId: body.header.member_id, leader: body.leader, raftTerm: Number(body.raftTerm) };
  }

  /** etcd member id -> member name. */
  async memberIds(): Promise<Map<string, string>> {
    const out = new Map<string, string>();
    for (const m of this.members) {
      if (m.proc === null) continue;
      out.set((await this.status(m.name)).memberId, m.name);
    }
    return out;
  }

  /** Name of the current leader, as the running members agree. */
  async leader(): Promise<string> {
    const ids = await this.memberIds();
    const alive = this.members.find((m) => m.proc !== null)!;
    const leader = ids.get((await this.status(alive.name)).leader);
    if (!leader) throw new Error('no leader');
    return leader;
  }

  /** Polls /health on every running member until all report healthy (bounded). */
  async waitHealthy(timeoutMs = 20_000): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const verdicts = await Promise.all(
        this.members
          .filter((m) => m.proc !== null)
          .map(async (m) => {
            try {
              const res = await fetch(`${m.clientUrl}/health`, { signal: AbortSignal.timeout(500) });
              return ((await res.json()) as { health?: string }).health === 'true';
            } catch {
              return false;
            }
          }),
      );
      if (verdicts.every(Boolean)) return;
      if (Date.now() > deadline) throw new Error(`etcd did not become healthy within ${timeoutMs} ms: ${this.output.slice(-2000)}`);
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }

  /** Kills a member (SIGKILL: a crash, not a shutdown) and waits for it to be gone. */
  async kill(name: string): Promise<void> {
    const m = this.member(name);
    const proc = m.proc;
    if (!proc) return;
    m.proc = null;
    const exited = once(proc, 'exit');
    proc.kill('SIGKILL');
    await exited;
  }

  /** Starts a killed member again on its old data; resolves once every member is healthy. */
  async restart(name: string): Promise<void> {
    const m = this.member(name);
    if (m.proc !== null) return;
    this.launch(m, 'existing');
    await this.waitHealthy();
  }

  async stop(): Promise<void> {
    await Promise.all(
      this.members.map(async (m) => {
        const proc = m.proc;
        if (!proc) return;
        m.proc = null;
        const exited = once(proc, 'exit');
        proc.kill('SIGTERM');
        const timer = setTimeout(() => proc.kill('SIGKILL'), 5_000);
        await exited;
        clearTimeout(timer);
      }),
    );
    rmSync(this.dir, { recursive: true, force: true });
  }

  private launch(m: EtcdMember, state: 'new' | 'existing'): void {
    const cluster = this.members.map((x) => `${x.name}=http://127.0.0.1:${x.peerPort}`).join(',');
    const proc = spawn(
      ETCD_BINARY,
      [
        '--name', m.name,
        '--data-dir', join(this.dir, m.name),
        '--listen-client-urls', m.clientUrl,
        '--advertise-client-urls', m.clientUrl,
        '--listen-peer-urls', `http://127.0.0.1:${m.peerPort}`,
        '--initial-advertise-peer-urls', `http://127.0.0.1:${m.peerPort}`,
        '--initial-cluster', cluster,
        '--initial-cluster-state', state,
        '--initial-cluster-token', 'lakefront-test',
        '--heartbeat-interval', String(this.options.heartbeatMs),
        '--election-timeout', String(this.options.electionMs),
        '--logger', 'zap',
        '--log-level', 'error',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    track(proc);
    proc.stderr!.on('data', (c: Buffer) => {
      this.output += c.toString();
      if (this.output.length > 100_000) this.output = this.output.slice(-50_000);
    });
    proc.on('error', (err) => (this.output += `\n${err.message}`));
    m.proc = proc;
  }
}

/** base64 of a UTF-8 string, as the JSON gateway wants keys and values. */
export function b64(text: string): string {
  return Buffer.from(text).toString('base64');
}
