// When a Node timer fires against the delay asked: the hedge trigger is one (`setTimeout(delay)`
// with the node's own p95, fractional milliseconds). Each delay is armed 200 times, 0.4 ms into
// an event-loop turn (as a request handler after some work), and timed with performance.now().
//   node bench/timer-granularity.mjs [delay-ms ...]
const delays = process.argv.slice(2).map(Number);
const rows = [];
for (const delay of delays.length > 0 ? delays : [0.6, 1.5, 2.9, 5.5]) {
  const took = [];
  for (let i = 0; i < 200; i++) {
    await new Promise((resolve) => setImmediate(resolve));
    const turn = performance.now();
    while (performance.now() - turn < 0.4);
    const armed = performance.now();
    await new Promise((resolve) => setTimeout(resolve, delay));
    took.push(performance.now() - armed);
  }
  took.sort((a, b) => a - b);
  rows.push({ 'asked ms': delay, 'min ms': +took[0].toFixed(2), 'median ms': +took[100].toFixed(2), 'p95 ms': +took[190].toFixed(2), 'max ms': +took[199].toFixed(2) });
}
console.table(rows);
