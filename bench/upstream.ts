/**
 * The bench's upstream nodes: one process, one uWS App per node port, single-threaded, so the
 * upstream costs as little CPU as possible and the proxies are what is measured.
 *
 *   node dist/bench/upstream.js --ports 0,0,0 [--body-bytes 64] [--stall-ms 50 --stall-p 0.02] [--websocket] [--version V]
 *
 * Prints one JSON line `{"ports":[...]}` once every node listens. Every node answers `/health`
 * and any other path (any method) with `bodyBytes` of JSON-ish payload, after reading the body.
 * With --stall-p, each request independently waits --stall-ms first (tail-latency experiments).
 * A request's `?bytes=N` overrides the body size. With --websocket, every node also echoes
 * WebSocket messages. With --version, every answer carries `x-lakefront-version: V`: replicas of
 * a replicated route that are all in step (no read repair), for the quorum bench.
 */
import { parseArgs } from 'node:util';
import { loadUws } from '../src/server/uws.js';

const { values } = parseArgs({
  options: {
    ports: { type: 'string', default: '0,0,0' },
    'body-bytes': { type: 'string', default: '64' },
    'stall-ms': { type: 'string', default: '0' },
    'stall-p': { type: 'string', default: '0' },
    seed: { type: 'string', default: '1' },
    websocket: { type: 'boolean', default: false },
    version: { type: 'string' },
  },
});
const uws = loadUws();
const bodyBytes = Number(values['body-bytes']);
const stallMs = Number(values['stall-ms']);
const stallP = Number(values['stall-p']);
const version = values.version ?? null;

// A small deterministic PRNG (mulberry32) so stall patterns repeat run to run.
let state = Number(values.seed) >>> 0;
function random(): number {
  state = (state + 0x6d2b79f5) >>> 0;
  let t = state;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}

const bodies = new Map<number, Buffer>();
function bodyOf(size: number): Buffer {
  let body = bodies.get(size);
  if (!body) {
    body = Buffer.alloc(size, 'x');
    if (size >= 2) {
      body[0] = 0x22;
      body[size - 1] = 0x22;
    }
    bodies.set(size, body);
  }
  return body;
}

/** Requests received by every node of this process (health checks and counts excluded). */
let received = 0;

const ports: number[] = [];
const wanted = values.ports!.split(',').map(Number);
let pending = wanted.length;
wanted.forEach((port, index) => {
  const app = uws.App();
  const id = `node-${index}`;
  app.get('/health', (res) => {
    res.end('{"ok":true}');
  });
  // What the nodes received, for benches that count upstream requests (the hedging bench).
  app.get('/__received', (res) => {
    res.end(JSON.stringify({ received }));
  });
  // WebSocket echo (the WebSocket bench), only when asked: uWS checks every GET for a handshake.
  if (values.websocket) {
    app.ws('/*', {
      maxPayloadLength: 1024 * 1024,
      message: (ws, message, isBinary) => {
        ws.send(message, isBinary);
      },
    });
  }
  app.any('/*', (res, req) => {
    received++;
    const bytesParam = req.getQuery('bytes');
    const size = bytesParam ? Number(bytesParam) : bodyBytes;
    let aborted = false;
    res.onAborted(() => {
      aborted = true;
    });
    const reply = (): void => {
      if (aborted) return;
      res.cork(() => {
        res.writeStatus('200 OK').writeHeader('content-type', 'application/json').writeHeader('x-node', id);
        if (version !== null) res.writeHeader('x-lakefront-version', version);
        res.end(bodyOf(size));
      });
    };
    res.onData((_chunk, isLast) => {
      if (!isLast) return;
      if (stallP > 0 && random() < stallP) setTimeout(reply, stallMs);
      else reply();
    });
  });
  app.listen('127.0.0.1', port, (socket) => {
    if (!socket) {
      process.stderr.write(`upstream: could not listen on ${port}\n`);
      process.exit(1);
    }
    ports[index] = uws.us_socket_local_port(socket);
    if (--pending === 0) process.stdout.write(`${JSON.stringify({ ports })}\n`);
  });
});
