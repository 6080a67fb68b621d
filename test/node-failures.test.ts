/**
 * The core promise under real node failures: every request gets an answer, and a bare write is
 * never sent twice. Three nodes in their own processes behind the command's front door (2
 * threads); a mixed load runs while one node is SIGKILLed and then started again on its port.
 */
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { EventEmitter, once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { after, describe, it } from 'node:test';
import { call, waitForLine, type Reply } from './fixtures/http.js';

const CLI = fileURLToPath(new URL('../src/cli.js', import.meta.url));
const NODE = fileURLToPath(new URL('./fixtures/counting-node.js', import.meta.url));

/** Every request id each node printed, as `node method`, across its lives. */
const received = new Map<string, string[]>();
const children: ChildProcess[] = [];

async function startNode(id: string, port = 0): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, [NODE, id, String(port)], { stdio: ['ignore', 'pipe', 'inherit'] });
  children.push(child);
  let buffered = '';
  const listening = new Promise<number>((resolve, reject) => {
    child.once('exit', () => reject(new Error(`node ${id} exited before it listened`)));
    child.stdout!.on('data', (chunk: Buffer) => {
      buffered += chunk.toString();
      let end: number;
      while ((end = buffered.indexOf('\n')) >= 0) {
        const [kind, method, rid] = buffered.slice(0, end).split(' ');
        buffered = buffered.slice(end + 1);
        if (kind === 'listening') resolve(Number(method));
        else if (kind === 'R') received.set(rid!, [...(received.get(rid!) ?? []), `${id} ${method}`]);
      }
    });
  });
  return { child, port: await listening };
}

async function healthy(url: string): Promise<string[]> {
  return (await call(`${url}/health`)).json<{ healthy: string[] }>().healthy;
}

describe('node failures under load (real node processes)', () => {
  after(() => {
    for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
  });

  it('a node SIGKILLed mid-load and started again on its port: every request answered once, no bare write sent twice, and the node serves again', async () => {
    const ids = ['k-a', 'k-b', 'k-c'];
    const nodes = await Promise.all(ids.map((id) => startNode(id)));
    const front = spawn(process.execPath, [
      CLI, '--port', '0', '--host', '127.0.0.1', '--threads', '2',
      '--nodes', ids.map((id, i) => `${id}=http://127.0.0.1:${nodes[i]!.port}`).join(','),
      '--health-interval-ms', '100', '--unreachable-hold-ms', '300', '--eject-ms', '1000',
    ], { stdio: ['ignore', 'pipe', 'inherit'] });
    children.push(front);
    const [, url] = await waitForLine(front, /listening on (http:\/\/127\.0\.0\.1:\d+)/);

    const total = 1_500;
    const results: { rid: string; method: string; reply: Reply }[] = [];
    let next = 0;
    const finished = { count: 0, event: new EventEmitter() };
    const reached = (n: number): Promise<void> =>
      finished.count >= n ? Promise.resolve() : new Promise((resolve) => {
        const check = (): void => { if (finished.count >= n) { finished.event.off('done', check); resolve(); } };
        finished.event.on('done', check);
      });
    const client = async (): Promise<void> => {
      while (next < total) {
        const i = next++;
        const method = i % 10 < 7 ? 'GET' : 'POST';
        const rid = `req-${i}`;
        const reply = await call(`${url}/rpc/${method === 'GET' ? 'board.read' : 'board.append'}`, {
          method,
          headers: { 'x-req-id': rid, 'x-lakefront-board': `board-${(i * 7919) % 1009}`, 'content-type': 'application/json' },
          body: method === 'POST' ? `{"rid":"${rid}"}` : undefined,
        });
        results.push({ rid, method, reply });
        finished.count++;
        finished.event.emit('done');
      }
    };
    const chaos = async (): Promise<void> => {
      await reached(total / 5);
      const killed = nodes[1]!;
      killed.child.kill('SIGKILL');
      await once(killed.child.stdout!, 'end'); // every line it printed is in
      await reached(total / 2);
      await startNode('k-b', killed.port);
    };
    await Promise.all([chaos(), ...Array.from({ length: 32 }, client)]);

    assert.equal(results.length, total);
    for (const { rid, method, reply } of results) {
      const reachedNodes = received.get(rid) ?? [];
      if (reply.status >= 200 && reply.status < 300) {
        assert.equal(reply.json<{ rid: string }>().rid, rid, `${rid}: its own answer`);
        assert.ok(reachedNodes.includes(`${reply.headers['x-lakefront-served-by']} ${method}`), `${rid}: served by a node that got it`);
        if (method === 'POST') assert.equal(reachedNodes.length, 1, `${rid}: a bare write answered ${reply.status} reached ${reachedNodes.join(', ')}`);
        continue;
      }
      // The front door's own answer: a documented code, with its reason.
      const body = reply.json<{ code: string; error: string }>();
      assert.ok(body.error, `${rid}: ${reply.status} says why: ${reply.text}`);
      const expected: Record<string, number> = method === 'GET'
        ? { LF_ERR_ALL_CANDIDATES_FAILED: 502, LF_ERR_NO_HEALTHY_NODE: 503 }
        : { LF_ERR_OUTCOME_UNKNOWN: 502, LF_ERR_NOT_SENT: 503, LF_ERR_NO_HEALTHY_NODE: 503 };
      assert.equal(reply.status, expected[body.code], `${rid} ${method}: ${reply.status} ${reply.text}`);
      if (body.code === 'LF_ERR_OUTCOME_UNKNOWN') assert.ok(reachedNodes.length <= 1, `${rid}: a bare write reached ${reachedNodes.join(', ')}`);
      else if (method === 'POST') assert.deepEqual(reachedNodes, [], `${rid}: answered ${body.code}, yet reached a node`);
    }
    for (const [rid, got] of received) {
      if (got.some((g) => g.endsWith(' POST'))) assert.equal(got.length, 1, `${rid}: a bare write reached ${got.join(', ')}`);
    }

    // The restarted node is back in the rankings, and its boards are served by it again.
    while (!(await healthy(url!)).includes('k-b')) await new Promise((resolve) => setTimeout(resolve, 20));
    let board = '';
    for (let i = 0; board === ''; i++) {
      const ranking = (await call(`${url}/route?board=back-${i}`)).json<{ ranking: { id: string }[] }>().ranking;
      if (ranking[0]!.id === 'k-b') board = `back-${i}`;
    }
    const back = await call(`${url}/rpc/board.read`, { headers: { 'x-req-id': 'back', 'x-lakefront-board': board } });
    assert.equal(back.status, 200);
    assert.equal(back.headers['x-lakefront-served-by'], 'k-b');

    front.kill('SIGTERM');
    assert.deepEqual(await once(front, 'exit'), [0, null]);
  });
});
