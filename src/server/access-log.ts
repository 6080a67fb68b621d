/**
 * The access log (`--access-log`): one JSON line for each request a route took (proxied, or
 * refused by the front door) and for each path no route takes. Every worker thread writes the
 * same file, opened for appending (a write lands whole at the end), or standard output (`-`).
 * Lines are batched in the thread and written off the event loop, at most FLUSH_MS after they
 * were made or as soon as BATCH_BYTES wait, so the request path never waits on the disk; a
 * worker's stop writes what is left before it ends. A line holds no header, no query string and
 * no routing key: nothing secret.
 */
import { closeSync, fstatSync, openSync, write, writeSync } from 'node:fs';

/** `--access-log -`: standard output. */
export const STDOUT = '-';
const FLUSH_MS = 100;
/**
 * Lines written in one call at most, in bytes. Standard output may be a pipe, where a write of
 * up to PIPE_BUF (4096 on Linux) lands whole: lines of two threads never interleave there.
 */
const PIPE_BATCH_BYTES = 4096;
const FILE_BATCH_BYTES = 64 * 1024;
/** A full pipe (EAGAIN): try again after this long. */
const RETRY_MS = 10;
/** Lines waiting beyond this (the output does not take them) are dropped, and counted. */
const MAX_QUEUED_BYTES = 8 * 1024 * 1024;
/** How long a stop waits for an output that takes nothing. */
const CLOSE_WAIT_MS = 1_000;

/**
 * A string as JSON, every character past ASCII escaped: a line's length in characters is its
 * length in bytes (the batches' sizes are counted so).
 */
