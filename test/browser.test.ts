/**
 * A real browser (Debian's Chromium, driven by playwright-core) through the front door: a
 * WebSocket placed, handed its affinity ticket, and put back on the same node when it offers the
 * ticket as a subprotocol, as seed 004's clients do. Needs /usr/bin/chromium (.ci/run installs it).
 */
import assert from 'node:assert/strict';
import { after, before, describe, it } from 'node:test';
import { chromium, type Browser, type Page } from 'playwright-core';
import { defaultSettings } from '../src/server/settings.js';
import { FrontDoor } from '../src/server/supervisor.js';
import { WsNode } from './fixtures/ws-node.js';

const CHROMIUM = '/usr/bin/chromium';

interface Visit {
  readonly ticket: string;
  readonly protocol: string;
  readonly echo: string;
}

/** In the page: opens a socket offering `protocols`, reads the ticket, sends one echo, closes. */
function visit(page: Page, url: string, protocols: string[]): Promise<Visit> {
  return page.evaluate(
    ({ url, protocols }) =>
      new Promise<Visit>((resolve, reject) => {
        const ws = new WebSocket(url, protocols);
        let ticket = '';
        ws.onerror = () => reject(new Error(`the browser failed the WebSocket to ${url} offering ${JSON.stringify(protocols)}`));
        ws.onmessage = (event) => {
          if (ticket === '') {
            ticket = (JSON.parse(String(event.data)) as { ticket: string }).ticket;
            ws.send('hi');
            return;
          }
          resolve({ ticket, protocol: ws.protocol, echo: String(event.data) });
          ws.close(1000);
        };
      }),
    { url, protocols },
  );
}

/** In the page: whether the browser completes a handshake offering `protocols` to `url`. */
function opens(page: Page, url: string, protocols: string[]): Promise<boolean> {
  return page.evaluate(
    ({ url, protocols }) =>
      new Promise<boolean>((resolve) => {
        const ws = new WebSocket(url, protocols);
        ws.onopen = () => {
          resolve(true);
          ws.close(1000);
        };
        ws.onerror = () => resolve(false);
      }),
    { url, protocols },
  );
}

describe('a browser through the front door', () => {
  let nodes: WsNode[];
  let door: FrontDoor;
  let browser: Browser;
  let page: Page;
  before(async () => {
    nodes = await Promise.all(['br-1', 'br-2', 'br-3'].map((id) => new WsNode(id).start()));
    door = await FrontDoor.start({
      host: '127.0.0.1',
      port: 0,
      threads: 2,
      clusters: [{ name: 'default', members: nodes.map((n) => ({ id: n.id, url: n.url })) }],
      routes: [
        {
          pattern: '/live/*',
          cluster: 'default',
          policy: 'round_robin',
          keyHeader: null,
          affinity: { app: 'live', header: 'x-lakefront-affinity', ttlSeconds: 3600, generation: 0, keys: ['b'.repeat(40)] },
        },
      ],
      healthIntervalMs: 60_000,
      healthTimeoutMs: 500,
      settings: defaultSettings({}),
    });
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    });
    page = await browser.newPage();
  });
  after(async () => {
    await browser?.close();
    await door?.stop();
    await Promise.all((nodes ?? []).map((n) => n.stop()));
  });

  it('keeps a browser\'s socket on its node across reconnects, by the ticket offered as a subprotocol', async () => {
    const url = `${door.url.replace('http:', 'ws:')}/live/feed`;
    const first = await visit(page, url, []);
    const home = first.echo.split(':')[0]!;
    assert.match(home, /^br-[123]$/);
    const offer = `lakefront-affinity.${first.ticket}`;
    for (let i = 0; i < 4; i++) {
      const back = await visit(page, url, [offer]);
      assert.equal(back.echo, `${home}:hi`, 'the same node');
      assert.equal(back.protocol, offer, 'the browser accepted the ticket entry as the selected subprotocol');
    }
    const withApp = await visit(page, url, [offer, 'chat.v2']);
    assert.equal(withApp.echo, `${home}:hi`);
    assert.equal(withApp.protocol, 'chat.v2', "the node's choice");
    const placed = new Set<string>();
    for (let i = 0; i < 4; i++) placed.add((await visit(page, url, [])).echo.split(':')[0]!);
    assert.ok(placed.size > 1, 'without the ticket, round robin places each socket anew');
  });

  it('fails a handshake that selects none of its offer (why the ticket entry is selected)', async () => {
    // Straight to a node that picks no subprotocol from this offer: the browser refuses it.
    const direct = nodes[0]!.url.replace('http:', 'ws:');
    assert.equal(await opens(page, `${direct}/live/feed`, ['x.proto']), false);
    assert.equal(await opens(page, `${direct}/live/feed`, []), true, 'with nothing offered it opens');
  });
});
