/**
 * Signed affinity tickets (seed 004): minting and every reason to refuse one, key rotation, and
 * sticky placement through the front door.
 */
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { performance } from 'node:perf_hooks';
import { setTimeout as delay } from 'node:timers/promises';
import { Buffer } from 'node:buffer';
import { createHmac } from 'node:crypto';
import { after, before, describe, it } from 'node:test';
import { TicketBook, type AffinitySettings, type TicketCheck } from '../src/affinity/tickets.js';
import { pinFirst, preferRegion, regionTurn, type Policy } from '../src/policies/types.js';
import { parseCommand } from '../src/config/config.js';
import { ConfigError } from '../src/errors.js';
import { defaultSettings } from '../src/server/settings.js';
import { FrontDoor, type FrontDoorConfig } from '../src/server/supervisor.js';
import { startNodes, type FakeNode } from './fixtures/fake-node.js';
import { call, rawExchange, rpc } from './fixtures/http.js';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const KEY_A = 'a'.repeat(24) + '-first-signing-key';
const KEY_B = 'b'.repeat(24) + '-second-signing-key';

function settings(overrides: Partial<AffinitySettings> = {}): AffinitySettings {
  return { app: 'boards', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 1, keys: [KEY_A], ...overrides };
}

/** The node a ticket check names, or why it refused. */
function nodeOf(check: TicketCheck): string {
  return 'node' in check ? check.node : `refused: ${check.refused}`;
}

/** A ticket signed properly around an arbitrary payload text. */
function signedAround(payload: string, key = KEY_A): string {
  const signed = `v1.${Buffer.from(payload).toString('base64url')}`;
  return `${signed}.${createHmac('sha256', key).update(signed).digest('base64url')}`;
}

