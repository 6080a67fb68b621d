/**
 * The configuration file (`--config lakefront.json`): clusters and the routes onto them, for
 * set-ups the flags do not cover (several clusters, per-route policies, etcd next to /rpc).
 *
 * ```json
 * {
 *   "port": 8080, "host": "0.0.0.0", "threads": 2,
 *   "clusters": [
 *     { "name": "boards", "nodes": "a=http://10.0.0.1:7000,b=http://10.0.0.2:7000" },
 *     { "name": "etcd", "nodes": [{ "id": "e1", "url": "http://10.0.0.5:2379" }], "preset": "etcd" }
 *   ],
 *   "routes": [
 *     { "path": "/rpc/*", "cluster": "boards", "policy": "rendezvous", "keyHeader": "x-lakefront-board" },
 *     { "path": "/v3/*", "cluster": "etcd", "policy": "hybrid", "preset": "etcd" }
 *   ]
 * }
 * ```
 *
 * Every bad value is a ConfigError naming its place, e.g. `routes[1].policy: unknown policy "x"`.
 */
import { DEFAULT_AFFINITY_HEADER, DEFAULT_TICKET_TTL_SECONDS, ticketFits, type AffinitySettings } from '../affinity/tickets.js';
import { DROPPED_REQUEST_HEADERS, HEDGED_HEADER, IDEMPOTENT_HEADER, SERVED_BY_HEADER, hasDotSegment } from '../contract.js';
import { ConfigError, quoted } from '../errors.js';
import { REGION_NAME, parseMemberList, validateMembers, type MemberConfig } from '../membership/membership.js';
import { OWN_PATHS, POLICY_NAMES, type OperationRules, type PolicyName, type PolicySettings } from '../server/protocol.js';
import type { ClusterConfig, RouteConfig } from '../server/supervisor.js';
import { ETCD_HEALTH_PATH, ETCD_OPERATIONS, etcdPreset } from './presets.js';
import { ACKS_HEADER, CONSISTENCY_LEVELS, DEFAULT_HINT_WINDOW_MS, DEFAULT_MAX_HINT_BYTES, HINT_HEADER, VERSION_HEADER, majority, type Consistency, type QuorumSettings } from '../replication/quorum.js';

export interface FileConfig {
  readonly port?: number;
  readonly host?: string;
  readonly threads?: number;
  /** The front door's own region (local_quorum). */
  readonly region?: string;
  /** Where hints are saved at a stop (see `--hints-file`). */
  readonly hintsFile?: string;
  /** The access log (see `--access-log`). */
  readonly accessLog?: string;
  /** `"append"`: X-Forwarded-For and friends to the nodes (see --forwarded-for). */
  readonly forwardedFor?: 'append' | 'off';
  readonly clusters: ClusterConfig[];
  readonly routes: RouteConfig[];
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** A setting's place: `lf.json: port` at the top level (`where` ends in ':'), else `routes[0].policy`. */
function field(where: string, key: string): string {
  return where.endsWith(':') ? `${where} ${key}` : `${where}.${key}`;
}

function fail(where: string, message: string): never {
  throw new ConfigError(`${where}: ${message}`);
}

function str(obj: Json, key: string, where: string, required: true): string;
function str(obj: Json, key: string, where: string, required?: false): string | undefined;
function str(obj: Json, key: string, where: string, required = false): string | undefined {
  const v = obj[key];
  if (v === undefined) return required ? fail(field(where, key), 'is required') : undefined;
  if (typeof v !== 'string' || v === '') fail(field(where, key), `must be a non-empty string, got ${JSON.stringify(v)}`);
  return v;
}

function num(obj: Json, key: string, where: string, min: number, max: number): number | undefined {
  const v = obj[key];
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min || v > max) fail(field(where, key), `must be a number in ${min}..${max}, got ${JSON.stringify(v)}`);
  return v;
}

function bool(obj: Json, key: string, where: string): boolean | undefined {
  const v = obj[key];
  if (v === undefined) return undefined;
  if (typeof v !== 'boolean') fail(field(where, key), `must be true or false, got ${JSON.stringify(v)}`);
  return v;
}

