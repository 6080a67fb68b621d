/**
 * The access log (`--access-log`): one JSON line for each request a route took (proxied, or
 * refused by the front door) and for each path no route takes. Every worker thread writes the
 * same file, opened for appending (a write lands whole at the end), or standard output (`-`).
 * Lines are batched in the thread and written off the event loop, at most FLUSH_MS after they
 * were made or as soon as BATCH_BYTES wait, so the request path never waits on the disk; a
 * worker's stop writes what is left before it ends. A line holds no header, no query string and
 * no routing key: nothing secret.
 */
import { closeSync, openSync, write, writeSync } from 'node:fs';

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
  private lines: string[] = [];
  private waiting = 0;
  private writing = false;
  private timer: NodeJS.Timeout | null = null;
  private reopenWanted = false;
  private closed = false;
  private idle: (() => void) | null = null;
  private readonly batchBytes: number;

  constructor(
    readonly path: string,
    private readonly report: (message: string) => void,
  ) {
    this.fd = openAccessLog(path);
    this.batchBytes = path === STDOUT ? PIPE_BATCH_BYTES : FILE_BATCH_BYTES;
  }

  /** Adds one line (JSON, without its newline); written within FLUSH_MS. */
  add(line: string): void {
    if (this.closed) return;
    this.lines.push(line);
    this.waiting += line.length + 1;
    if (this.waiting >= this.batchBytes) this.flush();
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
    this.writeAllSync();
    this.swapFile();
  }

  /** Writes what is left and closes the file (a worker's stop). */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.clearTimer();
    if (this.writing) await new Promise<void>((resolve) => (this.idle = resolve));
    this.writeAllSync();
    if (this.fd !== 1) closeSync(this.fd);
  }

  /** A dying thread's last resort: whatever is waiting, written now. */
  closeNow(): void {
    if (this.closed) return;
    this.closed = true;
    this.clearTimer();
    this.writeAllSync();
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
    if (this.writing || this.lines.length === 0) return;
    this.writeBuffer(this.take());
  }

  /** The waiting lines, up to a batch (at least one line), as one buffer. */
  private take(): Buffer {
    let count = 0;
    let size = 0;
    while (count < this.lines.length && (count === 0 || size + this.lines[count]!.length + 1 <= this.batchBytes)) {
      size += this.lines[count]!.length + 1;
      count++;
    }
    const batch = this.lines.splice(0, count);
    this.waiting -= size;
    return Buffer.from(`${batch.join('\n')}\n`);
  }

  private writeBuffer(buffer: Buffer): void {
    this.writing = true;
    write(this.fd, buffer, 0, buffer.length, null, (err, written) => {
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
        const idle = this.idle;
        this.idle = null;
        idle();
        return;
      }
      if (this.waiting >= this.batchBytes) this.flush();
      else if (this.lines.length > 0 && this.timer === null) this.timer = setTimeout(this.onTimer, FLUSH_MS).unref();
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
    closeSync(old);
  }

  private writeAllSync(): void {
    while (this.lines.length > 0) {
      const buffer = this.take();
      let at = 0;
      // A full pipe: a bounded number of tries, then the rest is given up (and said).
      for (let tries = 0; at < buffer.length; ) {
        try {
          at += writeSync(this.fd, buffer, at);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || ++tries > 100) {
            this.report(`access log ${this.path}: ${(err as Error).message} (lines were lost)`);
            this.lines.length = 0;
            return;
          }
        }
      }
    }
  }
}
