/**
 * Configuration from flags and environment (flags win). Every bad value stops start-up with a
 * ConfigError whose message is one line naming the value.
 */
import { MIN_KEY_LENGTH } from '../affinity/tickets.js';
import { parseArgs } from 'node:util';
import { ConfigError, jsonProblem } from '../errors.js';
import { readFileSync } from 'node:fs';
import { parseMemberList } from '../membership/membership.js';
import type { PolicyName } from '../server/protocol.js';
import type { ClusterConfig, RouteConfig } from '../server/supervisor.js';
import { duplicateKey, parseFileConfig, type FileConfig } from './file.js';
import { ETCD_POLICIES, etcdPreset } from './presets.js';
import {
  DEFAULT_CLUSTER,
  DEFAULT_HEALTH_INTERVAL_MS,
  DEFAULT_HEALTH_TIMEOUT_MS,
  DEFAULT_UNREACHABLE_HOLD_MS,
  DEFAULT_EJECT_MS,
  DEFAULT_EJECT_MAX_PERCENT,
  DEFAULT_HOST,
  DEFAULT_WORKER_YOUNG_MB,
  RPC_ROUTE,
  DEMO_KV_ROUTE,
  defaultSettings,
  defaultThreads,
} from '../server/settings.js';
import type { FrontDoorConfig } from '../server/supervisor.js';

export interface CliOption {
  readonly flag: string;
  readonly env?: string;
  readonly value: string;
  readonly help: string;
}

