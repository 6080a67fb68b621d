/**
 * Data-plane worker entry point: wires a WorkerFront (src/server/front.ts) to its parent.
 * Kept thin on purpose; everything it runs lives in src/.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { loadUndici } from '../src/forward/upstream.js';
import { WorkerFront } from '../src/server/front.js';
import type { MainMessage, WorkerInit, WorkerMessage } from '../src/server/protocol.js';

if (!parentPort) throw new Error('workers/data-plane.js must run as a worker thread');
const port = parentPort;
const init = workerData as WorkerInit;

function send(message: WorkerMessage): void {
  port.postMessage(message);
}

let front: WorkerFront | null = null;

// A worker that dies holding uWS sockets takes the whole process down with it (Node aborts on
// the open handles), so every fatal path closes them first and exits with a code the
// supervisor reads as "replace me".
function die(err: unknown): never {
  const reason = err instanceof Error ? err.stack ?? err.message : String(err);
  process.stderr.write(`lakefront: worker ${init.slot} crashed: ${reason}\n`);
  try {
    // Its clients are told (a bare write sent: 502 LF_ERR_OUTCOME_UNKNOWN), not just cut.
    front?.answerUnfinished(true);
  } catch {
    // The sockets close all the same.
  }
  try {
    front?.emergencyClose();
  } finally {
    process.exit(70);
  }
}
process.on('uncaughtException', die);
process.on('unhandledRejection', die);

try {
  // Only a front door that sends through undici loads it (see loadUndici).
  if (init.settings.upstreamClient === 'undici') await loadUndici();
  front = new WorkerFront(init, {
    requestStats: (id) => send({ t: 'stats-request', id }),
    nodeUnreachable: (node) => send({ t: 'node-unreachable', node }),
    nodeFailing: (node, failures, code) => send({ t: 'node-failing', node, failures, code }),
    leaderFailed: (node) => send({ t: 'leader-failed', node }),
  });
} catch (err) {
  send({ t: 'listen-failed', reason: err instanceof Error ? err.message : String(err) });
  process.exit(78);
}
const running = front;

running.listen().then(
  (boundPort) => send({ t: 'listening', port: boundPort }),
  (err: Error) => {
    send({ t: 'listen-failed', reason: err.message });
    running.emergencyClose();
    process.exit(78);
  },
);

port.on('message', (message: MainMessage) => {
  switch (message.t) {
    case 'stats-reply':
      running.statsReply(message.id, message.body);
      break;
    case 'collect':
      send({ t: 'histograms', id: message.id, encoded: running.collect() });
      break;
    case 'close-tunnels':
      running.closeTunnels();
      break;
    case 'reopen-log':
      running.reopenLog();
      break;
    case 'hint-rows':
      running.held.read(message.rows);
      break;
    case 'forget-hint-rows':
      running.held.forget(message.door);
      break;
    case 'adopt-hints':
      running.adoptHints(message.hints);
      send({ t: 'hints-adopted' });
      break;
    case 'drain':
      // drain() closes the listening socket before anything asynchronous: said at once, so that
      // a reload resolves only once no new connection can reach this worker.
      running.drain(message.keepHints, message.lingerTunnels).then(({ abandoned, hints }) => {
        send({ t: 'drained', abandoned, hints });
        // Let the message flush before the thread ends; counts made since the drain's own flush
        // (attempts ending as their pools closed) go in too.
        setImmediate(() => {
          running.flushCounters();
          process.exit(0);
        });
      }, die);
      send({ t: 'unlistened' });
      break;
    case 'close-now':
      running.emergencyClose();
      process.exit(0);
      break;
    case 'crash':
      setImmediate(() => {
        throw new Error('crash requested by the control plane (fault injection)');
      });
      break;
    case 'hang': {
      const until = Date.now() + message.ms;
      while (Date.now() < until);
      break;
    }
  }
});
