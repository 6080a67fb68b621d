// What a sample and a hedge trigger cost the window that sets it (src/forward/latency.ts), in a
// loop: 2 million samples of a skewed latency distribution into one window, the p95 asked after
// each, three rounds. Compare builds: node bench/trigger-window.mjs dist .ab/base
// (each a compiled tree inside the repository; build first: npm run build).
const dists = process.argv.slice(2);
for (const dist of dists.length > 0 ? dists : ['dist']) {
  const { SampleWindow } = await import(new URL(`../${dist}/src/forward/latency.js`, import.meta.url).href);
  const window = new SampleWindow();
  let x = 1;
  const random = () => (x = (x * 1103515245 + 12345) % 2147483648) / 2147483648;
  const values = new Float64Array(1 << 16);
  for (let i = 0; i < values.length; i++) values[i] = 0.2 + random() * random() * 3;
  let sum = 0;
  const rounds = [];
  for (let r = 0; r < 3; r++) {
    const started = performance.now();
    for (let i = 0; i < 2_000_000; i++) {
      window.record(values[i & 65535]);
      sum += window.triggerMs(95, 250);
    }
    rounds.push((((performance.now() - started) * 1e6) / 2_000_000).toFixed(1));
  }
  console.log(`${dist}: ${rounds.join(', ')} ns a sample and trigger (three rounds; checksum ${sum.toFixed(0)})`);
}
