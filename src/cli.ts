#!/usr/bin/env node
/**
 * The `lakefront` command: the front door over configured nodes, or over an embedded demo
 * cluster when none are configured.
 */
import { readFileSync } from 'node:fs';
import { constants } from 'node:os';
import { Command, helpText, parseCommand } from './config/config.js';
import type { DemoCluster } from './demo.js';
import { ConfigError } from './errors.js';
import { FrontDoor, type FrontDoorConfig } from './server/supervisor.js';

/** Exit code for a configuration the operator must fix. */
const EXIT_CONFIG = 2;

/** How long `endBy` waits for its own signal to end the process before it aborts. */
const SIGNAL_WAIT_MS = 2_000;

/** How long a second signal waits for the worker threads to close their sockets and end. */
const CLOSE_NOW_MS = 1_000;

/**
 * Where a front door listens, for its start-up line: its URL, or, on every interface (0.0.0.0,
 * ::), the address it is bound to and the URL to reach it from this machine (its `url`, which
 * names loopback, would read as listening on loopback alone).
 */
function listeningOn(door: FrontDoor): string {
  if (door.host !== '0.0.0.0' && door.host !== '::') return door.url;
  const bound = door.host === '::' ? `[::]:${door.port}` : `${door.host}:${door.port}`;
  return `${bound} (every interface; ${door.url} from this machine)`;
}

/** A kernel setting under /proc/sys, trimmed; null where it cannot be read. */
function readSysctl(path: string): string | null {
  try {
    return readFileSync(`/proc/sys/${path}`, 'utf8').trim();
  } catch {
    return null;
  }
}

function fail(message: string, code: number): never {
  process.stderr.write(`lakefront: ${message}\n`);
  process.exit(code);
}

/**
 * Ends the process now, by `signal`'s default action. Not `process.exit` while a worker thread
 * may still hold uWS sockets (`workersGone` false: mid-drain, or stuck): on exit Node tears every
 * worker thread down, and tearing down one that holds them aborts the process with an assertion
 * and a core dump. Death by the signal the operator sent is what an unhandled signal would have
 * done; the kernel closes every socket.
 */
function endBy(signal: NodeJS.Signals, workersGone: boolean): never {
  // As PID 1 (a container started without an init) the kernel drops a signal whose action is the
  // default, even one a process sends itself: there only an exit (once the workers are gone) or
  // an abort ends it.
  if (process.pid !== 1) {
    process.removeAllListeners(signal);
    process.kill(process.pid, signal);
    // Delivery to this process is asynchronous: wait for it here rather than run on, but not for
    // ever.
    Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, SIGNAL_WAIT_MS);
  }
  if (workersGone) process.exit(128 + (constants.signals[signal] ?? 0));
  process.abort();
}