function known(obj: Json, keys: readonly string[], where: string): void {
  for (const key of Object.keys(obj)) if (!keys.includes(key)) fail(field(where, key), `unknown setting (known: ${keys.join(', ')})`);
}

function members(value: unknown, where: string): MemberConfig[] {
  if (typeof value === 'string') return parseMemberList(value, where);
  if (!Array.isArray(value)) fail(where, 'must be "id=url,..." or a list of { id, url, region?, weight? }');
  return validateMembers(
    value.map((m, i) => {
      if (!isObject(m)) fail(`${where}[${i}]`, 'must be { id, url, region?, weight? }');
      known(m, ['id', 'url', 'region', 'weight'], `${where}[${i}]`);
      return {
        id: m.id as string,
        url: m.url as string,
        ...(m.region !== undefined ? { region: m.region as string } : {}),
        ...(m.weight !== undefined ? { weight: m.weight as number } : {}),
      };
    }),
    where,
  );
}

/**
 * A route's `operations`. Each key given replaces the preset's (`base`); a key left out keeps the
 * preset's, so overriding the reads of an etcd route still refuses `/v3/watch`.
 */
function operations(value: unknown, where: string, base: OperationRules | null): OperationRules {
  if (!isObject(value)) fail(where, 'must be { reads: [...], writes: [...], unsupported: [...], otherwise: "read" | "write" }');
  known(value, ['reads', 'writes', 'unsupported', 'otherwise'], where);
  const list = (key: 'reads' | 'writes' | 'unsupported'): readonly string[] => {
    const v: unknown = value[key] ?? base?.[key] ?? [];
    if (!Array.isArray(v) || v.some((p) => typeof p !== 'string' || !PATH_PATTERN.test(p))) fail(field(where, key), `must be a list of paths starting with / (exact, or a prefix ending in *), got ${JSON.stringify(v)}`);
    return v as string[];
  };
  const otherwise = value.otherwise ?? base?.otherwise ?? 'write';
  if (otherwise !== 'read' && otherwise !== 'write') fail(`${where}.otherwise`, `must be "read" or "write", got ${JSON.stringify(otherwise)}`);
  const rules: OperationRules = { reads: list('reads'), writes: list('writes'), unsupported: list('unsupported'), otherwise };
  // One path in two lists would be classified by whichever the classifier happened to take.
  const listed = new Map<string, string>();
  for (const key of ['reads', 'writes', 'unsupported'] as const) {
    for (const path of rules[key] ?? []) {
      const first = listed.get(path);
      if (first !== undefined && first !== key) fail(where, `${JSON.stringify(path)} is in both ${first} and ${key}${base ? ' (with the preset\'s lists)' : ''}`);
      listed.set(path, key);
    }
  }
  return rules;
}

/** A header name (an RFC 9110 token, lower case). */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9a-z-]+$/;
/** A route or operation path: exact, or a prefix ending in `*`. */
const PATH_PATTERN = /^\/[^*]*\*?$/;

/**
 * What keeps a route's path from being the literal path (or prefix) it reads as, where uWS's
 * router takes it: a segment starting with `:` is a uWS parameter (`/:id/*` takes any first
 * segment); a query, a fragment, a space, a control or format character, an empty segment
 * (`//a/*`) or a dot segment (`/a/../*`, `/a/..;x/*`: such requests are refused, `400`) can never
 * match a request; and a percent-escape or a backslash can only match spellings the front door
 * refuses or routes by their plain form. Null for a good path.
 */
