/**
 * Writing a proxied answer's head into a uWS response with as few calls into native code as it
 * takes: the status line from a table of pre-encoded lines, and every relayed header line in one
 * `writeHeader` call.
 *
 * uWS writes `writeHeader(key, value)` as `key: value\r\n`, byte for byte. So the relayed lines
 * are laid out in one scratch buffer as `name: value\r\n...` and handed over as key = the first
 * name, value = everything after its `: ` up to the last CRLF. The bytes are the node's own
 * (the h1 client rejects a bare CR or LF in a head, llhttp does for undici), minus the headers the
 * front door does not relay, plus the front door's own lines (served-by, hedged).
 */
import { STATUS_CODES } from 'node:http';
import type { HttpResponse } from 'uWebSockets.js';
import { HEDGED_HEADER, SERVED_BY_HEADER } from '../contract.js';
import { nameIs, type HeaderFields } from '../forward/fields.js';

const STATUS_BYTES: (Buffer | undefined)[] = [];

/** `200 OK` and the like, encoded once per status. An unknown status gets an empty reason. */
export function statusBytes(status: number): Buffer {
  let line = STATUS_BYTES[status];
  if (line === undefined) STATUS_BYTES[status] = line = Buffer.from(`${status} ${STATUS_CODES[status] ?? ''}`, 'latin1');
  return line;
}

/**
 * Response headers the front door does not relay: hop-by-hop ones, those uWS writes itself
 * (`date`, `content-length`), which would otherwise be duplicated, and its own.
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
    case 14:
      return nameIs(buf, start, end, 'content-length');
    case 16:
      return nameIs(buf, start, end, 'proxy-connection');
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

/**
 * The front door's own lines for an answer served by a node: index `2 * node + (hedged ? 1 : 0)`.
 * Built once per cluster.
 */
export function answerTails(ids: readonly string[]): Buffer[] {
  const tails: Buffer[] = [];
  for (const id of ids) {
    for (const hedged of ['0', '1']) tails.push(Buffer.from(`${SERVED_BY_HEADER}: ${id}\r\n${HEDGED_HEADER}: ${hedged}\r\n`, 'utf8'));
  }
  return tails;
}

/** Per-thread scratch for the header block; grown when a head needs more. */
let scratch = Buffer.allocUnsafe(16 * 1024);

/**
 * Writes the relayed fields and `tail` (whole `name: value\r\n` lines) as header lines of `res`,
 * in one call. For a HEAD answer (`head`), returns the node's content-length (uWS must be told
 * it; it is not relayed as a line), else 0.
 */
export function writeRelayedHeaders(res: HttpResponse, fields: HeaderFields | null, tail: Buffer, head: boolean): number {
  let need = tail.length;
  const count = fields === null ? 0 : fields.count;
  const o = fields === null ? null : fields.offsets;
  const src = fields === null ? tail : fields.buf;
  for (let i = 0; i < count * 4; i += 4) need += o![i + 1]! - o![i]! + o![i + 3]! - o![i + 2]! + 4;
  if (need > scratch.length) scratch = Buffer.allocUnsafe(need * 2);
  const out = scratch;
  let at = 0;
  let keyEnd = -1;
  let declaredLength = 0;
  for (let i = 0; i < count * 4; i += 4) {
    const ns = o![i]!;
    const ne = o![i + 1]!;
    if (isDroppedResponseHeader(src, ns, ne)) {
      if (head && nameIs(src, ns, ne, 'content-length')) declaredLength = decimal(src, o![i + 2]!, o![i + 3]!);
      continue;
    }
    for (let k = ns; k < ne; k++) out[at++] = src[k]!;
    if (keyEnd < 0) keyEnd = at;
    out[at++] = 0x3a;
    out[at++] = 0x20;
    const ve = o![i + 3]!;
    for (let k = o![i + 2]!; k < ve; k++) out[at++] = src[k]!;
    out[at++] = 0x0d;
    out[at++] = 0x0a;
  }
  // No relayed line: the tail's first name (served-by) is the key.
  if (keyEnd < 0) keyEnd = at + SERVED_BY_HEADER.length;
  for (let k = 0; k < tail.length; k++) out[at++] = tail[k]!;
  res.writeHeader(out.subarray(0, keyEnd), out.subarray(keyEnd + 2, at - 2));
  return declaredLength;
}

function decimal(buf: Uint8Array, start: number, end: number): number {
  let n = 0;
  for (let i = start; i < end; i++) {
    const c = buf[i]! - 48;
    if (c < 0 || c > 9) return 0;
    n = n * 10 + c;
  }
  return n;
}
