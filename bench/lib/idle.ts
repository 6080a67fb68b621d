/**
 * Idle keep-alive client connections for the memory bench (bench/memory.ts): many connections,
 * each answered once and then left open, and how many of them are still open when memory is read.
 */
import { connect, type Socket } from 'node:net';

/**
 * Opens `count` connections to `url` (500 at a time), sends `request` (one whole HTTP/1.1
 * request, keep-alive) on each, and resolves with the sockets once every one has its answer's
 * head, all still open. Rejects when a connection fails, or an answer is not a 2xx or says
 * `connection: close`: such a connection is not an idle keep-alive one the front door holds.
 */
export async function holdConnections(url: string, count: number, request: (i: number) => string): Promise<Socket[]> {
  const { port, hostname } = new URL(url);
  const sockets: Socket[] = [];
  const batch = 500;
  for (let i = 0; i < count; i += batch) {
    const opened = Array.from({ length: Math.min(batch, count - i) }, (_, k) => {
      return new Promise<Socket>((resolve, reject) => {
        const socket = connect(Number(port), hostname);
        let head = '';
        const onData = (chunk: Buffer): void => {
          head += chunk.toString('latin1');
          const end = head.indexOf('\r\n\r\n');
          if (end < 0) return;
          socket.off('data', onData);
          const status = head.slice(0, head.indexOf('\r\n'));
          if (!/^HTTP\/1\.1 2\d\d /.test(status)) reject(new Error(`${url}: "${status}" on connection ${i + k}, not a 2xx`));
          else if (/^connection:[ \t]*close[ \t]*$/im.test(head.slice(0, end))) reject(new Error(`${url}: connection ${i + k} was answered with connection: close`));
          else resolve(socket);
        };
        socket.once('error', reject);
        socket.once('close', () => reject(new Error(`${url}: connection ${i + k} closed before its answer`)));
        socket.once('connect', () => socket.write(request(i + k)));
        socket.on('data', onData);
      });
    });
    sockets.push(...(await Promise.all(opened)));
  }
  return sockets;
}

/**
 * How many of `sockets` are still open now: neither ended by the server (a FIN, a reset) nor
 * destroyed. Read from each socket's state at the moment of asking, so a connection the server
 * closed at any time before (while others were still opening, say) is not counted.
 */
export function stillOpen(sockets: readonly Socket[]): number {
  let open = 0;
  for (const s of sockets) if (!s.destroyed && !s.readableEnded && s.readyState === 'open') open++;
  return open;
}
