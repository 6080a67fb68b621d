/**
 * The tunnels' WebSocket client (src/forward/ws-upstream.ts) against raw TCP nodes that write
 * their handshake answers and frames byte by byte where it matters.
 */
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { createServer, type Server, type Socket } from 'node:net';
import { after, describe, it } from 'node:test';
import { performance } from 'node:perf_hooks';
import { WsUpstream, type WsUpstreamHandler } from '../src/forward/ws-upstream.js';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';

/** A frame from the node (unmasked unless `mask` is given). */
function frame(opcode: number, payload: Buffer | string, { fin = true, mask = null as Buffer | null, rsv = 0 } = {}): Buffer {
  const data = typeof payload === 'string' ? Buffer.from(payload) : payload;
  const length = data.length;
  const size = length < 126 ? 2 : length < 0x10000 ? 4 : 10;
  const head = Buffer.alloc(size + (mask ? 4 : 0));
  head[0] = (fin ? 0x80 : 0) | rsv | opcode;
  head[1] = (mask ? 0x80 : 0) | (length < 126 ? length : length < 0x10000 ? 126 : 127);
  if (size === 4) head.writeUInt16BE(length, 2);
  if (size === 10) head.writeBigUInt64BE(BigInt(length), 2);
  if (!mask) return Buffer.concat([head, data]);
  mask.copy(head, size);
  return Buffer.concat([head, Buffer.from(data.map((b, i) => b ^ mask[i & 3]!))]);
}

interface Frame {
  fin: boolean;
  opcode: number;
  masked: boolean;
  payload: Buffer;
}

/** Reads the client's frames off a socket (they must be masked). */
class FrameReader {
  private buf = Buffer.alloc(0);
  readonly frames: Frame[] = [];
  private waiters: (() => void)[] = [];

  push(chunk: Buffer): void {
    this.buf = Buffer.concat([this.buf, chunk]);
    for (;;) {
      if (this.buf.length < 2) break;
      let length = this.buf[1]! & 0x7f;
      let at = 2;
      if (length === 126) {
        if (this.buf.length < 4) break;
        length = this.buf.readUInt16BE(2);
        at = 4;
      } else if (length === 127) {
        if (this.buf.length < 10) break;
        length = Number(this.buf.readBigUInt64BE(2));
        at = 10;
      }
      const masked = (this.buf[1]! & 0x80) !== 0;
      const end = at + (masked ? 4 : 0) + length;
      if (this.buf.length < end) break;
      const mask = masked ? this.buf.subarray(at, at + 4) : null;
      const body = this.buf.subarray(end - length, end);
      const payload = Buffer.from(mask ? body.map((b, i) => b ^ mask[i & 3]!) : body);
      this.frames.push({ fin: (this.buf[0]! & 0x80) !== 0, opcode: this.buf[0]! & 0x0f, masked, payload });
      this.buf = this.buf.subarray(end);
    }
    for (const wake of this.waiters.splice(0)) wake();
  }

  /** Resolves once `count` frames have come. */
  async wait(count: number): Promise<Frame[]> {
    while (this.frames.length < count) await new Promise<void>((resolve) => this.waiters.push(resolve));
    return this.frames;
  }
}

/** What a node does with a handshake: its answer (given the accept value) and what follows. */
type Script = (socket: Socket, accept: string, reader: FrameReader, head: string) => void;

const servers: Server[] = [];
const accepted: Socket[] = [];
const clients: WsUpstream[] = [];
after(() => {
  for (const socket of clients) socket.terminate();
  for (const socket of accepted) socket.destroy();
  for (const server of servers) server.close();
});

/** A raw node on port 0 that reads a handshake head and runs `script` on it. */
async function node(script: Script): Promise<string> {
  const server = createServer((socket) => {
    accepted.push(socket);
    let head = '';
    const reader = new FrameReader();
    let upgraded = false;
    socket.on('error', () => {});
    socket.on('data', (chunk: Buffer) => {
      if (upgraded) {
        reader.push(chunk);
        return;
      }
      head += chunk.toString('latin1');
      const end = head.indexOf('\r\n\r\n');
      if (end < 0) return;
      upgraded = true;
      const key = /\r\nsec-websocket-key: (.+)\r\n/i.exec(head)![1]!;
      const accept = createHash('sha1').update(key + GUID).digest('base64');
      const rest = Buffer.from(head.slice(end + 4), 'latin1');
      if (rest.length > 0) reader.push(rest);
      script(socket, accept, reader, head.slice(0, end + 2));
    });
  });
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const address = server.address() as { port: number };
  return `ws://127.0.0.1:${address.port}`;
}

