/**
 * Response header fields as offsets into one buffer.
 *
 * The h1 client parses a response head in place and reports its fields as offsets into the bytes
 * it read, rather than as a Buffer per name and value: no allocation per field, and the front
 * door copies the fields it relays straight into its response. Views are valid only during the
 * callback that hands them over (the bytes may be a per-thread read buffer).
 */

import { Buffer } from 'node:buffer';

const EMPTY = Buffer.alloc(0);

/** Case-insensitive compare of raw bytes `buf[start, end)` against a lower-case ASCII name. */
export function nameIs(buf: Uint8Array, start: number, end: number, lower: string): boolean {
  if (end - start !== lower.length) return false;
  for (let i = 0; i < lower.length; i++) {
    const c = buf[start + i]!;
    if ((c >= 65 && c <= 90 ? c | 0x20 : c) !== lower.charCodeAt(i)) return false;
  }
  return true;
}

/** Parses a non-negative decimal from `buf[start, end)`; -1 if the bytes are not one. */
export function parseDecimal(buf: Uint8Array, start: number, end: number): number {
  if (start >= end) return -1;
  let n = 0;
  for (let i = start; i < end; i++) {
    const c = buf[i]! - 48;
    if (c < 0 || c > 9) return -1;
    n = n * 10 + c;
    if (n > Number.MAX_SAFE_INTEGER) return -1;
  }
  return n;
}

/**
 * Where the first element of a content-length list `buf[start, end)` ends, when the list repeats
 * one decimal value (`42, 42`: RFC 9110 8.6's duplicate lines an upstream processor combined,
 * taken as one, as two lines of one value are); -1 if it is not such a list.
 */
export function repeatedLengthEnd(buf: Uint8Array, start: number, end: number): number {
  let first = -1;
  let value = -1;
  for (let at = start; at <= end; ) {
    let comma = at;
    while (comma < end && buf[comma] !== 0x2c) comma++;
    let s = at;
    let e = comma;
    while (s < e && (buf[s] === 0x20 || buf[s] === 0x09)) s++;
    while (e > s && (buf[e - 1] === 0x20 || buf[e - 1] === 0x09)) e--;
    const n = parseDecimal(buf, s, e);
    if (n < 0 || (value >= 0 && n !== value)) return -1;
    if (value < 0) first = e;
    value = n;
    at = comma + 1;
  }
  return first;
}

export class HeaderFields {
  /** The bytes the offsets index. */
  buf: Buffer = EMPTY;
  /** Per field, four entries: name start, name end, value start, value end (value trimmed). */
  offsets = new Int32Array(64);
  count = 0;

  /** Forget every field; offsets will index `buf`. */
  reset(buf: Buffer): void {
    this.buf = buf;
    this.count = 0;
  }

  push(nameStart: number, nameEnd: number, valueStart: number, valueEnd: number): void {
    let o = this.offsets;
    const at = this.count * 4;
    if (at + 4 > o.length) {
      const grown = new Int32Array(o.length * 2);
      grown.set(o);
      this.offsets = o = grown;
    }
    o[at] = nameStart;
    o[at + 1] = nameEnd;
    o[at + 2] = valueStart;
    o[at + 3] = valueEnd;
    this.count++;
  }

  /**
   * Copies the bytes the fields use out of `buf` (a shared read buffer about to be reused) into
   * a buffer of their own, and rebases the offsets.
   */
  own(): void {
    if (this.count === 0) {
      this.buf = EMPTY;
      return;
    }
    const o = this.offsets;
    const n = this.count * 4;
    let low = o[0]!;
    let high = o[3]!;
    for (let i = 0; i < n; i += 4) {
      if (o[i]! < low) low = o[i]!;
      if (o[i + 3]! > high) high = o[i + 3]!;
    }
    this.buf = Buffer.from(this.buf.subarray(low, high));
    for (let i = 0; i < n; i++) o[i] = o[i]! - low;
  }

