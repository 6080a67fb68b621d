/**
 * The control plane's own HTTP asks (health probes, etcd leader probes), made with undici's
 * `request` over one keep-alive agent rather than `fetch`: `fetch` builds a WHATWG Request,
 * Headers, Response and body stream for each, about 0.4 ms of main-thread CPU a probe against
 * about 0.05 here (bench/RESULTS.md, "Twenty-fourth session"), and a front door over many nodes
 * probes each every second. Redirects are not followed (a `3xx` health answer is no pass, as in
 * nginx's, HAProxy's and Envoy's checks). Idle connections do not keep the process alive.
 * A caller's own `fetch` (the library's `fetch` option) is used instead where one is given.
 */
import { Agent, request } from 'undici';

/** One agent for every probe of the process: a connection a node, kept between rounds. */
let agent: Agent | null = null;

function dispatcher(): Agent {
  // pipelining 1: a probe never waits behind another on one connection.
  return (agent ??= new Agent({ pipelining: 1, keepAliveTimeout: 30_000 }));
}

/** GET `url`; its status once the body is read (and dropped). Rejects on a network error or at `timeoutMs`. */
export async function probeStatus(url: string, timeoutMs: number): Promise<number> {
  const signal = AbortSignal.timeout(timeoutMs);
  const res = await request(url, { method: 'GET', dispatcher: dispatcher(), signal });
  // The deadline covers the body too: `dump()` without the signal resolves when the deadline
  // destroys the body, so a node that sent a 2xx head and stalled would pass. (The limit is
  // undici's default: past it the connection is dropped, not read, and the status stands.)
  await res.body.dump({ signal, limit: 128 * 1024 });
  return res.statusCode;
}

/** POST `body` (JSON) to `url`; the status and, for a 200, the parsed answer. Rejects as `probeStatus`. */
export async function probeJson(url: string, body: string, timeoutMs: number): Promise<{ status: number; json: unknown }> {
  const res = await request(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    dispatcher: dispatcher(),
    signal: AbortSignal.timeout(timeoutMs),
  });
  if (res.statusCode !== 200) {
    await res.body.dump();
    return { status: res.statusCode, json: null };
  }
  return { status: 200, json: await res.body.json() };
}
