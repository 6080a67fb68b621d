/**
 * Requests whose framing is in doubt: two different content-length lines. uWS frames the body by
 * the first and reads on; whoever sent the request (or a proxy in front that framed it by the
 * other) may mean a request hidden in that body. Answering and closing afterwards is too late:
 * uWS parses what follows in the same read as the next request before a close takes effect (a
 * hidden request was proxied behind a 400). So such a connection is closed at once, without an
 * answer, as uWS itself does for a malformed content-length.
 */
import type { HttpRequest } from 'uWebSockets.js';

const lengths = { seen: false, first: '', conflict: false };

function noteLength(name: string, value: string): void {
  if (name.length !== 14 || name !== 'content-length') return;
  if (!lengths.seen) {
    lengths.seen = true;
    lengths.first = value;
  } else if (value !== lengths.first) lengths.conflict = true;
}

/** Whether `req` has content-length lines that disagree (one pass over its headers). */
export function lengthsDisagree(req: HttpRequest): boolean {
  lengths.seen = false;
  lengths.conflict = false;
  req.forEach(noteLength);
  return lengths.conflict;
}
