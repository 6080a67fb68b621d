import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, it } from 'node:test';
import { parseCommand } from '../src/config/config.js';
import { parseFileConfig } from '../src/config/file.js';
import type { FrontDoorConfig } from '../src/server/supervisor.js';

function run(argv: string[], env: Record<string, string> = {}): FrontDoorConfig {
  const command = parseCommand(argv, env);
  assert.equal(command.kind, 'run');
  return (command as { config: FrontDoorConfig }).config;
}

describe('flags and environment', () => {
  it('with nothing configured: the demo cluster behind /rpc/*, on loopback', () => {
    const command = parseCommand([], {});
    assert.equal(command.kind, 'run');
    assert.equal((command as { demo: boolean }).demo, true);
    assert.equal((command as { config: FrontDoorConfig }).config.host, '127.0.0.1');
  });

  it('--etcd adds a leader-probed etcd cluster behind /v3/* with the hybrid policy', () => {
    const config = run(['--etcd', 'e1=http://127.0.0.1:2379,e2=http://127.0.0.1:2479']);
    assert.deepEqual(config.clusters.map((c) => [c.name, c.leader, c.healthPath]), [['etcd', 'etcd', '/version']]);
    const [route] = config.routes;
    assert.equal(route!.pattern, '/v3/*');
    assert.equal(route!.policy, 'hybrid');
    assert.equal(route!.keyHeader, null);
    assert.equal(route!.hedge, false);
    assert.equal(route!.failoverUnsent, true);
    assert.deepEqual(route!.operations!.reads, ['/v3/kv/range']);
  });

  it("--worker-young-mb caps a worker thread's young generation: 12 MiB unless given, 1-1024", () => {
    const nodes = ['--nodes', 'a=http://127.0.0.1:1'];
    assert.equal(run(nodes).workerYoungMb, 12);
    assert.equal(run([...nodes, '--worker-young-mb', '48']).workerYoungMb, 48);
    assert.equal(run(nodes, { LAKEFRONT_WORKER_YOUNG_MB: '6' }).workerYoungMb, 6);
    assert.throws(() => parseCommand([...nodes, '--worker-young-mb', '0'], {}), /^ConfigError: --worker-young-mb: 0 is out of range 1\.\.1024$/);
    assert.throws(() => parseCommand([...nodes, '--worker-young-mb', '2.5'], {}), /^ConfigError: --worker-young-mb: not a whole number: "2\.5"$/);
  });

  it('--nodes and --etcd together serve /rpc/* and /v3/*', () => {
    const config = run(['--nodes', 'a=http://127.0.0.1:1', '--etcd', 'e1=http://127.0.0.1:2', '--etcd-policy', 'round_robin']);
    assert.deepEqual(config.routes.map((r) => [r.pattern, r.policy]), [['/rpc/*', 'rendezvous'], ['/v3/*', 'round_robin']]);
  });

  const bad: [string, string[], Record<string, string>, RegExp][] = [
    ['unknown etcd policy', ['--etcd', 'e1=http://127.0.0.1:2', '--etcd-policy', 'random'], {}, /--etcd-policy: must be hybrid or round_robin or boltzmann, got "random"/],
    ['the same id in both clusters', ['--nodes', 'a=http://127.0.0.1:1', '--etcd', 'a=http://127.0.0.1:2'], {}, /node id "a" is also in --nodes/],
    ['config file and --nodes', ['--config', '/nonexistent.json', '--nodes', 'a=http://127.0.0.1:1'], {}, /--config: give clusters either in the file or with --nodes\/--etcd/],
    ['missing config file', ['--config', '/nonexistent.json'], {}, /--config: cannot read "\/nonexistent.json" \(ENOENT\)/],
    ['bad hedge mode', ['--hedge-mode', 'sometimes'], {}, /--hedge-mode: must be percentile or fixed or off/],
    ['an etcd policy without etcd members', ['--nodes', 'a=http://127.0.0.1:1', '--etcd-policy', 'round_robin'], {}, /--etcd-policy: applies to --etcd members, and none are given/],
    ['the same, from the environment', ['--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_ETCD_POLICY: 'hybrid' }, /LAKEFRONT_ETCD_POLICY: applies to --etcd members/],
    // parseArgs alone calls `-1` an ambiguous argument without naming it.
    ['a negative thread count', ['--threads', '-1', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--threads: -1 is out of range 1\.\.256$/],
    ['a negative body limit', ['--max-body-bytes', '-5', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--max-body-bytes: -5 is out of range 0\.\.1073741824$/],
    ['a fraction of a thread', ['--threads', '1.5', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--threads: not a whole number: "1\.5"$/],
    ['a response limit under 1 KiB', ['--max-response-bytes', '100', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--max-response-bytes: 100 is out of range 1024\.\.1073741824$/],
    ['a response limit from the environment that is not a number', ['--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_MAX_RESPONSE_BYTES: 'lots' }, /^LAKEFRONT_MAX_RESPONSE_BYTES: not a whole number: "lots"$/],
    ['a WebSocket backlog under 64 KiB', ['--ws-backlog-bytes', '4096', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--ws-backlog-bytes: 4096 is out of range 65536\.\.1073741824$/],
    ['a negative hedge budget', ['--hedge-budget-percent', '-1', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--hedge-budget-percent: -1 is out of range 0\.\.100$/],
    ['a node URL with credentials (never echoed)', ['--nodes', 'a=http://user:s3cret@127.0.0.1:1'], {}, /^--nodes: the URL for node "a" carries credentials, which are not supported$/],
    ['a node URL with only a password', ['--nodes', 'a=http://:s3cret@127.0.0.1:1'], {}, /^--nodes: the URL for node "a" carries credentials/],
    ['a node URL on port 0', ['--nodes', 'a=http://127.0.0.1:0'], {}, /^--nodes: bad URL "http:\/\/127\.0\.0\.1:0" for node "a" \(port 0 cannot be reached\)$/],
    // parseArgs keeps the last of a repeated flag silently.
    ['a flag given twice', ['--nodes', 'a=http://127.0.0.1:1', '--nodes', 'b=http://127.0.0.1:2'], {}, /^--nodes: given more than once$/],
    ['the same, in its --flag=value form', ['--threads=1', '--nodes', 'a=http://127.0.0.1:1', '--threads', '2'], {}, /^--threads: given more than once$/],
    ['nodes from the environment and a config file', ['--config', '/nonexistent.json'], { LAKEFRONT_NODES: 'a=http://127.0.0.1:1' }, /^--config: give clusters either in the file or with --nodes\/--etcd, not both \(LAKEFRONT_NODES is set too\)$/],
    ['affinity keys from the environment with no configuration file', ['--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_AFFINITY_KEYS: 'short' }, /^LAKEFRONT_AFFINITY_KEYS: affinity tickets belong to routes in a configuration file \(--config\), and none is given$/],
    // An unparsable URL is shown without what could be a secret in it.
    ['an unparsable node URL with credentials (not shown)', ['--nodes', 'a=http://admin:hunter2@10.0.0.1:70000'], {}, /^--nodes: bad URL for node "a" \(not a URL of the form http\(s\):\/\/host:port, the port 1-65535; not shown, as it may hold a password\)$/],
    ['the same from the environment, for etcd', [], { LAKEFRONT_ETCD: 'e1=http://root:etcdpass@10.0.0.5:2379x' }, /^LAKEFRONT_ETCD: bad URL for node "e1" \(not a URL/],
    ['a password with a slash in it (the URL does not parse)', ['--nodes', 'a=http://user:pa/ss@host:1'], {}, /^--nodes: bad URL for node "a" \(not a URL/],
    ['a node URL with a query (not echoed)', ['--nodes', 'a=http://127.0.0.1:1/?token=s3cr3t'], {}, /^--nodes: bad URL "http:\/\/127\.0\.0\.1:1\?\*\*\*" for node "a" \(http\(s\):\/\/host:port only, no path\)$/],
    // An entry that is no id=url is named by its place: it may be a URL with a password.
    ['a URL with no id (not shown)', ['--nodes', 'http://user:pass@h:1'], {}, /^--nodes: bad entry 1 of 1 \(want id=url; not shown, as it may hold a password\)$/],
    ['a URL with no id and a query (not taken for id=url)', ['--nodes', 'http://10.0.0.1:80/?token=s3cr3t'], {}, /^--nodes: bad entry 1 of 1 \(it starts with a URL: want id=url; not shown, as it may hold a password\)$/],
    ['a comma in a password (the tail an entry of its own, not shown)', ['--nodes', 'a=http://127.0.0.1:1,b=http://u:p,ss@h:1'], {}, /^--nodes: bad entry 3 of 3 \(want id=url; not shown, as it may hold a password\)$/],
    // Set but empty is not unset: an empty LAKEFRONT_NODES must not start the demo.
    ['an empty LAKEFRONT_NODES', [], { LAKEFRONT_NODES: '' }, /^LAKEFRONT_NODES: set but empty \(unset it for the default: the demo cluster\)$/],
    ['an empty LAKEFRONT_CONFIG', [], { LAKEFRONT_CONFIG: ' ' }, /^LAKEFRONT_CONFIG: set but empty/],
    ['an empty LAKEFRONT_ETCD', [], { LAKEFRONT_ETCD: '' }, /^LAKEFRONT_ETCD: set but empty/],
    ['an empty LAKEFRONT_HOST', ['--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_HOST: '' }, /^LAKEFRONT_HOST: set but empty/],
    ['a node id with a control character', ['--nodes', 'a\x7fb=http://127.0.0.1:1'], {}, /^--nodes: bad node id "a\\u007fb" \(non-empty, no spaces, commas, '=', control or format characters\)$/],
    ['a node id with a NUL', ['--nodes', 'a\x00b=http://127.0.0.1:1'], {}, /^--nodes: bad node id "a\\u0000b"/],
    ['a node id with a C1 control character (shown escaped)', [], { LAKEFRONT_NODES: 'a\x9bb=http://127.0.0.1:1' }, /^LAKEFRONT_NODES: bad node id "a\\u009bb"/],
    ['a node id with a bidirectional override (shown escaped)', ['--nodes', 'a\u202eb=http://127.0.0.1:1'], {}, /^--nodes: bad node id "a\\u202eb"/],
    ['a hedge percentile in hex', ['--hedge-percentile', '0x5F', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--hedge-percentile: not a decimal number: "0x5F"$/],
    ['a hedge budget in binary, from the environment', ['--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_HEDGE_BUDGET_PERCENT: '0b1010' }, /^LAKEFRONT_HEDGE_BUDGET_PERCENT: not a decimal number: "0b1010"$/],
    ['a hedge percentile with an exponent', ['--hedge-percentile', '.5e2', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--hedge-percentile: not a decimal number/],
    ['a hedge percentile with a trailing point', ['--hedge-percentile', '5.', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--hedge-percentile: not a decimal number/],
    // A fraction written without its leading 0: parseArgs alone calls it ambiguous, naming no value.
    ['a negative hedge budget written as a bare fraction', ['--hedge-budget-percent', '-.5', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--hedge-budget-percent: -\.5 is out of range 0\.\.100$/],
    // Past 2^53 the number read is not the one written: the line shows what was given.
    ['a thread count past 2^53', ['--threads', '9007199254740993', '--nodes', 'a=http://127.0.0.1:1'], {}, /^--threads: 9007199254740993 is out of range 1\.\.256$/],
  ];
  for (const [name, argv, env, pattern] of bad) {
    it(`rejects ${name} with one line naming it`, () => {
      assert.throws(() => parseCommand(argv, env), (err: Error) => {
        assert.match(err.message, pattern);
        assert.equal(err.message.includes('\n'), false);
        return true;
      });
    });
  }
});

describe('configuration file', () => {
  const good = {
    port: 0,
    threads: 1,
    clusters: [
      { name: 'boards', nodes: 'a=http://127.0.0.1:1,b=http://127.0.0.1:2' },
      { name: 'kv', nodes: [{ id: 'e1', url: 'http://127.0.0.1:3' }], preset: 'etcd', policy: { rho: 3 } },
    ],
    routes: [
      { path: '/rpc/*', cluster: 'boards', keyHeader: 'X-Lakefront-Board' },
      { path: '/v3/*', cluster: 'kv', policy: 'boltzmann' },
      { path: '/kv2/*', cluster: 'kv', preset: 'etcd', operations: { reads: ['/kv2/get'], writes: [], otherwise: 'write' } },
    ],
  };

  it('reads clusters, routes and presets', () => {
    const file = parseFileConfig(good, 'lf.json');
    assert.equal(file.port, 0);
    assert.equal(file.threads, 1);
    assert.equal(file.clusters[1]!.leader, 'etcd');
    assert.equal(file.clusters[1]!.policySettings!.rho, 3);
    assert.equal(file.routes[0]!.policy, 'rendezvous');
    assert.equal(file.routes[0]!.keyHeader, 'x-lakefront-board');
    assert.equal(file.routes[1]!.policy, 'boltzmann');
    assert.equal(file.routes[1]!.operations!.reads[0], '/v3/kv/range', 'the cluster preset applies to its routes');
    assert.deepEqual(file.routes[1]!.operations!.unsupported, ['/v3/watch', '/v3/election/observe'], 'watch and observe streams are refused');
    assert.deepEqual(file.routes[2]!.operations!.reads, ['/kv2/get']);
    assert.deepEqual(file.routes[2]!.operations!.writes, []);
  });

  it('takes an empty environment variable for unset where its default is no surprise (PORT, LAKEFRONT_THREADS)', () => {
    const run = parseCommand(['--nodes', 'a=http://127.0.0.1:1'], { PORT: '', LAKEFRONT_THREADS: '' });
    assert.equal(run.kind === 'run' && run.config.port, 8080);
  });

  it('takes route paths with a colon inside a segment, an exact path with a trailing slash, the root, and dots inside segments', () => {
    const file = parseFileConfig({ ...good, routes: ['/v1/models:predict', '/a/', '/', '/*', '/.well-known/*', '/a.b/.c/*'].map((path) => ({ path, cluster: 'boards', keyHeader: 'x-lakefront-board' })) }, 'lf.json');
    assert.deepEqual(file.routes.map((r) => r.pattern), ['/v1/models:predict', '/a/', '/', '/*', '/.well-known/*', '/a.b/.c/*']);
  });

  it('takes a strict quorum that says it keeps no hints (maxHintBytes 0), and its window for hints taken over', () => {
    const file = parseFileConfig({ ...good, routes: [{ path: '/kv/*', cluster: 'boards', quorum: { n: 2, sloppy: false, maxHintBytes: 0, hintWindowSeconds: 60 } }] }, 'lf.json');
    assert.equal(file.routes[0]!.quorum!.sloppy, false);
    assert.equal(file.routes[0]!.quorum!.hintWindowMs, 60_000);
  });

  it('says where a file stops being JSON, by line and column, and quotes none of it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lakefront-json-'));
    try {
      const path = join(dir, 'lf.json');
      for (const [text, problem] of [
        ['{\n  "clusters": [ }\n', 'an unexpected character at line 2, column 17'],
        ['{ "port": 8080, }', 'an unexpected character at line 1, column 17'],
        ['{ "port": "secret-value\u0001" }', 'an unexpected character at line 1, column 24'],
        ['{ "port": 8080', 'it ends too soon'],
      ] as const) {
        writeFileSync(path, text);
        assert.throws(() => parseCommand(['--config', path], {}), (err: Error) => {
          assert.equal(err.message, `${path}: not valid JSON (${problem})`);
          return true;
        });
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('refuses a key given twice in one object, naming its place, as it does a flag given twice (JSON.parse would keep the last)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lakefront-dup-'));
    try {
      const path = join(dir, 'lf.json');
      const clusters = '"clusters": [{ "name": "boards", "nodes": "a=http://127.0.0.1:1" }]';
      const rpc = '{ "path": "/rpc/*", "cluster": "boards", "keyHeader": "x-lakefront-board" }';
      const kv = '{ "path": "/kv/*", "cluster": "boards", "quorum": { "n": 1 } }';
      for (const [text, place] of [
        // Two snippets pasted together: the first list of routes would go without a word.
        [`{ ${clusters}, "routes": [${rpc}], "routes": [${kv}] }`, 'routes'],
        [`{ ${clusters}, "routes": [${rpc}, { "path": "/kv/*", "cluster": "boards", "quorum": { "n": 1, "n": 1 } }] }`, 'routes[1].quorum.n'],
        [`{ "clusters": [{ "name": "boards", "nodes": "a=http://127.0.0.1:1", "name": "b2" }], "routes": [${rpc}] }`, 'clusters[0].name'],
        // Spelled otherwise, one key all the same.
        [`{ ${clusters}, "routes": [${rpc}], "rou\\u0074es": [${kv}] }`, 'routes'],
      ] as const) {
        writeFileSync(path, text);
        assert.throws(() => parseCommand(['--config', path], {}), (err: Error) => {
          assert.equal(err.message, `${path}: ${place}: given more than once`);
          return true;
        });
      }
      // One key in several objects, and keys and braces inside strings, are no repeats.
      writeFileSync(path, `{ "clusters": [{ "name": "boards", "nodes": "a=http://127.0.0.1:1", "healthPath": "/h?{\\"name\\": [" }], "routes": [${rpc}, { "path": "/x/*", "cluster": "boards", "keyHeader": "x-lakefront-board" }] }`);
      const config = run(['--config', path]);
      assert.deepEqual(config.routes.map((r) => r.pattern), ['/rpc/*', '/x/*']);
      assert.equal(config.clusters[0]!.healthPath, '/h?{"name": [');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('reads a file that begins with a byte-order mark (some editors write one)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lakefront-bom-'));
    try {
      const path = join(dir, 'lf.json');
      writeFileSync(path, `\ufeff${JSON.stringify(good)}`);
      assert.deepEqual(run(["--config", path]).clusters[0]!.members.map((m) => m.id), ["a", "b"]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('names a node without a url, and says what a URL must look like', () => {
    assert.throws(() => parseFileConfig({ ...good, clusters: [{ ...good.clusters[0], nodes: [{ id: 'a' }] }, good.clusters[1]] }, 'lf.json'), /lf\.json: clusters\[0\]\.nodes: node "a" has no url \(http\(s\):\/\/host:port\)$/);
    assert.throws(() => parseCommand(['--nodes', 'a=http://127.0.0.1:99999'], {}), /--nodes: bad URL for node "a" \(not a URL of the form http\(s\):\/\/host:port, the port 1-65535; not shown, as it may hold a password\)$/);
  });

  it('reads a string node list as --nodes does, each id and URL trimmed', () => {
    const file = parseFileConfig({ ...good, clusters: [{ ...good.clusters[0], nodes: ' a = http://127.0.0.1:1 , b=http://127.0.0.1:2 ' }, good.clusters[1]] }, 'lf.json');
    assert.deepEqual(file.clusters[0]!.members.map((m) => [m.id, m.url]), [['a', 'http://127.0.0.1:1'], ['b', 'http://127.0.0.1:2']]);
  });

  it("keeps the preset's operation rules for each key a route's operations leave out", () => {
    const routes = [
      { path: '/v3/*', cluster: 'kv', operations: { reads: ['/v3/kv/range', '/v3/maintenance/status'] } },
      { path: '/v4/*', cluster: 'kv', operations: { unsupported: [], otherwise: 'read' } },
    ];
    const [reads, cleared] = parseFileConfig({ ...good, routes }, 'lf.json').routes;
    assert.deepEqual(reads!.operations!.reads, ['/v3/kv/range', '/v3/maintenance/status']);
    assert.equal(reads!.operations!.writes[0], '/v3/kv/put', 'writes kept from the preset');
    assert.deepEqual(reads!.operations!.unsupported, ['/v3/watch', '/v3/election/observe'], 'watch and observe still refused');
    assert.equal(reads!.operations!.otherwise, 'write');
    assert.deepEqual(cleared!.operations!.unsupported, [], "an empty list clears the preset's");
    assert.equal(cleared!.operations!.otherwise, 'read');
    assert.equal(cleared!.operations!.reads[0], '/v3/kv/range');
  });

  it('takes round_robin or boltzmann on an etcd cluster whose leader probe is off ("leader": null)', () => {
    const file = parseFileConfig({ ...good, clusters: [good.clusters[0], { ...good.clusters[1], leader: null }], routes: [{ path: '/v3/*', cluster: 'kv', policy: 'round_robin' }, { path: '/v4/*', cluster: 'kv', preset: 'etcd', policy: 'boltzmann' }] }, 'lf.json');
    assert.equal(file.clusters[1]!.leader, null);
    assert.deepEqual(file.routes.map((r) => r.policy), ['round_robin', 'boltzmann']);
    assert.equal(file.routes[0]!.operations!.reads[0], '/v3/kv/range');
  });

  it('is what --config loads', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lakefront-config-'));
    try {
      const path = join(dir, 'lf.json');
      writeFileSync(path, JSON.stringify(good));
      const config = run(['--config', path]);
      assert.equal(config.port, 0);
      assert.equal(config.threads, 1);
      assert.equal(config.routes.length, 3);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  const bad: [string, unknown, RegExp][] = [
    ['an unknown policy', { ...good, routes: [{ path: '/x/*', cluster: 'boards', policy: 'hybird' }] }, /lf\.json: routes\[0\]\.policy: unknown policy "hybird"/],
    ['an unknown cluster', { ...good, routes: [{ path: '/x/*', cluster: 'nope' }] }, /routes\[0\]\.cluster: unknown cluster "nope"/],
    ['a rendezvous route without a key', { ...good, routes: [{ path: '/x/*', cluster: 'boards', keyHeader: null }] }, /routes\[0\]\.keyHeader: the rendezvous policy needs a key header/],
    ['a * inside an operations path', { ...good, routes: [{ path: '/z/*', cluster: 'kv', operations: { reads: ['/z/*/get'] } }] }, /routes\[0\]\.operations\.reads: must be a list of paths starting with \/ \(exact, or a prefix ending in \*\), got \["\/z\/\*\/get"\]/],
    ['one operations path in two lists', { ...good, routes: [{ path: '/z/*', cluster: 'kv', operations: { reads: ['/z/get', '/z/list*'], unsupported: ['/z/list*'] } }] }, /routes\[0\]\.operations: "\/z\/list\*" is in both reads and unsupported/],
    ['an etcd route reading what its preset refuses', { ...good, routes: [{ path: '/v3/*', cluster: 'kv', preset: 'etcd', operations: { reads: ['/v3/kv/range', '/v3/watch'] } }] }, /routes\[0\]\.operations: "\/v3\/watch" is in both reads and unsupported \(with the preset's lists\)/],
    ['a ring route without a key', { ...good, routes: [{ path: '/x/*', cluster: 'boards', policy: 'ring', keyHeader: null }] }, /routes\[0\]\.keyHeader: the ring policy needs a key header/],
    ['a duplicate node id across clusters', { ...good, clusters: [good.clusters[0], { name: 'c2', nodes: 'a=http://127.0.0.1:9' }] }, /clusters\[1\]\.nodes: node id "a" is used by another cluster/],
    ['an unknown setting', { ...good, colour: 'blue' }, / lf\.json: colour: unknown setting/],
    ['a bad forwardedFor', { ...good, forwardedFor: true }, / lf\.json: forwardedFor: must be a non-empty string, got true/],
    ['an unknown forwardedFor', { ...good, forwardedFor: 'replace' }, / lf\.json: forwardedFor: must be "append" or "off", got "replace"/],
    ['a bad top-level value, named as the nested ones are', { ...good, threads: 0 }, / lf\.json: threads: must be a number in 1\.\.256, got 0$/],
    ['a host with a space, named by its place as the other top-level values are', { ...good, host: '0.0.0.0 ' }, / lf\.json: host: bad address "0\.0\.0\.0 "$/],
    ['a bad path', { ...good, routes: [{ path: 'rpc', cluster: 'boards' }] }, /routes\[0\]\.path: must start with \//],
    ['a wildcard that is not a whole segment (uWS matches /api* only as written)', { ...good, routes: [{ path: '/api*', cluster: 'boards' }] }, /routes\[0\]\.path: must start with \/ and may end in \/\* \(a wildcard is a whole segment: "\/api\/\*", not "\/api\*"\), got "\/api\*"/],
    ['a route over the front door\'s own /stats', { ...good, routes: [{ path: '/stats', cluster: 'boards' }] }, /routes\[0\]\.path: \/stats is the front door's own endpoint/],
    // Paths uWS's router would read otherwise, or that no request can match.
    ['a route path with a uWS parameter', { ...good, routes: [{ path: '/:id/*', cluster: 'boards' }] }, /routes\[0\]\.path: no segment starting with ":" in a route path \(uWS would take it for a parameter that matches any segment\), got "\/:id\/\*"/],
    ['a route path with a query', { ...good, routes: [{ path: '/stats?x', cluster: 'boards' }] }, /routes\[0\]\.path: no query, fragment, spaces, control or format characters in a route path, got "\/stats\?x"/],
    ['a route path with an encoded dot segment', { ...good, routes: [{ path: '/a/%2e%2e/*', cluster: 'boards' }] }, /routes\[0\]\.path: no percent-escapes or backslashes in a route path \(write it plain\), got "\/a\/%2e%2e\/\*"/],
    ['a route path with a backslash', { ...good, routes: [{ path: '/a\\b/*', cluster: 'boards' }] }, /routes\[0\]\.path: no percent-escapes or backslashes/],
    ['a route path with a dot segment carrying a parameter', { ...good, routes: [{ path: '/a/..;x/*', cluster: 'boards' }] }, /routes\[0\]\.path: no "\." or "\.\." segments/],
    ['a route path with a C1 control character (shown escaped)', { ...good, routes: [{ path: '/a\u0085b', cluster: 'boards' }] }, /routes\[0\]\.path: no query, fragment, spaces, control or format characters in a route path, got "\/a\\u0085b"/],
    ['a route path with a space', { ...good, routes: [{ path: '/a b/*', cluster: 'boards' }] }, /routes\[0\]\.path: no query, fragment, spaces/],
    ['a route path with a dot segment', { ...good, routes: [{ path: '/a/../*', cluster: 'boards' }] }, /routes\[0\]\.path: no "\." or "\.\." segments in a route path \(requests with them are refused\), got "\/a\/\.\.\/\*"/],
    ['a route path with an empty segment', { ...good, routes: [{ path: '//a/*', cluster: 'boards' }] }, /routes\[0\]\.path: no empty segments in a route path \("\/\/"\), got "\/\/a\/\*"/],
    // Taken and doing nothing is refused too.
    ['a hint budget on a strict quorum', { ...good, routes: [{ path: '/kv/*', cluster: 'boards', quorum: { sloppy: false, maxHintBytes: 1024 } }] }, /routes\[0\]\.quorum\.maxHintBytes: applies to a sloppy quorum only/],
    // The conflict, not the etcd preset's hybrid default on a cluster with no leader probe.
    ['a replicated route with the etcd preset, over a cluster with no leader probe', { ...good, routes: [{ path: '/kv/*', cluster: 'boards', preset: 'etcd', quorum: {} }] }, /routes\[0\]\.preset: does not apply to a replicated route \(quorum\)/],
    ['a leader probe interval on a cluster with no leader probe', { ...good, clusters: [{ ...good.clusters[0], leaderIntervalMs: 100 }, good.clusters[1]] }, /clusters\[0\]\.leaderIntervalMs: the cluster has no leader probe to time/],
    ['an affinity header the front door sets itself', { ...good, routes: [{ path: '/live/*', cluster: 'boards', policy: 'round_robin', keyHeader: null, affinity: { app: 'a', header: 'X-Forwarded-For' } }] }, /routes\[0\]\.affinity\.header: "x-forwarded-for" is a header the nodes or the front door need/],
    // A key put where the settings belong is not echoed.
    ['affinity given as a string (not echoed)', { ...good, routes: [{ path: '/live/*', cluster: 'boards', policy: 'round_robin', keyHeader: null, affinity: 'k3y-that-must-not-be-logged' }] }, /^(?!.*k3y).*routes\[0\]\.affinity: must be \{ app, header\?, ttlSeconds\?, generation\? \}, got a string$/],
    // What is wrong, not a default that followed from it.
    ['a replicated route over a cluster with only nodes of weight 0', { ...good, clusters: [{ name: 'z', nodes: [{ id: 'z1', url: 'http://127.0.0.1:5', weight: 0 }] }], routes: [{ path: '/kv/*', cluster: 'z', quorum: {} }] }, /lf\.json: routes\[0\]\.quorum: cluster "z" has no node of weight above 0 to keep keys on \(1 of weight 0\)$/],
    ['a replicated route over an etcd cluster', { ...good, routes: [{ path: '/kv/*', cluster: 'kv', quorum: {} }] }, /lf\.json: routes\[0\]\.quorum: cluster "kv" is an etcd cluster, which replicates by itself$/],
    ['a bad rho', { ...good, clusters: [{ ...good.clusters[1], policy: { rho: 0.5 } }, good.clusters[0]] }, /clusters\[0\]\.policy\.rho: must be a number in 1\.\.1000, got 0\.5/],
    ['no routes', { ...good, routes: [] }, /lf\.json: routes: must be a non-empty list/],
    // Framing headers are consumed by the front door, never seen as a key: every request got 401.
    ['a framing header as the key', { ...good, routes: [{ path: '/x/*', cluster: 'boards', keyHeader: 'Content-Length' }] }, /routes\[0\]\.keyHeader: "content-length" is a hop-by-hop or framing header, not a routing key/],
    // Without a leader probe hybrid would send every write round robin.
    ['hybrid through the etcd preset on a cluster that does not probe for a leader', { ...good, routes: [{ path: '/v3/*', cluster: 'boards', preset: 'etcd' }] }, /routes\[0\]\.policy: "hybrid" pins writes to the leader, and cluster "boards" does not probe for one/],
    ['hybrid on a cluster that does not probe for a leader', { ...good, routes: [{ path: '/x/*', cluster: 'boards', policy: 'hybrid', keyHeader: null }] }, /routes\[0\]\.policy: "hybrid" pins writes to the leader, and cluster "boards" does not probe for one/],
    ['hybrid where "leader": null turned the preset\'s probe off', { ...good, clusters: [good.clusters[0], { ...good.clusters[1], leader: null }], routes: [{ path: '/v3/*', cluster: 'kv' }] }, /routes\[0\]\.policy: "hybrid" pins writes to the leader, and cluster "kv" does not probe for one/],
    ['a key header that is no header name', { ...good, routes: [{ path: '/x/*', cluster: 'boards', keyHeader: 'Board Id' }] }, /routes\[0\]\.keyHeader: not a header name: "board id"/],
  ];
  for (const [name, raw, pattern] of bad) {
    it(`rejects ${name}`, () => assert.throws(() => parseFileConfig(raw, 'lf.json'), pattern));
  }
});

describe('configuration file errors', () => {
  const good = {
    port: 0,
    clusters: [{ name: 'boards', nodes: 'a=http://127.0.0.1:1' }],
    routes: [{ path: '/rpc/*', cluster: 'boards', keyHeader: 'x-b' }],
  };
  // JSON strings may carry line breaks and terminal escapes (`"ri\nng"`): the file's own values,
  // named in the line, must not break it in two (README: one line naming it).
  const broken: [string, unknown, RegExp][] = [
    ['a policy with a line break', { ...good, routes: [{ ...good.routes[0], policy: 'ri\nng' }] }, /routes\[0\]\.policy: unknown policy "ri\\u000ang"/],
    ['a cluster name with a line break', { ...good, routes: [{ ...good.routes[0], cluster: 'b\nc' }] }, /routes\[0\]\.cluster: unknown cluster "b\\u000ac"/],
    ['a preset with a line break', { ...good, clusters: [{ ...good.clusters[0], preset: 'et\ncd' }] }, /clusters\[0\]\.preset: unknown preset "et\\u000acd"/],
    ['an unknown setting with a line break', { ...good, routes: [{ ...good.routes[0], 'bo\ngus': 1 }] }, /routes\[0\]\.bo\\u000agus: unknown setting/],
    ['a duplicate cluster with a terminal escape', { ...good, clusters: [{ name: 'x\x1b[2J', nodes: 'a=http://127.0.0.1:1' }, { name: 'x\x1b[2J', nodes: 'b=http://127.0.0.1:2' }] }, /clusters\[1\]\.name: duplicate cluster "x\\u001b\[2J"/],
  ];
  for (const [name, raw, pattern] of broken) {
    it(`names ${name} on one line, the character escaped`, () => {
      assert.throws(() => parseFileConfig(raw, 'lf.json'), (err: Error) => {
        assert.match(err.message, pattern);
        assert.doesNotMatch(err.message, /[\p{Cc}\p{Cf}]/u);
        return true;
      });
    });
  }
});

describe('the README', () => {
  it('shows a configuration file that parses', () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    const section = readme.slice(readme.indexOf('### Configuration file'));
    const json = /```json\n([^]*?)```/.exec(section)![1]!;
    const parsed = parseFileConfig(JSON.parse(json), 'README');
    assert.deepEqual(parsed.routes.map((r) => r.pattern), ['/rpc/*', '/v3/*', '/kv/*', '/zk/*']);
    assert.equal(parsed.routes[2]!.quorum!.n, 3);
    assert.equal(parsed.region, 'east');
  });
});

describe('forwardedFor', () => {
  it('comes from the file, and the flag overrides it', () => {
    const dir = mkdtempSync(join(tmpdir(), 'lf-fwd-'));
    try {
      const path = join(dir, 'lf.json');
      writeFileSync(path, JSON.stringify({ forwardedFor: 'append', clusters: [{ name: 'c', nodes: 'a=http://127.0.0.1:1' }], routes: [{ path: '/x/*', cluster: 'c', policy: 'round_robin', keyHeader: null }] }));
      const settingOf = (argv: string[]): boolean | undefined => (parseCommand(argv, {}) as { config: { settings: { forwardedFor?: boolean } } }).config.settings.forwardedFor;
      assert.equal(settingOf(['--config', path]), true);
      assert.equal(settingOf(['--config', path, '--forwarded-for', 'off']), false);
      assert.equal(settingOf(['--nodes', 'a=http://127.0.0.1:1']), false, 'off by default');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('--hints-file', () => {
  it('takes a path, and refuses an empty one rather than taking it for none', () => {
    const run = parseCommand(['--hints-file', '/var/lib/lakefront/hints.json'], {});
    assert.equal(run.kind === 'run' && run.config.hintsFile, '/var/lib/lakefront/hints.json');
    assert.throws(() => parseCommand(['--hints-file', ''], {}), /--hints-file: an empty path/);
    assert.throws(() => parseCommand([], { LAKEFRONT_HINTS_FILE: ' ' }), /LAKEFRONT_HINTS_FILE: an empty path/);
    // Set but empty is unset here (a template's `${X:-}`): no hints file.
    const unset = parseCommand([], { LAKEFRONT_HINTS_FILE: '' });
    assert.equal(unset.kind === 'run' && unset.config.hintsFile, null);
  });
});

describe('--upstream-pipelining', () => {
  it('is 1 (none) by default, and takes the flag or LAKEFRONT_UPSTREAM_PIPELINING', () => {
    const settingOf = (argv: string[], env: Record<string, string> = {}): number | undefined =>
      (parseCommand(argv, env) as { config: { settings: { upstreamPipelining?: number } } }).config.settings.upstreamPipelining;
    assert.equal(settingOf(['--nodes', 'a=http://127.0.0.1:1']), 1);
    assert.equal(settingOf(['--nodes', 'a=http://127.0.0.1:1', '--upstream-pipelining', '8']), 8);
    assert.equal(settingOf(['--nodes', 'a=http://127.0.0.1:1'], { LAKEFRONT_UPSTREAM_PIPELINING: '16' }), 16);
    // undici keeps one request a connection: 1 is its only value.
    assert.equal(settingOf(['--nodes', 'a=http://127.0.0.1:1', '--upstream-client', 'undici', '--upstream-pipelining', '1']), 1);
    assert.throws(() => parseCommand(['--nodes', 'a=http://127.0.0.1:1', '--upstream-client', 'undici', '--upstream-pipelining', '2'], {}), /pipelining is the h1 client's/);
  });
});
