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
import { Buffer } from 'node:buffer';
import { TextEncoder } from 'node:util';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
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
/** Board bytes the wasm memory is sized for at first (the front door's key limit is 1,024 chars). */
const FIRST_BOARD_BYTES = 1024 * 3;

/**
 * The hot path's form of {@link unitHash}: one board against a fixed list of seeds, in one call
 * into WebAssembly, with no BigInt and no copy per node.
 *
 * `h64Raw` costs, per node: a read of the wasm memory's size (an API getter), a copy of the board
 * into wasm memory, a BigInt result, a BigInt mask and a BigInt shift. Here the board is written
 * once, straight into wasm memory, and a small module of our own calls xxhash-wasm's `xxh64`
 * export once per seed and stores each `u` as a float (the same arithmetic as {@link toUnit}):
 *
 *   memory: [seeds: count x i64][units: count x f64][board bytes ...]
 *
 * The XXH64 code is xxhash-wasm's own: the module file its `workerd` build ships
 * (`xxhash-wasm/workerd/xxhash.wasm`, byte for byte the module its Node build embeds). If that
 * file cannot be loaded, or disagrees with `h64` on a check at load, the batch falls back to
 * {@link unitHash} per node: slower, same values.
 */
export class SeededUnits {
  readonly count: number;
  private readonly seeds: readonly bigint[];
  private readonly run: ((board: number, length: number, count: number, seeds: number, out: number) => void) | null;
  private readonly memory: WebAssembly.Memory | null;
  private bytes: Uint8Array;
  private units: Float64Array;
  private readonly boardAt: number;

  /** `batched: false` forces the {@link unitHash} fallback (for tests). */
  constructor(seeds: readonly bigint[], batched = true) {
    this.count = seeds.length;
    this.seeds = seeds.slice();
    this.boardAt = 16 * this.count;
    const wasm = BATCH === null || !batched ? null : BATCH.instantiate();
    if (wasm === null) {
      this.run = null;
      this.memory = null;
      this.bytes = new Uint8Array(0);
      this.units = new Float64Array(this.count);
      return;
    }
    this.run = wasm.units;
    this.memory = wasm.memory;
    this.bytes = new Uint8Array(0);
    this.units = new Float64Array(0);
    this.reserve(this.boardAt + FIRST_BOARD_BYTES);
    new BigInt64Array(this.memory.buffer, 0, this.count).set(seeds);
  }

  /** `u` of `boardId` for every seed, in seed order. Valid until the next call. */
  of(boardId: string): Float64Array {
    const run = this.run;
    if (run === null) {
      for (let i = 0; i < this.count; i++) this.units[i] = unitHash(this.seeds[i]!, boardId);
      return this.units;
    }
    const length = boardId.length;
    const at = this.boardAt;
    if (at + length * 3 > this.bytes.length) this.reserve(at + length * 3);
    const bytes = this.bytes;
    let n = length;
    for (let i = 0; i < length; i++) {
      const c = boardId.charCodeAt(i);
      if (c > 0x7f) {
        n = encoder.encodeInto(boardId, bytes.subarray(at)).written;
        break;
      }
      bytes[at + i] = c;
    }
    run(at, n, this.count, 0, 8 * this.count);
    return this.units;
  }

  /** Grows the wasm memory to hold `size` bytes and renews the views over it. */
  private reserve(size: number): void {
    const memory = this.memory!;
    if (memory.buffer.byteLength < size) memory.grow(Math.ceil((size - memory.buffer.byteLength) / 65_536));
    this.bytes = new Uint8Array(memory.buffer);
    this.units = new Float64Array(memory.buffer, 8 * this.count, this.count);
  }
}

/**
 * `units(board, length, count, seeds, out)`: for i in [0, count),
 * `f64[out + 8i] = (f64(xxh64(board, length, i64[seeds + 8i]) >>> 12) + 0.5) * 2^-52`.
 * Imports xxhash-wasm's memory and its `xxh64(ptr, len, seed) -> i64`.
 */
