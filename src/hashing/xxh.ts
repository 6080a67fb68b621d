/**
 * XXH64 from xxhash-wasm, instantiated once per thread (module top-level await).
 *
 * The hash inputs are fixed so that any implementation can reproduce a ranking:
 *
 *   nodeSeed(node)       = XXH64(utf8(node.id), seed = 0)
 *   h(node, board)       = XXH64(utf8(boardId), seed = nodeSeed(node))
 *   u(node, board)       = (floor(h / 2^12) + 0.5) / 2^52          in the open interval (0, 1)
 *
 * Seeding the board hash with a per-node seed means the node half is hashed once per membership
 * change, and a request hashes only its board, once per node, with no string concatenation.
 */
import xxhash from 'xxhash-wasm';

const api = await xxhash();

const TWO_POW_52 = 2 ** 52;

/** The per-node seed: XXH64(utf8(nodeId), 0). Compute once per membership change. */
export function nodeSeed(nodeId: string): bigint {
  return api.h64(nodeId, 0n);
}

/**
 * `u` in the open interval (0, 1) for a node (given by its seed) and a board: the top 52 bits of
 * the 64-bit hash, centred in their bucket, so it is never 0 or 1 and `ln(u)` is finite and < 0.
 */
export function unitHash(seed: bigint, boardId: string): number {
  return toUnit(api.h64(boardId, seed));
}

/** The top 52 bits of a 64-bit hash, centred in their bucket, as a value in (0, 1). */
function toUnit(hash: bigint): number {
  return (Number(hash >> 12n) + 0.5) / TWO_POW_52;
}

const encoder = new TextEncoder();
/** Longest board encoded by the ASCII fast path; longer or non-ASCII boards use TextEncoder. */
const FAST_CHARS = 1024;
let scratch = new Uint8Array(FAST_CHARS * 3);
/** views[n]: the first n bytes of `scratch`, made once per length. */
let views: Uint8Array[] = [];

/**
 * The UTF-8 bytes of a board, for hashing it against several nodes after encoding it once. The
 * view is valid until the next call (one per thread: module state is per thread).
 */
export function boardBytes(boardId: string): Uint8Array {
  const length = boardId.length;
  let n = -1;
  if (length <= FAST_CHARS) {
    n = length;
    for (let i = 0; i < length; i++) {
      const c = boardId.charCodeAt(i);
      if (c > 0x7f) {
        n = -1;
        break;
      }
      scratch[i] = c;
    }
  }
  if (n < 0) {
    if (scratch.length < length * 3) {
      scratch = new Uint8Array(length * 3);
      views = [];
    }
    n = encoder.encodeInto(boardId, scratch).written;
  }
  if (n > FAST_CHARS * 3) return scratch.subarray(0, n);
  return (views[n] ??= scratch.subarray(0, n));
}

/** {@link unitHash} over a board's bytes (from {@link boardBytes}): the same value. */
export function unitHashBytes(seed: bigint, board: Uint8Array): number {
  return toUnit(api.h64Raw(board, seed));
}
