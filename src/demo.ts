/**
 * The embedded demo cluster: three local nodes that answer `/health` and `/rpc/*`, each naming
 * itself, echo WebSocket messages on `/rpc/*`, and keep replicated values on `/kv/*` (the
 * reference replica), so `lakefront` with no configuration is a working front door out of the box.
 */
import { Buffer } from 'node:buffer';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { WebSocketServer } from 'ws';
import type { MemberConfig } from './membership/membership.js';
import { ReplicaStore } from './replication/store.js';

export interface DemoCluster {
  readonly members: MemberConfig[];
  close(): Promise<void>;
}

function demoNode(id: string): { server: Server; sockets: WebSocketServer } {
  const store = new ReplicaStore();
  const server = createServer((req, res) => {
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
      if (req.url?.startsWith('/kv/')) {
        const answer = store.handle(req.method!, req.url, req.headers, Buffer.concat(chunks));
        res.writeHead(answer.status, { ...answer.headers, 'x-demo-node': id }).end(answer.body);
        return;
      }
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'not found', node: id }));
    });
  });
  // Text comes back as { node, echo }; binary as it is.
  const sockets = new WebSocketServer({ noServer: true, perMessageDeflate: false });
  server.on('upgrade', (req, socket, head) => {
    if (!req.url?.startsWith('/rpc/')) {
      socket.end('HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
      return;
    }
    sockets.handleUpgrade(req, socket, head, (ws) => {
      ws.on('message', (data: Buffer, isBinary) => ws.send(isBinary ? data : JSON.stringify({ node: id, echo: data.toString() }), { binary: isBinary }));
    });
  });
  return { server, sockets };
}

/** Starts `count` demo nodes on loopback ports chosen by the OS. */
export async function startDemoCluster(count = 3): Promise<DemoCluster> {
  const nodes: ReturnType<typeof demoNode>[] = [];
  const members: MemberConfig[] = [];
  for (let i = 0; i < count; i++) {
    const id = `demo-${String.fromCharCode(97 + i)}`;
    const node = demoNode(id);
    const server = node.server;
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    nodes.push(node);
    members.push({ id, url: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
  }
  return {
    members,
    close: () =>
      Promise.all(
        nodes.map(
          ({ server, sockets }) =>
            new Promise<void>((resolve) => {
              server.close(() => resolve());
              server.closeAllConnections();
              // Upgraded sockets are no longer the HTTP server's to close.
              for (const ws of sockets.clients) ws.terminate();
            }),
        ),
      ).then(() => undefined),
  };
}