function batchModuleBytes(): Uint8Array {
  const section = (id: number, body: number[]): number[] => [id, ...leb(body.length), ...body];
  const name = (text: string): number[] => [text.length, ...Buffer.from(text, 'latin1')];
  const I32 = 0x7f;
  const I64 = 0x7e;
  const f64 = (value: number): number[] => [...new Uint8Array(new Float64Array([value]).buffer)];
  const code = [
    0x01, 0x01, I32, // one local, i32: i (local 5, after the five params)
    0x02, 0x40, 0x03, 0x40, // block, loop
    0x20, 5, 0x20, 2, 0x4f, 0x0d, 1, // if (i >= count) break
    0x20, 4, 0x20, 5, 0x41, 3, 0x74, 0x6a, // out + (i << 3)
    0x20, 0, 0x20, 1, // board, length
    0x20, 3, 0x20, 5, 0x41, 3, 0x74, 0x6a, 0x29, 3, 0, // i64.load(seeds + (i << 3))
    0x10, 0, // call xxh64
    0x42, 12, 0x88, 0xba, // >>> 12, as an unsigned integer to f64
    0x44, ...f64(0.5), 0xa0, 0x44, ...f64(2 ** -52), 0xa2, // (+ 0.5) * 2^-52
    0x39, 3, 0, // f64.store
    0x20, 5, 0x41, 1, 0x6a, 0x21, 5, // i++
    0x0c, 0, 0x0b, 0x0b, 0x0b, // continue; end loop, block, function
  ];
  return new Uint8Array([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, [2, 0x60, 3, I32, I32, I64, 1, I64, 0x60, 5, I32, I32, I32, I32, I32, 0]),
    ...section(2, [2, ...name('x'), ...name('mem'), 0x02, 0x00, 0x01, ...name('x'), ...name('xxh64'), 0x00, 0x00]),
    ...section(3, [1, 1]),
    ...section(7, [1, ...name('units'), 0x00, 1]),
    ...section(10, [1, ...leb(code.length), ...code]),
  ]);
}

function leb(value: number): number[] {
  const out: number[] = [];
  do {
    let byte = value & 0x7f;
    value >>>= 7;
    if (value !== 0) byte |= 0x80;
    out.push(byte);
  } while (value !== 0);
  return out;
}

interface BatchWasm {
  memory: WebAssembly.Memory;
  units: (board: number, length: number, count: number, seeds: number, out: number) => void;
}

/** The two compiled modules (once per thread), or null when xxhash-wasm's file is not usable. */
const BATCH = loadBatch();

function loadBatch(): { instantiate(): BatchWasm } | null {
  let xxh: WebAssembly.Module;
  let batch: WebAssembly.Module;
  try {
    // The package's exports map names only its entry points: find the file beside them.
    const entry = createRequire(import.meta.url).resolve('xxhash-wasm');
    xxh = new WebAssembly.Module(readFileSync(join(dirname(entry), '..', 'workerd', 'xxhash.wasm')));
    batch = new WebAssembly.Module(batchModuleBytes());
  } catch {
    return null;
  }
  const instantiate = (): BatchWasm => {
    const exports = new WebAssembly.Instance(xxh).exports as { mem: WebAssembly.Memory; xxh64: unknown };
    const wrapper = new WebAssembly.Instance(batch, { x: { mem: exports.mem, xxh64: exports.xxh64 } });
    return { memory: exports.mem, units: wrapper.exports.units as BatchWasm['units'] };
  };
  // Trust it only if it agrees with the library's own h64 (ASCII, multi-byte, empty, long).
  try {
    const seeds = ['a', 'node-1', 'ノード'].map((id) => nodeSeed(id));
    const { memory, units } = instantiate();
    const bytes = new Uint8Array(memory.buffer);
    new BigInt64Array(memory.buffer, 0, seeds.length).set(seeds);
    for (const board of ['', 'board-42', 'ボード', 'x'.repeat(300)]) {
      const encoded = encoder.encode(board);
      bytes.set(encoded, 64);
      units(64, encoded.length, seeds.length, 0, 24);
      const got = new Float64Array(memory.buffer, 24, seeds.length);
      for (let i = 0; i < seeds.length; i++) if (got[i] !== unitHash(seeds[i]!, board)) return null;
    }
  } catch {
    return null;
  }
  return { instantiate };
}

/** Whether {@link SeededUnits} runs in one wasm call (false: the unitHash fallback). For tests. */
export const batchedUnits = BATCH !== null;
