/**
 * The relayed head of a node's answer (server/relay.ts): the node's own lines pass byte for byte,
 * but not the ones the front door writes itself.
 */
import assert from 'node:assert/strict';
import { Buffer } from 'node:buffer';
import { describe, it } from 'node:test';
import type { HttpResponse } from 'uWebSockets.js';
import { HeaderFields } from '../src/forward/fields.js';
import { writeRelayedHeaders } from '../src/server/relay.js';

/** Fields as the h1 client reports them, from `name: value` lines. */
function fields(lines: string[]): HeaderFields {
  const buf = Buffer.from(lines.join(''), 'latin1');
  const out = new HeaderFields();
  out.reset(buf);
  let at = 0;
  for (const line of lines) {
    const colon = line.indexOf(':');
    out.push(at, at + colon, at + colon + 2, at + line.length);
    at += line.length;
  }
  return out;
}

/** The header block writeRelayedHeaders hands uWS (one writeHeader call), as text. */
function relayed(f: HeaderFields, head = false): string {
  let text = '';
  const res = {
    writeHeader(key: ArrayBuffer | string, value: Uint8Array | string) {
      text += `${typeof key === 'string' ? key : Buffer.from(key).toString('latin1')}: ${typeof value === 'string' ? value : Buffer.from(value).toString('latin1')}\r\n`;
      return res;
    },
  } as unknown as HttpResponse;
  writeRelayedHeaders(res, f, Buffer.from('a\r\nx-lakefront-hedged: 0\r\n'), head);
  return text;
}

describe('relayed answer heads', () => {
  it('drop a node\'s own lines of the front door\'s headers: served-by, hedged, and a replicated answer\'s acks', () => {
    const text = relayed(fields(['x-lakefront-served-by: evil', 'x-lakefront-hedged: 1', 'x-lakefront-acks: 3/3', 'set-cookie: a=1', 'set-cookie: b=2']));
    assert.equal(text, 'x-lakefront-served-by: a\r\nx-lakefront-hedged: 0\r\nset-cookie: a=1\r\nset-cookie: b=2\r\n');
  });
});
