/**
 * A background poll loop: runs `tick` every `intervalMs`, never two at once (the next round is
 * scheduled when the last one ends), without keeping the process alive. start/stop are
 * idempotent.
 */
export class PollLoop {
  private timer: NodeJS.Timeout | null = null;
  private running = false;

  constructor(
    private readonly intervalMs: number,
    private readonly tick: () => Promise<void>,
  ) {}

  start(): void {
    if (this.running) return;
    this.running = true;
    this.schedule();
  }

  stop(): void {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  private schedule(): void {
    if (!this.running) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      this.tick().finally(() => this.schedule());
    }, this.intervalMs);
    this.timer.unref();
  }
}
