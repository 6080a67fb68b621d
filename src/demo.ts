/**
 * The embedded demo cluster: three local nodes that answer `/health` and `/rpc/*`, each naming
 * itself, so `lakefront` with no configuration is a working front door out of the box.
 */
import { Buffer } from 'node:buffer';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { MemberConfig } from './membership/membership.js';

export interface DemoCluster {
  readonly members: MemberConfig[];
  close(): Promise<void>;
}

function demoNode(id: string): Server {
  return createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      if (req.url === '/health') {
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ok: true, node: id }));
        return;
      }
      if (req.url?.startsWith('/rpc/')) {
        const body = {
          node: id,
          method: req.method,
          path: req.url,
          board: req.headers['x-lakefront-board'] ?? null,
          bytes: Buffer.concat(chunks).length,
        };
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
        return;
      }
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'not found', node: id }));
    });
  });
}

/** Starts `count` demo nodes on loopback ports chosen by the OS. */
export async function startDemoCluster(count = 3): Promise<DemoCluster> {
  const servers: Server[] = [];
  const members: MemberConfig[] = [];
  for (let i = 0; i < count; i++) {
    const id = `demo-${String.fromCharCode(97 + i)}`;
    const server = demoNode(id);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    servers.push(server);
    members.push({ id, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
  }
  return {
    members,
    close: () =>
      Promise.all(
        servers.map(
          (s) =>
            new Promise<void>((resolve) => {
              s.close(() => resolve());
              s.closeAllConnections();
            }),
        ),
      ).then(() => undefined),
  };
}
