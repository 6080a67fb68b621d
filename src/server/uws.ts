/**
 * Loads uWebSockets.js's native binary directly.
 *
 * The package's own entry point falls back to a slow pure-JS server (with a console warning) when
 * the binary does not load; a front door that silently runs on that fallback is a much slower
 * product than the one the operator asked for. So the binary is required by path, and a failure
 * stops start-up with one line that says why.
 */
import { createRequire } from 'node:module';
import type * as UWS from 'uWebSockets.js';

export type Uws = typeof UWS;

const require = createRequire(import.meta.url);

let loaded: Uws | null = null;

export function loadUws(): Uws {
  if (loaded) return loaded;
  if (/^(true|1)$/i.test(process.env.UWS_USE_FALLBACK ?? '')) {
    throw new Error('uWebSockets.js: UWS_USE_FALLBACK is set; Lakefront runs only on the native binary (unset it)');
  }
  const binary = `uWebSockets.js/binaries/uws_${process.platform}_${process.arch}_${process.versions.modules}.node`;
  try {
    loaded = require(binary) as Uws;
  } catch (err) {
    const reason = err instanceof Error ? err.message.split('\n')[0] : String(err);
    throw new Error(
      `uWebSockets.js native binary did not load (${binary}: ${reason}); ` +
        `this build supports Node 16/18/20 on glibc >= 2.27; refusing to start on the slow fallback`,
    );
  }
  return loaded;
}