async function main(): Promise<void> {
  // An output whose reader has gone (a log shipper that died, a pipe into `head`): its lines are
  // lost (EPIPE), and the front door goes on. Unheard, the stream's 'error' would end the process
  // at its next line (`SIGTERM: draining`, a reload's) with an abort, and no drain.
  for (const stream of [process.stdout, process.stderr]) stream.on('error', () => undefined);
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

  // A reload or log reopen asked while the front door starts (an init system's reload at once
  // after its start) is kept, done once it serves: Node's default for SIGHUP would end the
  // process, and for SIGUSR1 open the inspector.
  const asked = new Set<'SIGHUP' | 'SIGUSR1'>();
  const keepHup = (): void => void asked.add('SIGHUP');
  const keepUsr1 = (): void => void asked.add('SIGUSR1');
  process.on('SIGHUP', keepHup);
  process.on('SIGUSR1', keepUsr1);

  let demo: DemoCluster | null = null;
  let config = command.config;
  if (command.demo) {
    // Loaded only for the demo (it brings the `ws` server along).
    const { startDemoCluster } = await import('./demo.js');
    demo = await startDemoCluster();
    config = { ...config, clusters: [{ name: config.clusters[0]!.name, members: demo.members }] };
  }

  let door: FrontDoor;
  try {
    door = await FrontDoor.start(config);
  } catch (err) {
    await demo?.close();
    fail((err as Error).message, err instanceof ConfigError ? EXIT_CONFIG : 1);
  }
  const watch = (d: FrontDoor): void => {
    d.on('worker-exit', (slot: number, code: number, hintsLost: number) => {
      const hints = hintsLost > 0 ? `; ${hintsLost} hint(s) for replicas that were down were lost with it` : '';
      process.stderr.write(`lakefront: worker ${slot} exited (code ${code})${hints}; replacing it\n`);
    });
    d.on('error', (err: Error) => process.stderr.write(`lakefront: ${err.message}\n`));
  };
  watch(door);
  const over = (c: FrontDoorConfig): string => c.clusters.flatMap((cluster) => cluster.members.map((m) => `${m.id}=${m.url}`)).join(', ');

  let signals = 0;
  /** Front doors draining into their successors (reloads): a stop waits for them too. */
  const draining = new Set<FrontDoor>();
  let reloading: Promise<void> | null = null;
  let reloadAgain = false;
  let migrateWarned = false;
  const configFile = command.configFile;

  /**
   * SIGHUP, when a configuration file was given: it is read again and a front door running it
   * takes over the port (`FrontDoor.reload`); a bad file, or one that cannot start, changes
   * nothing. Without one, SIGHUP is said on stderr and changes nothing.
   */
  const reload = (): void => {
    if (signals > 0) return;
    if (reloading !== null) {
      // One more after the one running, with the file as it is then.
      reloadAgain = true;
      return;
    }
    reloading = (async () => {
      const previous = door;
      let next: FrontDoorConfig;
      let successor: FrontDoor;
      try {
        const parsed = parseCommand(process.argv.slice(2), process.env);
        if (parsed.kind !== 'run') return;
        next = parsed.config;
        successor = await previous.reload(next);
      } catch (err) {
        process.stderr.write(`lakefront: SIGHUP: ${(err as Error).message}; still serving the previous configuration\n`);
        return;
      }
      door = successor;
      config = next;
      watch(successor);
      draining.add(previous);
      process.stdout.write(`lakefront: SIGHUP: reloaded ${configFile}: serving on ${listeningOn(successor)} with ${successor.threads} worker thread(s) over ${over(next)}; the previous configuration drains\n`);
      if (!migrateWarned && readSysctl('net/ipv4/tcp_migrate_req') !== '1') {
        migrateWarned = true;
        process.stderr.write('lakefront: net.ipv4.tcp_migrate_req is not 1: a connection not yet accepted by the old workers when they stop listening is reset; `sysctl -w net.ipv4.tcp_migrate_req=1` (Linux 5.14+) hands such connections to the new ones\n');
      }
      previous.drained.then(
        () => {
          draining.delete(previous);
          process.stdout.write('lakefront: the previous configuration has drained\n');
        },
        // A worker stuck in JavaScript: it stays in `draining`, and a stop ends by the signal.
        (err: Error) => process.stderr.write(`lakefront: the previous configuration: ${err.message}\n`),
      );
    })().finally(() => {
      reloading = null;
      if (reloadAgain && signals === 0) {
        reloadAgain = false;
        reload();
      }
    });
  };

  const shutdown = (signal: NodeJS.Signals): void => {
    if (++signals > 2) {
      // The close is bounded and ends the process. As PID 1 this signal could only abort it.
      if (process.pid !== 1) endBy(signal, false);
      return;
    }
    if (signals === 2) {
      process.stderr.write(`lakefront: second ${signal}: exiting without draining\n`);
      Promise.all([door, ...draining].map((d) => d.closeNow(CLOSE_NOW_MS).catch(() => [-1])))
        .then((each) => each.flat())
        .then((stuck) => {
          if (stuck.length > 0) process.stderr.write(`lakefront: worker thread(s) ${stuck.join(', ')} did not end within ${CLOSE_NOW_MS} ms (stuck in JavaScript?)\n`);
          endBy(signal, stuck.length === 0);
        });
      return;
    }
    process.stdout.write(`lakefront: ${signal}: draining\n`);
    // A reload under way finishes first: then the front door serving is the one to drain.
    (reloading ?? Promise.resolve())
      // Once a second signal came, the end is its business (the drain ends as its workers do).
      // The stop waits for the front doors still draining into this one (their hints come first).
      .then(() => door.stop())
      .then(() => {
        // Not silently: what the drain dropped of the replicated routes' hinted handoff.
        // Those for routes or nodes no longer configured, or lost with a worker that died, were
        // said at the time.
        const lost = door.hintsLost() - door.unconfiguredHints - door.hintsLostWithWorkers;
        if (lost > 0) process.stderr.write(`lakefront: ${lost} hint(s) for replicas that were down were dropped at shutdown; read repair converges those keys when they are read\n`);
        if (door.hintsSaved > 0) process.stdout.write(`lakefront: ${door.hintsSaved} hint(s) for replicas that were down saved to ${config.hintsFile} for the next start\n`);
      })
      .then(() => demo?.close())
      .then(
        () => {
          if (signals !== 1) return;
          // An earlier configuration's worker stuck in JavaScript still holds its sockets: only
          // the signal's end is clean then (it was said when its drain failed).
          if ([...draining].some((d) => d.liveWorkers > 0)) endBy(signal, false);
          process.exit(0);
        },
        (err: Error) => {
          process.stderr.write(`lakefront: ${err.message}\n`);
          if (signals === 1) endBy(signal, false);
        },
      );
  };
  if (configFile !== null) process.on('SIGHUP', reload);
  // Without one there is nothing to read again; a reload (as an init system sends it) must not
  // end the front door, so it is said and nothing changes.
  else process.on('SIGHUP', () => process.stderr.write('lakefront: SIGHUP: nothing to reload (no --config); still serving\n'));
  // SIGUSR1, as nginx: every worker opens the access log's file again (logrotate moved it). It
  // also keeps Node from opening its inspector on that signal, which a front door does not want.
  process.on('SIGUSR1', () => door.reopenAccessLog());
  process.on('SIGTERM', () => shutdown('SIGTERM'));
  process.on('SIGINT', () => shutdown('SIGINT'));
  process.off('SIGHUP', keepHup);
  process.off('SIGUSR1', keepUsr1);
  // Said once the signals are handled: whoever reads this line may signal at once.
  process.stdout.write(
    `lakefront: listening on ${listeningOn(door)} with ${door.threads} worker thread(s) over ${demo ? 'the embedded demo cluster: ' : ''}${over(config)}\n`,
  );
  if (demo) {
    process.stdout.write(
      `try: curl -s -X POST -H 'x-lakefront-board: board-1' -d '{}' ${door.url}/rpc/query.execute -i\n` +
        `try: curl -s -X PUT -d 'hello' ${door.url}/kv/greeting -i; curl -s ${door.url}/kv/greeting   # replicated on three nodes\n`,
    );
  }
  for (const signal of asked) process.emit(signal, signal);
}

main().catch((err: Error) => fail(err.stack ?? err.message, 1));
