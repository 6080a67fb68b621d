#!/usr/bin/env node
/**
 * The `lakefront` command: the front door over configured nodes, or over an embedded demo
 * cluster when none are configured.
 */
import { readFileSync } from 'node:fs';
import { Command, helpText, parseCommand } from './config/config.js';
import { startDemoCluster, type DemoCluster } from './demo.js';
import { FrontDoor } from './server/supervisor.js';

/** Exit code for a configuration the operator must fix. */
const EXIT_CONFIG = 2;

/** How long `dieBy` waits for its own signal to end the process before it aborts. */
const SIGNAL_WAIT_MS = 2_000;

function fail(message: string, code: number): never {
  process.stderr.write(`lakefront: ${message}\n`);
  process.exit(code);
}

/**
 * Ends the process now, by `signal`'s default action, after one line saying why. Not
 * `process.exit`: on exit Node tears down every worker thread, and tearing down one that still
 * holds uWS sockets (mid-drain, or stuck) aborts the process with an assertion and a core dump.
 * Death by the signal the operator sent is what an unhandled signal would have done; the kernel
 * closes every socket.
 */
function dieBy(signal: NodeJS.Signals, message: string): never {
  process.stderr.write(`lakefront: ${message}\n`);
  // As PID 1 (a container started without an init) the kernel drops a signal whose action is the
  // default, even one a process sends itself: abort at once there, the one end left.
  if (process.pid !== 1) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
    // Delivery to this process is asynchronous: wait for it here rather than run on, but not for
    // ever.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, SIGNAL_WAIT_MS);
  }
  process.abort();
}

async function main(): Promise<void> {
  let command: Command;
  try {
    command = parseCommand(process.argv.slice(2), process.env);
  } catch (err) {
    fail((err as Error).message, EXIT_CONFIG);
  }
  if (command.kind === 'help') {
    process.stdout.write(`${helpText()}\n`);
    return;
  }
  if (command.kind === 'version') {
    const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string };
    process.stdout.write(`${pkg.version}\n`);
    return;
  }

  let demo: DemoCluster | null = null;
  let config = command.config;
  if (command.demo) {
    demo = await startDemoCluster();
    config = { ...config, clusters: [{ name: config.clusters[0]!.name, members: demo.members }] };
  }

  let door: FrontDoor;
  try {
    door = await FrontDoor.start(config);
  } catch (err) {
    await demo?.close();
    fail((err as Error).message, 1);
  }
  door.on('worker-exit', (slot: number, code: number) => {
    process.stderr.write(`lakefront: worker ${slot} exited (code ${code}); replacing it\n`);
  });
  door.on('error', (err: Error) => process.stderr.write(`lakefront: ${err.message}\n`));

  const nodes = config.clusters.flatMap((c) => c.members.map((m) => `${m.id}=${m.url}`)).join(', ');
  process.stdout.write(
    `lakefront: listening on ${door.url} with ${door.threads} worker thread(s) over ${demo ? 'the embedded demo cluster: ' : ''}${nodes}\n`,
  );
  if (demo) {
    process.stdout.write(
      `try: curl -s -X POST -H 'x-lakefront-board: board-1' -d '{}' ${door.url}/rpc/query.execute -i\n`,
    );
  }

  let signals = 0;
  const shutdown = (signal: NodeJS.Signals): void => {
    if (++signals > 1) dieBy(signal, `second ${signal}: exiting without draining`);
    process.stdout.write(`lakefront: ${signal}: draining\n`);
    door
      .stop()
      .then(() => demo?.close())
      .then(
        () => process.exit(0),
        (err: Error) => dieBy(signal, err.message),
      );
  };
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
}

main().catch((err: Error) => fail(err.stack ?? err.message, 1));
