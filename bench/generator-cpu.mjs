// What the open-loop load generator itself spends: CPU a request of the hedging bench's load
// (2,000 req/s, 10 s) straight to a bench node, for one pacer. Build first (npm run build).
//   node bench/generator-cpu.mjs native|timer|worker
// Prints this process's CPU a request (the Node pacers' whole generator; for `native`, writing
// the requests out and reading the report back) and its waited-for children's (the C program).
import { readFileSync } from 'node:fs';

const pacer = process.argv[2] ?? 'native';
const { startUpstream } = await import('../dist/bench/lib/contenders.js');
const { openLoop, spreadBoards } = await import('../dist/bench/lib/openloop.js');
/** CPU of waited-for children, microseconds (cutime + cstime, 100 ticks a second). */
const childrenUs = () => {
  const fields = readFileSync('/proc/self/stat', 'utf8').split(') ')[1].split(' ');
  return (Number(fields[13]) + Number(fields[14])) * 10_000;
};
const upstream = await startUpstream({ stallMs: 50, stallP: 0 });
try {
  const boards = spreadBoards();
  const url = `http://127.0.0.1:${upstream.ports[0]}`;
  const load = (seconds) => openLoop(url, { rate: 2000, seconds, path: '/rpc/query.execute', headers: (i) => ({ 'x-lakefront-board': boards[i % boards.length] }), pacer });
  await load(2);
  const self = process.cpuUsage();
  const children = childrenUs();
  const result = await load(10);
  const selfUs = process.cpuUsage(self);
  const perRequest = (us) => (us / result.sent).toFixed(1);
  console.log(`${pacer}: ${result.sent} requests; CPU a request: this process ${perRequest(selfUs.user + selfUs.system)} us, its children ${perRequest(childrenUs() - children)} us`);
} finally {
  await upstream.proc.stop();
}
