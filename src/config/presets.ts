/** Ready-made route settings for known stores. */
import type { OperationRules } from '../server/protocol.js';
import type { ClusterConfig, RouteConfig } from '../server/supervisor.js';
import type { MemberConfig } from '../membership/membership.js';
import type { PolicyName } from '../server/protocol.js';

/**
 * etcd's v3 JSON gateway: `range` reads; puts, deletes, transactions, compaction and leases
 * write. Anything else (maintenance, cluster, auth) is treated as a write: sent to the leader,
 * once, never hedged. `watch` and `election/observe` are streams that do not end, which a proxy
 * that buffers whole answers cannot carry: they are refused (501) rather than held to the request
 * timeout and reported as a failed write.
 */
export const ETCD_OPERATIONS: OperationRules = {
  reads: ['/v3/kv/range'],
  writes: ['/v3/kv/put', '/v3/kv/deleterange', '/v3/kv/txn', '/v3/kv/compaction', '/v3/lease/*'],
  unsupported: ['/v3/watch', '/v3/election/observe'],
  otherwise: 'write',
};

export const ETCD_HEALTH_PATH = '/version';

export const ETCD_POLICIES: readonly PolicyName[] = ['hybrid', 'round_robin', 'boltzmann'];

/**
 * An etcd cluster (leader probed through the JSON gateway) and its `/v3/*` route.
 *
 * Health is liveness (`GET /version`), not etcd's `/health`: that one runs a linearizable read,
 * which queues behind the proposals stuck after a leader dies. Measured: it failed on both
 * survivors for a whole poll interval after the new leader was already serving writes, and the
 * front door answered 503 for that second. Consensus is the leader probe's business.
 */
export function etcdPreset(name: string, members: readonly MemberConfig[], policy: PolicyName, pattern = '/v3/*'): { cluster: ClusterConfig; route: RouteConfig } {
  return {
    cluster: { name, members, healthPath: ETCD_HEALTH_PATH, leader: 'etcd' },
    route: {
      pattern,
      cluster: name,
      policy,
      keyHeader: null,
      operations: ETCD_OPERATIONS,
      // The paper's policies do not hedge; reads fail over, writes are sent once.
      hedge: false,
      // A write whose connection was refused never reached etcd: the round-robin fallback may
      // take it (seed 002: leader-pinned writes fall back until a new leader is found).
      failoverUnsent: true,
    },
  };
}
