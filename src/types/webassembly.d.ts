/**
 * The few WebAssembly globals Lakefront uses (src/hashing/xxh.ts). TypeScript declares them only
 * in its DOM and web-worker libs, which this Node project does not load.
 */
declare namespace WebAssembly {
  class Module {
    constructor(bytes: Uint8Array);
  }
  class Instance {
    constructor(module: Module, imports?: Record<string, Record<string, unknown>>);
    readonly exports: Record<string, unknown>;
  }
  class Memory {
    readonly buffer: ArrayBuffer;
    grow(pages: number): number;
  }
}
