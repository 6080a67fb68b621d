/**
 * Cache affinity by weighted rendezvous hashing (seed 000): a key's candidates are every routable
 * node ranked by score, so a board keeps landing on its native node and fails over in an order
 * every router agrees on.
 */
import { RendezvousRanker } from '../hashing/rendezvous.js';
import type { ClusterView, Policy } from './types.js';

export class RendezvousPolicy implements Policy {
  readonly name = 'rendezvous';
  private ranker: RendezvousRanker | null = null;

  update(view: ClusterView): void {
    this.ranker = new RendezvousRanker(view.ids, view.weights);
  }

  pick(key: string, _op: number, out: Int32Array): number {
    return this.ranker === null ? 0 : this.ranker.rankInto(key, out);
  }
}
