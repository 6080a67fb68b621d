/**
 * The access log (`--access-log`): one JSON line for each request a route took (proxied, or
 * refused by the front door) and for each path no route takes. Every worker thread writes the
 * same file, opened for appending (a write lands whole at the end), or standard output (`-`).
 * Lines are batched in the thread and written off the event loop, at most FLUSH_MS after they
 * were made or as soon as a batch is full, so the request path never waits on the disk; a
 * worker's stop writes what is left before it ends. A line holds no header, no cookie and no
 * query string: nothing secret.
 */
import { closeSync, constants, fstatSync, openSync, write, writeSync } from 'node:fs';

/** `--access-log -`: standard output. */
const STDOUT = '-';
const FLUSH_MS = 100;
/**
 * Lines written in one call at most, in bytes: to a regular file, FILE_BATCH_BYTES (an append
 * lands whole); to anything else (standard output, a pipe), PIPE_BATCH_BYTES, as a write of up to
 * PIPE_BUF (4096 on Linux) lands whole in a pipe: lines of two threads never interleave there.
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

/**
 * Opens `path` for appending (created if missing): throws with the reason it cannot. Never
 * blocks: a named pipe is opened non-blocking (one with no reader fails, ENXIO), and its writes
 * are too (a full one says EAGAIN), so neither the thread nor a libuv pool thread waits on it.
 */
export function openAccessLog(path: string): number {
  return path === STDOUT ? 1 : openSync(path, constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NONBLOCK, 0o640);
}

export class AccessLog {
  private fd: number;
  /** The output is a regular file (else a pipe or a terminal: batches of PIPE_BATCH_BYTES). */
  private regular: boolean;
  private batchBytes: number;
  /**
   * Lines are laid out as they come, each with its newline, in a batch buffer (a line's string
   * dies young: kept as strings until a write, they would live on into the old generation). Full
   * batches wait in `queue` for the write under way.
   */
  private current = Buffer.allocUnsafeSlow(FILE_BATCH_BYTES);
  private used = 0;
  private readonly queue: Buffer[] = [];
  /** Bytes waiting: the queue's and the current batch's. */
  private waiting = 0;
  /** A write is under way (in libuv's pool, or waiting to try a full pipe again), of this many bytes. */
  private writing = false;
  private inFlight = 0;
  private timer: NodeJS.Timeout | null = null;
  private reopenWanted = false;
  /** A stop began: no more lines are taken. */
  private closing = false;
  /** The stop is over (its file closed). */
  private closed = false;
  /** Given up on (a stop's deadline, or the thread dying): a write still under way ends there. */
  private abandoned = false;
  private idle: (() => void) | null = null;
  /** Lines dropped since the last report (the queue was full: the output is not being read). */
  private dropped = 0;
  /** A write failed and was said; said again only after one succeeds. */
  private failing = false;
  /**
   * A write failed part way through a batch (a full disk takes the part that fits, then says
   * ENOSPC): the output ends inside a line, so the next bytes written start with a newline, and
   * no later line is glued to the torn one.
   */
  private torn = false;

  constructor(
    readonly path: string,
    private readonly report: (message: string) => void,
  ) {
    this.fd = openAccessLog(path);
    this.regular = fstatSync(this.fd).isFile();
    this.batchBytes = this.regular ? FILE_BATCH_BYTES : PIPE_BATCH_BYTES;
  }

  /**
   * Adds one line (JSON, without its newline; ASCII, as `asciiJson` makes it, so characters
   * count bytes); written within FLUSH_MS. With MAX_QUEUED_BYTES waiting (nothing reads the
   * output) it is dropped, and counted.
   */
  add(line: string): void {
    if (this.closing) return;
    const size = line.length + 1;
    if (this.waiting + size > MAX_QUEUED_BYTES) {
      if (this.dropped++ === 0) this.report(`access log ${this.path}: ${MAX_QUEUED_BYTES} bytes of lines wait for the output; lines are dropped until it takes them (counted)`);
      return;
    }
    this.waiting += size;
    if (size > this.batchBytes - this.used) {
      this.seal();
      // A line longer than a batch goes alone.
      if (size > this.batchBytes) this.queue.push(Buffer.from(`${line}\n`, 'latin1'));
    }
    if (size <= this.batchBytes) {
      this.used += this.current.write(line, this.used, 'latin1');
      this.current[this.used++] = 10;
    }
    if (this.queue.length > 0) this.flush();
    else if (this.timer === null) this.timer = setTimeout(this.onTimer, FLUSH_MS).unref();
  }

  /**
   * Opens the file again, for log rotation (`SIGUSR1`): the lines waiting go to the file open
   * until now (at once if it is a regular file, else with the write under way), the lines after
   * to whatever is at the path now. If it cannot be opened, logging goes on to the file open
   * before (said).
   */
  reopen(): void {
    if (this.path === STDOUT || this.closing) return;
    this.reopenWanted = true;
    if (this.writing) return;
    if (this.regular) this.writeAllSync(Date.now() + CLOSE_WAIT_MS);
    this.swapFile();
    this.flush();
  }

