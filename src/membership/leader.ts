/**
 * Leader detection for leader-based stores, run by the control plane (seed 002, section III-D:
 * active refresh, not start-up-only detection).
 *
 * etcd: every `intervalMs` (250) each member is asked `POST /v3/maintenance/status` through its
 * JSON gateway. Its answer names itself (`header.member_id`), the leader it follows (`leader`)
 * and the Raft term (`raftTerm`). The leader published is the one named in the highest term
 * among the answers, and only if that member answered this round itself: followers keep naming
 * a dead leader until their election timeout, and publishing it would pin writes to a corpse.
 */
import { EventEmitter } from 'node:events';
import type { MemberConfig } from './membership.js';
import { PollLoop } from './poll.js';
import { probeJson } from './probe.js';

export interface LeaderProbeOptions {
  readonly members: readonly MemberConfig[];
  /** Default 250. */
  readonly intervalMs?: number;
  /** Per-request deadline. Default 200. */
  readonly timeoutMs?: number;
  readonly fetch?: typeof globalThis.fetch;
}

export const DEFAULT_LEADER_INTERVAL_MS = 250;

interface StatusAnswer {
  readonly id: string;
  readonly memberId: string;
  readonly leader: string;
  readonly term: bigint;
}

/** Emits `change` when the detected leader (a member id of ours, or null) changes. */
export class EtcdLeaderProbe extends EventEmitter {
  private current: string | null = null;
  private readonly members: readonly MemberConfig[];
  /** How often every member is asked (its leader rounds). */
  readonly intervalMs: number;
  private readonly timeoutMs: number;
  /** The caller's own fetch, if given (else probe.ts's node:http request). */
  private readonly fetchImpl: typeof globalThis.fetch | null;
  /** etcd member id (decimal string) -> our node id, learned from each member's own answer. */
  private readonly byMemberId = new Map<string, string>();
  private readonly loop: PollLoop;
  private probing: Promise<void> | null = null;

  constructor(options: LeaderProbeOptions) {
    super();
    this.members = options.members;
    this.intervalMs = options.intervalMs ?? DEFAULT_LEADER_INTERVAL_MS;
    this.timeoutMs = options.timeoutMs ?? 200;
    this.fetchImpl = options.fetch ?? null;
    this.loop = new PollLoop(this.intervalMs, () => this.probeOnce());
  }

  /** Our id of the current leader, or null when none is known. */
  get leader(): string | null {
    return this.current;
  }

  /** The etcd member id we learned for one of our nodes (for tests and stats). */
  memberIdOf(id: string): string | undefined {
    for (const [memberId, node] of this.byMemberId) if (node === id) return memberId;
    return undefined;
  }

  /** Forget the leader now (a write to it could not connect); the next round may find it again. */
  clear(): void {
    this.set(null);
  }

  probeOnce(): Promise<void> {
    if (this.probing) return this.probing;
    this.probing = Promise.all(this.members.map((m) => this.status(m))).then((answers) => {
      this.probing = null;
      // The leader named at the newest term that names one, unless a majority of the members
      // are past that term with no leader yet (an election among them): then none is published,
      // for a leader named only at an older term may be one cut off from its peers, and writes
      // pinned to it would wait out their timeouts. A lone member past it (cut off itself, and
      // campaigning term after term without pre-vote, as etcd 3.4 does) does not count.
      let best: StatusAnswer | null = null;
      /** Each member that answered: whether it named itself the leader. */
      const answered = new Map<string, boolean>();
      for (const answer of answers) {
        if (answer === null) continue;
        answered.set(answer.id, answer.leader === answer.memberId);
        this.byMemberId.set(answer.memberId, answer.id);
        if (answer.leader !== '0' && (best === null || answer.term > best.term)) best = answer;
      }
      if (best !== null) {
        let electing = 0;
        for (const answer of answers) if (answer !== null && answer.leader === '0' && answer.term > best.term) electing++;
        if (electing * 2 > this.members.length) best = null;
      }
      // And only a leader that says so itself: the others' word may be stale (etcd 3.4's status
      // gives the term of the last applied entry, not the current one, so a member that lost its
      // leadership, or never had it, can be named at the newest term a round after an election
      // began, while that member answers that it knows no leader).
      const leaderId = best !== null ? this.byMemberId.get(best.leader) : undefined;
      this.set(leaderId !== undefined && answered.get(leaderId) === true ? leaderId : null);
      // While a leader is published, a member that answers that it knows none is cut off from
      // its peers (a partition, or just restarted and not caught up): its serializable reads may
      // be stale and its linearizable ones wait out their timeout. Said each round, so that it
      // stays out of the rankings while it lasts (see the supervisor).
      if (this.current !== null) {
        const cutOff: string[] = [];
        for (const answer of answers) if (answer !== null && answer.leader === '0') cutOff.push(answer.id);
        if (cutOff.length > 0) this.emit('leaderless', cutOff);
      }
    });
    return this.probing;
  }

  start(): void {
    this.loop.start();
  }

  stop(): void {
    this.loop.stop();
  }

  private set(leader: string | null): void {
    if (leader === this.current) return;
    this.current = leader;
    this.emit('change', leader);
  }

  private async status(member: MemberConfig): Promise<StatusAnswer | null> {
    try {
      const url = `${member.url}/v3/maintenance/status`;
      let answer: unknown;
      if (this.fetchImpl === null) {
        const { status, json } = await probeJson(url, '{}', this.timeoutMs);
        if (status !== 200) return null;
        answer = json;
      } else {
        const res = await this.fetchImpl(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}', redirect: 'manual', signal: AbortSignal.timeout(this.timeoutMs) });
        if (res.status !== 200) {
          await res.arrayBuffer();
          return null;
        }
        answer = await res.json();
      }
      const body = (answer ?? {}) as { header?: { member_id?: string }; leader?: string; raftTerm?: string };
      const memberId = body.header?.member_id;
      if (typeof memberId !== 'string') return null;
      return { id: member.id, memberId, leader: String(body.leader ?? '0'), term: BigInt(body.raftTerm ?? '0') };
    } catch {
      return null;
    }
  }
}