export function asciiJson(text: string): string {
  const json = JSON.stringify(text);
  return NON_ASCII.test(json) ? json.replace(NON_ASCII_ALL, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`) : json;
}
const NON_ASCII = /[^\x00-\x7f]/;
const NON_ASCII_ALL = /[^\x00-\x7f]/g;

/** Opens `path` for appending (created if missing): throws with the reason it cannot. */
export function openAccessLog(path: string): number {
  return path === STDOUT ? 1 : openSync(path, 'a', 0o640);
}

export class AccessLog {
  private fd: number;
  /**
   * Lines are laid out as they come, each with its newline, in a batch buffer (the line's string
   * dies young: kept as strings until a write, they would live on into the old generation). Full
   * batches wait in `queue` for the write under way.
   */
  private current: Buffer;
  private used = 0;
  private readonly queue: Buffer[] = [];
  /** Bytes waiting: the queue's and the current batch's. */
  private waiting = 0;
  private writing = false;
  private timer: NodeJS.Timeout | null = null;
  private reopenWanted = false;
  private closed = false;
  /** The close gave up on a write that could not go on (a reader that stopped reading). */
  private abandoned = false;
  private idle: (() => void) | null = null;
  /** Lines dropped since the last report (the queue was full: the output is not being read). */
  private dropped = 0;
  private readonly batchBytes: number;
  /** A regular file (not a pipe): a synchronous write to it cannot wait for a reader. */
  private regular: boolean;

  constructor(
    readonly path: string,
    private readonly report: (message: string) => void,
  ) {
    this.fd = openAccessLog(path);
    this.regular = fstatSync(this.fd).isFile();
    this.batchBytes = path === STDOUT ? PIPE_BATCH_BYTES : FILE_BATCH_BYTES;
    this.current = Buffer.allocUnsafeSlow(this.batchBytes);
  }

  /**
   * Adds one line (JSON, without its newline; ASCII, as `asciiJson` makes it, so characters
   * count bytes); written within FLUSH_MS. With MAX_QUEUED_BYTES waiting (nothing reads the
   * output) it is dropped, and counted.
   */
  add(line: string): void {
    if (this.closed) return;
    const size = line.length + 1;
    if (this.waiting + size > MAX_QUEUED_BYTES) {
      if (this.dropped++ === 0) this.report(`access log ${this.path}: ${MAX_QUEUED_BYTES} bytes of lines wait for the output; lines are dropped until it takes them (counted)`);
      return;
    }
    this.waiting += size;
    if (size > this.current.length - this.used) {
      this.seal();
      // A line longer than a batch goes alone.
      if (size > this.current.length) this.queue.push(Buffer.from(`${line}\n`, 'latin1'));
    }
    if (size <= this.current.length) {
      this.used += this.current.write(line, this.used, 'latin1');
      this.current[this.used++] = 10;
    }
    if (this.queue.length > 0) this.flush();
    else if (this.timer === null) this.timer = setTimeout(this.onTimer, FLUSH_MS).unref();
  }

  /**
   * Opens the file again, for log rotation (`SIGUSR1`): the lines waiting go to the file open
   * until now (at once, or with the write under way), the lines after to whatever is at the path
   * now. If it cannot be opened, logging goes on to the file open before (said).
   */
  reopen(): void {
    if (this.path === STDOUT || this.closed) return;
    this.reopenWanted = true;
    if (this.writing) return;
    this.clearTimer();
    // Into the file open until now: at once if it is a file (a pipe, by its path, could block).
    if (this.regular) this.writeAllSync();
    this.swapFile();
  }

  /**
   * Writes what is left and closes the file (a worker's stop). An output that takes nothing for
   * CLOSE_WAIT_MS (a pipe nobody reads) does not hold the stop: what it did not take is dropped,
   * and said.
   */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.clearTimer();
    const deadline = Date.now() + CLOSE_WAIT_MS;
    while (this.writing || this.waiting > 0) {
      if (!this.writing) this.writeBuffer(this.take()!);
      const left = deadline - Date.now();
      if (left <= 0 || !(await this.whenIdle(left))) {
        this.abandoned = true;
        this.drop();
        this.report(`access log ${this.path}: the output took nothing for ${CLOSE_WAIT_MS} ms; the lines still waiting were dropped`);
        break;
      }
    }
    this.reportDropped();
    // A write still under way (given up on) keeps its descriptor.
    if (this.fd !== 1 && !this.abandoned) closeSync(this.fd);
  }

  /**
   * A dying thread's last resort: whatever is waiting, written now, to a file or standard output
   * (non-blocking there: a full pipe is waited for, up to CLOSE_WAIT_MS); a pipe opened by its
   * path could block the thread for good, so what waits for one is dropped (and said).
   */
  closeNow(): void {
    if (this.closed) return;
    this.closed = true;
    this.clearTimer();
    if (this.regular || this.path === STDOUT) this.writeAllSync();
    else if (this.waiting > 0) {
      this.drop();
      this.report(`access log ${this.path}: the lines still waiting were dropped (the thread ended)`);
    }
    this.reportDropped();
  }

  /** Resolves true once no write is under way, false after `ms` with one still under way. */
  private whenIdle(ms: number): Promise<boolean> {
    if (!this.writing) return Promise.resolve(true);
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.idle = null;
        resolve(false);
      }, ms);
      this.idle = () => {
        clearTimeout(timer);
        this.idle = null;
        resolve(true);
      };
    });
  }

  private reportDropped(): void {
    if (this.dropped > 0) this.report(`access log ${this.path}: ${this.dropped} line(s) were dropped while the output did not take them`);
    this.dropped = 0;
  }

  private readonly onTimer = (): void => {
    this.timer = null;
    this.flush();
  };

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }

  private flush(): void {
    this.clearTimer();
    if (this.writing || this.waiting === 0) return;
    this.writeBuffer(this.take()!);
  }

  /** The current batch, if it holds lines, into the queue; a fresh one takes its place. */
  private seal(): void {
    if (this.used === 0) return;
    this.queue.push(this.current.subarray(0, this.used));
    this.current = Buffer.allocUnsafeSlow(this.batchBytes);
    this.used = 0;
  }

  /** The oldest batch waiting (whole lines), or null. */
  private take(): Buffer | null {
    if (this.queue.length === 0) this.seal();
    const batch = this.queue.shift();
    if (batch === undefined) return null;
    this.waiting -= batch.length;
    return batch;
  }

  /** Forgets every line waiting. */
  private drop(): void {
    this.queue.length = 0;
    this.used = 0;
    this.waiting = 0;
  }

  private writeBuffer(buffer: Buffer): void {
    this.writing = true;
    write(this.fd, buffer, 0, buffer.length, null, (err, written) => {
      if (this.abandoned) return;
      // Standard output is non-blocking when it is a pipe: a full one is tried again shortly.
      if (err && (err as NodeJS.ErrnoException).code === 'EAGAIN') {
        setTimeout(() => this.writeBuffer(buffer), RETRY_MS).unref();
        return;
      }
      if (err) this.report(`access log ${this.path}: ${err.message} (lines were lost)`);
      else if (written < buffer.length) {
        this.writeBuffer(buffer.subarray(written));
        return;
      }
      this.writing = false;
      if (this.reopenWanted) this.swapFile();
      if (this.idle !== null) {
        this.idle();
        return;
      }
      if (this.dropped > 0 && this.waiting < MAX_QUEUED_BYTES / 2) this.reportDropped();
      if (this.queue.length > 0) this.flush();
      else if (this.waiting > 0 && this.timer === null) this.timer = setTimeout(this.onTimer, FLUSH_MS).unref();
    });
  }

  private swapFile(): void {
    this.reopenWanted = false;
    let fd: number;
    try {
      fd = openAccessLog(this.path);
    } catch (err) {
      this.report(`access log ${this.path}: cannot open it again (${(err as Error).message}); still writing to the file open before`);
      return;
    }
    const old = this.fd;
    this.fd = fd;
    this.regular = fstatSync(fd).isFile();
    closeSync(old);
  }

  /** Writes every waiting line now; a full pipe is waited for, up to CLOSE_WAIT_MS in all. */
  private writeAllSync(): void {
    const deadline = Date.now() + CLOSE_WAIT_MS;
    for (let buffer = this.take(); buffer !== null; buffer = this.take()) {
      for (let at = 0; at < buffer.length; ) {
        try {
          at += writeSync(this.fd, buffer, at);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() >= deadline) {
            this.report(`access log ${this.path}: ${(err as Error).message} (lines were lost)`);
            this.drop();
            return;
          }
          Atomics.wait(PAUSE, 0, 0, 1);
        }
      }
    }
  }
}

/** Waited on (never woken) to pause a thread for a millisecond between tries at a full pipe. */
const PAUSE = new Int32Array(new SharedArrayBuffer(4));
