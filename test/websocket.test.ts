/**
 * WebSocket tunnels end to end: a real `ws` client, the front door's worker threads, and real
 * `ws` servers as nodes.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import type { IncomingHttpHeaders } from 'node:http';
import { after, afterEach, before, describe, it } from 'node:test';
import { performance } from 'node:perf_hooks';
import { spawn } from 'node:child_process';
import { connect as tcpConnect, type Socket } from 'node:net';
import WebSocket from 'ws';
import { parseCommand } from '../src/config/config.js';
import { FrontDoor, type FrontDoorConfig } from '../src/server/supervisor.js';
import { TicketBook } from '../src/affinity/tickets.js';
import { defaultSettings } from '../src/server/settings.js';
import { call, ranking, rawExchange } from './fixtures/http.js';
import { WsNode } from './fixtures/ws-node.js';

function connect(url: string, board: string | null, protocols: string[] = [], headers: Record<string, string> = {}): WebSocket {
  return new WebSocket(url.replace('http:', 'ws:') + '/rpc/live', protocols, {
    headers: { ...(board === null ? {} : { 'x-lakefront-board': board }), ...headers },
    perMessageDeflate: false,
  });
}

async function opened(ws: WebSocket): Promise<void> {
  await once(ws, 'open');
}

/** The next message: its text (or bytes) and whether it was binary. */
async function nextMessage(ws: WebSocket): Promise<{ data: Buffer; isBinary: boolean }> {
  const [data, isBinary] = (await once(ws, 'message')) as [Buffer, boolean];
  return { data, isBinary };
}

/** The next close a node sees (code and reason). */
async function nodeClose(node: WsNode): Promise<{ code: number; reason: string }> {
  const [close] = (await once(node, 'closed')) as [{ code: number; reason: string }];
  return close;
}

async function closed(ws: WebSocket): Promise<{ code: number; reason: string }> {
  const [code, reason] = (await once(ws, 'close')) as [number, Buffer];
  return { code, reason: reason.toString() };
}

/** The node's last socket stops reading; the client sends `count` messages of `size`: the close code it gets. */
async function floodStalledNode(node: WsNode, ws: WebSocket, count: number, size: number): Promise<number> {
  (node.sockets.at(-1) as unknown as { _socket: Socket })._socket.pause();
  const closing = closed(ws);
  for (let i = 0; i < count; i++) ws.send(Buffer.alloc(size, 4), { binary: true });
  return (await closing).code;
}

/** The plain HTTP answer a handshake got instead of a 101. */
async function refusal(ws: WebSocket): Promise<{ status: number; headers: IncomingHttpHeaders; body: string }> {
  // An accepted handshake fails the test at once, rather than waiting out its timeout.
  const accepted = new Promise<never>((_resolve, reject) =>
    ws.once('open', () => {
      ws.terminate();
      reject(new Error('the handshake was accepted, not refused'));
    }),
  );
  const [, response] = (await Promise.race([once(ws, 'unexpected-response'), accepted])) as [unknown, import('node:http').IncomingMessage];
  let body = '';
  for await (const chunk of response) body += chunk;
  ws.on('error', () => undefined); // terminating a handshake that never opened reports an error
  ws.terminate();
  return { status: response.statusCode!, headers: response.headers, body };
}

/** A masked client frame (FIN set, `b0` its first byte) of a short payload. */
function maskedFrame(b0: number, payload: Buffer): Buffer {
  const key = [1, 2, 3, 4];
  return Buffer.concat([Buffer.from([b0, 0x80 | payload.length, ...key]), Buffer.from(payload.map((b, i) => b ^ key[i & 3]!))]);
}

/** A raw client's tunnel on `board`, its handshake done: the socket, and what came after the 101. */
async function rawTunnel(url: string, board: string): Promise<{ socket: Socket; received: () => Buffer }> {
  const socket = tcpConnect(Number(new URL(url).port), '127.0.0.1');
  socket.on('error', () => undefined);
  let buf = Buffer.alloc(0);
  socket.on('data', (d: Buffer) => (buf = Buffer.concat([buf, d])));
  socket.write(`GET /rpc/live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nx-lakefront-board: ${board}\r\n\r\n`);
  while (buf.indexOf('\r\n\r\n') < 0) await once(socket, 'data');
  assert.match(buf.toString('latin1'), /^HTTP\/1\.1 101 /);
  buf = buf.subarray(buf.indexOf('\r\n\r\n') + 4);
  return { socket, received: () => buf };
}

