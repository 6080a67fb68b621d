/**
 * The control plane's own HTTP asks (health probes, etcd leader probes), made with `node:http`
 * (`node:https` for an https node) over one keep-alive agent each, rather than `fetch` or undici:
 * `fetch` builds a WHATWG Request, Headers, Response and body stream for each, about 0.4 ms of
 * main-thread CPU a probe against about 0.12 here (bench/RESULTS.md, "Twenty-fourth session",
 * where undici's `request` and `node:http` cost the same), and undici's code and state held about
 * 5 MiB of the main thread's live heap that `node:http`, part of Node, does not (12 MiB less
 * resident with it gone: "Twenty-eighth session"). Redirects are not followed (a `3xx` health
 * answer is no pass, as in nginx's, HAProxy's and Envoy's checks). Idle connections do not keep the process alive (the agent unrefs
 * them). A caller's own `fetch` (the library's `fetch` option) is used instead where one is given.
 */
import { Agent as HttpAgent, request as httpRequest, type ClientRequest, type IncomingMessage, type RequestOptions } from 'node:http';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';

/**
 * How long a connection a node answered on is kept for the next probe (probes run every second
 * by default). A kept connection is one a node; a probe never waits behind another.
 */
const KEPT_MS = 30_000;

/** The largest health answer read: past it the connection is dropped, not read, and the status stands. */
const STATUS_BODY_LIMIT = 128 * 1024;
/** The largest leader-status answer taken (etcd's is a few hundred bytes). */
const JSON_BODY_LIMIT = 1024 * 1024;

let httpAgent: HttpAgent | null = null;
let httpsAgent: HttpsAgent | null = null;

function agentFor(url: URL): HttpAgent {
  // `timeout` closes a kept connection idle that long (the agent's own timeout listener destroys
  // only free sockets); each probe keeps its own deadline.
  if (url.protocol === 'https:') return (httpsAgent ??= new HttpsAgent({ keepAlive: true, timeout: KEPT_MS, scheduling: 'lifo' }));
  return (httpAgent ??= new HttpAgent({ keepAlive: true, timeout: KEPT_MS, scheduling: 'lifo' }));
}

/** Errors of a connection that ended before any byte of the answer. */
const CLOSED_UNANSWERED: ReadonlySet<unknown> = new Set(['ECONNRESET', 'EPIPE']);

interface Answer {
  readonly status: number;
  /** The body, when asked for; null when it was dropped. */
  readonly body: Buffer | null;
}

/**
 * One ask of `url`, its answer read whole within `deadline` (performance.now()): the body kept
 * when `keepBody` (one past `limit` bytes fails the ask), else dropped (past `limit` the
 * connection is closed, not read, and the status stands).
 * Asked once more if it failed on a kept connection that closed before any byte of this one's
 * answer: the node closing it as idle just as the probe went out (a server whose idle timeout is
 * about the probe interval: every few rounds a probe crossed the close, ECONNRESET). One such
 * race would otherwise fail the node's probe and take it out of every ranking for a round. The
 * second ask goes on a new connection (the closed one is gone), within the same deadline; a new
 * connection closed unanswered is the node's answer, and not asked again.
 */
function ask(url: URL, options: RequestOptions, body: string | null, limit: number, keepBody: boolean, deadline: number, again: boolean): Promise<Answer> {
  return new Promise<Answer>((resolve, reject) => {
    let answered = false;
    let settled = false;
    const settle = (err: Error | null, answer?: Answer): void => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (err === null) resolve(answer!);
      else if (again && !answered && req.reusedSocket && CLOSED_UNANSWERED.has((err as { code?: unknown }).code)) {
        ask(url, options, body, limit, keepBody, deadline, false).then(resolve, reject);
      } else reject(err);
    };
    const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const req: ClientRequest = send(url, { ...options, agent: agentFor(url) }, (res: IncomingMessage) => {
      answered = true;
      const status = res.statusCode ?? 0;
      const chunks: Buffer[] = [];
      let size = 0;
      res.on('data', (chunk: Buffer) => {
        size += chunk.length;
        if (size > limit) {
          // Too long to read: the connection goes (not kept with an answer half read).
          req.destroy();
          if (keepBody) settle(new Error(`answer over ${limit} bytes`));
          else settle(null, { status, body: null });
          return;
        }
        if (keepBody) chunks.push(chunk);
      });
      res.on('end', () => settle(null, { status, body: keepBody ? Buffer.concat(chunks) : null }));
      res.on('error', (err) => settle(err));
      res.on('aborted', () => settle(new Error('the answer was cut off')));
    });
    // The deadline covers the body too: a node that sent a 2xx head and stalled does not pass.
    const timer = setTimeout(() => {
      const err = Object.assign(new Error(`no answer within the probe's deadline`), { code: 'ETIMEDOUT' });
      settle(err);
      req.destroy(err);
    }, Math.max(1, deadline - performance.now()));
    req.on('error', (err) => settle(err));
    // A 101 to a probe that asked for no upgrade: node:http hands the socket to this listener (with
    // none, it destroys the socket and the request says nothing until the deadline). No pass.
    req.on('upgrade', (res: IncomingMessage, socket: { destroy(): void }) => {
      socket.destroy();
      settle(new Error(`the node switched protocols (${res.statusCode ?? 0})`));
    });
    req.end(body ?? undefined);
  });
}

/** GET `url`; its status once the body is read (and dropped). Rejects on a network error or at `timeoutMs`. */
export async function probeStatus(url: string, timeoutMs: number): Promise<number> {
  const answer = await ask(new URL(url), { method: 'GET' }, null, STATUS_BODY_LIMIT, false, performance.now() + timeoutMs, true);
  return answer.status;
}

/** POST `body` (JSON) to `url`; the status and, for a 200, the parsed answer. Rejects as `probeStatus`. */
export async function probeJson(url: string, body: string, timeoutMs: number): Promise<{ status: number; json: unknown }> {
  const headers = { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) };
  const answer = await ask(new URL(url), { method: 'POST', headers }, body, JSON_BODY_LIMIT, true, performance.now() + timeoutMs, true);
  if (answer.status !== 200) return { status: answer.status, json: null };
  return { status: 200, json: JSON.parse(answer.body!.toString('utf8')) as unknown };
}
