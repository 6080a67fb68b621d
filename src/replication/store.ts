/**
 * A reference replica for replicated routes: what a node behind one must do, in a few lines. The
 * demo cluster serves `/kv/*` with it, and the tests use it as a real replica.
 *
 * - `PUT <path>` with `x-lakefront-version: V` and a body: keep (body, content-type, V) under the
 *   path unless a version >= V is already there (last write wins; a write delivered twice, or
 *   late, changes nothing). 204 either way: the write is durable here.
 * - `DELETE <path>` with a version: the same, keeping a deletion (a tombstone) at V, so that an
 *   older value arriving later (a hint, a read repair) cannot bring the key back.
 * - `GET` / `HEAD <path>`: 200 with the body, its content-type and `x-lakefront-version`; a
 *   deletion is 404 with its version; a key never written is 404 without one.
 * - A write without a version is refused (400): it could not be ordered against the others.
 *
 * Versions are compared as integers (BigInt here; int64 elsewhere).
 */
import type { Buffer } from 'node:buffer';
import { HINT_HEADER, VERSION_HEADER } from './quorum.js';

interface Entry {
  readonly version: bigint;
  /** null: deleted. */
  readonly body: Buffer | null;
  readonly type: string | null;
}

export interface ReplicaAnswer {
  readonly status: number;
  readonly headers: Record<string, string>;
  readonly body: string | Buffer;
}

const VERSION = /^\d{1,19}$/;

export class ReplicaStore {
  private readonly entries = new Map<string, Entry>();
  /** Writes that came as a stand-in's, by the replica they were for. */
  readonly hinted = new Map<string, number>();

  /** The stored value at `path` (tests and the demo's logs). */
  get(path: string): { version: string; body: string | null } | undefined {
    const entry = this.entries.get(path);
    return entry === undefined ? undefined : { version: String(entry.version), body: entry.body === null ? null : entry.body.toString() };
  }

  /** Forget everything (a replica that lost its disk). */
  clear(): void {
    this.entries.clear();
    this.hinted.clear();
  }

  handle(method: string, path: string, headers: Record<string, string | string[] | undefined>, body: Buffer): ReplicaAnswer {
    const key = path.split('?')[0]!;
    if (method === 'GET' || method === 'HEAD') {
      const entry = this.entries.get(key);
      if (entry === undefined) return json(404, { error: 'no such key' });
      if (entry.body === null) return json(404, { error: 'deleted' }, String(entry.version));
      return {
        status: 200,
        // Said outright: a HEAD answer carries the length of the body it leaves out.
        headers: { [VERSION_HEADER]: String(entry.version), 'content-length': String(entry.body.length), ...(entry.type !== null ? { 'content-type': entry.type } : {}) },
        body: entry.body,
      };
    }
    if (method !== 'PUT' && method !== 'DELETE') return json(405, { error: `${method} is not a replica operation` });
    const text = headers[VERSION_HEADER];
    if (typeof text !== 'string' || !VERSION.test(text)) return json(400, { error: `a write needs ${VERSION_HEADER}` });
    const version = BigInt(text);
    const standInFor = headers[HINT_HEADER];
    if (typeof standInFor === 'string') this.hinted.set(standInFor, (this.hinted.get(standInFor) ?? 0) + 1);
    const current = this.entries.get(key);
    if (current === undefined || current.version < version) {
      const type = headers['content-type'];
      this.entries.set(key, { version, body: method === 'PUT' ? body : null, type: method === 'PUT' && typeof type === 'string' ? type : null });
    }
    return { status: 204, headers: { [VERSION_HEADER]: String(this.entries.get(key)!.version) }, body: '' };
  }
}

function json(status: number, body: object, version?: string): ReplicaAnswer {
  return { status, headers: { 'content-type': 'application/json', ...(version !== undefined ? { [VERSION_HEADER]: version } : {}) }, body: JSON.stringify(body) };
}