/** Every option, for `--help` and the README's configuration table. */
export const OPTIONS: readonly CliOption[] = [
  { flag: 'nodes', env: 'LAKEFRONT_NODES', value: 'id=url,...', help: 'nodes behind /rpc/*; with no nodes, etcd or config: an embedded demo cluster of three' },
  { flag: 'policy', env: 'LAKEFRONT_POLICY', value: 'rendezvous|ring', help: 'how /rpc/* places a board: weighted rendezvous hashing, or a consistent-hash ring with 128 tokens a node [rendezvous]' },
  { flag: 'etcd', env: 'LAKEFRONT_ETCD', value: 'id=url,...', help: 'etcd members behind /v3/* (leader-aware, seed 002)' },
  { flag: 'etcd-policy', env: 'LAKEFRONT_ETCD_POLICY', value: 'hybrid|round_robin|boltzmann', help: 'routing policy for /v3/* [hybrid]' },
  { flag: 'config', env: 'LAKEFRONT_CONFIG', value: 'file.json', help: 'clusters and routes from a JSON file (instead of --nodes/--etcd)' },
  { flag: 'port', env: 'PORT', value: 'n', help: 'listen port (0: any free port) [8080]' },
  { flag: 'host', env: 'LAKEFRONT_HOST', value: 'addr', help: `listen address [${DEFAULT_HOST}; 127.0.0.1 for the demo]` },
  { flag: 'threads', env: 'LAKEFRONT_THREADS', value: 'n', help: 'data-plane worker threads [one per core]' },
  { flag: 'worker-young-mb', env: 'LAKEFRONT_WORKER_YOUNG_MB', value: 'n', help: "V8's young generation (nursery) a worker thread may grow to, MiB, 1-1024 [12]" },
  { flag: 'hedge-mode', env: 'LAKEFRONT_HEDGE_MODE', value: 'percentile|fixed|off', help: "when reads hedge: at the node's own percentile, always at --hedge-ms, or never [percentile]" },
  { flag: 'hedge-ms', env: 'LAKEFRONT_HEDGE_MS', value: 'ms', help: 'hedge delay before a node has 8 latency samples [250]' },
  { flag: 'hedge-percentile', env: 'LAKEFRONT_HEDGE_PERCENTILE', value: 'p', help: "percentile of a node's own latency that triggers a hedge [95]" },
  { flag: 'hedge-budget-percent', env: 'LAKEFRONT_HEDGE_BUDGET_PERCENT', value: 'p', help: 'hedges may not exceed this share of retryable requests; less while hedges seldom win; 100: no budget [5]' },
  { flag: 'health-interval-ms', env: 'LAKEFRONT_HEALTH_INTERVAL_MS', value: 'ms', help: 'health-poll interval [1000]' },
  { flag: 'health-timeout-ms', env: 'LAKEFRONT_HEALTH_TIMEOUT_MS', value: 'ms', help: 'health-probe deadline [500]' },
  { flag: 'unreachable-hold-ms', env: 'LAKEFRONT_UNREACHABLE_HOLD_MS', value: 'ms', help: 'a node a request could not reach (connection refused, or not made in time, or its name not found) is out of every ranking this long, then until a health probe passes [3000]' },
  { flag: 'eject-after', env: 'LAKEFRONT_EJECT_AFTER', value: 'n', help: 'passive health: a node this many attempts in a row failed at (no answer: a timeout, a reset, a refused connection), across all threads, is ejected from every ranking; 0: never [5]' },
  { flag: 'eject-ms', env: 'LAKEFRONT_EJECT_MS', value: 'ms', help: 'an ejected node is out this long times its ejections in a row (at most 300000, or this), then until a health probe passes [30000]' },
  { flag: 'eject-max-percent', env: 'LAKEFRONT_EJECT_MAX_PERCENT', value: 'p', help: "at most this share of a cluster's nodes out by ejection at once; one always may be, never the last routable one [10]" },
  { flag: 'request-timeout-ms', env: 'LAKEFRONT_REQUEST_TIMEOUT_MS', value: 'ms', help: 'an attempt slower than this fails [10000]' },
  { flag: 'max-body-bytes', env: 'LAKEFRONT_MAX_BODY_BYTES', value: 'n', help: 'largest request body accepted [1048576]' },
  { flag: 'max-response-bytes', env: 'LAKEFRONT_MAX_RESPONSE_BYTES', value: 'n', help: 'largest answer relayed from a node; a larger one is a 502, asked of no other node [67108864]' },
  { flag: 'upstream-client', env: 'LAKEFRONT_UPSTREAM_CLIENT', value: 'h1|undici', help: 'upstream HTTP client [h1]' },
  { flag: 'upstream-connections', env: 'LAKEFRONT_UPSTREAM_CONNECTIONS', value: 'n', help: 'keep-alive connections per node, per thread [64]' },
  { flag: 'upstream-pipelining', env: 'LAKEFRONT_UPSTREAM_PIPELINING', value: 'n', help: "h1 client: safe reads sent to a node in one loop turn share a connection and a write (HTTP/1.1 pipelining), up to n in flight on it; writes never; 1: off [1]" },
  { flag: 'cancel-grace-ms', env: 'LAKEFRONT_CANCEL_GRACE_MS', value: 'ms', help: 'a hedge loser may finish this long before its connection is closed [250]' },
  { flag: 'drain-timeout-ms', env: 'LAKEFRONT_DRAIN_TIMEOUT_MS', value: 'ms', help: 'on SIGTERM/SIGINT, and for the old workers at a reload, wait this long for in-flight requests [10000]' },
  { flag: 'ws-ping-ms', env: 'LAKEFRONT_WS_PING_MS', value: 'ms', help: "WebSocket tunnels: a node quiet this long is pinged, and the tunnel closed (1011) without an answer as long again; a node out of the rankings, after 2 s and 5 s; 0: never [30000]" },
  { flag: 'ws-backlog-bytes', env: 'LAKEFRONT_WS_BACKLOG_BYTES', value: 'n', help: 'WebSocket tunnels: bytes that may wait either way (a client or a node behind) before the tunnel is closed (1013); a client a quarter of this behind (at most 1 MiB) stops the node being read [16777216]' },
  { flag: 'affinity-keys-file', env: 'LAKEFRONT_AFFINITY_KEYS_FILE', value: 'path', help: 'affinity ticket signing keys, one a line, the first signing; read again at SIGHUP (instead of LAKEFRONT_AFFINITY_KEYS) [none]' },
  { flag: 'forwarded-for', env: 'LAKEFRONT_FORWARDED_FOR', value: 'append|off', help: "append the client's address to x-forwarded-for, and set x-forwarded-proto and x-forwarded-host, on every request a node gets [off]" },
  { flag: 'hints-file', env: 'LAKEFRONT_HINTS_FILE', value: 'path', help: "replicated routes: where a stop saves the hints not yet handed over, and the next start takes them back [none: dropped]" },
  { flag: 'access-log', env: 'LAKEFRONT_ACCESS_LOG', value: 'path|-', help: 'a JSON line for each request on a route (and each 404), appended to this file or, with -, standard output; SIGUSR1 opens the file again [none]' },
];