describe('affinity tickets', () => {
  it('names the node it was minted for', () => {
    const book = new TicketBook(settings());
    const ticket = book.mint('node-b');
    assert.match(ticket, /^v1\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]{43}$/);
    assert.equal((book.check(ticket) as { node: string }).node, 'node-b');
    assert.equal((book.check(ticket) as { node: string }).node, 'node-b', 'again (from the cache)');
  });

  it('carries the client\'s region when it has one', () => {
    const book = new TicketBook(settings());
    assert.deepEqual(pick(book.check(book.mint('node-b', 'eu-west'))), { node: 'node-b', region: 'eu-west' });
    assert.deepEqual(pick(book.check(book.mint('node-b'))), { node: 'node-b', region: null });
    for (const r of [5, '', 'x'.repeat(65)]) {
      const payload = JSON.stringify({ a: 'boards', n: 'node-b', iat: 1, exp: 9_999_999_999, g: 1, r });
      assert.equal(nodeOf(book.check(signedAround(payload))), 'refused: malformed', `region ${JSON.stringify(r)}`);
    }
  });

  it('refuses a malformed, forged, expired, other-app or other-generation ticket', () => {
    let now = 1_800_000_000_000;
    const book = new TicketBook(settings(), () => now);
    const good = book.mint('node-a');
    const [version, payload, signature] = good.split('.');
    const cases: [string, string][] = [
      ['', 'malformed'],
      ['garbage', 'malformed'],
      [`v2.${payload}.${signature}`, 'malformed'],
      [`v1.${payload}.short`, 'malformed'],
      [signedAround('not json'), 'malformed'],
      [signedAround('{"a":"boards","g":1}'), 'malformed'],
      [new TicketBook(settings({ keys: [KEY_B] })).mint('node-a'), 'forged'],
      [`${version}.${Buffer.from(Buffer.from(payload!, 'base64url').toString().replace('node-a', 'node-c')).toString('base64url')}.${signature}`, 'forged'],
      [new TicketBook(settings({ app: 'other' }), () => now).mint('node-a'), 'app'],
      [new TicketBook(settings({ generation: 2 }), () => now).mint('node-a'), 'generation'],
    ];
    // Other spellings of a good ticket (Node's base64url decoder would skip the junk and the
    // spare bits of the last character): each would verify, and take a place in the cache.
    const spare = signature!.at(-1) === 'A' ? 'B' : String.fromCharCode(signature!.charCodeAt(42) + 1);
    cases.push(
      [`${good}=`, 'malformed'],
      [`${good}!`, 'malformed'],
      [`${version}.${payload}.${signature!.slice(0, 10)}$$${signature!.slice(10)}`, 'malformed'],
      [`${version}.${payload}.${signature!.slice(0, 42)}${spare}`, 'malformed'],
      [`${version}.${'A'.repeat(1401)}.${signature}`, 'malformed'],
    );
    for (const [ticket, reason] of cases) assert.deepEqual(book.check(ticket), { refused: reason }, ticket);
    assert.equal((book.check(good) as { node: string }).node, 'node-a');
    now += 3600 * 1000;
    assert.deepEqual(book.check(good), { refused: 'expired' }, 'an hour later, though verified before');
    assert.deepEqual(new TicketBook(settings(), () => now).check(good), { refused: 'expired' });
  });

  it('rotates keys: the new key signs, the old one still verifies until it is dropped', () => {
    const old = new TicketBook(settings({ keys: [KEY_A] })).mint('node-a');
    const rotating = new TicketBook(settings({ keys: [KEY_B, KEY_A] }));
    assert.equal(nodeOf(rotating.check(old)), 'node-a');
    const fresh = rotating.mint('node-c');
    assert.equal(nodeOf(new TicketBook(settings({ keys: [KEY_B] })).check(fresh)), 'node-c', 'signed with the new key');
    assert.deepEqual(new TicketBook(settings({ keys: [KEY_B] })).check(old), { refused: 'forged' }, 'the old key dropped');
  });

  it('takes its keys from LAKEFRONT_AFFINITY_KEYS or a keys file, never naming one in an error', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lakefront-affinity-'));
    try {
      const path = join(dir, 'lf.json');
      writeFileSync(
        path,
        JSON.stringify({
          clusters: [{ name: 'c', nodes: 'a=http://127.0.0.1:1' }],
          routes: [{ path: '/live/*', cluster: 'c', policy: 'round_robin', keyHeader: null, affinity: { app: 'boards', generation: 3 } }],
        }),
      );
      const parsed = parseCommand(['--config', path], { LAKEFRONT_AFFINITY_KEYS: `${KEY_B}, ${KEY_A}` });
      assert.equal(parsed.kind, 'run');
      const route = (parsed as { config: FrontDoorConfig }).config.routes[0]!;
      assert.deepEqual(route.affinity, { app: 'boards', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 3, keys: [KEY_B, KEY_A] });
      assert.throws(() => parseCommand(['--config', path], {}), (err: Error) => err instanceof ConfigError && /routes\[0\]\.affinity: tickets need signing keys in LAKEFRONT_AFFINITY_KEYS/.test(err.message));
      const short = 'short-secret-value';
      assert.throws(
        () => parseCommand(['--config', path], { LAKEFRONT_AFFINITY_KEYS: `${KEY_A},${short}` }),
        (err: Error) => err instanceof ConfigError && /key 2 of 2 has 18 characters; at least 32/.test(err.message) && !err.message.includes(short),
      );
      // Or from a keys file (one a line; blank lines and # comments skipped), never both.
      const keys = join(dir, 'keys');
      writeFileSync(keys, `# rotated 2026-11-30\n${KEY_B}\n\n  ${KEY_A}  \n`);
      const fromFile = parseCommand(['--config', path, '--affinity-keys-file', keys], {}) as { config: FrontDoorConfig };
      assert.deepEqual(fromFile.config.routes[0]!.affinity!.keys, [KEY_B, KEY_A]);
      assert.deepEqual((parseCommand(['--config', path], { LAKEFRONT_AFFINITY_KEYS_FILE: keys }) as { config: FrontDoorConfig }).config.routes[0]!.affinity!.keys, [KEY_B, KEY_A]);
      assert.throws(() => parseCommand(['--config', path, '--affinity-keys-file', keys], { LAKEFRONT_AFFINITY_KEYS: KEY_A }), /--affinity-keys-file: give the affinity keys either in LAKEFRONT_AFFINITY_KEYS or in a keys file, not both/);
      assert.throws(() => parseCommand(['--config', path, '--affinity-keys-file', join(dir, 'missing')], {}), /: --affinity-keys-file: cannot read the keys file \(ENOENT\)$/);
      // A key given where the path belongs is not printed back.
      assert.throws(() => parseCommand(['--config', path], { LAKEFRONT_AFFINITY_KEYS_FILE: KEY_A }), (err: Error) => err.message === 'LAKEFRONT_AFFINITY_KEYS_FILE: cannot read the keys file (ENOENT)');
      writeFileSync(keys, '# nothing yet\n\n');
      assert.throws(() => parseCommand(['--config', path, '--affinity-keys-file', keys], {}), /holds no key \(one a line, the first signs\)/);
      writeFileSync(keys, `${KEY_A}\n${short}\n`);
      assert.throws(
        () => parseCommand(['--config', path, '--affinity-keys-file', keys], {}),
        (err: Error) => /^--affinity-keys-file: key 2 of 2 has 18 characters; at least 32/.test(err.message) && !err.message.includes(short),
      );
      assert.throws(() => parseCommand(['--nodes', 'a=http://127.0.0.1:1', '--affinity-keys-file', keys], {}), /--affinity-keys-file: affinity tickets belong to routes in a configuration file \(--config\), and none is given/);
      // The keys file given as the configuration by mistake: its error quotes none of it.
      assert.throws(() => parseCommand(['--config', keys], {}), (err: Error) => /: not valid JSON \(an unexpected character at line 1, column 1\)$/.test(err.message) && !err.message.includes(KEY_A.slice(0, 6)));
      const withAffinity = (affinity: unknown, keyHeader: string | null = null): void => {
        writeFileSync(path, JSON.stringify({ clusters: [{ name: 'c', nodes: 'a=http://127.0.0.1:1' }], routes: [{ path: '/live/*', cluster: 'c', policy: 'round_robin', keyHeader, affinity }] }));
        parseCommand(['--config', path], { LAKEFRONT_AFFINITY_KEYS: KEY_A });
      };
      assert.throws(() => withAffinity({ app: 'x', header: 'Authorization' }), /routes\[0\]\.affinity\.header: "authorization" is a header the nodes or the front door need/);
      assert.throws(() => withAffinity({ app: 'x', header: 'sec-websocket-protocol' }), /affinity\.header: "sec-websocket-protocol" is a header/);
      for (const own of ['x-lakefront-served-by', 'x-lakefront-hedged', 'x-lakefront-idempotent', 'x-lakefront-version', 'x-lakefront-acks', 'x-lakefront-hint-for']) {
        assert.throws(() => withAffinity({ app: 'x', header: own }), new RegExp(`affinity\\.header: "${own}" is a header the nodes or the front door need`));
      }
      assert.throws(() => withAffinity({ app: 'x', header: 'x-session' }, 'x-session'), /affinity\.header: "x-session" is the route's key header/);
      assert.throws(() => withAffinity('yes'), /routes\[0\]\.affinity: must be \{ app, header\?, ttlSeconds\?, generation\? \}, got a string/);
      assert.throws(() => withAffinity({ app: 'x', ttlSeconds: 0 }), /affinity\.ttlSeconds/);
      assert.throws(() => withAffinity({ app: 'x'.repeat(129) }), /affinity\.app: must be 1-128 characters, got 129/);
      // A node id too long for a ticket would make every ticket unverifiable: refused up front.
      writeFileSync(path, JSON.stringify({ clusters: [{ name: 'c', nodes: [{ id: 'n'.repeat(1100), url: 'http://127.0.0.1:1' }] }], routes: [{ path: '/live/*', cluster: 'c', policy: 'round_robin', keyHeader: null, affinity: { app: 'x' } }] }));
      assert.throws(() => parseCommand(['--config', path], { LAKEFRONT_AFFINITY_KEYS: KEY_A }), /routes\[0\]\.affinity: node id "n{40}\.\.\." is too long to name in a ticket/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

/** A checked ticket's node and region. */
function pick(check: TicketCheck): { node: string; region: string | null } | string {
  return 'node' in check ? { node: check.node, region: check.region } : check.refused;
}

describe('preferring a region', () => {
  it('moves the region\'s candidates ahead, each group keeping its order', () => {
    const regionOf = Int32Array.from([0, 1, 0, 1, 0]);
    const list = Int32Array.from([1, 0, 3, 2, 4]);
    assert.equal(preferRegion(list, 5, regionOf, 0), 3);
    assert.deepEqual([...list], [0, 2, 4, 1, 3]);
    assert.equal(preferRegion(list, 5, regionOf, 2), 0, 'no candidate there: unchanged');
    assert.deepEqual([...list], [0, 2, 4, 1, 3]);
  });

  it('lets a round robin\'s region candidates take turns evenly, whatever their places', () => {
    const cases: [number[], number][] = [
      [[1, 1, 0, 0, 1], 0], // the region's two side by side in five
      [[0, 0, 1, 1], 0], // two of four, at the start
      [[1, 1, 0, 0, 0, 0], 0], // four of six
    ];
    for (const [regions, region] of cases) {
      const regionOf = Int32Array.from(regions);
      const n = regions.length;
      const members = regions.flatMap((r, i) => (r === region ? [i] : []));
      const first = new Map<number, number>();
      const turns = new Int32Array(2);
      const policy = { rotating: true } as Policy;
      const placements = 12 * members.length;
      for (let i = 0; i < placements; i++) {
        const list = Int32Array.from({ length: n }, (_, k) => (i + k) % n); // the round robin's order
        assert.equal(preferRegion(list, n, regionOf, region, regionTurn(policy, turns, region)), members.length);
        first.set(list[0]!, (first.get(list[0]!) ?? 0) + 1);
        assert.deepEqual([...list.subarray(members.length)], [...Int32Array.from({ length: n }, (_, k) => (i + k) % n)].filter((x) => regionOf[x] !== region), 'the others keep their order');
      }
      assert.deepEqual([...first.entries()].sort((a, b) => a[0] - b[0]), members.map((m) => [m, 12]), `regions ${regions.join('')}`);
    }
    assert.equal(regionTurn({ name: 'rendezvous' } as Policy, new Int32Array(1), 0), -1, 'a policy that does not rotate keeps its order');
  });
});

describe('pinning a candidate list', () => {
  it('moves the named node to the front, puts a routable one past the window in front, and refuses an unroutable one', () => {
    const list = Int32Array.from([4, 2, 7, 1]);
    assert.equal(pinFirst(list, 4, 7, true), 4);
    assert.deepEqual([...list], [7, 4, 2, 1]);
    assert.equal(pinFirst(list, 3, 9, true), 4, 'past the three held: in front, room for it');
    assert.deepEqual([...list], [9, 7, 4, 2]);
    assert.equal(pinFirst(list, 4, 5, true), 4, 'no room: the last drops out');
    assert.deepEqual([...list], [5, 9, 7, 4]);
    assert.equal(pinFirst(list, 4, 3, false), -1);
    assert.deepEqual([...list], [5, 9, 7, 4], 'unchanged');
  });
});

/**
 * A front door over `nodes` with one round-robin affinity route on /rpc/*. With a `region`, each
 * node's region is its id up to the first '-'.
 */
function stickyDoor(nodes: FakeNode[], options: { threads: number; healthIntervalMs: number; region?: string }): Promise<FrontDoor> {
  const region = (n: FakeNode) => (options.region === undefined ? {} : { region: n.id.split('-')[0]! });
  return FrontDoor.start({
    host: '127.0.0.1',
    port: 0,
    threads: options.threads,
    ...(options.region === undefined ? {} : { region: options.region }),
    clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url, ...region(n) })) }],
    routes: [{ pattern: '/rpc/*', cluster: 'default', policy: 'round_robin', keyHeader: null, affinity: settings() }],
    healthIntervalMs: options.healthIntervalMs,
    healthTimeoutMs: 500,
    settings: defaultSettings({ hedgeDelayMs: 20 }),
  });
}