  /**
   * Writes what is left and closes the file (a worker's stop). An output that does not take it
   * within CLOSE_WAIT_MS (a pipe nobody reads) does not hold the stop: the rest is dropped, and
   * said.
   */
  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    this.clearTimer();
    const deadline = Date.now() + CLOSE_WAIT_MS;
    while (!this.abandoned && (this.writing || this.waiting > 0)) {
      const left = deadline - Date.now();
      if (left <= 0) {
        this.giveUp(`the output did not take the last lines within ${CLOSE_WAIT_MS} ms`);
        break;
      }
      if (!this.writing) this.writeBuffer(this.take()!);
      if (!(await this.whenIdle(left))) this.giveUp(`the output did not take the last lines within ${CLOSE_WAIT_MS} ms`);
    }
    this.reportDropped();
    this.closed = true;
    // A write still under way (given up on) closes the file when it ends.
    if (!this.writing) this.closeFile();
  }

  /**
   * A dying thread's last resort, also in the middle of a stop: whatever waits is written now,
   * synchronously (every output is non-blocking: a full pipe is waited for, up to
   * CLOSE_WAIT_MS). A batch whose write is under way may land after these lines.
   */
  closeNow(): void {
    if (this.closed) return;
    this.closing = true;
    this.clearTimer();
    this.abandoned = true;
    this.writeAllSync(Date.now() + CLOSE_WAIT_MS);
    this.reportDropped();
    this.closed = true;
    if (!this.writing) this.closeFile();
  }

  /** Stops writing (a stop's deadline): what waits is dropped, and said. */
  private giveUp(reason: string): void {
    this.abandoned = true;
    if (this.waiting > 0 || this.writing) this.report(`access log ${this.path}: ${reason}; ${this.waiting + this.inFlight} bytes of lines still waiting were dropped`);
    this.drop();
  }

  private closeFile(): void {
    if (this.fd > 2) closeSync(this.fd);
    this.fd = -1;
  }

  private reportDropped(): void {
    if (this.dropped > 0) this.report(`access log ${this.path}: ${this.dropped} line(s) were dropped while the output did not take them`);
    this.dropped = 0;
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
    if (this.writing || this.waiting === 0 || this.abandoned) return;
    this.writeBuffer(this.take()!);
  }

  /** The current batch, if it holds lines, into the queue; a fresh one takes its place. */
  private seal(): void {
    if (this.used === 0) return;
    this.queue.push(this.current.subarray(0, this.used));
    this.current = Buffer.allocUnsafeSlow(FILE_BATCH_BYTES);
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

  /**
   * Writes one batch off the event loop (`resumed`: the rest of a batch partly written;
   * `prefixed`: it starts with the newline that ends a torn line).
   */
  private writeBuffer(buffer: Buffer, resumed = false, prefixed = false): void {
    if (!resumed && !prefixed && this.torn) {
      buffer = Buffer.concat([NEWLINE, buffer]);
      prefixed = true;
      this.torn = false;
    }
    this.writing = true;
    this.inFlight = buffer.length;
    write(this.fd, buffer, 0, buffer.length, null, (err, written) => {
      if (this.abandoned) {
        // Given up on while under way: the stop (or the dying thread) left the file to close.
        this.writing = false;
        this.inFlight = 0;
        if (this.closed) this.closeFile();
        this.idle?.();
        return;
      }
      // A full pipe (the output is non-blocking): tried again shortly.
      if (err && (err as NodeJS.ErrnoException).code === 'EAGAIN') {
        setTimeout(() => this.writeBuffer(buffer, resumed, prefixed), RETRY_MS).unref();
        return;
      }
      if (err) {
        if (!this.failing) this.report(`access log ${this.path}: ${err.message}; lines are lost until a write succeeds`);
        this.failing = true;
        // Part of the batch (or of the newline before it) is out: the output ends inside a line.
        if (resumed || prefixed) this.torn = true;
      } else if (written < buffer.length) {
        this.writeBuffer(buffer.subarray(written), true);
        return;
      } else this.failing = false;
      this.writing = false;
      this.inFlight = 0;
      if (this.reopenWanted) this.swapFile();
      if (this.idle !== null) {
        this.idle();
        return;
      }
      if (this.dropped > 0 && this.waiting < MAX_QUEUED_BYTES / 2) this.reportDropped();
      if (this.queue.length > 0 || this.reopenWanted) this.flush();
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
    // A torn line stays in the file it tore: the new one starts with a whole line.
    this.torn = false;
    this.regular = fstatSync(fd).isFile();
    // (A batch filled before is written as it is.)
    this.batchBytes = this.regular ? FILE_BATCH_BYTES : PIPE_BATCH_BYTES;
    closeSync(old);
  }

  /** Writes every waiting line now; a full pipe is waited for, until `deadline` (Date.now()). */
  private writeAllSync(deadline: number): void {
    for (let buffer = this.take(); buffer !== null; buffer = this.take()) {
      const prefixed = this.torn;
      if (prefixed) {
        buffer = Buffer.concat([NEWLINE, buffer]);
        this.torn = false;
      }
      for (let at = 0; at < buffer.length; ) {
        try {
          at += writeSync(this.fd, buffer, at);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || Date.now() >= deadline) {
            if (at > 0 || prefixed) this.torn = true;
            this.report(`access log ${this.path}: ${(err as Error).message}; ${this.waiting + buffer.length - at} bytes of lines were lost`);
            this.drop();
            return;
          }
          Atomics.wait(PAUSE, 0, 0, 1);
        }
      }
    }
  }
}

const NEWLINE = Buffer.from('\n');

/** Waited on (never woken) to pause a thread for a millisecond between tries at a full pipe. */
const PAUSE = new Int32Array(new SharedArrayBuffer(4));