export const DEFAULT_PORT = 8080;

export type Command =
  | { readonly kind: 'help' }
  | { readonly kind: 'version' }
  /** `configFile`: the `--config` (or LAKEFRONT_CONFIG) file, which SIGHUP re-reads; null: none. */
  | { readonly kind: 'run'; readonly demo: boolean; readonly config: FrontDoorConfig; readonly configFile: string | null };

/** Environment variables refused when set but empty, with what their default would be. */
const EMPTY_REFUSED: ReadonlyMap<string, string> = new Map([
  ['LAKEFRONT_NODES', 'the demo cluster'],
  ['LAKEFRONT_ETCD', 'no etcd members'],
  ['LAKEFRONT_CONFIG', 'no configuration file'],
  ['LAKEFRONT_HOST', 'every interface'],
]);

function integer(raw: string, source: string, min: number, max: number): number {
  // A negative whole number is one: the range names what is wrong with it.
  if (!/^-?\d+$/.test(raw.trim())) throw new ConfigError(`${source}: not a whole number: ${JSON.stringify(raw)}`);
  const value = Number(raw);
  // Named as given: past 2^53 the number read is not the one written.
  if (value < min || value > max) throw new ConfigError(`${source}: ${raw.trim()} is out of range ${min}..${max}`);
  return value;
}

/** A decimal number as people write one (`95`, `99.9`, `-1`, `.5`): not hex, binary, octal or exponents. */
function decimal(raw: string, source: string, min: number, max: number): number {
  if (!/^-?(\d+(\.\d+)?|\.\d+)$/.test(raw.trim())) throw new ConfigError(`${source}: not a decimal number: ${JSON.stringify(raw)}`);
  const value = Number(raw);
  if (value < min || value > max) throw new ConfigError(`${source}: ${raw.trim()} is out of range ${min}..${max}`);
  return value;
}

function readConfigFile(path: string, source: string): FileConfig {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`${source}: cannot read ${JSON.stringify(path)} (${(err as NodeJS.ErrnoException).code ?? (err as Error).message})`);
  }
  // A byte-order mark, as some editors on Windows write: not JSON, but no fault of the contents.
  if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`${path}: not valid JSON (${jsonProblem(err, text)})`);
  }
  const twice = duplicateKey(text);
  if (twice !== null) throw new ConfigError(`${path}: ${twice}: given more than once`);
  return parseFileConfig(raw, path);
}

/**
 * Ticket signing keys, the first signing and every one verifying (two during a rotation): from
 * LAKEFRONT_AFFINITY_KEYS (comma-separated), or from a keys file (`--affinity-keys-file`, one
 * key a line; blank lines and lines starting with `#` skipped), which a reload (`SIGHUP`) reads
 * again: keys rotate without a restart. Errors name a key by its place, never by its value.
 */
function affinityKeys(raw: string | undefined, file: [string, string] | undefined): string[] {
  const fromEnv = raw !== undefined && raw.trim() !== '';
  if (fromEnv && file !== undefined) throw new ConfigError(`${file[1]}: give the affinity keys either in LAKEFRONT_AFFINITY_KEYS or in a keys file, not both`);
  let keys: string[];
  let source: string;
  if (file !== undefined) {
    // Named by its flag, not its path: a key given where the path belongs must not be printed.
    source = file[1];
    if (file[0].trim() === '') throw new ConfigError(`${file[1]}: an empty path`);
    let text: string;
    try {
      text = readFileSync(file[0], 'utf8');
    } catch (err) {
      throw new ConfigError(`${source}: cannot read the keys file (${(err as NodeJS.ErrnoException).code ?? 'unreadable'})`);
    }
    keys = text
      .split('\n')
      .map((line) => line.trim())
      .filter((line) => line !== '' && !line.startsWith('#'));
    if (keys.length === 0) throw new ConfigError(`${source}: the keys file holds no key (one a line, the first signs)`);
  } else {
    if (!fromEnv) return [];
    source = 'LAKEFRONT_AFFINITY_KEYS';
    keys = raw.split(',').map((k) => k.trim());
  }
  keys.forEach((key, i) => {
    if (key.length < MIN_KEY_LENGTH) throw new ConfigError(`${source}: key ${i + 1} of ${keys.length} has ${key.length} characters; at least ${MIN_KEY_LENGTH} are needed`);
  });
  return keys;
}

