/**
 * Signed affinity tickets (seed 004): a ticket names the node a client was placed on, so that
 * later requests and reconnects land there too. A ticket is a routing hint, not a capability:
 * the signature only makes sure the front door follows tickets it minted itself.
 *
 *   ticket  = "v1." + base64url(payload) + "." + base64url(HMAC-SHA256(key, "v1." + base64url(payload)))
 *   payload = JSON { a: app, n: node id, iat: issued (s), exp: expires (s), g: generation, r?: region }
 *
 * `r` is the client's region (seed 004): where it was first placed, the front door's own region.
 * Placing a client anew (no ticket, or its node is down) prefers a node in that region.
 *
 * The first key signs; every key verifies (a two-key window rotates keys without dropping the
 * tickets out there). Verification refuses a ticket that is malformed, forged, expired, for
 * another app, or from another generation (bumping the generation re-places every client at
 * once).
 */
import { Buffer } from 'node:buffer';
import { createHmac, timingSafeEqual } from 'node:crypto';

export interface AffinitySettings {
  /** Names the application: a ticket minted for another one is refused. */
  readonly app: string;
  /** Request header a ticket arrives in, and response header a fresh one leaves in. */
  readonly header: string;
  readonly ttlSeconds: number;
  /** The fleet generation: tickets of any other generation are refused. */
  readonly generation: number;
  /** Signing keys: the first signs, every one verifies. Never logged. */
  readonly keys: readonly string[];
}

export const DEFAULT_AFFINITY_HEADER = 'x-lakefront-affinity';
export const DEFAULT_TICKET_TTL_SECONDS = 3600;
/** Shortest signing key accepted (characters). */
export const MIN_KEY_LENGTH = 32;
/** A WebSocket client offers its ticket as a subprotocol: this prefix, then the ticket. */
export const TICKET_PROTOCOL_PREFIX = 'lakefront-affinity.';

/**
 * A ticket that checks out: its node, region, when it expires (ms since the epoch) and its
 * client's turn (`ticketTurn`); or why not.
 */
export type TicketCheck =
  | { readonly node: string; readonly region: string | null; readonly expiresAt: number; readonly turn: number }
  | { readonly refused: 'malformed' | 'forged' | 'expired' | 'app' | 'generation' };

/** Longest region name (as node regions in the configuration). */
const MAX_REGION_CHARS = 64;

const VERSION = 'v1.';
/**
 * The only shape a ticket takes: base64url payload, a 43-character base64url signature. Checked
 * before decoding: Node's base64url decoder skips stray characters and spare bits, so without it
 * endless spellings of one ticket would verify (and each take a place in the cache).
 */
const MAX_PAYLOAD_CHARS = 1400;
const SHAPE = new RegExp(`^v1\\.[A-Za-z0-9_-]{1,${MAX_PAYLOAD_CHARS}}\\.[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$`);

/** Whether tickets for `node` fit the shape (the app name and node id set the payload's size). */
export function ticketFits(app: string, node: string, generation: number): boolean {
  const payload = JSON.stringify({ a: app, n: node, iat: 9_999_999_999, exp: 9_999_999_999, g: generation, r: 'r'.repeat(MAX_REGION_CHARS) });
  return Math.ceil((Buffer.byteLength(payload) * 4) / 3) <= MAX_PAYLOAD_CHARS;
}
/** Verified tickets kept per thread (a client sends the same one again and again). */
const CACHE_LIMIT = 10_000;

function sign(key: string, text: string): Buffer {
  return createHmac('sha256', key).update(text).digest();
}

export class TicketBook {
  /** Verified tickets: the node each names, its region and when it expires (ms). */
  private readonly verified = new Map<string, { node: string; region: string | null; expiresAt: number; turn: number }>();

  constructor(
    private readonly settings: AffinitySettings,
    private readonly now: () => number = Date.now,
  ) {}

  get header(): string {
    return this.settings.header;
  }

  /** Whether a valid ticket is past half its lifetime: an answer carries a fresh one then. */
  wearing(expiresAt: number): boolean {
    return expiresAt - this.now() < this.settings.ttlSeconds * 500;
  }

  /** A ticket naming `node` (and the client's `region`, if known), valid for the configured time. */
  mint(node: string, region: string | null = null): string {
    const { app, ttlSeconds, generation, keys } = this.settings;
    const iat = Math.floor(this.now() / 1000);
    const fields = { a: app, n: node, iat, exp: iat + ttlSeconds, g: generation, ...(region !== null ? { r: region } : {}) };
    const payload = Buffer.from(JSON.stringify(fields)).toString('base64url');
    const signed = VERSION + payload;
    return `${signed}.${sign(keys[0]!, signed).toString('base64url')}`;
  }

  /** The node a ticket names, or why it is refused. */
  check(ticket: string): TicketCheck {
    const hit = this.verified.get(ticket);
    if (hit !== undefined) {
      if (this.now() < hit.expiresAt) return hit;
      this.verified.delete(ticket);
      return { refused: 'expired' };
    }
    if (!SHAPE.test(ticket)) return { refused: 'malformed' };
    const dot = ticket.lastIndexOf('.');
    const signed = ticket.slice(0, dot);
    const signature = Buffer.from(ticket.slice(dot + 1), 'base64url');
    if (!this.settings.keys.some((key) => timingSafeEqual(sign(key, signed), signature))) return { refused: 'forged' };
    let payload: { a?: unknown; n?: unknown; exp?: unknown; g?: unknown; r?: unknown };
    try {
      payload = JSON.parse(Buffer.from(signed.slice(VERSION.length), 'base64url').toString('utf8')) as typeof payload;
    } catch {
      return { refused: 'malformed' };
    }
    if (typeof payload !== 'object' || payload === null || typeof payload.n !== 'string' || typeof payload.exp !== 'number') return { refused: 'malformed' };
    if (payload.r !== undefined && (typeof payload.r !== 'string' || payload.r === '' || payload.r.length > MAX_REGION_CHARS)) return { refused: 'malformed' };
    if (payload.a !== this.settings.app) return { refused: 'app' };
    if (payload.g !== this.settings.generation) return { refused: 'generation' };
    const expiresAt = payload.exp * 1000;
    if (this.now() >= expiresAt) return { refused: 'expired' };
    const valid = { node: payload.n, region: (payload.r as string | undefined) ?? null, expiresAt, turn: ticketTurn(ticket) };
    if (this.verified.size >= CACHE_LIMIT) this.verified.clear();
    this.verified.set(ticket, valid);
    return valid;
  }
}

/**
 * A turn of a client's own on a rotating route, from its ticket (FNV-1a of the ticket as sent),
 * worked out once a ticket (the check caches it): where its node cannot take it, every request
 * and socket carrying the same ticket is placed on the same sibling (seed 004: both legs of a
 * client on one follower), while the clients of a node that failed spread over its siblings as
 * their tickets differ (see policies/types.ts placeClient).
 */
export function ticketTurn(ticket: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < ticket.length; i++) {
    h ^= ticket.charCodeAt(i);
    h = Math.imul(h, 0x01000193);
  }
  return (h >>> 0) & 0x3fffffff;
}
