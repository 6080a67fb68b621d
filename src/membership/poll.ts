import { performance } from 'node:perf_hooks';

/**
 * A background poll loop: runs `tick` every `intervalMs`, counted from the start of one round to
 * the start of the next, so a round slowed by one member that does not answer (up to its probe
 * deadline) does not stretch the period for everyone. Never two rounds at once: a round that
 * outlasts the interval is followed at once by the next. It does not keep the process alive.
 * start/stop are idempotent.
 */
export class PollLoop {
  private timer: NodeJS.Timeout | null = null;
  private running = false;
  /** Bumped by stop(): a round under way then schedules nothing (a restart has its own). */
  private epoch = 0;

  constructor(
    private readonly intervalMs: number,
    private readonly tick: () => Promise<void>,
    /** Milliseconds on a monotonic clock (tests pass their own). */
    private readonly now: () => number = () => performance.now(),
  ) {}

  start(): void {
    if (this.running) return;
    this.running = true;
    this.schedule(this.intervalMs);
  }

  stop(): void {
    this.running = false;
    this.epoch++;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(delayMs: number): void {
    if (!this.running) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      const startedAt = this.now();
      const epoch = this.epoch;
      this.tick().finally(() => {
        if (epoch === this.epoch) this.schedule(Math.max(0, this.intervalMs - (this.now() - startedAt)));
      });
    }, delayMs);
    this.timer.unref();
  }
}
