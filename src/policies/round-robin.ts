/**
 * round_robin: the stock etcd client's behaviour (gRPC's round_robin balancer). Every operation,
 * read or write, goes to the next routable member in turn; the rest follow as failover order.
 */
import { rotateInto, routable, type ClusterView, type Policy } from './types.js';

export class RoundRobinPolicy implements Policy {
  readonly name = 'round_robin';
  readonly rotating = true;
  private nodes: number[] = [];
  private next = 0;

  update(view: ClusterView): void {
    this.nodes = routable(view);
  }

  pick(_key: string, _op: number, out: Int32Array, takeTurn = true): number {
    const n = this.nodes.length;
    if (n === 0) return 0;
    const start = this.next;
    if (takeTurn) this.next = (start + 1) % n;
    return rotateInto(this.nodes, start, out, 0);
  }
}
