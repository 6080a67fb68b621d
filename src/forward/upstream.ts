/**
 * Upstream attempts over undici's low-level `dispatch()` handler API: no response stream, no
 * promise, no parsed header object per request. undici 7 runs the legacy handler shape
 * (onConnect/onHeaders/onData/onComplete/onError) natively; the newer controller shape is wrapped
 * in an adapter that parses headers into an object per response, so the legacy shape is used.
 */
import { Pool } from 'undici';
import type { Dispatcher } from 'undici';
import { isGatewayFailure, type AttemptHandle, type Exchange } from './exchange.js';

export interface PoolOptions {
  readonly connections: number;
  readonly requestTimeoutMs: number;
}

/** A keep-alive pool to one node. */
export function createPool(url: string, options: PoolOptions): Pool {
  return new Pool(url, {
    connections: options.connections,
    pipelining: 1,
    keepAliveTimeout: 4_000,
    keepAliveMaxTimeout: 60_000,
    headersTimeout: options.requestTimeoutMs,
    bodyTimeout: options.requestTimeoutMs,
    connect: { timeout: Math.min(options.requestTimeoutMs, 5_000) },
  });
}

/** Told how each attempt ended, for counters, latency windows and passive health. */
export interface AttemptObserver {
  attemptEnded(node: number, ok: boolean, latencyMs: number, error: unknown): void;
}

class AbortedError extends Error {
  readonly code = 'LF_ERR_ATTEMPT_ABORTED';
  constructor() {
    super('attempt aborted');
  }
}
const ABORTED = new AbortedError();

/**
 * One attempt: the undici handler and the exchange's abort handle in one object, so an attempt
 * costs one allocation plus its body chunks.
 */
export class DispatchAttempt implements AttemptHandle {
  private abortFn: ((reason?: Error) => void) | null = null;
  private aborted = false;
  private ended = false;
  private status = 0;
  private rawHeaders: Buffer[] | null = null;
  private chunks: Buffer[] | null = null;
  private single: Buffer | null = null;
  private readonly startedAt = performance.now();

  constructor(
    private readonly exchange: Exchange,
    private readonly ordinal: number,
    private readonly node: number,
    private readonly observer: AttemptObserver,
  ) {}

  /** Dispatches on `pool`; the attempt reports to its exchange when it ends. */
  start(pool: Pool, options: Dispatcher.DispatchOptions): this {
    pool.dispatch(options, this as unknown as Dispatcher.DispatchHandler);
    return this;
  }

  abort(): void {
    if (this.ended || this.aborted) return;
    this.aborted = true;
    if (this.abortFn !== null) this.abortFn(ABORTED);
  }

  // --- undici handler (legacy shape) ---

  onConnect(abort: (reason?: Error) => void): void {
    this.abortFn = abort;
    if (this.aborted) abort(ABORTED);
  }

  onHeaders(statusCode: number, rawHeaders: Buffer[], _resume: () => void, _statusText: string): boolean {
    if (statusCode < 200) return true; // 1xx: the final head is still to come
    this.status = statusCode;
    this.rawHeaders = rawHeaders;
    return true;
  }

  onData(chunk: Buffer): boolean {
    if (this.single === null && this.chunks === null) this.single = chunk;
    else {
      if (this.chunks === null) {
        this.chunks = [this.single!];
        this.single = null;
      }
      this.chunks.push(chunk);
    }
    return true;
  }

  onComplete(_trailers: unknown): void {
    if (this.ended) return;
    this.ended = true;
    const ms = performance.now() - this.startedAt;
    const body = this.chunks !== null ? Buffer.concat(this.chunks) : this.single ?? EMPTY;
    const ok = !isGatewayFailure(this.status);
    this.observer.attemptEnded(this.node, ok, ms, ok ? null : this.status);
    this.exchange.answered(this.ordinal, this.status, this.rawHeaders, body, ms);
  }

  onError(err: Error): void {
    if (this.ended) return;
    this.ended = true;
    if (this.aborted) {
      // A hedge loser or a cancelled request: not the node's fault.
      this.observer.attemptEnded(this.node, true, -1, ABORTED);
      this.exchange.failed(this.ordinal, ABORTED);
      return;
    }
    this.observer.attemptEnded(this.node, false, performance.now() - this.startedAt, err);
    this.exchange.failed(this.ordinal, err);
  }

  onResponseStarted(): void {}

  onUpgrade(): void {
    this.onError(new Error('unexpected upgrade from upstream'));
  }
}

const EMPTY = Buffer.alloc(0);
