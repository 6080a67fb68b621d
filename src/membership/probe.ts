/**
 * The control plane's own HTTP asks (health probes, etcd leader probes), made with undici's
 * `request` over one keep-alive agent rather than `fetch`: `fetch` builds a WHATWG Request,
 * Headers, Response and body stream for each, about 0.4 ms of main-thread CPU a probe against
 * about 0.05 here (bench/RESULTS.md, "Twenty-fourth session"), and a front door over many nodes
 * probes each every second. Redirects are not followed (a `3xx` health answer is no pass, as in
 * nginx's, HAProxy's and Envoy's checks). Idle connections do not keep the process alive.
 * A caller's own `fetch` (the library's `fetch` option) is used instead where one is given.
 */
import { performance } from 'node:perf_hooks';
import { Agent, request, type Dispatcher } from 'undici';

/** One agent for every probe of the process: a connection a node, kept between rounds. */
let agent: Agent | null = null;

function dispatcher(): Agent {
  // pipelining 1: a probe never waits behind another on one connection.
  return (agent ??= new Agent({ pipelining: 1, keepAliveTimeout: 30_000 }));
}

/**
 * When each URL's last probe had its answer (performance.now()): a probe sent within KEPT_MS of it
 * went out on the connection that answer came on (undici keeps it that long, or less when the
 * node's `Keep-Alive: timeout` says so).
 */
const answeredAt = new Map<string, number>();
const KEPT_MS = 30_000;

/** Errors of a connection that ended before any byte of the answer. */
const CLOSED_UNANSWERED: ReadonlySet<unknown> = new Set(['UND_ERR_SOCKET', 'ECONNRESET', 'EPIPE']);

/**
 * undici's `request`, asked once more if it failed on a connection kept from the last probe that
 * closed before any byte of this one's answer: the node closing it as idle just as the probe went
 * out (a server whose idle timeout is about the probe interval, and that sends no `Keep-Alive:
 * timeout` for undici to stay under: every few rounds a probe crossed the close, ECONNRESET).
 * One such race would otherwise fail the node's probe and take it out of every ranking for a
 * round (the front door's own reads are sent once again in that case). The second ask goes on a
 * new connection (the closed one is gone), within the same deadline; a connection not kept (the
 * node has not answered lately) closed unanswered is the node's answer, and not asked again.
 */
async function ask(url: string, options: Omit<Dispatcher.RequestOptions, 'origin' | 'path'>, signal: AbortSignal): Promise<Dispatcher.ResponseData> {
  let res: Dispatcher.ResponseData;
  try {
    res = await request(url, { ...options, dispatcher: dispatcher(), signal });
  } catch (err) {
    const kept = performance.now() - (answeredAt.get(url) ?? -Infinity) < KEPT_MS;
    answeredAt.delete(url);
    if (signal.aborted || !kept || !CLOSED_UNANSWERED.has((err as { code?: unknown } | null)?.code)) throw err;
    res = await request(url, { ...options, dispatcher: dispatcher(), signal });
  }
  answeredAt.set(url, performance.now());
  return res;
}

/** GET `url`; its status once the body is read (and dropped). Rejects on a network error or at `timeoutMs`. */
export async function probeStatus(url: string, timeoutMs: number): Promise<number> {
  const signal = AbortSignal.timeout(timeoutMs);
  const res = await ask(url, { method: 'GET' }, signal);
  // The deadline covers the body too: `dump()` without the signal resolves when the deadline
  // destroys the body, so a node that sent a 2xx head and stalled would pass. (The limit is
  // undici's default: past it the connection is dropped, not read, and the status stands.)
  await res.body.dump({ signal, limit: 128 * 1024 });
  return res.statusCode;
}

/** POST `body` (JSON) to `url`; the status and, for a 200, the parsed answer. Rejects as `probeStatus`. */
export async function probeJson(url: string, body: string, timeoutMs: number): Promise<{ status: number; json: unknown }> {
  const res = await ask(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body }, AbortSignal.timeout(timeoutMs));
  if (res.statusCode !== 200) {
    await res.body.dump();
    return { status: res.statusCode, json: null };
  }
  return { status: 200, json: await res.body.json() };
}