const ok = (accept: string, extra = ''): string => `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n${extra}\r\n`;

/** Writes bytes one at a time (each its own read at the client, mostly). */
async function trickle(socket: Socket, bytes: Buffer): Promise<void> {
  for (const byte of bytes) {
    socket.write(Buffer.of(byte));
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

/** Events a client saw, and promises for the next of each. */
class Recorder implements WsUpstreamHandler {
  opened: string | null = null;
  refused: { status: number; headers: readonly (readonly [string, string])[]; body: Buffer | null } | null = null;
  failed: string | null = null;
  readonly messages: { data: Buffer; isBinary: boolean }[] = [];
  closed: { code: number; reason: string; violation: boolean } | null = null;
  private waiters: (() => void)[] = [];

  onOpen(protocol: string): void {
    this.opened = protocol;
    this.wake();
  }
  onRefused(status: number, headers: readonly (readonly [string, string])[], body: Buffer | null): void {
    this.refused = { status, headers, body };
    this.wake();
  }
  onFailed(reason: string): void {
    this.failed = reason;
    this.wake();
  }
  onMessage(data: Buffer, isBinary: boolean): void {
    this.messages.push({ data: Buffer.from(data), isBinary });
    this.wake();
  }
  onClose(code: number, reason: Buffer, violation: boolean): void {
    this.closed = { code, reason: reason.toString(), violation };
    this.wake();
  }
  private wake(): void {
    for (const wake of this.waiters.splice(0)) wake();
  }
  async until(done: () => boolean): Promise<void> {
    while (!done()) await new Promise<void>((resolve) => this.waiters.push(resolve));
  }
}

interface ClientOptions {
  headers?: Record<string, string>;
  timeoutMs?: number;
  maxPayload?: number;
  maxRefusalBytes?: number;
  passOver?: (status: number) => boolean;
}

function client(origin: string, options: ClientOptions = {}): { socket: WsUpstream; events: Recorder } {
  const events = new Recorder();
  const socket = new WsUpstream(
    {
      origin,
      path: '/live/../x?q=1',
      headers: options.headers ?? {},
      handshakeTimeoutMs: options.timeoutMs ?? 5_000,
      maxPayload: options.maxPayload ?? 1024 * 1024,
      maxRefusalBytes: options.maxRefusalBytes ?? 64 * 1024,
      ...(options.passOver ? { passOver: options.passOver } : {}),
      // Long: a test that waited for it instead of an event would time out, not pass.
      closeWaitMs: 600_000,
    },
    events,
  );
  clients.push(socket);
  return { socket, events };
}

describe('the tunnels\' WebSocket client: handshake', () => {
  it('sends the path as given, its headers and a key, and opens on a valid 101 split byte by byte, with frames in the same read', async () => {
    let seen = '';
    const origin = await node((socket, accept, _reader, head) => {
      seen = head;
      void trickle(socket, Buffer.from(ok(accept, 'Sec-WebSocket-Protocol: chat.v2\r\n'))).then(() => socket.write(Buffer.concat([frame(1, 'first'), frame(2, Buffer.of(1, 2, 3))])));
    });
    const { socket, events } = client(origin, { headers: { 'sec-websocket-protocol': 'chat.v1, chat.v2', 'x-custom': 'yes' } });
    await events.until(() => events.messages.length === 2);
    assert.equal(events.opened, 'chat.v2');
    assert.match(seen, /^GET \/live\/\.\.\/x\?q=1 HTTP\/1\.1\r\n/);
    assert.match(seen, /\r\nupgrade: websocket\r\n/i);
    assert.match(seen, /\r\nsec-websocket-version: 13\r\n/i);
    assert.match(seen, /\r\nx-custom: yes\r\n/);
    assert.match(seen, /\r\nsec-websocket-protocol: chat\.v1, chat\.v2\r\n/);
    assert.deepEqual(events.messages.map((m) => [m.data.toString('hex'), m.isBinary]), [[Buffer.from('first').toString('hex'), false], ['010203', true]]);
    socket.terminate();
  });

  it('fails a 101 with the wrong accept, an extension, or a subprotocol nobody offered', async () => {
    const cases: [string, (accept: string) => string, RegExp][] = [
      ['wrong accept', () => ok('AAAAAAAAAAAAAAAAAAAAAAAAAAA='), /wrong sec-websocket-accept/],
      ['an extension', (accept) => ok(accept, 'Sec-WebSocket-Extensions: permessage-deflate\r\n'), /extension/],
      ['a subprotocol not offered', (accept) => ok(accept, 'Sec-WebSocket-Protocol: other\r\n'), /subprotocol "other"/],
      ['no upgrade header', (accept) => `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`, /does not upgrade/],
      ['not HTTP', () => 'SSH-2.0-OpenSSH\r\n\r\n', /not HTTP/],
    ];
    for (const [name, answer, reason] of cases) {
      const origin = await node((socket, accept) => socket.write(answer(accept)));
      const { events } = client(origin, { headers: { 'sec-websocket-protocol': 'chat.v1' } });
      await events.until(() => events.failed !== null);
      assert.match(events.failed!, reason, name);
      assert.equal(events.opened, null, name);
    }
  });

  it('fails a handshake answer with a header name that is not a token, or a control byte in a value (a bare LF would split a relayed refusal)', async () => {
    const heads = [
      'HTTP/1.1 403 Forbidden\r\nx-a: one\nset-cookie: planted=1\r\ncontent-length: 0\r\n\r\n',
      'HTTP/1.1 403 Forbidden\r\nx-a : v\r\ncontent-length: 0\r\n\r\n',
      'HTTP/1.1 403 Forbidden\r\nx-a: a\u0000b\r\ncontent-length: 0\r\n\r\n',
      'HTTP/1.1 403 Forbidden\r\n x-a: folded\r\ncontent-length: 0\r\n\r\n',
    ];
    for (const head of heads) {
      const origin = await node((socket) => socket.end(head));
      const { events } = client(origin);
      await events.until(() => events.failed !== null || events.refused !== null);
      assert.equal(events.refused, null, JSON.stringify(head));
      assert.match(events.failed!, /malformed header line/, JSON.stringify(head));
    }
  });

  it('fails a handshake answer whose status is below 100 (relayed, the client got `HTTP/1.1 0 `)', async () => {
    for (const head of ['HTTP/1.1 000 Zero\r\ncontent-length: 0\r\n\r\n', 'HTTP/1.1 099 Low\r\ncontent-length: 0\r\n\r\n']) {
      const origin = await node((socket) => socket.end(head));
      const { events } = client(origin);
      await events.until(() => events.failed !== null || events.refused !== null);
      assert.equal(events.refused, null, JSON.stringify(head));
      assert.match(events.failed!, /status below 100/, JSON.stringify(head));
    }
  });

  it('reads a refusal whole: by content-length, chunked (after a 100), or to the connection\'s end; over the limit the body is null', async () => {
    const answers: [string, (socket: Socket) => void, number, string | null][] = [
      ['content-length', (s) => s.end('HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nX-Why: ticket\r\nContent-Length: 6\r\n\r\nno way'), 403, 'no way'],
      ['chunked after a 100', (s) => void trickle(s, Buffer.from('HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nnot\r\n6\r\n found\r\n0\r\nTrailer: t\r\n\r\n')), 404, 'not found'],
      ['the connection\'s end', (s) => s.end('HTTP/1.1 400 Bad Request\r\n\r\nbad request'), 400, 'bad request'],
      ['over the limit', (s) => s.end(`HTTP/1.1 401 Unauthorized\r\nContent-Length: 100\r\n\r\n${'x'.repeat(100)}`), 401, null],
      ['no body (204)', (s) => s.write('HTTP/1.1 204 No Content\r\n\r\n'), 204, ''],
    ];
    for (const [name, answer, status, body] of answers) {
      const origin = await node((socket) => answer(socket));
      const { events } = client(origin, { maxRefusalBytes: 50 });
      await events.until(() => events.refused !== null || events.failed !== null);
      assert.equal(events.failed, null, name);
      assert.equal(events.refused!.status, status, name);
      assert.equal(events.refused!.body === null ? null : events.refused!.body.toString(), body, name);
      if (name === 'content-length') assert.deepEqual(events.refused!.headers.find(([n]) => n === 'x-why'), ['x-why', 'ticket']);
    }
  });

  it('fails at the status line a status it passes over (its body unread), and a refusal whose connection was reset mid-body', async () => {
    // 4 of 100 bytes of the body, and nothing more: the attempt fails at the head, not at the timeout.
    const busy = await node((socket) => socket.write('HTTP/1.1 503 Service Unavailable\r\nContent-Length: 100\r\n\r\nbusy'));
    const passed = client(busy, { timeoutMs: 600_000, passOver: (status) => status === 503 });
    await passed.events.until(() => passed.events.failed !== null || passed.events.refused !== null);
    assert.equal(passed.events.failed, 'the node answered 503');
    // A body framed by the connection's end, cut by a reset: not a whole answer to relay.
    // The reset follows once the bytes have had time to be read (no event says they were; read
    // or not, the attempt must fail).
    const cut = await node((socket) => {
      socket.write('HTTP/1.1 400 Bad Request\r\n\r\npart of the bo', () => setTimeout(() => socket.resetAndDestroy(), 50));
    });
    const reset = client(cut);
    await reset.events.until(() => reset.events.failed !== null || reset.events.refused !== null);
    assert.equal(reset.events.refused, null);
    assert.equal(reset.events.failed, 'ECONNRESET');
  });

  it('fails a node that does not answer in time, and one that refuses the connection', async () => {
    const silent = await node(() => {});
    const slow = client(silent, { timeoutMs: 100 });
    await slow.events.until(() => slow.events.failed !== null);
    assert.match(slow.events.failed!, /no handshake answer within 100 ms/);
    // A port just closed refuses the connection.
    const gone = createServer();
    gone.listen(0, '127.0.0.1');
    await once(gone, 'listening');
    const port = (gone.address() as { port: number }).port;
    await new Promise<void>((resolve) => gone.close(() => resolve()));
    const refused = client(`ws://127.0.0.1:${port}`);
    await refused.events.until(() => refused.events.failed !== null);
    assert.match(refused.events.failed!, /ECONNREFUSED/);
  });

  it('does not call a node unreachable when the thread was stalled past the connect timeout and the connection came meanwhile', async () => {
    const origin = await node((socket, accept) => socket.write(ok(accept)));
    const c = client(origin, { timeoutMs: 100 });
    // The thread busy past the connect timeout (a long pause, a blocking call): the connection is
    // made meanwhile, and read in the same loop turn the overdue timer fires in.
    const until = performance.now() + 250;
    while (performance.now() < until);
    await c.events.until(() => c.events.opened !== null || c.events.failed !== null);
    // The whole handshake's 100 ms have passed too, so its answer may come too late: that is
    // this attempt's failure, not the node's being unreachable (which would hold it out of every
    // ranking).
    assert.notEqual(c.events.failed, 'LF_ERR_UPSTREAM_CONNECT_TIMEOUT', 'the connection was made');
  });
});

describe('the tunnels\' WebSocket client: frames', () => {
  /** A node that upgrades and hands its socket and reader to `then`. */
  async function open(then: (socket: Socket, reader: FrameReader) => void, options: { maxPayload?: number } = {}): Promise<{ socket: WsUpstream; events: Recorder }> {
    const origin = await node((socket, accept, reader) => {
      socket.write(ok(accept));
      then(socket, reader);
    });
    const c = client(origin, options);
    await c.events.until(() => c.events.opened !== null);
    return c;
  }

  it('puts a fragmented message together across reads, and answers a ping in the middle of it with a pong', async () => {
    let reader: FrameReader | null = null;
    const big = Buffer.alloc(70_000, 7);
    const { socket, events } = await open((s, r) => {
      reader = r;
      const bytes = Buffer.concat([frame(1, 'héllo ', { fin: false }), frame(9, 'are you there'), frame(0, 'wörld', { fin: false }), frame(0, '!'), frame(2, big)]);
      // The first frames a byte at a time, the large one in two writes.
      void trickle(s, bytes.subarray(0, 40)).then(() => {
        s.write(bytes.subarray(40, 30_000));
        setImmediate(() => s.write(bytes.subarray(30_000)));
      });
    });
    await events.until(() => events.messages.length === 2);
    assert.equal(events.messages[0]!.data.toString(), 'héllo wörld!');
    assert.equal(events.messages[0]!.isBinary, false);
    assert.ok(events.messages[1]!.data.equals(big));
    const [pong] = await reader!.wait(1);
    assert.deepEqual([pong!.opcode, pong!.masked, pong!.payload.toString()], [0xa, true, 'are you there']);
    socket.terminate();
  });

  it('lets go of the room a large message needed once it has passed', async () => {
    let node: Socket | null = null;
    const { socket, events } = await open((s) => {
      node = s;
      const big = frame(2, Buffer.alloc(300_000, 1));
      s.write(big.subarray(0, 1000));
      setImmediate(() => s.write(big.subarray(1000)));
    });
    await events.until(() => events.messages.length === 1);
    assert.equal(events.messages[0]!.data.length, 300_000);
    assert.ok(socket.heldBytes <= 64 * 1024, `${socket.heldBytes} bytes held after the message`);
    node!.write(frame(1, 'small'));
    await events.until(() => events.messages.length === 2);
    socket.terminate();
  });

  it('reads the node\'s FIN after its close frame even when a message just before it paused the socket', async () => {
    let nodeSocket: Socket | null = null;
    const { socket } = await open((s) => (nodeSocket = s));
    // As a tunnel does when its client falls behind: a message pauses the node's socket.
    const events = new (class extends Recorder {
      override onMessage(data: Buffer, isBinary: boolean): void {
        super.onMessage(data, isBinary);
        socket.pause();
      }
    })();
    socket.setHandler(events);
    const ended = once(nodeSocket!, 'end');
    nodeSocket!.write(Buffer.concat([frame(1, 'last'), frame(8, Buffer.of(0x03, 0xe8))]));
    await events.until(() => events.closed !== null);
    assert.deepEqual(events.closed, { code: 1000, reason: '', violation: false });
    // Our answering close frame and FIN came; the node ends its side, and that is read at once
    // (not at the close wait, 10 minutes here).
    await ended;
    nodeSocket!.end();
    while (socket.state !== 3) await new Promise<void>((resolve) => setImmediate(resolve));
    assert.equal(events.messages[0]!.data.toString(), 'last');
  });

  it('sends masked frames of every length class, text and binary', async () => {
    let reader: FrameReader | null = null;
    const { socket } = await open((_s, r) => (reader = r));
    const sizes = [0, 5, 125, 126, 65_535, 65_536, 200_000];
    for (const size of sizes) socket.send(Buffer.alloc(size, size % 251), size % 2 === 0);
    socket.send(Buffer.from('täxt'), false);
    const frames = await reader!.wait(sizes.length + 1);
    sizes.forEach((size, i) => {
      assert.equal(frames[i]!.masked, true);
      assert.equal(frames[i]!.fin, true);
      assert.equal(frames[i]!.opcode, size % 2 === 0 ? 2 : 1);
      assert.ok(frames[i]!.payload.equals(Buffer.alloc(size, size % 251)), `size ${size}`);
    });
    assert.equal(frames[sizes.length]!.payload.toString(), 'täxt');
    socket.terminate();
  });

  for (const [name, bytes, code] of [
    ['a masked frame', frame(1, 'hi', { mask: Buffer.of(1, 2, 3, 4) }), 1002],
    ['a reserved bit', frame(1, 'hi', { rsv: 0x40 }), 1002],
    ['an unknown opcode', frame(3, 'hi'), 1002],
    ['a fragmented ping', frame(9, 'hi', { fin: false }), 1002],
    ['a continuation with nothing to continue', frame(0, 'hi'), 1002],
    ['text that is not UTF-8', frame(1, Buffer.of(0xff, 0xfe)), 1007],
    ['a message over the limit', frame(2, Buffer.alloc(2000)), 1009],
    ['a close code that may not be sent', frame(8, Buffer.of(0x03, 0xed)), 1002],
  ] as const) {
    it(`closes with ${code} on ${name}, telling the node, and reads nothing after it`, async () => {
      let reader: FrameReader | null = null;
      const { events } = await open(
        (s, r) => {
          reader = r;
          s.write(Buffer.concat([bytes, frame(1, 'after')]));
        },
        { maxPayload: 1000 },
      );
      await events.until(() => events.closed !== null);
      assert.deepEqual(events.closed, { code, reason: '', violation: true });
      assert.equal(events.messages.length, 0);
      const [close] = await reader!.wait(1);
      assert.equal(close!.opcode, 8);
      assert.equal(close!.payload.readUInt16BE(0), code);
    });
  }

  it('answers the node\'s close with its code, and reports 1005 for a close without one and 1006 for a cut', async () => {
    for (const [payload, code, reason] of [[Buffer.concat([Buffer.of(0x0f, 0xa0), Buffer.from('bye now')]), 4000, 'bye now'], [Buffer.alloc(0), 1005, '']] as const) {
      let reader: FrameReader | null = null;
      const { events } = await open((s, r) => {
        reader = r;
        s.write(frame(8, payload));
      });
      await events.until(() => events.closed !== null);
      assert.deepEqual(events.closed, { code, reason, violation: false });
      const [answer] = await reader!.wait(1);
      assert.equal(answer!.opcode, 8);
      assert.equal(answer!.payload.length === 0 ? 1005 : answer!.payload.readUInt16BE(0), code);
    }
    const { events } = await open((s) => s.destroy());
    await events.until(() => events.closed !== null);
    assert.deepEqual(events.closed, { code: 1006, reason: '', violation: false });
  });

  it('starts a close with a code and reason, and reports the node\'s answer', async () => {
    const { socket, events } = await open((s, reader) => {
      void reader.wait(1).then(([close]) => s.end(frame(8, close!.payload)));
    });
    socket.close(4001, 'moving on');
    await events.until(() => events.closed !== null);
    assert.deepEqual(events.closed, { code: 4001, reason: 'moving on', violation: false });
  });
});
