/**
 * A buffer with views of its first n bytes made once per length: the request path hands out
 * a view of a per-thread scratch buffer for every write, and the lengths repeat.
 */
import { Buffer } from 'node:buffer';

/** Views are kept for lengths up to this; longer ones are made per call. */
const KEPT_UP_TO = 4096;

export class PrefixViews {
  private readonly views: (Buffer | undefined)[] = [];

  constructor(readonly buf: Buffer) {}

  /** `buf.subarray(0, n)`, made once per length up to 4 KiB. */
  of(n: number): Buffer {
    return n <= KEPT_UP_TO ? (this.views[n] ??= this.buf.subarray(0, n)) : this.buf.subarray(0, n);
  }
}