async function frontOver(nodes: WsNode[], flags: string[] = []): Promise<FrontDoor> {
  const command = parseCommand(
    // Health probes a minute apart, unless the test sets them.
    ['--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(','), '--port', '0', '--host', '127.0.0.1', '--threads', '2', ...(flags.includes('--health-interval-ms') ? [] : ['--health-interval-ms', '60000']), ...flags],
    {},
  );
  return FrontDoor.start((command as { config: FrontDoorConfig }).config);
}

describe('WebSocket tunnels', () => {
  let nodes: WsNode[];
  let door: FrontDoor;
  const clients: WebSocket[] = [];
  const track = (ws: WebSocket): WebSocket => {
    clients.push(ws);
    return ws;
  };
  before(async () => {
    nodes = await Promise.all(['ws-a', 'ws-b', 'ws-c'].map((id) => new WsNode(id).start()));
    door = await frontOver(nodes);
  });
  afterEach(() => {
    for (const ws of clients.splice(0)) ws.terminate();
    for (const n of nodes) {
      n.refuseWith = 0;
      n.refusalPadding = 0;
      n.upgradeHeaders = [];
      n.pick = (offered) => (offered.has('chat.v2') ? 'chat.v2' : false);
    }
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  const byId = (id: string): WsNode => nodes.find((n) => n.id === id)!;

  it('places the socket on the board\'s first node and relays text and binary both ways, in order', async () => {
    const [home] = await ranking(door.url, 'ws-board-1');
    const before = byId(home!).handshakes.length;
    const ws = track(connect(door.url, 'ws-board-1', [], { authorization: 'Bearer t0ken', constructor: 'c' }));
    await opened(ws);
    assert.equal(byId(home!).handshakes.length, before + 1, 'the board\'s node took it');
    const headers = byId(home!).handshakes.at(-1)!;
    assert.equal(headers['x-lakefront-board'], 'ws-board-1');
    assert.equal(headers.authorization, 'Bearer t0ken', 'forwarded as it is');
    assert.equal(headers.constructor, 'c', 'a header named like an object property is just a header');
    assert.equal(headers['sec-websocket-extensions'], undefined, 'no compression offered upstream');
    const got: string[] = [];
    const all = new Promise<void>((resolve) => {
      ws.on('message', (data: Buffer, isBinary) => {
        got.push(isBinary ? `bin:${data.toString('hex')}` : data.toString());
        if (got.length === 4) resolve();
      });
    });
    ws.send('one');
    ws.send(Buffer.from([0, 1, 2, 255]), { binary: true });
    ws.send('x'.repeat(100_000));
    ws.send('ünïcödé');
    await all;
    assert.deepEqual(got, [`${home}:one`, 'bin:000102ff', `${home}:${'x'.repeat(100_000)}`, `${home}:ünïcödé`]);
  });

  it('counts the tunnels open in /stats', async () => {
    const websockets = async (): Promise<number> => (await call(`${door.url}/stats`)).json<{ websockets: number }>().websockets;
    // The tunnels of tests before (their clients cut in afterEach) end at the front door by the
    // time their nodes see them close: the count starts from there, not while one still ends.
    await Promise.all(nodes.flatMap((n) => n.sockets.filter((s) => s.readyState !== WebSocket.CLOSED).map((s) => once(s, 'close'))));
    const base = await websockets();
    const a = track(connect(door.url, 'ws-count-1'));
    const b = track(connect(door.url, 'ws-count-2'));
    await Promise.all([opened(a), opened(b)]);
    assert.equal(await websockets(), base + 2);
    a.close(1000);
    await closed(a);
    assert.equal(await websockets(), base + 1);
    b.close(1000);
    await closed(b);
    assert.equal(await websockets(), base);
  });

  it('answers with the subprotocol the node chose', async () => {
    const ws = track(connect(door.url, 'ws-board-2', ['chat.v1', 'chat.v2']));
    await opened(ws);
    assert.equal(ws.protocol, 'chat.v2');
    const [home] = await ranking(door.url, 'ws-board-2');
    assert.equal(byId(home!).handshakes.at(-1)!['sec-websocket-protocol'], 'chat.v1,chat.v2', 'the offer reached the node, as the client wrote it');
    // An offer over two header lines is one list (RFC 6455 11.3.4): the node sees all of it.
    const split = await rawExchange(
      door.url,
      'GET /rpc/live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nsec-websocket-protocol: chat.v1\r\nsec-websocket-protocol: chat.v2\r\nx-lakefront-board: ws-board-2\r\n\r\n',
      { done: (text) => text.includes('\r\n\r\n') },
    );
    assert.match(split, /^HTTP\/1\.1 101 /);
    assert.match(split, /\r\nsec-websocket-protocol: chat\.v2\r\n/i);
    assert.equal(byId(home!).handshakes.at(-1)!['sec-websocket-protocol'], 'chat.v1, chat.v2');
    // The node picks none of the offer: the client is upgraded without one (as RFC 6455 allows;
    // the ws client would refuse that, so this handshake is raw).
    const head = await rawExchange(
      door.url,
      'GET /rpc/live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nsec-websocket-protocol: chat.v1\r\nx-lakefront-board: ws-board-2\r\ncookie: a=1\r\ncookie: b=2\r\n\r\n',
      { done: (text) => text.includes('\r\n\r\n') },
    );
    assert.match(head, /^HTTP\/1\.1 101 /);
    assert.match(head, /sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK\+xOo=/i);
    assert.doesNotMatch(head, /sec-websocket-protocol/i);
    assert.equal(byId(home!).handshakes.at(-1)!.cookie, 'a=1; b=2', 'two cookie lines make one cookie list');
    // A node that picks a subprotocol nobody offered is passed over; when every node does, 502.
    for (const n of nodes) n.pick = () => 'rogue';
    const rogue = await refusal(track(connect(door.url, 'ws-board-2', ['chat.v1'])));
    assert.equal(rogue.status, 502);
    assert.equal(JSON.parse(rogue.body).code, 'LF_ERR_ALL_CANDIDATES_FAILED');
  });

  it("relays the node's own header lines on the 101 (a cookie set at the upgrade), not hop-by-hop or handshake ones", async () => {
    for (const n of nodes) n.upgradeHeaders = ['Set-Cookie: a=1', 'Set-Cookie: b=2', 'X-Node-Custom: hello', 'X-Name: café', 'Keep-Alive: timeout=5', 'Connection: x-hop', 'X-Hop: 1', 'Sec-WebSocket-Extensions-Note: x'];
    const ws = track(connect(door.url, 'ws-board-101', ['chat.v2']));
    // 'open' follows 'upgrade' in the same tick: both awaited from the start.
    const upgraded = once(ws, 'upgrade') as Promise<[import('node:http').IncomingMessage]>;
    await opened(ws);
    const [response] = await upgraded;
    const h = response.headers;
    assert.deepEqual(h['set-cookie'], ['a=1', 'b=2']);
    assert.equal(h['x-node-custom'], 'hello');
    assert.equal(h['x-name'], Buffer.from('café').toString('latin1'), 'the bytes the node sent (UTF-8), not encoded again');
    assert.equal(h['keep-alive'], undefined, 'hop-by-hop');
    assert.equal(h['x-hop'], undefined, "named by the node's connection field: its hop's");
    assert.equal(h['sec-websocket-extensions-note'], undefined, 'the handshake is uWS\'s to write');
    assert.equal(h['sec-websocket-protocol'], 'chat.v2');
    assert.equal(ws.protocol, 'chat.v2');
    ws.send('after');
    assert.equal((await nextMessage(ws)).data.toString().endsWith(':after'), true, 'and the socket works');
  });

  it('carries close codes and reasons both ways', async () => {
    const [home] = await ranking(door.url, 'ws-board-3');
    const node = byId(home!);
    const fromClient = track(connect(door.url, 'ws-board-3'));
    await opened(fromClient);
    const atNode = nodeClose(node);
    fromClient.close(4001, 'client done');
    assert.deepEqual(await closed(fromClient), { code: 4001, reason: 'client done' });
    assert.deepEqual(await atNode, { code: 4001, reason: 'client done' });

    const fromNode = track(connect(door.url, 'ws-board-3'));
    await opened(fromNode);
    fromNode.send('hello');
    await nextMessage(fromNode);
    node.sockets.at(-1)!.close(4002, 'node done');
    assert.deepEqual(await closed(fromNode), { code: 4002, reason: 'node done' });
  });

  it('refuses a handshake with two host lines or two board headers (400), as a plain request', async () => {
    const counts = nodes.map((n) => n.handshakes.length);
    for (const [extra, name] of [['host: y\r\n', 'host'], ['x-lakefront-board: ws-two-b\r\n', 'x-lakefront-board']] as const) {
      const answer = await rawExchange(door.url, `GET /rpc/live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nx-lakefront-board: ws-two-a\r\n${extra}\r\n`, { done: (t) => t.startsWith('HTTP/1.1 101') || t.includes('}') });
      assert.match(answer, /^HTTP\/1\.1 400 /, extra);
      assert.match(answer, new RegExp(`more than one ${name} header`));
    }
    assert.deepEqual(nodes.map((n) => n.handshakes.length), counts, 'no node saw either');
  });

  it('drops the headers a connection field names, from the handshake and from a relayed refusal (RFC 9110 7.6.1)', async () => {
    const [home] = await ranking(door.url, 'ws-board-hop');
    const handshake = (extra: string) =>
      `GET /rpc/live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade, X-Hop\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nx-lakefront-board: ws-board-hop\r\nx-hop: for-the-first-hop\r\nx-kept: 1\r\n${extra}\r\n`;
    const opened = await rawExchange(door.url, handshake(''), { done: (t) => t.includes('\r\n\r\n') });
    assert.match(opened, /^HTTP\/1\.1 101 /);
    const seen = byId(home!).handshakes.at(-1)!;
    assert.equal(seen['x-kept'], '1');
    assert.equal(seen['x-hop'], undefined, 'a header the client\'s connection field named');
    byId(home!).refuseWith = 403;
    byId(home!).refusalHeaders = 'connection: X-Node-Hop\r\nx-node-hop: internal\r\nx-other: ok\r\n';
    try {
      const refused = await rawExchange(door.url, handshake('connection: close\r\n'));
      assert.match(refused, /^HTTP\/1\.1 403 /);
      assert.match(refused, /\r\nx-other: ok\r\n/i);
      assert.doesNotMatch(refused, /x-node-hop/i, 'a header the node\'s connection field named');
    } finally {
      byId(home!).refusalHeaders = '';
    }
  });

  it('passes over a node that refuses the connection or answers 503, and relays any other refusal', async () => {
    const [first, second, third] = await ranking(door.url, 'ws-board-4');
    byId(first!).refuseWith = 503;
    const counts = nodes.map((n) => n.handshakes.length);
    const ws = track(connect(door.url, 'ws-board-4'));
    await opened(ws);
    ws.send('which');
    assert.equal((await nextMessage(ws)).data.toString(), `${second}:which`, 'the second node, after the 503');
    assert.deepEqual(nodes.map((n, i) => n.handshakes.length - counts[i]!), nodes.map((n) => (n.id === third ? 0 : 1)));

    byId(first!).refuseWith = 0;
    byId(second!).refuseWith = 0;
    const refused = track(connect(door.url, 'ws-board-4'));
    byId(first!).refuseWith = 403;
    const answer = await refusal(refused);
    assert.equal(answer.status, 403);
    assert.equal(JSON.parse(answer.body).refused, first);
    assert.equal(answer.headers['x-node'], first);
    assert.equal(answer.headers['x-lakefront-served-by'], first);

    // Every node unable to serve: 502, the front door's own answer.
    for (const n of nodes) n.refuseWith = 503;
    const none = await refusal(track(connect(door.url, 'ws-board-4')));
    assert.equal(none.status, 502);
    assert.equal(JSON.parse(none.body).code, 'LF_ERR_ALL_CANDIDATES_FAILED');
    // Every node shedding load (503 with a Retry-After): 503 with the soonest, not a 502.
    nodes.forEach((n, i) => (n.refusalHeaders = `retry-after: ${9 - i}\r\n`));
    const shed = await refusal(track(connect(door.url, 'ws-board-4')));
    for (const n of nodes) n.refusalHeaders = '';
    assert.equal(shed.status, 503);
    assert.equal(shed.headers['retry-after'], String(9 - (nodes.length - 1)));
    assert.equal(JSON.parse(shed.body).code, 'LF_ERR_NODES_SHEDDING');
    // A refusal too large to relay whole is not cut short silently.
    for (const n of nodes) n.refuseWith = 0;
    byId(first!).refuseWith = 403;
    byId(first!).refusalPadding = 100_000;
    const large = await refusal(track(connect(door.url, 'ws-board-4')));
    assert.equal(large.status, 502);
    assert.match(JSON.parse(large.body).error, /too large to relay/);
  });

  it('stops reading the node while the client is behind, and loses nothing (96 MiB to a paused client: more than its socket buffers hold)', async () => {
    const [home] = await ranking(door.url, 'ws-board-6');
    const ws = track(connect(door.url, 'ws-board-6'));
    await opened(ws);
    const count = 384;
    const got: number[] = [];
    let closedWith = 0;
    ws.on('close', (code) => (closedWith = code));
    const all = new Promise<void>((resolve) => {
      ws.on('message', (data: Buffer) => {
        got.push(data.readUInt32BE(0));
        if (got.length === count) resolve();
      });
    });
    ws.pause();
    const node = byId(home!);
    node.flushed = 0;
    ws.send(`flood:${count}:${256 * 1024}`);
    await once(node, 'flushed');
    // Nothing marks the moment the front door stops reading the node, so it gets a second. Were
    // it to read on, the node would flush all 96 MiB in far less (loopback), and the front door
    // would hold past its 16 MiB backlog limit and close the socket (1013).
    await new Promise((r) => setTimeout(r, 1_000));
    assert.ok(node.flushed < count, `the node flushed ${node.flushed} of ${count} messages to a paused client: the front door did not stop reading`);
    ws.resume();
    await all;
    assert.deepEqual(got, Array.from({ length: count }, (_, i) => i), 'every message, in order');
    assert.equal(closedWith, 0, 'not closed for its backlog');
  });

  it('ends a tunnel whose message is larger than --max-body-bytes: cut from the client, 1009 from the node (named so to the client); a client text that is not UTF-8: 1007 to the node', async () => {
    const [home] = await ranking(door.url, 'ws-board-7');
    const node = byId(home!);
    const fromClient = track(connect(door.url, 'ws-board-7'));
    await opened(fromClient);
    const atNode = nodeClose(node);
    fromClient.send(Buffer.alloc(1024 * 1024 + 1), { binary: true });
    // uWS closes such a client's connection without a close frame; the node is told why.
    assert.equal((await closed(fromClient)).code, 1006);
    assert.deepEqual(await atNode, { code: 1009, reason: 'the client sent a message over the limit' });
    const notUtf8 = track(connect(door.url, 'ws-board-7'));
    await opened(notUtf8);
    const atNode2 = nodeClose(node);
    notUtf8.send(Buffer.from([0x61, 0xff, 0xfe]), { binary: false });
    assert.equal((await closed(notUtf8)).code, 1006);
    assert.deepEqual(await atNode2, { code: 1007, reason: 'the client sent a text message that is not UTF-8' });
    const fromNode = track(connect(door.url, 'ws-board-7'));
    await opened(fromNode);
    fromNode.send(`flood:1:${1024 * 1024 + 1}`);
    // Named as the client's is: a size limit, not a protocol breach.
    assert.deepEqual(await closed(fromNode), { code: 1009, reason: 'the node sent a message over the limit' });
  });

  it('relays a burst of small messages sent at once (many to a read, written to the node together) in order both ways, and a close right after a burst reaches the node after it', async () => {
    const [home] = await ranking(door.url, 'ws-board-burst');
    const node = byId(home!);
    const ws = track(connect(door.url, 'ws-board-burst'));
    await opened(ws);
    const nodeSide = node.sockets.at(-1)!;
    const atNode: number[] = [];
    nodeSide.on('message', (data: Buffer) => atNode.push(data.readUInt32BE(0)));
    const count = 5_000;
    // Written in one go: uWS reads them many at a time, and the front door batches them.
    const burst = (from: number): void => {
      for (let i = from; i < from + count; i++) {
        const message = Buffer.alloc(4 + (i % 40));
        message.writeUInt32BE(i, 0);
        ws.send(message, { binary: true });
      }
    };
    const echoes: number[] = [];
    const allEchoed = new Promise<void>((resolve) =>
      ws.on('message', (data: Buffer) => {
        echoes.push(data.readUInt32BE(0));
        if (echoes.length === count) resolve();
      }),
    );
    burst(0);
    await allEchoed;
    assert.deepEqual(echoes, Array.from({ length: count }, (_, i) => i));
    // A second burst and the close at once: every message reaches the node before the close.
    const nodeClosed = nodeClose(node);
    burst(count);
    ws.close(4000, 'after the burst');
    assert.deepEqual(await nodeClosed, { code: 4000, reason: 'after the burst' });
    assert.deepEqual(atNode, Array.from({ length: 2 * count }, (_, i) => i));
  });

  it('relays the messages a client sent in the read that ends with a frame uWS cuts it for (RSV1 set), then cuts the node', async () => {
    const [home] = await ranking(door.url, 'ws-board-cut');
    const node = byId(home!);
    const client = await rawTunnel(door.url, 'ws-board-cut');
    try {
      const atNode: string[] = [];
      node.sockets.at(-1)!.on('message', (data: Buffer) => atNode.push(data.toString()));
      const nodeClosed = nodeClose(node);
      // One write: uWS hands over the five messages (batched for the node), then cuts the client.
      client.socket.write(Buffer.concat([...[1, 2, 3, 4, 5].map((i) => maskedFrame(0x81, Buffer.from(`m${i}`))), maskedFrame(0x81 | 0x40, Buffer.from('rsv1'))]));
      assert.equal((await nodeClosed).code, 1006);
      assert.deepEqual(atNode, ['m1', 'm2', 'm3', 'm4', 'm5']);
    } finally {
      client.socket.destroy();
    }
  });

  it("ends the client's connection (close frame, then FIN) when the node's message and close frame come in one read", async () => {
    const [home] = await ranking(door.url, 'ws-board-fin');
    const node = byId(home!);
    const client = await rawTunnel(door.url, 'ws-board-fin');
    try {
      const ended = once(client.socket, 'end');
      // The node's own socket: a text frame and a close frame (4001) in one write.
      const raw = (node.sockets.at(-1) as unknown as { _socket: Socket })._socket;
      raw.write(Buffer.from([0x81, 2, 0x68, 0x69, 0x88, 2, 0x0f, 0xa1]));
      // The client never answers the close: the front door's FIN must come on its own (not at
      // uWS's idle timeout, 10 s or more later).
      const outcome = await Promise.race([ended.then(() => 'FIN'), new Promise((resolve) => setTimeout(resolve, 5_000, 'no FIN within 5 s'))]);
      assert.equal(outcome, 'FIN');
      const bytes = client.received();
      assert.deepEqual([...bytes.subarray(0, 4)], [0x81, 2, 0x68, 0x69], 'the message first');
      assert.deepEqual([...bytes.subarray(4, 8)], [0x88, 2, 0x0f, 0xa1], 'then the close, with its code');
    } finally {
      client.socket.destroy();
    }
  });

  it('passes a client message larger than the 16 MiB backlog limit when nothing waits before it, and closes (1013) a tunnel whose node stopped reading', async () => {
    const big = await frontOver(nodes, ['--max-body-bytes', String(32 * 1024 * 1024)]);
    try {
      const [home] = await ranking(big.url, 'ws-board-big');
      const node = byId(home!);
      const ws = track(connect(big.url, 'ws-board-big'));
      await opened(ws);
      const message = Buffer.alloc(20 * 1024 * 1024, 3);
      ws.send(message, { binary: true });
      const echo = await Promise.race([nextMessage(ws), closed(ws)]);
      assert.ok('data' in echo, `closed (${JSON.stringify(echo)}), not echoed`);
      assert.equal(echo.data.length, message.length, 'through to the node and back, not closed for its own size');
      // The node stops reading: what the client sends piles up at the front door, up to the limit.
      assert.equal(await floodStalledNode(node, ws, 64, 1024 * 1024), 1013);
    } finally {
      await big.stop();
    }
  });

  it('closes (1013) a tunnel whose node stopped reading once --ws-backlog-bytes waits (256 KiB here), and still relays while it reads', async () => {
    const small = await frontOver(nodes, ['--ws-backlog-bytes', String(256 * 1024)]);
    try {
      const [home] = await ranking(small.url, 'ws-board-small');
      const node = byId(home!);
      const ws = track(connect(small.url, 'ws-board-small'));
      await opened(ws);
      // Messages larger than a quarter of the limit still pass while the node reads.
      const message = Buffer.alloc(128 * 1024, 5);
      for (let i = 0; i < 8; i++) {
        ws.send(message, { binary: true });
        assert.equal((await nextMessage(ws)).data.length, message.length);
      }
      // Past what the sockets' kernel buffers take (a few MiB on loopback), the limit is reached.
      assert.equal(await floodStalledNode(node, ws, 256, 64 * 1024), 1013);
    } finally {
      await small.stop();
    }
  });

  it('closes a client that is behind past --ws-backlog-bytes with 1013 after what waits for it, whole frames only', async () => {
    // Messages may be larger than the backlog limit (1 MiB here): one such waits, and the message
    // read with its end finds the limit passed.
    const small = await frontOver(nodes, ['--ws-backlog-bytes', String(1024 * 1024), '--max-body-bytes', String(16 * 1024 * 1024)]);
    try {
      const [home] = await ranking(small.url, 'ws-board-behind');
      const node = byId(home!);
      const client = await rawTunnel(small.url, 'ws-board-behind');
      try {
        client.socket.pause();
        const nodeClosed = nodeClose(node);
        // One write of the node's: a 16 MiB binary message, then a short text one.
        const big = Buffer.alloc(10 + 16 * 1024 * 1024, 1);
        big[0] = 0x82;
        big[1] = 127;
        big.writeBigUInt64BE(BigInt(16 * 1024 * 1024), 2);
        (node.sockets.at(-1) as unknown as { _socket: Socket })._socket.write(Buffer.concat([big, Buffer.from([0x81, 4]), Buffer.from('tiny')]));
        assert.equal((await nodeClosed).code, 1013);
        const ended = once(client.socket, 'end');
        client.socket.resume();
        const outcome = await Promise.race([ended.then(() => 'FIN'), new Promise((resolve) => setTimeout(resolve, 10_000, 'no FIN within 10 s'))]);
        assert.equal(outcome, 'FIN');
        // Every frame whole, the last one the close (1013).
        let bytes = client.received();
        let last = -1;
        let code = 0;
        while (bytes.length > 0) {
          assert.ok(bytes.length >= 2, 'a frame cut short');
          let length = bytes[1]! & 0x7f;
          let head = 2;
          if (length === 126) (length = bytes.readUInt16BE(2)), (head = 4);
          else if (length === 127) (length = Number(bytes.readBigUInt64BE(2))), (head = 10);
          assert.ok(bytes.length >= head + length, `a frame cut short: ${bytes.length - head} of its ${length} bytes came`);
          last = bytes[0]! & 0x0f;
          if (last === 0x8) code = bytes.readUInt16BE(head);
          bytes = bytes.subarray(head + length);
        }
        assert.equal(last, 0x8, 'the close frame last');
        assert.equal(code, 1013);
      } finally {
        client.socket.destroy();
      }
    } finally {
      await small.stop();
    }
  });

  it('refuses a handshake without its key (401), and one uWS cannot take (400)', async () => {
    const answer = await refusal(track(connect(door.url, null)));
    assert.equal(answer.status, 401);
    assert.equal(JSON.parse(answer.body).code, 'LF_ERR_MISSING_BOARD');
    const raw = await rawExchange(door.url, 'GET /rpc/live HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\nx-lakefront-board: b\r\n\r\n');
    assert.match(raw, /^HTTP\/1\.1 400 /);
    assert.match(raw, /bad WebSocket handshake/);
    const longKey = await refusal(track(connect(door.url, 'k'.repeat(1025))));
    assert.equal(longKey.status, 400);
    // The upstream client would resolve dot segments: the node would get another path. (Raw:
    // the ws client resolves them itself.)
    const counts = nodes.map((n) => n.handshakes.length);
    for (const path of ['/rpc/%2e%2e/admin', '/rpc/a/../b', '/rpc/./x', '/rpc/x/%2E', '/rpc/x/..#y']) {
      const dotted = await rawExchange(
        door.url,
        `GET ${path} HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nx-lakefront-board: b\r\n\r\n`,
        { done: (text) => text.endsWith('}') },
      );
      assert.match(dotted, /^HTTP\/1\.1 400 /, path);
      assert.match(dotted, /dot segment/);
    }
    // Nor a path with an encoded NUL, where a node may end it.
    const nul = await rawExchange(
      door.url,
      'GET /rpc/a%00b HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\nx-lakefront-board: b\r\n\r\n',
      { done: (text) => text.endsWith('}') },
    );
    assert.match(nul, /^HTTP\/1\.1 400 /);
    assert.match(nul, /encoded NUL/);
    assert.deepEqual(nodes.map((n) => n.handshakes.length), counts, 'no node saw them');
  });

  it('reads the node\'s answering close even while the client was behind (no 30 s close wait)', async () => {
    const [home] = await ranking(door.url, 'ws-board-8');
    const node = byId(home!);
    const ws = track(connect(door.url, 'ws-board-8'));
    await opened(ws);
    ws.pause();
    ws.send(`flood:384:${256 * 1024}`);
    await once(node, 'flushed');
    const atNode = nodeClose(node);
    ws.close(4003, 'leaving while behind');
    // Before the fix this took ws's 30 s close timeout; the test's own limit is 120 s.
    const started = performance.now();
    assert.equal((await atNode).code, 4003);
    assert.ok(performance.now() - started < 20_000, 'the node heard the close promptly');
  });
});

describe('WebSocket tunnels: --forwarded-for', () => {
  it('append: the node\'s handshake carries the client\'s address after its own list, the scheme and the host', async () => {
    const nodes = [await new WsNode('ws-fwd').start()];
    const door = await frontOver(nodes, ['--forwarded-for', 'append']);
    try {
      const ws = connect(door.url, 'fwd-board', [], { 'x-forwarded-for': '198.51.100.1', 'x-forwarded-proto': 'https', 'x-forwarded-host': 'claimed.example' });
      await opened(ws);
      const handshake = nodes[0]!.handshakes.at(-1)!;
      assert.equal(handshake['x-forwarded-for'], '198.51.100.1, 127.0.0.1');
      assert.equal(handshake['x-forwarded-proto'], 'http');
      assert.equal(handshake['x-forwarded-host'], new URL(door.url).host);
      ws.close(1000);
      await closed(ws);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
});

describe('WebSocket tunnels: failover and shutdown', () => {
  it('answers a handshake still waiting for its node with 503 when the front door stops', async () => {
    const nodes = await Promise.all(['ws-p', 'ws-q'].map((id) => new WsNode(id).start()));
    let release!: () => void;
    const hold = new Promise<void>((resolve) => (release = resolve));
    for (const n of nodes) n.hold = hold;
    const door = await frontOver(nodes);
    try {
      const [home] = await ranking(door.url, 'ws-board-9');
      const waiting = connect(door.url, 'ws-board-9');
      await once(nodes.find((n) => n.id === home)!, 'handshake');
      const answer = refusal(waiting);
      await door.stop();
      const { status, body } = await answer;
      assert.equal(status, 503);
      assert.equal(JSON.parse(body).code, 'LF_ERR_SHUTTING_DOWN');
    } finally {
      release();
      await door.stop().catch(() => undefined);
      await Promise.all(nodes.map((n) => n.stop().catch(() => undefined)));
    }
  });

  it('takes a node it cannot connect to within the connect timeout out of every ranking, as a request does', async () => {
    // A node whose connections cannot be made: a process stopped with its accept queue full
    // (backlog 1, two connections waiting), so the kernel drops further SYNs. It answered the
    // front door's first health probe before it stopped; the next is a minute away.
    const stuck = spawn(process.execPath, ['-e', "const s=require('http').createServer((q,r)=>r.end('ok'));s.listen({port:0,host:'127.0.0.1',backlog:1},()=>console.log(s.address().port))"], { stdio: ['ignore', 'pipe', 'inherit'] });
    const fillers: Socket[] = [];
    const live = await new WsNode('ws-live').start();
    let door: FrontDoor | null = null;
    try {
      const port = Number(String((await once(stuck.stdout!, 'data'))[0]).trim());
      door = await frontOver([{ id: 'ws-stuck', url: `http://127.0.0.1:${port}` } as WsNode, live], ['--request-timeout-ms', '1500']);
      let board = '';
      for (let i = 0; board === ''; i++) if ((await ranking(door.url, `ws-board-c${i}`))[0] === 'ws-stuck') board = `ws-board-c${i}`;
      process.kill(stuck.pid!, 'SIGSTOP');
      for (let i = 0; i < 2; i++) {
        const filler = tcpConnect({ port, host: '127.0.0.1' });
        fillers.push(filler);
        await once(filler, 'connect');
      }
      const ws = connect(door.url, board);
      await opened(ws);
      ws.send('here');
      assert.equal((await nextMessage(ws)).data.toString(), 'ws-live:here');
      // Not connected within min(--request-timeout-ms, 5000): held unreachable, with no probe run.
      const { healthy } = (await call(`${door.url}/health`)).json<{ healthy: string[] }>();
      assert.deepEqual(healthy, ['ws-live']);
      ws.close();
      await closed(ws);
    } finally {
      for (const filler of fillers) filler.destroy();
      stuck.kill('SIGKILL');
      await door?.stop().catch(() => undefined);
      await live.stop();
    }
  });

  it('skips a node that is down, and closes open tunnels with 1001 when the front door stops', async () => {
    const nodes = await Promise.all(['ws-x', 'ws-y'].map((id) => new WsNode(id).start()));
    const door = await frontOver(nodes);
    try {
      const [first, second] = await ranking(door.url, 'ws-board-5');
      await nodes.find((n) => n.id === first)!.stop();
      const ws = connect(door.url, 'ws-board-5');
      await opened(ws);
      ws.send('alive');
      assert.equal((await nextMessage(ws)).data.toString(), `${second}:alive`);
      const stats = (await call(`${door.url}/stats`)).json<{ nodes: Record<string, { failures: number }> }>();
      assert.equal(stats.nodes[first!]!.failures, 1, 'the refused handshake counts against its node');
      const ending = closed(ws);
      const atNode = nodeClose(nodes.find((n) => n.id === second)!);
      const stopping = door.stop();
      assert.equal((await ending).code, 1001);
      assert.equal((await atNode).code, 1001, 'the node is told too');
      await stopping;
    } finally {
      await door.stop().catch(() => undefined);
      await Promise.all(nodes.map((n) => n.stop().catch(() => undefined)));
    }
  });
});

describe('WebSocket tunnels: a node that stops answering', () => {
  /** Nodes `ids` and a front door over them with `flags`, for `body`; all stopped after. */
  async function over(ids: string[], flags: string[], body: (nodes: WsNode[], door: FrontDoor) => Promise<void>): Promise<void> {
    const nodes = await Promise.all(ids.map((id) => new WsNode(id).start()));
    let door: FrontDoor | null = null;
    try {
      door = await frontOver(nodes, flags);
      await body(nodes, door);
    } finally {
      await door?.stop().catch(() => undefined);
      await Promise.all(nodes.map((n) => n.stop().catch(() => undefined)));
    }
  }

  it('is pinged when quiet, and its tunnel closed (1011) when the ping goes unanswered; a node that answers keeps its tunnel', () =>
    over(['ws-h', 'ws-l'], ['--ws-ping-ms', '200'], async (nodes, door) => {
      const [hung] = await ranking(door.url, 'ws-board-h');
      const live = nodes.find((n) => n.id !== hung)!;
      let liveBoard = '';
      for (let i = 0; liveBoard === ''; i++) if ((await ranking(door.url, `ws-board-l${i}`))[0] === live.id) liveBoard = `ws-board-l${i}`;
      const doomed = connect(door.url, 'ws-board-h');
      const kept = connect(door.url, liveBoard);
      await Promise.all([opened(doomed), opened(kept)]);
      doomed.send('one');
      assert.equal((await nextMessage(doomed)).data.toString(), `${hung}:one`);
      const ending = closed(doomed);
      nodes.find((n) => n.id === hung)!.stall();
      const { code, reason } = await ending;
      assert.equal(code, 1011);
      assert.match(reason, /did not answer a ping/);
      // The quiet node that answers: pinged again and again, its tunnel still carries messages.
      for (let i = 0; i < 3; i++) await once(live, 'pinged');
      kept.send('still');
      assert.equal((await nextMessage(kept)).data.toString(), `${live.id}:still`);
      kept.close();
      await closed(kept);
    }));

  it('does not give up on a node it stopped reading itself, for a client that is behind', () =>
    over(['ws-p1', 'ws-p2'], ['--ws-ping-ms', '100'], async (nodes, door) => {
      const [home] = await ranking(door.url, 'ws-board-p');
      const ws = connect(door.url, 'ws-board-p');
      await opened(ws);
      // The client stops reading while its node sends 6.4 MB: past the 1 MiB the front door lets
      // pile up, it stops reading the node (whose pongs then wait unread too) for a while far
      // longer than a ping and its wait.
      const socket = (ws as unknown as { _socket: Socket })._socket;
      socket.pause();
      const node = nodes.find((n) => n.id === home)!;
      ws.send('flood:100:65536');
      while (node.flushed < 20) await once(node, 'flushed');
      await new Promise((resolve) => setTimeout(resolve, 1_500));
      let received = 0;
      ws.on('message', () => void received++);
      const ended = closed(ws).then(({ code, reason }) => {
        throw new Error(`closed ${code} (${reason}) after ${received} of 100 messages`);
      });
      socket.resume();
      while (received < 100) await Promise.race([once(ws, 'message'), ended]);
      ws.send('still');
      const [last] = (await once(ws, 'message')) as [Buffer];
      assert.equal(last.toString(), `${home}:still`, 'the tunnel is open, nothing lost');
      ws.close();
      await closed(ws);
    }));

  it('closes the tunnels of a node out of the rankings within seconds when it answers no ping, and the client is placed anew', () =>
    // Quiet tunnels of a node in the rankings would wait ten minutes: only being out counts here.
    over(['ws-s', 'ws-t'], ['--ws-ping-ms', '600000', '--health-interval-ms', '100', '--health-timeout-ms', '100'], async (nodes, door) => {
      const [first, second] = await ranking(door.url, 'ws-board-s');
      const hung = nodes.find((n) => n.id === first)!;
      const ws = connect(door.url, 'ws-board-s');
      await opened(ws);
      const ending = closed(ws);
      hung.stall();
      hung.healthy = false;
      const { code, reason } = await ending;
      assert.equal(code, 1011);
      assert.match(reason, /did not answer a ping within 5 s/);
      const again = connect(door.url, 'ws-board-s');
      await opened(again);
      again.send('moved');
      assert.equal((await nextMessage(again)).data.toString(), `${second}:moved`);
      again.close();
      await closed(again);
    }));
});

describe('WebSocket tunnels with affinity tickets', () => {
  const KEY = 'k'.repeat(40);
  const affinity = { app: 'live', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 0, keys: [KEY] };
  let nodes: WsNode[];
  let door: FrontDoor;
  before(async () => {
    nodes = await Promise.all(['ws-s1', 'ws-s2', 'ws-s3'].map((id) => new WsNode(id).start()));
    door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [{ pattern: '/rpc/*', cluster: 'default', policy: 'round_robin', keyHeader: null, affinity }],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({}),
    });
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  /** Opens a socket (offering `protocols`), reads its first message (the ticket), and closes it. */
  async function visit(protocols: string[] = [], headers: Record<string, string> = {}): Promise<{ ticket: string; node: string; protocol: string }> {
    const counts = nodes.map((n) => n.handshakes.length);
    const ws = connect(door.url, null, protocols, headers);
    const first = nextMessage(ws);
    await opened(ws);
    const greeting = JSON.parse((await first).data.toString()) as { t: string; ticket: string };
    assert.equal(greeting.t, 'affinity');
    const node = nodes.find((n, i) => n.handshakes.length > counts[i]!)!;
    const protocol = ws.protocol;
    ws.close(1000);
    await closed(ws);
    return { ticket: greeting.ticket, node: node.id, protocol };
  }

  it('sends the ticket first, a reconnect that offers it lands on the same node, and that node\'s load shedding is relayed', async () => {
    const book = new TicketBook(affinity);
    const placed = await visit();
    assert.equal((book.check(placed.ticket) as { node: string }).node, placed.node, 'the first message names the node');
    const unpinned = new Set<string>();
    for (let i = 0; i < 3; i++) {
      const back = await visit([`lakefront-affinity.${placed.ticket}`]);
      assert.equal(back.node, placed.node);
      assert.equal(back.protocol, `lakefront-affinity.${placed.ticket}`, 'a browser that offered only its ticket gets it selected');
      const node = nodes.find((n) => n.id === placed.node)!;
      assert.equal(node.handshakes.at(-1)!['sec-websocket-protocol'], undefined, 'the ticket is not offered to the node');
      unpinned.add((await visit()).node);
    }
    assert.ok(unpinned.size > 1, 'without it, round robin moves on');
    const withApp = await visit([`lakefront-affinity.${placed.ticket}`, 'chat.v2']);
    assert.equal(withApp.node, placed.node);
    assert.equal(withApp.protocol, 'chat.v2', "the node's own choice wins");
    assert.equal(nodes.find((n) => n.id === placed.node)!.handshakes.at(-1)!['sec-websocket-protocol'], 'chat.v2');
    assert.equal((await visit([], { 'x-lakefront-affinity': placed.ticket })).node, placed.node, 'or as a header');
    // A header ticket that does not check out gives way to the one offered (helper-62).
    for (let i = 0; i < 3; i++) assert.equal((await visit([`lakefront-affinity.${placed.ticket}`], { 'x-lakefront-affinity': 'junk' })).node, placed.node, 'a bad header ticket, a good offered one');
    // Two tickets offered: the first is read, and the first is selected back (not the other).
    for (const offered of [[`lakefront-affinity.${placed.ticket}`, 'lakefront-affinity.forged'], ['lakefront-affinity.forged', `lakefront-affinity.${placed.ticket}`]]) {
      const both = await visit(offered);
      assert.equal(both.protocol, offered[0], 'the ticket read is the one selected');
      if (offered[0]!.endsWith(placed.ticket)) assert.equal(both.node, placed.node);
    }
    // Its node shedding load (503 with a Retry-After) is relayed: the client is not moved. A 503
    // without one is a node that cannot serve, passed over, and the client gets a fresh ticket.
    const own = nodes.find((n) => n.id === placed.node)!;
    own.refuseWith = 503;
    own.refusalHeaders = 'retry-after: 5\r\n';
    try {
      const counts = nodes.map((n) => n.handshakes.length);
      const shed = await refusal(connect(door.url, null, [`lakefront-affinity.${placed.ticket}`]));
      assert.equal(shed.status, 503);
      assert.equal(shed.headers['retry-after'], '5');
      assert.equal(shed.headers['x-lakefront-served-by'], placed.node);
      assert.deepEqual(nodes.map((n, i) => n.handshakes.length - counts[i]!), nodes.map((n) => (n === own ? 1 : 0)), 'no other node tried');
      own.refusalHeaders = '';
      const tried = nodes.map((n) => n.handshakes.length);
      const moved = await visit([`lakefront-affinity.${placed.ticket}`]);
      const fresh = (book.check(moved.ticket) as { node: string }).node;
      assert.notEqual(fresh, placed.node, 'placed anew, on another node');
      assert.deepEqual(nodes.map((n, i) => n.handshakes.length - tried[i]!), nodes.map((n) => (n === own || n.id === fresh ? 1 : 0)), 'its own node, then the one the fresh ticket names');
    } finally {
      own.refuseWith = 0;
      own.refusalHeaders = '';
    }
    // A node's refusal is relayed, but not a ticket header of its own.
    for (const n of nodes) n.refuseWith = 403;
    try {
      const refused = await refusal(connect(door.url, null));
      assert.equal(refused.status, 403);
      assert.equal(refused.headers['x-node'] !== undefined, true);
      assert.equal(refused.headers['x-lakefront-affinity'], undefined);
    } finally {
      for (const n of nodes) n.refuseWith = 0;
    }
  });

  it('takes a node that refused a handshake out of every ranking at once (its ticket holders placed anew)', async () => {
    const book = new TicketBook(affinity);
    const placed = await visit();
    const gone = nodes.find((n) => n.id === placed.node)!;
    await gone.stop();
    const moved = await visit([`lakefront-affinity.${placed.ticket}`]);
    assert.notEqual((book.check(moved.ticket) as { node: string }).node, placed.node);
    // No health probe has run (60 s apart): the handshake's refusal alone took it out.
    const { healthy } = (await call(`${door.url}/health`)).json<{ healthy: string[] }>();
    assert.deepEqual(healthy, nodes.filter((n) => n !== gone).map((n) => n.id));
  });
});

describe('WebSocket tunnels through a reload', () => {
  /** Nodes, and the configuration of a one-thread front door over them with this drain deadline. */
  async function setUp(ids: string[], drainMs: number): Promise<{ nodes: WsNode[]; config: FrontDoorConfig }> {
    const nodes = await Promise.all(ids.map((id) => new WsNode(id).start()));
    const command = parseCommand(
      ['--nodes', nodes.map((n) => `${n.id}=${n.url}`).join(','), '--port', '0', '--host', '127.0.0.1', '--threads', '1', '--health-interval-ms', '60000', '--drain-timeout-ms', String(drainMs)],
      {},
    );
    return { nodes, config: (command as { config: FrontDoorConfig }).config };
  }

  it('run on through the old workers\' drain, and those still open at its deadline are closed with 1001', async () => {
    const { nodes, config } = await setUp(['wr-a', 'wr-b'], 1500);
    const door = await FrontDoor.start(config);
    let next: FrontDoor | null = null;
    const kept = connect(door.url, 'stays');
    const leaving = connect(door.url, 'leaves');
    try {
      await Promise.all([opened(kept), opened(leaving)]);
      next = await door.reload(config);
      // Both tunnels still carry messages, through the old worker, after the reload.
      for (const ws of [kept, leaving]) {
        ws.send('after the reload');
        assert.match((await nextMessage(ws)).data.toString(), /^wr-[ab]:after the reload$/);
      }
      // One closes by itself; the other is still open when the drain's deadline comes.
      leaving.close(1000);
      assert.equal((await closed(leaving)).code, 1000);
      assert.deepEqual(await closed(kept), { code: 1001, reason: 'the front door reloaded its configuration' });
      await door.drained;
      // New tunnels reach the new workers.
      const fresh = connect(next.url, 'fresh');
      await opened(fresh);
      fresh.send('new');
      assert.match((await nextMessage(fresh)).data.toString(), /^wr-[ab]:new$/);
      fresh.close(1000);
      await closed(fresh);
    } finally {
      kept.terminate();
      leaving.terminate();
      await door.stop();
      await next?.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('let the old workers finish as soon as their last tunnel closes, before the deadline', async () => {
    const { nodes, config } = await setUp(['wq-a'], 600_000);
    const door = await FrontDoor.start(config);
    let next: FrontDoor | null = null;
    const ws = connect(door.url, 'only');
    try {
      await opened(ws);
      next = await door.reload(config);
      // The front door serving counts the tunnel still running through the old worker.
      assert.equal((await next.stats()).websockets, 1);
      let drained = false;
      void door.drained.then(() => (drained = true));
      ws.send('still here');
      await nextMessage(ws);
      assert.equal(drained, false, 'the drain waits for the open tunnel');
      ws.close(1000);
      await closed(ws);
      // Ten minutes' deadline: this returns because the tunnel closed.
      await door.drained;
      const stats = await next.stats();
      assert.equal(stats.websockets, 0);
      assert.equal(stats.requests, 1, 'the handshake, counted before the reload');
    } finally {
      ws.terminate();
      await door.stop();
      await next?.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('are closed at once (1001) when the front door that took over stops', async () => {
    const { nodes, config } = await setUp(['ws-stop'], 600_000);
    const door = await FrontDoor.start(config);
    const ws = connect(door.url, 'stopping');
    try {
      await opened(ws);
      const next = await door.reload(config);
      // A stop does not wait for them (ten minutes' deadline here): they are told at once.
      const ending = closed(ws);
      await next.stop();
      assert.deepEqual(await ending, { code: 1001, reason: 'the front door is shutting down' });
      await door.drained;
    } finally {
      ws.terminate();
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('run on through a second reload too, until the last front door stops', async () => {
    const { nodes, config } = await setUp(['wc-a'], 600_000);
    const first = await FrontDoor.start(config);
    const ws = connect(first.url, 'chained');
    let last: FrontDoor | null = null;
    try {
      await opened(ws);
      const second = await first.reload(config);
      last = await second.reload(config);
      assert.equal((await last.stats()).websockets, 1, 'the tunnel in the first front door\'s worker');
      // The second front door's hand-over does not close the first one's tunnel.
      ws.send('still through the first');
      assert.equal((await nextMessage(ws)).data.toString(), 'wc-a:still through the first');
      const ending = closed(ws);
      await last.stop();
      assert.equal((await ending).code, 1001);
      await Promise.all([first.drained, second.drained]);
    } finally {
      ws.terminate();
      await first.stop();
      await last?.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('are closed at once by a stop that cuts a reload short', async () => {
    const { nodes, config } = await setUp(['wx-a'], 600_000);
    const door = await FrontDoor.start(config);
    const ws = connect(door.url, 'cut-short');
    try {
      await opened(ws);
      const reloading = door.reload(config);
      const ending = closed(ws);
      await door.stop();
      assert.equal((await ending).code, 1001);
      await assert.rejects(reloading, /stopped/);
    } finally {
      ws.terminate();
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
});
