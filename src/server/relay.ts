/**
 * Writing a proxied answer's head into a uWS response with as few calls into native code as it
 * takes: the status line from a table of pre-encoded lines, and every relayed header line in one
 * `writeHeader` call.
 *
 * uWS writes `writeHeader(key, value)` as `key: value\r\n`, byte for byte. So the front door's
 * own lines come first, as key = `x-lakefront-served-by` and a value laid out in one scratch
 * buffer: the node's id, CRLF, the hedged line, then every relayed `name: value\r\n` line, up to
 * (not including) the last CRLF. The relayed bytes are the node's own (the h1 client rejects a
 * bare CR or LF in a head, llhttp does for undici), minus the headers the front door does not
 * relay. One call, one view allocated.
 */
import { Buffer } from 'node:buffer';
import { STATUS_CODES } from 'node:http';
import type { HttpResponse } from 'uWebSockets.js';
import { HEDGED_HEADER, SERVED_BY_HEADER } from '../contract.js';
import { nameIs, type HeaderFields } from '../forward/fields.js';
import { PrefixViews } from '../forward/prefix-views.js';
import { ACKS_HEADER } from '../replication/quorum.js';

const STATUS_BYTES: (Buffer | undefined)[] = [];

/** `200 OK` and the like, encoded once per status. An unknown status gets an empty reason. */
export function statusBytes(status: number): Buffer {
  let line = STATUS_BYTES[status];
  if (line === undefined) STATUS_BYTES[status] = line = Buffer.from(`${status} ${STATUS_CODES[status] ?? ''}`, 'latin1');
  return line;
}

/**
 * Response headers the front door does not relay: hop-by-hop ones, those uWS writes itself
 * (`date`, `content-length`, and its mark `uWebSockets: 20`: a node on uWS sends one too), which
 * would otherwise be duplicated, and its own (served-by, hedged, and a replicated answer's acks).
 */
export function isDroppedResponseHeader(buf: Uint8Array, start: number, end: number): boolean {
  switch (end - start) {
    case 2:
      return nameIs(buf, start, end, 'te');
    case 4:
      return nameIs(buf, start, end, 'date');
    case 7:
      return nameIs(buf, start, end, 'upgrade') || nameIs(buf, start, end, 'trailer');
    case 10:
      return nameIs(buf, start, end, 'connection') || nameIs(buf, start, end, 'keep-alive');
    case 11:
      return nameIs(buf, start, end, 'uwebsockets');
    case 14:
      return nameIs(buf, start, end, 'content-length');
    case 16:
      // The front door's own count of a replicated answer's acknowledgements: a node's line of
      // that name went out beside it (`x-lakefront-acks: 1/1` and the node's `3/3`).
      return nameIs(buf, start, end, 'proxy-connection') || nameIs(buf, start, end, ACKS_HEADER);
    case 17:
      return nameIs(buf, start, end, 'transfer-encoding');
    case 18:
      return nameIs(buf, start, end, HEDGED_HEADER);
    case 21:
      return nameIs(buf, start, end, SERVED_BY_HEADER);
    default:
      return false;
  }
}

/** An ArrayBuffer of exactly the name's bytes: uWS reads one without asking a view for its buffer. */
const SERVED_BY_KEY: ArrayBuffer = new Uint8Array(Buffer.from(SERVED_BY_HEADER, 'latin1')).slice().buffer;

/**
 * The front door's own lines for an answer served by a node, as they follow the served-by key:
 * `id\r\nx-lakefront-hedged: 0|1\r\n`. Index `2 * node + (hedged ? 1 : 0)`; built once per cluster.
 */
export function answerLines(ids: readonly string[]): Buffer[] {
  const lines: Buffer[] = [];
  for (const id of ids) {
    for (const hedged of ['0', '1']) lines.push(Buffer.from(`${id}\r\n${HEDGED_HEADER}: ${hedged}\r\n`, 'utf8'));
  }
  return lines;
}

/** Per-thread scratch for the header block; grown when a head needs more. */
let scratch = new PrefixViews(Buffer.allocUnsafe(16 * 1024));

/**
 * Writes the front door's `own` lines (from {@link answerLines}) and the relayed fields as header
 * lines of `res`, in one call. For a HEAD answer (`head`; not a 204, which has none) the node's
 * content-length is relayed as a line too: the answer then ends with `endWithoutBody()` and no argument (uWS 20.30 leaves a
 * response given a length there unfinished, and the connection dies with the next request).
 * `drop`: one more name not relayed.
 */
export function writeRelayedHeaders(res: HttpResponse, fields: HeaderFields | null, own: Buffer, head: boolean, drop: string | null = null): void {
  let need = own.length;
  const count = fields === null ? 0 : fields.count;
  const o = fields === null ? null : fields.offsets;
  const src = fields === null ? own : fields.buf;
  for (let i = 0; i < count * 4; i += 4) need += o![i + 1]! - o![i]! + o![i + 3]! - o![i + 2]! + 4;
  if (need > scratch.buf.length) scratch = new PrefixViews(Buffer.allocUnsafe(need * 2));
  const out = scratch.buf;
  let at = 0;
  for (let k = 0; k < own.length; k++) out[at++] = own[k]!;
  for (let i = 0; i < count * 4; i += 4) {
    const ns = o![i]!;
    const ne = o![i + 1]!;
    if (isDroppedResponseHeader(src, ns, ne) && !(head && nameIs(src, ns, ne, 'content-length'))) continue;
    // The route's affinity ticket header is the front door's to write.
    if (drop !== null && ne - ns === drop.length && nameIs(src, ns, ne, drop)) continue;
    for (let k = ns; k < ne; k++) out[at++] = src[k]!;
    out[at++] = 0x3a;
    out[at++] = 0x20;
    const ve = o![i + 3]!;
    for (let k = o![i + 2]!; k < ve; k++) out[at++] = src[k]!;
    out[at++] = 0x0d;
    out[at++] = 0x0a;
  }
  res.writeHeader(SERVED_BY_KEY, scratch.of(at - 2));
}
