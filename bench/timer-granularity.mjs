// When a hedge trigger fires against the delay asked. The triggers wait on the thread's hedge
// clock (src/forward/hedge-clock.ts: one Node timer a thread, a trigger fires at the first wake at
// or after its due time less EARLY_MS); a plain Node timer (`setTimeout(delay)`, what each
// request armed before) is measured beside it. Each delay is armed 200 times, 0.4 ms into an
// event-loop turn (as a request handler after some work), and timed with performance.now().
// Build first (npm run build).
//   node bench/timer-granularity.mjs [delay-ms ...]
const { HedgeClock } = await import('../dist/src/forward/hedge-clock.js');
const delays = process.argv.slice(2).map(Number);
const clock = new HedgeClock();

const ways = {
  'hedge clock': (delay, armed) =>
    new Promise((resolve) => clock.arm({ hedgeSlot: -1, onHedgeTimer: resolve }, armed + delay, armed)),
  'Node timer': (delay) => new Promise((resolve) => setTimeout(resolve, delay)),
};

// The clock's timer does not keep a process alive (a worker's sockets do): this one does.
const keepAlive = setInterval(() => {}, 1_000);
const rows = [];
for (const delay of delays.length > 0 ? delays : [0.6, 1.5, 2.9, 5.5]) {
  for (const [way, wait] of Object.entries(ways)) {
    const took = [];
    for (let i = 0; i < 200; i++) {
      await new Promise((resolve) => setImmediate(resolve));
      const turn = performance.now();
      while (performance.now() - turn < 0.4);
      const armed = performance.now();
      await wait(delay, armed);
      took.push(performance.now() - armed);
    }
    took.sort((a, b) => a - b);
    rows.push({ way, 'asked ms': delay, 'min ms': +took[0].toFixed(2), 'median ms': +took[100].toFixed(2), 'p95 ms': +took[190].toFixed(2), 'max ms': +took[199].toFixed(2) });
  }
}
clearInterval(keepAlive);
console.table(rows);
