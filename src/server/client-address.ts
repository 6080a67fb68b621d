/** The client's address, for the access log and the X-Forwarded-For a node gets. */
import { Buffer } from 'node:buffer';
import type { HttpResponse } from 'uWebSockets.js';

/**
 * The client's address as text (IPv4 dotted, IPv6 in RFC 5952's short form). An IPv4 address is read
 * in binary and its text kept while it repeats (one client, or a load balancer, sends most
 * requests): uWS formats the text with a printf a request.
 */
export function clientAddress(res: HttpResponse): string {
  const binary = res.getRemoteAddress();
  const view = new DataView(binary);
  let at = 0;
  // IPv6 in its short form, unless it maps an IPv4 address (::ffff:a.b.c.d, a dual-stack listener).
  if (binary.byteLength === 16) {
    if (view.getUint32(0) !== 0 || view.getUint32(4) !== 0 || view.getUint32(8) !== 0xffff) return ipv6Text(view);
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

/**
 * An IPv6 address (16 bytes) in RFC 5952's form: lower-case hex groups without leading zeros,
 * the longest run of two or more zero groups (the first of equal ones) written `::`. uWS's own
 * text writes all eight groups in full (`0000:...:0001` for `::1`).
 */
export function ipv6Text(view: DataView): string {
  const groups: number[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(view.getUint16(i));
  let bestAt = -1;
  let bestLength = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLength) {
      bestAt = i;
      bestLength = j - i;
    }
    i = j;
  }
  const hex = (list: number[]): string => list.map((g) => g.toString(16)).join(':');
  if (bestAt < 0) return hex(groups);
  return `${hex(groups.slice(0, bestAt))}::${hex(groups.slice(bestAt + bestLength))}`;
}
