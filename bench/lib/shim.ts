/**
 * A fault-injection TCP shim: a loopback forwarder that delays what passes through it, with
 * jitter, keeping byte order. `tc netem` is not available on these machines; this stands in for
 * it between Lakefront and one node.
 *
 * By default only what the node sends back is delayed (like netem on the node's egress), so a
 * request's round trip grows by `delayMs` +/- `jitterMs`. Each chunk leaves no earlier than the
 * one before it.
 */
import { once } from 'node:events';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';

export interface ShimOptions {
  readonly targetPort: number;
  readonly targetHost?: string;
  readonly delayMs: number;
  readonly jitterMs?: number;
  /** Which bytes to delay: the node's answers (default), the requests, or both. */
  readonly direction?: 'from-target' | 'to-target' | 'both';
}

export class DelayShim {
  private readonly server: Server;
  private readonly sockets = new Set<Socket>();
  delayMs: number;
  jitterMs: number;
  port = 0;
  /** Bytes forwarded towards the target, and back. */
  bytesIn = 0;
  bytesOut = 0;

  private constructor(private readonly options: ShimOptions) {
    this.delayMs = options.delayMs;
    this.jitterMs = options.jitterMs ?? 0;
    this.server = createServer((client) => this.accept(client));
  }

  static async start(options: ShimOptions): Promise<DelayShim> {
    const shim = new DelayShim(options);
    shim.server.listen(0, '127.0.0.1');
    await once(shim.server, 'listening');
    shim.port = (shim.server.address() as AddressInfo).port;
    return shim;
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async close(): Promise<void> {
    for (const s of this.sockets) s.destroy();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  private accept(client: Socket): void {
    const target = connect(this.options.targetPort, this.options.targetHost ?? '127.0.0.1');
    for (const s of [client, target]) {
      this.sockets.add(s);
      s.setNoDelay(true);
      s.on('error', () => undefined);
      s.on('close', () => {
        this.sockets.delete(s);
        client.destroy();
        target.destroy();
      });
    }
    const direction = this.options.direction ?? 'from-target';
    this.pipe(client, target, direction !== 'from-target', (n) => (this.bytesIn += n));
    this.pipe(target, client, direction !== 'to-target', (n) => (this.bytesOut += n));
  }

  private pipe(from: Socket, to: Socket, delayed: boolean, count: (n: number) => void): void {
    let lastAt = 0;
    let pending = 0;
    let ended = false;
    from.on('data', (chunk: Buffer) => {
      count(chunk.length);
      if (!delayed || this.delayMs <= 0) {
        to.write(chunk);
        return;
      }
      const jitter = this.jitterMs > 0 ? (Math.random() * 2 - 1) * this.jitterMs : 0;
      const at = Math.max(performance.now() + Math.max(0, this.delayMs + jitter), lastAt);
      lastAt = at;
      pending++;
      setTimeout(() => {
        if (!to.destroyed) to.write(chunk);
        if (--pending === 0 && ended) to.end();
      }, at - performance.now());
    });
    from.on('end', () => {
      ended = true;
      if (pending === 0) to.end();
    });
  }
}