describe('affinity through the front door', () => {
  let nodes: FakeNode[];
  let door: FrontDoor;
  const book = new TicketBook(settings());
  before(async () => {
    nodes = await startNodes('sticky-a', 'sticky-b', 'sticky-c');
    door = await stickyDoor(nodes, { threads: 2, healthIntervalMs: 50 });
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  const read = (ticket?: string) => call(`${door.url}/rpc/query.execute`, { headers: ticket === undefined ? {} : { 'x-lakefront-affinity': ticket } });

  it('places a client, hands it a ticket, and keeps it on that node while the ticket holds', async () => {
    const first = await read();
    assert.equal(first.status, 200);
    const placed = String(first.headers['x-lakefront-served-by']);
    const ticket = String(first.headers['x-lakefront-affinity']);
    assert.equal(nodeOf(book.check(ticket)), placed, 'the ticket names the node that served');
    const unpinned = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const reply = await read(ticket);
      assert.equal(reply.headers['x-lakefront-served-by'], placed);
      assert.equal(reply.headers['x-lakefront-affinity'], undefined, 'no new ticket while it holds');
      unpinned.add(String((await read()).headers['x-lakefront-served-by']));
    }
    assert.ok(unpinned.size > 1, 'without a ticket, round robin moves on');
    const node = nodes.find((n) => n.id === placed)!;
    assert.equal(node.received.at(-1)!.headers['x-lakefront-affinity'], undefined, 'the ticket is not forwarded');
  });

  it('is not hedged away from its node: the session lives there', async () => {
    const placed = await read();
    const node = nodes.find((n) => n.id === placed.headers['x-lakefront-served-by'])!;
    node.behaviour = { kind: 'answer', delayMs: 200 }; // ten hedge delays
    try {
      const reply = await read(String(placed.headers['x-lakefront-affinity']));
      assert.equal(reply.headers['x-lakefront-served-by'], node.id);
      assert.equal(reply.headers['x-lakefront-hedged'], '0');
    } finally {
      node.behaviour = { kind: 'answer' };
    }
  });

  it('re-places a client whose ticket is forged, or names a node that is down, with a fresh ticket', async () => {
    const forged = new TicketBook(settings({ keys: [KEY_B] })).mint('sticky-a');
    const served = new Set<string>();
    for (let i = 0; i < 6; i++) {
      const reply = await read(forged);
      served.add(String(reply.headers['x-lakefront-served-by']));
      assert.equal(nodeOf(book.check(String(reply.headers['x-lakefront-affinity']))), reply.headers['x-lakefront-served-by']);
    }
    assert.ok(served.size > 1, 'a forged ticket is no ticket: round robin');

    const placed = await read();
    const down = nodes.find((n) => n.id === placed.headers['x-lakefront-served-by'])!;
    down.healthy = false;
    try {
      while (((await call(`${door.url}/health`)).json<{ healthy: string[] }>().healthy).includes(down.id)) await once(down, 'probe');
      const moved = await read(String(placed.headers['x-lakefront-affinity']));
      assert.equal(moved.status, 200);
      assert.notEqual(moved.headers['x-lakefront-served-by'], down.id);
      assert.equal(nodeOf(book.check(String(moved.headers['x-lakefront-affinity']))), moved.headers['x-lakefront-served-by'], 'a fresh ticket for the new node');
    } finally {
      down.healthy = true;
    }
  });

  it('places every request carrying one stale ticket on the same sibling, and the clients of a node that is down over all its siblings', async () => {
    const down = nodes[0]!;
    // Sixteen clients placed on it, a second apart (tickets issued in the same second for the same
    // node are the same ticket: those clients cannot be told apart, and move together).
    const tickets = Array.from({ length: 16 }, (_, i) => new TicketBook(settings(), () => Date.now() - i * 1000).mint(down.id));
    // Every node in the rankings first (the test before may have left one on its way back): the
    // siblings must be the same two in both halves.
    for (;;) {
      const { healthy } = (await call(`${door.url}/health`)).json<{ healthy: string[] }>();
      if (healthy.length === nodes.length) break;
      await once(nodes.find((n) => !healthy.includes(n.id))!, 'probe');
    }
    /** Where each client's requests land: one sibling a client (its HTTP leg and its socket alike), not the rotation's next. */
    const siblings = async (): Promise<string[]> => {
      const landed: string[] = [];
      for (const ticket of tickets) {
        const where = new Set<string>();
        for (let i = 0; i < 4; i++) where.add(String((await read(ticket)).headers['x-lakefront-served-by']));
        assert.equal(where.size, 1, `one sibling for one client, got ${[...where]}`);
        landed.push([...where][0]!);
      }
      return landed;
    };
    // Failing while still in the rankings (its probe passes): each read fails over to a sibling.
    down.behaviour = { kind: 'answer', status: 502 };
    let failing: string[];
    try {
      failing = await siblings();
    } finally {
      down.behaviour = { kind: 'answer' };
    }
    down.healthy = false;
    try {
      while (((await call(`${door.url}/health`)).json<{ healthy: string[] }>().healthy).includes(down.id)) await once(down, 'probe');
      const out = await siblings();
      assert.deepEqual(out, failing, 'the same sibling once the node is out of the rankings as while it failed');
      assert.equal(out.includes(down.id), false);
      assert.equal(new Set(out).size, 2, 'the clients spread over both siblings');
    } finally {
      down.healthy = true;
      while (!((await call(`${door.url}/health`)).json<{ healthy: string[] }>().healthy).includes(down.id)) await once(down, 'probe');
    }
  });

  it('relays its own node\'s 503 with a Retry-After (the node sheds load) and keeps the client there; a plain 503 still moves it', async () => {
    const placed = await read();
    const id = String(placed.headers['x-lakefront-served-by']);
    const ticket = String(placed.headers['x-lakefront-affinity']);
    const node = nodes.find((n) => n.id === id)!;
    const others = nodes.filter((n) => n !== node);
    const before = others.map((n) => n.received.length);
    node.behaviour = { kind: 'answer', status: 503, headers: { 'retry-after': '5' }, body: '{"error":"shed"}' };
    try {
      const shed = await read(ticket);
      assert.equal(shed.status, 503, 'the node\'s own answer');
      assert.equal(shed.headers['retry-after'], '5');
      assert.equal(shed.headers['x-lakefront-served-by'], id);
      assert.equal(shed.headers['x-lakefront-affinity'], undefined, 'no new ticket: the client stays placed');
      assert.equal(shed.text, '{"error":"shed"}');
      assert.deepEqual(others.map((n) => n.received.length), before, 'not tried elsewhere');
      // Without a ticket the same 503 is a node that cannot serve: the request moves on.
      for (let i = 0; i < 3; i++) {
        const unpinned = await read();
        assert.equal(unpinned.status, 200);
        assert.notEqual(unpinned.headers['x-lakefront-served-by'], id);
      }
      // A 503 without a Retry-After from its own node: failed over, and a fresh ticket.
      node.behaviour = { kind: 'answer', status: 503 };
      const failedOver = await read(ticket);
      assert.equal(failedOver.status, 200);
      assert.notEqual(failedOver.headers['x-lakefront-served-by'], id);
      assert.equal(nodeOf(book.check(String(failedOver.headers['x-lakefront-affinity']))), failedOver.headers['x-lakefront-served-by']);
      // A bare write without a ticket, its node shedding: the node's 503 is relayed (a write is
      // sent once), and the client is not handed a ticket to the node that turned it away.
      for (const n of nodes) n.behaviour = { kind: 'answer', status: 503, headers: { 'retry-after': '5' } };
      const write = await call(`${door.url}/rpc/board.append`, { method: 'POST', body: '{}' });
      assert.equal(write.status, 503);
      assert.equal(write.headers['retry-after'], '5');
      assert.equal(write.headers['x-lakefront-affinity'], undefined);
    } finally {
      for (const n of nodes) n.behaviour = { kind: 'answer' };
    }
  });

  it('never relays a node\'s own ticket header, and renews a ticket past half its life', async () => {
    const placed = await read();
    const id = String(placed.headers['x-lakefront-served-by']);
    const node = nodes.find((n) => n.id === id)!;
    node.behaviour = { kind: 'answer', headers: { 'x-lakefront-affinity': 'set-by-the-node' } };
    try {
      const pinnedReply = await read(String(placed.headers['x-lakefront-affinity']));
      assert.equal(pinnedReply.headers['x-lakefront-served-by'], id);
      assert.equal(pinnedReply.headers['x-lakefront-affinity'], undefined, 'pinned, fresh ticket: nothing, and not the node\'s');
      const old = new TicketBook(settings(), () => Date.now() - 2_000 * 1000).mint(id);
      const renewed = await read(old);
      assert.equal(renewed.headers['x-lakefront-served-by'], id, 'still valid: still pinned');
      const fresh = String(renewed.headers['x-lakefront-affinity']);
      assert.equal(nodeOf(book.check(fresh)), id);
      assert.ok((book.check(fresh) as { expiresAt: number }).expiresAt > Date.now() + 3_500 * 1000, 'a full lifetime again');
    } finally {
      node.behaviour = { kind: 'answer' };
    }
  });

  it('keeps a write on its node too (a bare write is still sent once)', async () => {
    const placed = await read();
    const ticket = String(placed.headers['x-lakefront-affinity']);
    const reply = await rpc(door.url, 'board.append', 'unused', { headers: { 'x-lakefront-affinity': ticket } });
    assert.equal(reply.status, 200);
    assert.equal(reply.headers['x-lakefront-served-by'], placed.headers['x-lakefront-served-by']);
  });
});

describe('a node that cannot be reached (seed 004: marked failed for three seconds)', () => {
  const HOLD_MS = 3_000;
  let nodes: FakeNode[];
  let door: FrontDoor;
  let config: FrontDoorConfig;
  const book = new TicketBook(settings());
  before(async () => {
    nodes = await startNodes('hold-a', 'hold-b', 'hold-c');
    config = {
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [{ pattern: '/rpc/*', cluster: 'default', policy: 'round_robin', keyHeader: null, affinity: settings() }],
      // Probes run when the test says (probeOnce): a poll finding the node down first would
      // take it out before any request could report it.
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      unreachableHoldMs: HOLD_MS,
      settings: defaultSettings({ requestTimeoutMs: 300, hedgeMode: 'off' }),
    };
    door = await FrontDoor.start(config);
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  const read = (ticket?: string) => call(`${door.url}/rpc/query.execute`, { headers: ticket === undefined ? {} : { 'x-lakefront-affinity': ticket } });
  const healthy = async (): Promise<string[]> => (await call(`${door.url}/health`)).json<{ healthy: string[] }>().healthy;

  it('keeps a node that refused a request out of every ranking for the hold, though it passes a probe meanwhile and through a reload, then takes it back', async () => {
    const placed = await read();
    const id = String(placed.headers['x-lakefront-served-by']);
    const ticket = String(placed.headers['x-lakefront-affinity']);
    const gone = nodes.find((n) => n.id === id)!;
    await gone.stop();
    const stopped = performance.now();
    const moved = await read(ticket);
    assert.equal(moved.status, 200, 'failed over');
    assert.notEqual(moved.headers['x-lakefront-served-by'], id);
    assert.equal(nodeOf(book.check(String(moved.headers['x-lakefront-affinity']))), moved.headers['x-lakefront-served-by'], 'placed anew, with a fresh ticket');
    // Back at once, and its probe passes: the hold keeps it out all the same.
    await gone.restart();
    await door.memberships[0]!.probeOnce();
    assert.ok(performance.now() - stopped < HOLD_MS, 'still within the hold (else the machine was too slow for this check)');
    assert.ok(!(await healthy()).includes(id), 'out of the ranking');
    const hits = gone.received.length;
    const again = await read(ticket);
    assert.notEqual(again.headers['x-lakefront-served-by'], id);
    assert.equal(gone.received.length, hits, 'not tried again');
    // A reload's new workers and membership keep the hold (their first probe passes).
    const old = door;
    door = await door.reload(config);
    await old.drained;
    assert.ok(performance.now() - stopped < HOLD_MS, 'still within the hold (else the machine was too slow for this check)');
    assert.ok(!(await healthy()).includes(id), 'still out after the reload');
    // The hold is a time: past it, the next passing probe brings the node back.
    await delay(Math.max(0, HOLD_MS - (performance.now() - stopped)) + 20);
    await door.memberships[0]!.probeOnce();
    assert.ok((await healthy()).includes(id), 'back after the hold');
    assert.equal((await read(ticket)).headers['x-lakefront-served-by'], id, 'and its ticket holders with it');
  });

  it('holds no node for an answer that is only late: a request timeout is the node reached, not unreachable', async () => {
    const slow = nodes[0]!;
    slow.behaviour = { kind: 'hang' };
    try {
      // Round robin, no hedging: one of three reads starts on the hanging node, times out, and
      // moves on.
      const hits = slow.received.length;
      for (let i = 0; i < 3; i++) assert.equal((await read()).status, 200);
      assert.equal(slow.received.length, hits + 1, 'the hanging node was tried, once');
    } finally {
      slow.behaviour = { kind: 'answer' };
    }
    assert.deepEqual(await healthy(), nodes.map((n) => n.id), 'every node still in the ranking');
  });
});

describe('affinity across regions', () => {
  let nodes: FakeNode[];
  let door: FrontDoor;
  const book = new TicketBook(settings());
  before(async () => {
    nodes = await startNodes('east-a', 'west-a', 'east-b', 'west-b');
    door = await stickyDoor(nodes, { threads: 1, healthIntervalMs: 60_000, region: 'east' });
  });
  after(async () => {
    await door.stop();
    await Promise.all(nodes.map((n) => n.stop()));
  });

  const read = (ticket?: string) => call(`${door.url}/rpc/query.execute`, { headers: ticket === undefined ? {} : { 'x-lakefront-affinity': ticket } });
  async function setHealth(ids: string[], healthy: boolean): Promise<void> {
    for (const n of nodes) if (ids.includes(n.id)) n.healthy = healthy;
    const changed = once(door.memberships[0]!, 'change');
    await door.memberships[0]!.probeOnce();
    await changed;
  }

  it('places new clients in the front door\'s region, and keeps a client\'s region when its node goes', async () => {
    const served = new Set<string>();
    let ticket = '';
    for (let i = 0; i < 6; i++) {
      const reply = await read();
      served.add(String(reply.headers['x-lakefront-served-by']));
      ticket = String(reply.headers['x-lakefront-affinity']);
    }
    assert.deepEqual([...served].sort(), ['east-a', 'east-b'], 'round robin over the east only');
    const first = book.check(ticket) as { node: string; region: string | null };
    assert.equal(first.region, 'east');
    await setHealth([first.node], false);
    try {
      const moved = await read(ticket);
      const other = first.node === 'east-a' ? 'east-b' : 'east-a';
      assert.equal(moved.headers['x-lakefront-served-by'], other, 're-placed in its region');
      assert.deepEqual(pick(book.check(String(moved.headers['x-lakefront-affinity']))), { node: other, region: 'east' });
      await setHealth([other], false);
      const away = await read(String(moved.headers['x-lakefront-affinity']));
      assert.match(String(away.headers['x-lakefront-served-by']), /^west-/, 'no east node left: the west serves');
      assert.equal((book.check(String(away.headers['x-lakefront-affinity'])) as { region: string }).region, 'east', 'the client is still from the east');
    } finally {
      await setHealth(['east-a', 'east-b'], true);
    }
    // A client from the west (its ticket says so) placed anew goes west.
    const westerner = book.mint('no-such-node', 'west');
    const reply = await read(westerner);
    assert.match(String(reply.headers['x-lakefront-served-by']), /^west-/);
  });
});

/** One worker thread over `nodes` as the default cluster, and one affinity route (`pattern`, keyless). */
function ticketDoor(nodes: readonly FakeNode[], pattern: string, policy: 'round_robin' | 'boltzmann' | 'hybrid', affinity: AffinitySettings): Promise<FrontDoor> {
  return FrontDoor.start({
    host: '127.0.0.1',
    port: 0,
    threads: 1,
    clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
    routes: [{ pattern, cluster: 'default', policy, keyHeader: null, affinity }],
    healthIntervalMs: 60_000,
    healthTimeoutMs: 500,
    settings: defaultSettings({ hedgeMode: 'off' }),
  });
}

describe('a ticket holder whose node died is re-placed, even for a write (helper-62)', () => {
  const settings: AffinitySettings = { app: 'boards', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 1, keys: ['k'.repeat(40)] };
  const book = new TicketBook(settings);
  const nodeOf = (ticket: unknown): string => {
    const checked = book.check(String(ticket));
    return 'node' in checked ? checked.node : `refused: ${checked.refused}`;
  };

  for (const policy of ['boltzmann', 'hybrid'] as const) {
    it(`sends every request of a client whose node is out to one sibling, with one fresh ticket, on a keyless ${policy} route, never to a member the policy avoids`, async () => {
      const nodes = await startNodes('kp-a', 'kp-b', 'kp-c', 'kp-d');
      const door = await ticketDoor(nodes, '/rpc/*', policy, settings);
      try {
        // kp-c is slow: reads without tickets teach the policy so (hybrid takes it out of its read
        // pool, boltzmann draws it next to never).
        const slow = nodes[2]!;
        slow.behaviour = { kind: 'answer', delayMs: 80 };
        for (let i = 0; i < 60; i++) await call(`${door.url}/rpc/query.execute`);
        nodes[0]!.healthy = false;
        await door.memberships[0]!.probeOnce();
        // Clients whose tickets (each of its own second) name kp-a, out now.
        const placedOn = new Set<string>();
        for (let c = 0; c < 12; c++) {
          const ticket = new TicketBook(settings, () => Date.now() - c * 1000).mint('kp-a');
          const landed = new Set<string>();
          const fresh = new Set<string>();
          for (let i = 0; i < 4; i++) {
            const reply = await call(`${door.url}/rpc/query.execute`, { headers: { 'x-lakefront-affinity': ticket } });
            assert.equal(reply.status, 200);
            landed.add(String(reply.headers['x-lakefront-served-by']));
            fresh.add(nodeOf(reply.headers['x-lakefront-affinity']));
          }
          assert.equal(landed.size, 1, `client ${c}: one sibling: ${[...landed].join(' ')}`);
          assert.deepEqual([...fresh], [...landed], `client ${c}: its fresh tickets all name that sibling`);
          placedOn.add([...landed][0]!);
        }
        assert.ok(!placedOn.has('kp-a') && !placedOn.has(slow.id), `placed on ${[...placedOn].join(' ')}: not on the node out, nor on the slow one`);
      } finally {
        await door.stop();
        await Promise.all(nodes.map((n) => n.stop()));
      }
    });
  }

  it('re-places a ticket holder\'s write on a sibling when its node refuses the connection (the write was never sent)', async () => {
    const nodes = await startNodes('kw-a', 'kw-b', 'kw-c');
    const door = await ticketDoor(nodes, '/live/*', 'round_robin', settings);
    try {
      const ticket = book.mint('kw-a');
      // Its node dies; no probe has run yet: the front door learns of it from the refused connection.
      await nodes[0]!.stop();
      const reply = await call(`${door.url}/live/materialize`, { method: 'POST', body: '{}', headers: { 'x-lakefront-affinity': ticket } });
      assert.equal(reply.status, 200, reply.text);
      const servedBy = String(reply.headers['x-lakefront-served-by']);
      assert.notEqual(servedBy, 'kw-a');
      assert.equal(nodeOf(reply.headers['x-lakefront-affinity']), servedBy, 'with a fresh ticket for where it landed');
    } finally {
      await door.stop();
      await Promise.all(nodes.slice(1).map((n) => n.stop()));
    }
  });
});

describe('tickets that cannot be read one way, and apps across clusters (helper-62)', () => {
  const settings: AffinitySettings = { app: 'boards', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 1, keys: ['k'.repeat(40)] };
  const book = new TicketBook(settings);

  it('takes two ticket lines as none (placed anew, with a fresh ticket), whichever of them is valid', async () => {
    const nodes = await startNodes('td-a', 'td-b', 'td-c');
    const door = await ticketDoor(nodes, '/rpc/*', 'round_robin', settings);
    try {
      const good = book.mint('td-a');
      for (const [first, second] of [[good, 'junk'], ['junk', good]]) {
        const raw = await rawExchange(door.url, `GET /rpc/q HTTP/1.1\r\nhost: x\r\nx-lakefront-affinity: ${first}\r\nx-lakefront-affinity: ${second}\r\nconnection: close\r\n\r\n`);
        assert.match(raw, /^HTTP\/1\.1 200 /);
        // Placed anew: the answer carries a fresh ticket, wherever it landed.
        assert.match(raw, /\r\nx-lakefront-affinity: /i, `${first === good ? 'good first' : 'good second'}: a fresh ticket`);
      }
      // One line: pinned, no fresh ticket.
      const pinned = await rawExchange(door.url, `GET /rpc/q HTTP/1.1\r\nhost: x\r\nx-lakefront-affinity: ${good}\r\nconnection: close\r\n\r\n`);
      assert.match(pinned, /\r\nx-lakefront-served-by: td-a\r\n/i);
      assert.doesNotMatch(pinned, /\r\nx-lakefront-affinity: /i);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('refuses at start two clusters\' routes with one affinity app (a ticket does not name its cluster)', async () => {
    const nodes = await startNodes('ta-a', 'ta-b');
    try {
      await assert.rejects(
        FrontDoor.start({
          host: '127.0.0.1',
          port: 0,
          threads: 1,
          clusters: [
            { name: 'live', members: [{ id: 'n1', url: nodes[0]!.url }] },
            { name: 'api', members: [{ id: 'n1', url: nodes[1]!.url }] },
          ],
          routes: [
            { pattern: '/live/*', cluster: 'live', policy: 'round_robin', keyHeader: null, affinity: settings },
            { pattern: '/api/*', cluster: 'api', policy: 'round_robin', keyHeader: null, affinity: settings },
          ],
          healthIntervalMs: 60_000,
          healthTimeoutMs: 500,
          settings: defaultSettings({}),
        }),
        (err: Error) => err instanceof ConfigError && /^route \/api\/\*: affinity app "boards" is also an app of cluster "live"'s routes/.test(err.message),
      );
    } finally {
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
});

describe('spreading clients, and ticket holders placed anew across reloads (helper-83)', () => {
  const settings: AffinitySettings = { app: 'boards', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 1, keys: ['k'.repeat(40)] };
  const book = new TicketBook(settings);

  for (const policy of ['round_robin', 'hybrid'] as const) {
    it(`places new clients evenly on a ${policy} route though each comes back with its ticket (a ticket holder's request takes no turn)`, async () => {
      const nodes = await startNodes(`sp-${policy}-a`, `sp-${policy}-b`);
      const door = await ticketDoor(nodes, '/live/*', policy, settings);
      try {
        const placed = new Map<string, number>();
        // Seed 004's client: placed, then its next request carries the ticket; clients in turn.
        for (let c = 0; c < 20; c++) {
          const first = await call(`${door.url}/live/lease`);
          const node = String(first.headers['x-lakefront-served-by']);
          placed.set(node, (placed.get(node) ?? 0) + 1);
          const again = await call(`${door.url}/live/lease`, { headers: { 'x-lakefront-affinity': String(first.headers['x-lakefront-affinity']) } });
          assert.equal(again.headers['x-lakefront-served-by'], node);
          // A look at the ranking takes no turn either.
          assert.equal((await call(`${door.url}/route?board=any&route=${encodeURIComponent('/live/*')}`)).status, 200);
        }
        assert.deepEqual([...placed.values()], [10, 10], `placed: ${JSON.stringify([...placed])}`);
      } finally {
        await door.stop();
        await Promise.all(nodes.map((n) => n.stop()));
      }
    });
  }

  it('re-places a stale ticket on the same boltzmann sibling while its node is out and after a reload removed it', async () => {
    const nodes = await startNodes('rl-a', 'rl-b', 'rl-c', 'rl-d');
    const config = (members: readonly FakeNode[]): FrontDoorConfig => ({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      // A warm temperature: every member stays placeable, so only the reload can move a client.
      clusters: [{ name: 'default', members: members.map((n) => ({ id: n.id, url: n.url })), policySettings: { temperatureMs: 1_000_000 } }],
      routes: [{ pattern: '/live/*', cluster: 'default', policy: 'boltzmann', keyHeader: null, affinity: settings }],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({ hedgeMode: 'off' }),
    });
    let door = await FrontDoor.start(config(nodes));
    try {
      const tickets = Array.from({ length: 24 }, (_, i) => new TicketBook(settings, () => Date.now() - i * 1000).mint('rl-a'));
      const place = async (): Promise<string[]> => {
        const out: string[] = [];
        for (const ticket of tickets) out.push(String((await call(`${door.url}/live/x`, { headers: { 'x-lakefront-affinity': ticket } })).headers['x-lakefront-served-by']));
        return out;
      };
      nodes[0]!.healthy = false;
      await door.memberships[0]!.probeOnce();
      const whileOut = await place();
      assert.ok(!whileOut.includes('rl-a'));
      door = await door.reload(config(nodes.slice(1)));
      const afterReload = await place();
      assert.deepEqual(afterReload, whileOut, 'each client keeps the sibling it was re-placed on');
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });

  it('does not hedge a request whose valid ticket names a node no longer in the cluster (a keyed route)', async () => {
    const nodes = await startNodes('hg-a', 'hg-b', 'hg-c');
    const door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 1,
      clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [{ pattern: '/live/*', cluster: 'default', policy: 'rendezvous', keyHeader: 'x-board', affinity: settings }],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({ hedgeMode: 'fixed', hedgeDelayMs: 20 }),
    });
    try {
      const home = String((await call(`${door.url}/live/x`, { headers: { 'x-board': 'board-1' } })).headers['x-lakefront-served-by']);
      nodes.find((n) => n.id === home)!.behaviour = { kind: 'answer', delayMs: 200 };
      // A ticket for a node a reload took out of the cluster: placed by its key, as its socket is.
      const reply = await call(`${door.url}/live/x`, { headers: { 'x-board': 'board-1', 'x-lakefront-affinity': book.mint('hg-gone') } });
      assert.equal(reply.headers['x-lakefront-hedged'], '0');
      assert.equal(reply.headers['x-lakefront-served-by'], home);
      assert.equal('node' in book.check(String(reply.headers['x-lakefront-affinity'])) && (book.check(String(reply.headers['x-lakefront-affinity'])) as { node: string }).node, home);
    } finally {
      await door.stop();
      await Promise.all(nodes.map((n) => n.stop()));
    }
  });
});
