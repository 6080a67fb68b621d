/**
 * ring: consistent hashing with virtual nodes (seed 003). A key's candidates are its preference
 * list, the distinct routable nodes clockwise from the key on the ring: the first is the key's
 * home, the rest its failover and hedge order. A lookup hashes the key once, whatever the node
 * count (rendezvous hashes it once per node), then walks the ring: 118 ns for 3 nodes, 1.2 us
 * for a full list of 64 (rendezvous: 125 ns and 4.8 us; `node dist/bench/ring.js`).
 */
import { HashRing } from '../hashing/ring.js';
import type { ClusterView, Policy } from './types.js';

export class RingPolicy implements Policy {
  readonly name = 'ring';
  private ring: HashRing | null = null;

  update(view: ClusterView): void {
    this.ring = new HashRing(view.ids, view.weights);
  }

  pick(key: string, _op: number, out: Int32Array): number {
    return this.ring === null ? 0 : this.ring.preferenceInto(key, out);
  }
}
