/**
 * Requests whose framing is in doubt: two different content-length lines, or a transfer-encoding
 * whose last coding is not chunked (chunked twice, an empty value, `gzip`, `chunked;x` ...).
 * uWS frames the body its own way (by the first length; as chunked whatever the codings) and reads
 * on; whoever sent the request, or a proxy in front that framed it otherwise, may mean a request
 * hidden in that body. Answering and closing afterwards is too late: uWS parses what follows in
 * the same read as the next request before a close takes effect (a hidden request was proxied
 * behind a 400, a 401, a 404 and a 200 from /health). So such a connection is closed at once,
 * without an answer, as uWS itself does for a malformed content-length.
 */
import type { HttpRequest } from 'uWebSockets.js';

const seen = { length: false, first: '', conflict: false, codings: null as string | null };

function note(name: string, value: string): void {
  if (name.length === 14 && name === 'content-length') {
    if (!seen.length) {
      seen.length = true;
      seen.first = value;
    } else if (value !== seen.first) seen.conflict = true;
  } else if (name.length === 17 && name === 'transfer-encoding') {
    seen.codings = seen.codings === null ? value : `${seen.codings}, ${value}`;
  }
}

/** Whether `req`'s framing is in doubt (one pass over its headers): see above. */
export function framingInDoubt(req: HttpRequest): boolean {
  seen.length = false;
  seen.conflict = false;
  seen.codings = null;
  req.forEach(note);
  return seen.conflict || (seen.codings !== null && !chunkedLast(seen.codings));
}

/**
 * Whether chunked is a transfer-encoding list's last coding, once, with no empty one: the body is
 * framed by chunked (RFC 9112 6.3), as uWS reads it.
 */
export function chunkedLast(codings: string): boolean {
  const list = codings.split(',').map((c) => c.trim().toLowerCase());
  return list.indexOf('chunked') === list.length - 1 && !list.includes('');
}