/** Policies for the keyed /rpc/* route. */
const RPC_POLICIES: readonly PolicyName[] = ['rendezvous', 'ring'];

function oneOf<T extends string>(raw: string, source: string, allowed: readonly T[]): T {
  if (!(allowed as readonly string[]).includes(raw)) throw new ConfigError(`${source}: must be ${allowed.join(' or ')}, got ${JSON.stringify(raw)}`);
  return raw as T;
}

/** Parses the command line and environment into a command. Throws ConfigError on a bad value. */
export function parseCommand(argv: readonly string[], env: NodeJS.ProcessEnv): Command {
  const options: Record<string, { type: 'string' | 'boolean'; short?: string }> = {
    help: { type: 'boolean', short: 'h' },
    version: { type: 'boolean' },
  };
  for (const option of OPTIONS) options[option.flag] = { type: 'string' };
  // `--threads -1`, `--hedge-budget-percent -.5`: parseArgs calls a value that starts with '-'
  // ambiguous without naming it; taken as the flag's value, the range check names it.
  const args: string[] = [];
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const next = argv[i + 1];
    if (arg.startsWith('--') && options[arg.slice(2)]?.type === 'string' && next !== undefined && /^-\.?\d/.test(next)) {
      args.push(`${arg}=${next}`);
      i++;
    } else args.push(arg);
  }
  let values: Record<string, string | boolean | undefined>;
  try {
    const parsed = parseArgs({ args, options, strict: true, allowPositionals: false, tokens: true });
    values = parsed.values;
    // parseArgs keeps the last of a repeated flag; which one was meant is the operator's to say.
    const given = new Set<string>();
    for (const token of parsed.tokens) {
      if (token.kind !== 'option') continue;
      if (given.has(token.name)) throw new ConfigError(`--${token.name}: given more than once`);
      given.add(token.name);
    }
  } catch (err) {
    if (err instanceof ConfigError) throw err;
    throw new ConfigError((err as Error).message.split('\n')[0]!);
  }
  if (values.help) return { kind: 'help' };
  if (values.version) return { kind: 'version' };

  /** The raw value of an option and where it came from: flag over environment. */
  const read = (flag: string): [string, string] | undefined => {
    const fromFlag = values[flag];
    if (typeof fromFlag === 'string') return [fromFlag, `--${flag}`];
    const option = OPTIONS.find((o) => o.flag === flag)!;
    const fromEnv = option.env !== undefined ? env[option.env] : undefined;
    if (fromEnv === undefined) return undefined;
    // Set but empty means the default (as templates write `${X:-}`), except where the default
    // is a surprise no one should get by accident: an empty node list or configuration would
    // serve the demo cluster, an empty host listen on every interface. Those stop start-up.
    if (fromEnv.trim() === '' && EMPTY_REFUSED.has(option.env!)) throw new ConfigError(`${option.env}: set but empty (unset it for the default: ${EMPTY_REFUSED.get(option.env!)})`);
    if (fromEnv === '') return undefined;
    return [fromEnv, option.env!];
  };
  const int = (flag: string, fallback: number, min: number, max: number): number => {
    const got = read(flag);
    return got ? integer(got[0], got[1], min, max) : fallback;
  };
  /** An optional whole number: undefined keeps the documented default. */
  const opt = (flag: string, min: number, max: number): number | undefined => {
    const got = read(flag);
    return got ? integer(got[0], got[1], min, max) : undefined;
  };

  const nodesRaw = read('nodes');
  const etcdRaw = read('etcd');
  const configRaw = read('config');
  if (configRaw && (nodesRaw || etcdRaw)) {
    throw new ConfigError(`${configRaw[1]}: give clusters either in the file or with --nodes/--etcd, not both (${(nodesRaw ?? etcdRaw)![1]} is set too)`);
  }
  const file = configRaw ? readConfigFile(configRaw[0], configRaw[1]) : null;
  const demo = !nodesRaw && !etcdRaw && !file;
  const clusters: ClusterConfig[] = [];
  const routes: RouteConfig[] = [];
  if (file) {
    clusters.push(...file.clusters);
    const keys = affinityKeys(env.LAKEFRONT_AFFINITY_KEYS, read('affinity-keys-file'));
    for (const [i, route] of file.routes.entries()) {
      if (!route.affinity) {
        routes.push(route);
        continue;
      }
      if (keys.length === 0) throw new ConfigError(`${configRaw![1]}: routes[${i}].affinity: tickets need signing keys in LAKEFRONT_AFFINITY_KEYS (comma-separated; the first signs) or a --affinity-keys-file`);
      routes.push({ ...route, affinity: { ...route.affinity, keys } });
    }
  }
  const keysFileRaw = read('affinity-keys-file');
  if (keysFileRaw && !file) throw new ConfigError(`${keysFileRaw[1]}: affinity tickets belong to routes in a configuration file (--config), and none is given`);
  if (env.LAKEFRONT_AFFINITY_KEYS && !file) throw new ConfigError('LAKEFRONT_AFFINITY_KEYS: affinity tickets belong to routes in a configuration file (--config), and none is given');
  const rpcPolicyRaw = read('policy');
  if (rpcPolicyRaw && !(demo || nodesRaw)) throw new ConfigError(`${rpcPolicyRaw[1]}: applies to /rpc/* over --nodes (or the demo); a config file names each route's policy`);
  if (demo || nodesRaw) {
    clusters.push({ name: DEFAULT_CLUSTER, members: nodesRaw ? parseMemberList(nodesRaw[0], nodesRaw[1]) : [] });
    routes.push(rpcPolicyRaw ? { ...RPC_ROUTE, policy: oneOf(rpcPolicyRaw[0], rpcPolicyRaw[1], RPC_POLICIES) } : RPC_ROUTE);
    // The demo's nodes also keep replicated values (the reference replica, replication/store.ts).
    if (demo) routes.push(DEMO_KV_ROUTE);
  }
  const policyRaw = read('etcd-policy');
  if (policyRaw && !etcdRaw) throw new ConfigError(`${policyRaw[1]}: applies to --etcd members, and none are given`);
  if (etcdRaw) {
    const policy = policyRaw ? oneOf(policyRaw[0], policyRaw[1], ETCD_POLICIES) : 'hybrid';
    const etcdMembers = parseMemberList(etcdRaw[0], etcdRaw[1]);
    if (nodesRaw) {
      const taken = new Set(clusters[0]!.members.map((m) => m.id));
      const clash = etcdMembers.find((m) => taken.has(m.id));
      if (clash) throw new ConfigError(`${etcdRaw[1]}: node id "${clash.id}" is also in ${nodesRaw[1]}`);
    }
    const preset = etcdPreset('etcd', etcdMembers, policy as PolicyName);
    clusters.push(preset.cluster);
    routes.push(preset.route);
  }
  const hostRaw = read('host');
  const host = hostRaw ? hostRaw[0].trim() : (file?.host ?? (demo ? '127.0.0.1' : DEFAULT_HOST));
  if (host === '' || /\s/.test(host)) throw new ConfigError(`${hostRaw?.[1] ?? 'host'}: bad address ${JSON.stringify(host)}`);
  const percentileRaw = read('hedge-percentile');
  const budgetRaw = read('hedge-budget-percent');
  const clientRaw = read('upstream-client');
  const pipeliningRaw = read('upstream-pipelining');
  if (pipeliningRaw && clientRaw && clientRaw[0].trim() === 'undici' && integer(pipeliningRaw[0], pipeliningRaw[1], 1, 256) > 1) {
    throw new ConfigError(`${pipeliningRaw[1]}: pipelining is the h1 client's; ${clientRaw[1]} undici keeps one request a connection`);
  }
  const modeRaw = read('hedge-mode');
  const forwardedRaw = read('forwarded-for');
  const forwardedFor = forwardedRaw ? oneOf(forwardedRaw[0], forwardedRaw[1], ['append', 'off'] as const) : file?.forwardedFor;

  const config: FrontDoorConfig = {
    host,
    port: int('port', file?.port ?? DEFAULT_PORT, 0, 65535),
    threads: int('threads', file?.threads ?? defaultThreads(), 1, 256),
    workerYoungMb: int('worker-young-mb', DEFAULT_WORKER_YOUNG_MB, 1, 1024),
    clusters,
    routes,
    ...(file?.region !== undefined ? { region: file.region } : {}),
    hintsFile: hintsFileOf(read('hints-file'), file?.hintsFile),
    accessLog: pathOf(read('access-log'), file?.accessLog, 'leave it out for no access log'),
    healthIntervalMs: int('health-interval-ms', DEFAULT_HEALTH_INTERVAL_MS, 10, 3_600_000),
    healthTimeoutMs: int('health-timeout-ms', DEFAULT_HEALTH_TIMEOUT_MS, 1, 60_000),
    unreachableHoldMs: int('unreachable-hold-ms', DEFAULT_UNREACHABLE_HOLD_MS, 0, 3_600_000),
    ejectMs: int('eject-ms', DEFAULT_EJECT_MS, 1, 3_600_000),
    ejectMaxPercent: int('eject-max-percent', DEFAULT_EJECT_MAX_PERCENT, 1, 100),
    settings: defaultSettings({
      hedgeMode: modeRaw ? oneOf(modeRaw[0], modeRaw[1], ['percentile', 'fixed', 'off'] as const) : undefined,
      hedgeDelayMs: opt('hedge-ms', 0, 600_000),
      hedgeAfterPercentile: percentileRaw ? decimal(percentileRaw[0], percentileRaw[1], 1, 100) : undefined,
      hedgeBudgetPercent: budgetRaw ? decimal(budgetRaw[0], budgetRaw[1], 0, 100) : undefined,
      requestTimeoutMs: opt('request-timeout-ms', 1, 3_600_000),
      maxBodyBytes: opt('max-body-bytes', 0, 1024 * 1024 * 1024),
      maxResponseBytes: opt('max-response-bytes', 1024, 1024 * 1024 * 1024),
      upstreamClient: clientRaw ? oneOf(clientRaw[0], clientRaw[1], ['h1', 'undici'] as const) : undefined,
      upstreamConnections: opt('upstream-connections', 1, 100_000),
      upstreamPipelining: opt('upstream-pipelining', 1, 256),
      cancelGraceMs: opt('cancel-grace-ms', 0, 600_000),
      drainTimeoutMs: opt('drain-timeout-ms', 0, 3_600_000),
      forwardedFor: forwardedFor === 'append',
      ejectAfter: opt('eject-after', 0, 1000),
      wsPingMs: opt('ws-ping-ms', 0, 3_600_000),
      wsBacklogBytes: opt('ws-backlog-bytes', 65_536, 1024 * 1024 * 1024),
    }),
  };
  return { kind: 'run', demo, config, configFile: configRaw ? configRaw[0] : null };
}

