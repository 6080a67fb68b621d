/** The client's address, for the access log and the X-Forwarded-For a node gets. */
import { Buffer } from 'node:buffer';
import type { HttpResponse } from 'uWebSockets.js';

/**
 * The client's address as text (IPv4 dotted, or IPv6 as uWS writes it). An IPv4 address is read
 * in binary and its text kept while it repeats (one client, or a load balancer, sends most
 * requests): uWS formats the text with a printf a request.
 */
export function clientAddress(res: HttpResponse): string {
  const binary = res.getRemoteAddress();
  const view = new DataView(binary);
  let at = 0;
  // IPv6: as uWS writes it, unless it maps an IPv4 address (::ffff:a.b.c.d, a dual-stack listener).
  if (binary.byteLength === 16) {
    if (view.getUint32(0) !== 0 || view.getUint32(4) !== 0 || view.getUint32(8) !== 0xffff) return Buffer.from(res.getRemoteAddressAsText()).toString('latin1');
    at = 12;
  } else if (binary.byteLength !== 4) return Buffer.from(res.getRemoteAddressAsText()).toString('latin1');
  const key = view.getUint32(at);
  if (key !== lastClient.key) {
    lastClient.key = key;
    lastClient.text = `${key >>> 24}.${(key >>> 16) & 255}.${(key >>> 8) & 255}.${key & 255}`;
  }
  return lastClient.text;
}
const lastClient = { key: -1, text: '' };