  /** A copy that owns its bytes, for an answer kept past its callback. */
  clone(): HeaderFields {
    const copy = new HeaderFields();
    copy.offsets = this.offsets.slice(0, Math.max(4, this.count * 4));
    copy.count = this.count;
    copy.buf = this.buf;
    copy.own(); // always copies the bytes the fields use
    return copy;
  }

  /** The value of the first field named `lower` (latin1), or null. */
  find(lower: string): string | null {
    const o = this.offsets;
    for (let i = 0; i < this.count * 4; i += 4) {
      if (nameIs(this.buf, o[i]!, o[i + 1]!, lower)) return this.buf.toString('latin1', o[i + 2]!, o[i + 3]!);
    }
    return null;
  }

  nameIs(field: number, lower: string): boolean {
    return nameIs(this.buf, this.offsets[field * 4]!, this.offsets[field * 4 + 1]!, lower);
  }

  /** Every field as [name, value] strings (latin1 keeps the bytes), for tests and diagnostics. */
  pairs(encoding: BufferEncoding = 'latin1'): [string, string][] {
    const o = this.offsets;
    const out: [string, string][] = [];
    for (let i = 0; i < this.count * 4; i += 4) {
      out.push([this.buf.toString(encoding, o[i]!, o[i + 1]!), this.buf.toString(encoding, o[i + 2]!, o[i + 3]!)]);
    }
    return out;
  }

  /** Forgets every field whose name (lower case) is in `names`, keeping the others in order. */
  dropNamed(names: readonly string[]): void {
    const o = this.offsets;
    let kept = 0;
    for (let i = 0; i < this.count * 4; i += 4) {
      const ns = o[i]!;
      const ne = o[i + 1]!;
      if (names.some((name) => name.length === ne - ns && nameIs(this.buf, ns, ne, name))) continue;
      if (kept !== i) o.copyWithin(kept, i, i + 4);
      kept += 4;
    }
    this.count = kept / 4;
  }

  /** From [name, value, ...] buffers (undici's raw headers): one copy into a buffer of its own. */
  static fromRaw(raw: readonly Buffer[] | null): HeaderFields {
    const fields = new HeaderFields();
    if (raw === null || raw.length < 2) return fields;
    let size = 0;
    for (const part of raw) size += part.length;
    const buf = Buffer.allocUnsafe(size);
    fields.reset(buf);
    let at = 0;
    for (let i = 0; i + 1 < raw.length; i += 2) {
      const name = raw[i]!;
      const value = raw[i + 1]!;
      name.copy(buf, at);
      value.copy(buf, at + name.length);
      fields.push(at, at + name.length, at + name.length, at + name.length + value.length);
      at += name.length + value.length;
    }
    // Every connection line, as the h1 client reads them: a first `keep-alive` line hid the names
    // on later ones, which reached the client.
    let named: string[] | null = null;
    const o = fields.offsets;
    for (let i = 0; i < fields.count; i++) {
      if (!fields.nameIs(i, 'connection')) continue;
      const listed = connectionNamed(buf.toString('latin1', o[i * 4 + 2]!, o[i * 4 + 3]!));
      if (listed !== null) (named ??= []).push(...listed);
    }
    if (named !== null) fields.dropNamed(named);
    return fields;
  }
}

/**
 * The header names a `connection` field lists for its own hop (RFC 9110 7.6.1: a proxy does not
 * forward them), lower case; null when it lists none but `close` and `keep-alive` (nearly always).
 */
export function connectionNamed(value: string): string[] | null {
  if (value === 'keep-alive' || value === 'close' || value === 'Keep-Alive' || value === 'Close') return null;
  let named: string[] | null = null;
  for (const token of value.split(',')) {
    const name = token.trim().toLowerCase();
    if (name !== '' && name !== 'close' && name !== 'keep-alive') (named ??= []).push(name);
  }
  return named;
}

/** Whether a transfer-encoding list is exactly `chunked` (any case, no other coding). */
export function isChunkedOnly(codings: string): boolean {
  return codings.trim().toLowerCase() === 'chunked';
}