export function helpText(): string {
  const lines = [
    'Usage: lakefront [options]',
    '',
    'A multi-threaded HTTP and WebSocket front door: routes /rpc/* by x-lakefront-board with',
    'weighted rendezvous hashing (or a consistent-hash ring), hedges reads at each node\'s own p95,',
    'sends bare writes exactly once; routes etcd\'s /v3/* by operation type (writes to the leader,',
    'reads over healthy members). Affinity tickets and more routes: --config (see the README).',
    '',
    'Options (flags override the environment variable in brackets):',
  ];
  for (const option of OPTIONS) {
    const left = `  --${option.flag} ${option.value}`;
    const help = `${option.help}${option.env ? ` [env ${option.env}]` : ''}`;
    // A long flag gets its help on the next line rather than running into it.
    lines.push(left.length < 33 ? `${left.padEnd(34)}${help}` : `${left}\n${''.padEnd(34)}${help}`);
  }
  lines.push('  -h, --help                      this text', '  --version                       print the version');
  return lines.join('\n');
}

/** `--hints-file`, else the file's `hintsFile`: an empty path is refused, not taken for none. */
function hintsFileOf(flag: [string, string] | undefined, fromFile: string | undefined): string | null {
  return pathOf(flag, fromFile, 'leave it out to drop hints at a stop');
}

/** A path from a flag, else from the file: an empty one is refused, not taken for none. */
function pathOf(flag: [string, string] | undefined, fromFile: string | undefined, instead: string): string | null {
  if (flag === undefined) return fromFile ?? null;
  if (flag[0].trim() === '') throw new ConfigError(`${flag[1]}: an empty path (${instead})`);
  return flag[0];
}