function routePathProblem(path: string): string | null {
  if (/[?#\s\p{Cc}\p{Cf}]/u.test(path)) return 'no query, fragment, spaces, control or format characters in a route path';
  // Requests are matched as they are spelled; the front door refuses (a dot segment, %00) or
  // routes by their plain spelling (another route's path spelled with escapes) those that are not.
  if (/[%\\]/.test(path)) return 'no percent-escapes or backslashes in a route path (write it plain)';
  const segments = path.slice(1).split('/');
  // Only the last may be empty ("/", an exact "/a/").
  if (segments.slice(0, -1).some((seg) => seg === '')) return 'no empty segments in a route path ("//")';
  if (hasDotSegment(path)) return 'no "." or ".." segments in a route path (requests with them are refused)';
  if (segments.some((seg) => seg.startsWith(':'))) return 'no segment starting with ":" in a route path (uWS would take it for a parameter that matches any segment)';
  return null;
}

/** Headers a ticket may not travel in: the nodes' (authorization, cookies) and every one of the front door's own. */
const RESERVED_TICKET_HEADERS: ReadonlySet<string> = new Set([
  'authorization',
  'cookie',
  'set-cookie',
  SERVED_BY_HEADER,
  HEDGED_HEADER,
  IDEMPOTENT_HEADER,
  VERSION_HEADER,
  ACKS_HEADER,
  HINT_HEADER,
  // Set or rewritten by the front door itself with --forwarded-for append, and read by nodes.
  'x-forwarded-for',
  'x-forwarded-proto',
  'x-forwarded-host',
  'forwarded',
]);

/**
 * A route's `affinity` (seed 004): `{ app, header?, ttlSeconds?, generation? }`. The signing keys
 * never come from the file: the caller adds them from the environment (LAKEFRONT_AFFINITY_KEYS).
 */
function affinity(value: unknown, where: string, keyHeader: string | null, members: readonly MemberConfig[]): AffinitySettings {
  // Not echoed: a signing key put here by mistake must not reach the log.
  if (!isObject(value)) fail(where, `must be { app, header?, ttlSeconds?, generation? }, got ${value === null ? 'null' : Array.isArray(value) ? 'a list' : `a ${typeof value}`}`);
  known(value, ['app', 'header', 'ttlSeconds', 'generation'], where);
  const app = str(value, 'app', where, true);
  if (app === '' || app.length > 128) fail(`${where}.app`, `must be 1-128 characters, got ${app.length}`);
  const header = (str(value, 'header', where) ?? DEFAULT_AFFINITY_HEADER).toLowerCase();
  if (!HEADER_NAME.test(header) || DROPPED_REQUEST_HEADERS.has(header)) fail(`${where}.header`, `not a usable header name: ${JSON.stringify(header)}`);
  // The ticket header is taken off every request: it must not be one the nodes or the front door
  // need (authorization and cookies are forwarded untouched).
  if (RESERVED_TICKET_HEADERS.has(header) || header.startsWith('sec-websocket-') || header === keyHeader) {
    fail(`${where}.header`, `"${header}" is ${header === keyHeader ? "the route's key header" : 'a header the nodes or the front door need'}; tickets need one of their own`);
  }
  const ttlSeconds = num(value, 'ttlSeconds', where, 1, 30 * 86_400) ?? DEFAULT_TICKET_TTL_SECONDS;
  const generation = num(value, 'generation', where, 0, Number.MAX_SAFE_INTEGER) ?? 0;
  if (!Number.isInteger(ttlSeconds)) fail(`${where}.ttlSeconds`, `must be a whole number, got ${ttlSeconds}`);
  if (!Number.isInteger(generation)) fail(`${where}.generation`, `must be a whole number, got ${generation}`);
  const long = members.find((m) => !ticketFits(app, m.id, generation));
  if (long) fail(`${where}`, `node id "${long.id.slice(0, 40)}..." is too long to name in a ticket`);
  return { app, header, ttlSeconds, generation, keys: [] };
}

/**
 * A replicated route's `quorum` (seed 003): `{ n?, w?, r?, consistency?, sloppy?,
 * hintWindowSeconds?, maxHintBytes? }`. w + r must exceed n, so every read quorum meets the
 * latest write quorum.
 */
function quorum(value: unknown, where: string, cluster: ClusterConfig, region: string | undefined): QuorumSettings {
  if (!isObject(value)) fail(where, `must be { n?, w?, r?, consistency?, sloppy?, hintWindowSeconds?, maxHintBytes? }, got ${JSON.stringify(value)}`);
  known(value, ['n', 'w', 'r', 'consistency', 'sloppy', 'hintWindowSeconds', 'maxHintBytes'], where);
  // The ring places keys on nodes of weight above 0 only.
  const size = cluster.members.filter((m) => m.weight !== 0).length;
  const drained = cluster.members.length - size;
  const whole = (key: string, min: number, max: number): number | undefined => {
    const v = num(value, key, where, min, max);
    if (v !== undefined && !Number.isInteger(v)) fail(field(where, key), `must be a whole number, got ${v}`);
    return v;
  };
  if (size === 0) fail(where, `cluster "${cluster.name}" has no node of weight above 0 to keep keys on (${drained} of weight 0)`);
  // A key's replicas are n distinct nodes (seed 003): two ids for one URL are one store, whose
  // acknowledgement would count twice toward w (and its answer twice toward r).
  const byUrl = new Map<string, string>();
  for (const m of cluster.members) {
    if (m.weight === 0) continue;
    const other = byUrl.get(m.url);
    if (other !== undefined) fail(where, `nodes "${other}" and "${m.id}" of cluster "${cluster.name}" have one URL (${m.url}): a replicated route needs its replicas to be distinct nodes`);
    byUrl.set(m.url, m.id);
  }
  const n = whole('n', 1, 1_000) ?? Math.min(3, size);
  if (n > size) fail(`${where}.n`, `${n} replicas, and cluster "${cluster.name}" has ${size} node${size === 1 ? '' : 's'}${drained > 0 ? ` of weight above 0 (${drained} of weight 0 hold no keys)` : ''}`);
  const consistency = (value.consistency ?? 'quorum') as Consistency;
  if (!CONSISTENCY_LEVELS.includes(consistency)) fail(`${where}.consistency`, `unknown level ${JSON.stringify(value.consistency)} (known: ${CONSISTENCY_LEVELS.join(', ')})`);
  if (consistency !== 'quorum') {
    for (const key of ['w', 'r']) if (value[key] !== undefined) fail(field(where, key), `applies to consistency "quorum" only (${consistency} takes majorities per region)`);
  }
  const w = whole('w', 1, n) ?? majority(n);
  const r = whole('r', 1, n) ?? majority(n);
  if (w + r <= n) fail(where, `w + r must exceed n (${w} + ${r} <= ${n}): a read could miss the latest acknowledged write`);
  if (consistency === 'each_quorum' && cluster.members.every((m) => m.region === undefined)) {
    fail(`${where}.consistency`, `each_quorum needs regions, and no node of cluster "${cluster.name}" has one (without them it is quorum)`);
  }
  if (consistency === 'local_quorum') {
    if (region === undefined) fail(`${where}.consistency`, 'local_quorum needs the front door\'s own "region" (top level of the file)');
    if (!cluster.members.some((m) => m.region === region)) fail(`${where}.consistency`, `local_quorum: no node of cluster "${cluster.name}" is in region "${region}"`);
  }
  const hintWindowSeconds = whole('hintWindowSeconds', 1, 7 * 86_400);
  const maxHintBytes = whole('maxHintBytes', 0, 1024 * 1024 * 1024);
  const sloppy = bool(value, 'sloppy', where) ?? true;
  if (sloppy && maxHintBytes === 0) fail(`${where}.maxHintBytes`, '0 keeps no hints, so no stand-in could be used: set "sloppy": false instead');
  // A strict quorum makes no hints, so a budget for them would be taken and do nothing (0 says
  // the same as "sloppy": false, and is taken). Its hintWindowSeconds still bounds the hints it
  // takes over from a hints file or a sloppy predecessor, so that one is taken.
  if (!sloppy && maxHintBytes !== undefined && maxHintBytes > 0) fail(field(where, 'maxHintBytes'), 'applies to a sloppy quorum only (a strict one makes no hints), and "sloppy" is false');
  return {
    n,
    w,
    r,
    consistency,
    sloppy,
    hintWindowMs: hintWindowSeconds !== undefined ? hintWindowSeconds * 1000 : DEFAULT_HINT_WINDOW_MS,
    maxHintBytes: maxHintBytes ?? DEFAULT_MAX_HINT_BYTES,
  };
}

/**
 * The place of the first key given twice in one object of `text`, which JSON.parse has taken
 * (`routes`, `routes[1].quorum.n`); null when there is none. JSON.parse keeps the last of them,
 * so the first (a list of routes pasted in twice, two snippets merged) would go without a word,
 * as a flag given twice would; the file is refused instead. Keys are compared decoded
 * (`"rou\u0074es"` is `routes`).
 */
export function duplicateKey(text: string): string | null {
  /** An open object (`keys`) or array (`keys` null), its place, and where its next member goes. */
  interface Open {
    readonly place: string;
    readonly keys: Set<string> | null;
    key: string;
    index: number;
    expectKey: boolean;
  }
  const stack: Open[] = [];
  const placeOfNext = (): string => {
    const parent = stack[stack.length - 1];
    if (parent === undefined) return '';
    if (parent.keys === null) return `${parent.place}[${parent.index}]`;
    return parent.place === '' ? parent.key : `${parent.place}.${parent.key}`;
  };
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    const top = stack[stack.length - 1];
    if (c === '{' || c === '[') {
      stack.push({ place: placeOfNext(), keys: c === '{' ? new Set() : null, key: '', index: 0, expectKey: c === '{' });
    } else if (c === '}' || c === ']') {
      stack.pop();
    } else if (c === ',') {
      if (top?.keys === null) top.index++;
      else if (top !== undefined) top.expectKey = true;
    } else if (c === '"') {
      const start = i;
      for (i++; text[i] !== '"'; i++) if (text[i] === '\\') i++;
      if (top?.keys && top.expectKey) {
        const key = JSON.parse(text.slice(start, i + 1)) as string;
        top.expectKey = false;
        top.key = key;
        if (top.keys.has(key)) return top.place === '' ? key : `${top.place}.${key}`;
        top.keys.add(key);
      }
    }
  }
  return null;
}

/** Validates a parsed configuration file. */
export function parseFileConfig(raw: unknown, file: string): FileConfig {
  if (!isObject(raw)) fail(file, 'must hold a JSON object');
  /** The top level's place: `lf.json:` (see `field`). */
  const top = `${file}:`;
  known(raw, ['port', 'host', 'threads', 'region', 'hintsFile', 'accessLog', 'forwardedFor', 'clusters', 'routes'], top);
  const forwardedFor = str(raw, 'forwardedFor', top);
  if (forwardedFor !== undefined && forwardedFor !== 'append' && forwardedFor !== 'off') fail(field(top, 'forwardedFor'), `must be "append" or "off", got ${JSON.stringify(forwardedFor)}`);
  // Checked here too, to be named by its place (the flag's is checked where the two meet).
  const host = str(raw, 'host', top);
  if (host !== undefined && /\s/.test(host)) fail(field(top, 'host'), `bad address ${JSON.stringify(host)}`);
  const region = str(raw, 'region', top);
  if (region !== undefined && !REGION_NAME.test(region)) fail(field(top, 'region'), `must be 1-64 letters, digits, '.', '_' or '-', got ${JSON.stringify(region)}`);
  const clustersRaw = raw.clusters;
  if (!Array.isArray(clustersRaw) || clustersRaw.length === 0) fail(field(top, 'clusters'), 'must be a non-empty list');
  const clusters: ClusterConfig[] = [];
  const presets = new Map<string, string>();
  const seenNodeIds = new Set<string>();
  clustersRaw.forEach((c, i) => {
    const where = `${file}: clusters[${i}]`;
    if (!isObject(c)) fail(where, 'must be an object');
    known(c, ['name', 'nodes', 'healthPath', 'preset', 'leader', 'leaderIntervalMs', 'policy'], where);
    const name = str(c, 'name', where, true);
    if (clusters.some((x) => x.name === name)) fail(`${where}.name`, `duplicate cluster "${name}"`);
    const list = members(c.nodes, `${where}.nodes`);
    for (const m of list) {
      if (seenNodeIds.has(m.id)) fail(`${where}.nodes`, `node id "${m.id}" is used by another cluster`);
      seenNodeIds.add(m.id);
    }
    const preset = str(c, 'preset', where);
    if (preset !== undefined && preset !== 'etcd') fail(`${where}.preset`, `unknown preset "${preset}" (known: etcd)`);
    // An explicit `"leader": null` turns the preset's probe off; only an absent key takes it.
    const leader = c.leader !== undefined ? c.leader : preset === 'etcd' ? 'etcd' : null;
    if (leader !== null && leader !== 'etcd') fail(`${where}.leader`, `must be "etcd" or null, got ${JSON.stringify(leader)}`);
    const healthPath = str(c, 'healthPath', where) ?? (preset === 'etcd' ? ETCD_HEALTH_PATH : '/health');
    if (!healthPath.startsWith('/')) fail(`${where}.healthPath`, `must start with /, got ${JSON.stringify(healthPath)}`);
    let policySettings: Partial<PolicySettings> | undefined;
    if (c.policy !== undefined) {
      if (!isObject(c.policy)) fail(`${where}.policy`, 'must be an object');
      known(c.policy, ['ewmaAlpha', 'temperatureMs', 'rho', 'probeShare'], `${where}.policy`);
      policySettings = {
        ...(num(c.policy, 'ewmaAlpha', `${where}.policy`, 0.001, 1) !== undefined ? { ewmaAlpha: c.policy.ewmaAlpha as number } : {}),
        ...(num(c.policy, 'temperatureMs', `${where}.policy`, 0.001, 1e6) !== undefined ? { temperatureMs: c.policy.temperatureMs as number } : {}),
        ...(num(c.policy, 'rho', `${where}.policy`, 1, 1000) !== undefined ? { rho: c.policy.rho as number } : {}),
        ...(num(c.policy, 'probeShare', `${where}.policy`, 0, 1) !== undefined ? { probeShare: c.policy.probeShare as number } : {}),
      };
    }
    const leaderIntervalMs = num(c, 'leaderIntervalMs', where, 10, 60_000);
    if (leaderIntervalMs !== undefined && leader === null) fail(`${where}.leaderIntervalMs`, 'the cluster has no leader probe to time (set "leader": "etcd", or the etcd preset)');
    if (preset) presets.set(name, preset);
    clusters.push({
      name,
      members: list,
      healthPath,
      leader: leader as 'etcd' | null,
      ...(leaderIntervalMs !== undefined ? { leaderIntervalMs } : {}),
      ...(policySettings ? { policySettings } : {}),
    });
  });
  const routesRaw = raw.routes;
  if (!Array.isArray(routesRaw) || routesRaw.length === 0) fail(field(top, 'routes'), 'must be a non-empty list');
  const routes: RouteConfig[] = routesRaw.map((r, i) => {
    const where = `${file}: routes[${i}]`;
    if (!isObject(r)) fail(where, 'must be an object');
    known(r, ['path', 'cluster', 'policy', 'keyHeader', 'preset', 'operations', 'hedge', 'failoverUnsent', 'affinity', 'quorum'], where);
    const path = str(r, 'path', where, true);
    if (!PATH_PATTERN.test(path) || (path.endsWith('*') && !path.endsWith('/*'))) {
      // uWS matches a wildcard only as a whole last segment: `/api*` would match nothing but itself.
      fail(`${where}.path`, `must start with / and may end in /* (a wildcard is a whole segment: "/api/*", not "/api*"), got ${JSON.stringify(path)}`);
    }
    const unmatchable = routePathProblem(path);
    if (unmatchable !== null) fail(`${where}.path`, `${unmatchable}, got ${quoted(path)}`);
    if (OWN_PATHS.includes(path)) fail(`${where}.path`, `${path} is the front door's own endpoint (${OWN_PATHS.join(', ')} are not proxied)`);
    const cluster = str(r, 'cluster', where, true);
    const clusterConfig = clusters.find((c) => c.name === cluster);
    if (clusterConfig === undefined) fail(`${where}.cluster`, `unknown cluster "${cluster}"`);
    const preset = str(r, 'preset', where) ?? presets.get(cluster);
    if (preset !== undefined && preset !== 'etcd') fail(`${where}.preset`, `unknown preset "${preset}" (known: etcd)`);
    const replicated = r.quorum !== undefined && r.quorum !== null;
    if (replicated) {
      // Said before any default that follows from them (an etcd preset's hybrid policy).
      // The replicas are the key's preference list on the ring; the path is the key by default.
      for (const key of ['operations', 'affinity', 'hedge', 'failoverUnsent', 'preset']) {
        if (r[key] !== undefined) fail(field(where, key), 'does not apply to a replicated route (quorum): every request goes to the key\'s replicas');
      }
      if (preset !== undefined) fail(`${where}.quorum`, `cluster "${cluster}" is an ${preset} cluster, which replicates by itself`);
    }
    const policy = (str(r, 'policy', where) ?? (preset === 'etcd' ? 'hybrid' : replicated ? 'ring' : 'rendezvous')) as PolicyName;
    if (!POLICY_NAMES.includes(policy)) fail(`${where}.policy`, `unknown policy "${policy}" (known: ${POLICY_NAMES.join(', ')})`);
    // hybrid pins writes to the leader the cluster's probe finds: with no probe it would send
    // every write round robin, followers included, and say nothing. (round_robin and boltzmann
    // never read the leader.)
    if (policy === 'hybrid' && clusterConfig.leader === null) {
      fail(`${where}.policy`, `"hybrid" pins writes to the leader, and cluster "${cluster}" does not probe for one (set "leader": "etcd" on it, or use round_robin or boltzmann)`);
    }
    const base: RouteConfig = preset === 'etcd' ? etcdPreset(cluster, [], policy, path).route : { pattern: path, cluster, policy, keyHeader: null };
    const keyHeader = r.keyHeader === null ? null : (str(r, 'keyHeader', where)?.toLowerCase() ?? base.keyHeader);
    if (keyHeader !== null && !HEADER_NAME.test(keyHeader)) fail(`${where}.keyHeader`, `not a header name: ${JSON.stringify(keyHeader)}`);
    if (keyHeader !== null && DROPPED_REQUEST_HEADERS.has(keyHeader)) {
      fail(`${where}.keyHeader`, `"${keyHeader}" is a hop-by-hop or framing header, not a routing key`);
    }
    if (replicated) {
      if (policy !== 'ring') fail(`${where}.policy`, `a replicated route places keys on the ring: "ring", not ${JSON.stringify(policy)}`);
    } else if ((policy === 'rendezvous' || policy === 'ring') && keyHeader === null) fail(`${where}.keyHeader`, `the ${policy} policy needs a key header`);
    return {
      ...base,
      keyHeader,
      operations: r.operations !== undefined ? operations(r.operations, `${where}.operations`, base.operations ?? null) : (base.operations ?? null),
      hedge: bool(r, 'hedge', where) ?? base.hedge ?? true,
      // An affinity route re-places a client whose node cannot be reached (seed 004: a ticket for
      // a failed node does not bounce the client): a write never sent goes on to a sibling.
      failoverUnsent: bool(r, 'failoverUnsent', where) ?? base.failoverUnsent ?? (r.affinity !== undefined && r.affinity !== null),
      affinity: r.affinity !== undefined && r.affinity !== null ? affinity(r.affinity, `${where}.affinity`, keyHeader, clusterConfig.members) : null,
      quorum: replicated ? quorum(r.quorum, `${where}.quorum`, clusterConfig, region) : null,
    };
  });
  const paths = new Set<string>();
  for (const [i, route] of routes.entries()) {
    if (paths.has(route.pattern)) fail(`${file}: routes[${i}].path`, `duplicate path "${route.pattern}"`);
    paths.add(route.pattern);
  }
  const port = num(raw, 'port', top, 0, 65535);
  const threads = num(raw, 'threads', top, 1, 256);
  if (port !== undefined && !Number.isInteger(port)) fail(field(top, 'port'), `must be a whole number, got ${port}`);
  if (threads !== undefined && !Number.isInteger(threads)) fail(field(top, 'threads'), `must be a whole number, got ${threads}`);
  return {
    ...(port !== undefined ? { port } : {}),
    ...(threads !== undefined ? { threads } : {}),
    ...(host !== undefined ? { host } : {}),
    ...(region !== undefined ? { region } : {}),
    ...(str(raw, 'hintsFile', top) !== undefined ? { hintsFile: raw.hintsFile as string } : {}),
    ...(str(raw, 'accessLog', top) !== undefined ? { accessLog: raw.accessLog as string } : {}),
    ...(forwardedFor !== undefined ? { forwardedFor } : {}),
    clusters,
    routes,
  };
}

export { ETCD_OPERATIONS };
