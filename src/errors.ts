/**
 * Errors with a stable code and an HTTP status. Compare `code`, never `instanceof`: errors cross
 * thread boundaries as plain objects.
 */
export class LakefrontError extends Error {
  readonly code: string;
  readonly status: number;

  constructor(code: string, status: number, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'LakefrontError';
    this.code = code;
    this.status = status;
  }
}

/**
 * A configuration value that cannot be used. `message` is one line naming the value: a control
 * or format character in it (a line break inside a JSON string in a configuration file, named in
 * the message as a cluster, preset, policy or setting) is written as its `\u` escape, so that
 * no value can break the line or rewrite what a terminal shows.
 */
export class ConfigError extends LakefrontError {
  constructor(message: string) {
    super('LF_ERR_CONFIG', 500, oneLine(message));
    this.name = 'ConfigError';
  }
}

/** Codes used in JSON error bodies and `ForwardResult`s. */
export const ErrorCodes = {
  NO_HEALTHY_NODE: 'LF_ERR_NO_HEALTHY_NODE',
  ALL_CANDIDATES_FAILED: 'LF_ERR_ALL_CANDIDATES_FAILED',
  OUTCOME_UNKNOWN: 'LF_ERR_OUTCOME_UNKNOWN',
  NOT_SENT: 'LF_ERR_NOT_SENT',
  /** A node's answer was larger than the front door relays (h1 client: 64 MiB). */
  RESPONSE_TOO_LARGE: 'LF_ERR_UPSTREAM_RESPONSE_TOO_LARGE',
  MISSING_BOARD: 'LF_ERR_MISSING_BOARD',
  BODY_TOO_LARGE: 'LF_ERR_BODY_TOO_LARGE',
  NOT_FOUND: 'LF_ERR_NOT_FOUND',
  BAD_REQUEST: 'LF_ERR_BAD_REQUEST',
  UNSUPPORTED: 'LF_ERR_UNSUPPORTED',
  SHUTTING_DOWN: 'LF_ERR_SHUTTING_DOWN',
  /**
   * Every candidate failed, and at least one node that answered was shedding load (503 with a
   * Retry-After): 503, with the soonest Retry-After any of them gave.
   */
  NODES_SHEDDING: 'LF_ERR_NODES_SHEDDING',
  /** A replicated request whose reachable replicas could not make its quorum: nothing was sent. */
  QUORUM_UNAVAILABLE: 'LF_ERR_QUORUM_UNAVAILABLE',
  /** A replicated request sent to its replicas that too few acknowledged or answered. */
  QUORUM_FAILED: 'LF_ERR_QUORUM_FAILED',
  /** A method a route does not carry (405). */
  METHOD_NOT_ALLOWED: 'LF_ERR_METHOD_NOT_ALLOWED',
} as const;

/** The JSON body of an answer the front door makes itself: `{ error, code, ...extra }`. */
export function errorBody(message: string, code: string, extra?: Record<string, unknown>): string {
  return JSON.stringify({ error: message, code, ...extra });
}

/**
 * Why `JSON.parse` refused `text`, without quoting any of it: V8's message quotes the text around
 * the error ("KEY2bbbbbb"...), which a log line must not carry when the file holds secrets (a
 * keys file given as the configuration, a hints file with authorization headers). Where the
 * error is comes from a scan of our own (V8 names no position for an unexpected token).
 */
export function jsonProblem(err: unknown, text?: string): string {
  if (text !== undefined) {
    const at = jsonErrorAt(text);
    if (at >= text.length) return 'it ends too soon';
    if (at >= 0) {
      let line = 1;
      let lineStart = 0;
      for (let i = 0; i < at; i++) {
        if (text.charCodeAt(i) === 0x0a) {
          line++;
          lineStart = i + 1;
        }
      }
      return `an unexpected character at line ${line}, column ${at - lineStart + 1}`;
    }
  }
  const message = err instanceof Error ? err.message : String(err);
  const at = /at position (\d+)/.exec(message);
  if (at) return `a syntax error at character ${Number(at[1]) + 1}`;
  if (/end of JSON/.test(message)) return 'it ends too soon';
  if (/^Unexpected token/.test(message)) return 'an unexpected character';
  return 'a syntax error';
}

/**
 * The offset at which `text` stops being JSON (RFC 8259): `text.length` when it ends too soon, -1
 * when it is JSON, -2 when it nests too deep to scan. Only for saying where a refused file is bad.
 */
export function jsonErrorAt(text: string): number {
  let i = 0;
  const space = (): void => {
    for (let c = text.charCodeAt(i); c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d; c = text.charCodeAt(++i));
  };
  const expect = (ok: boolean): void => {
    if (!ok) throw i;
  };
  const string = (): void => {
    for (i++; i < text.length; ) {
      const c = text.charCodeAt(i);
      if (c === 0x22) {
        i++;
        return;
      }
      expect(c >= 0x20);
      if (c !== 0x5c) i++;
      else if (text[i + 1] === 'u') {
        i += 2;
        for (let k = 0; k < 4; k++, i++) expect(/[0-9a-fA-F]/.test(text[i] ?? ''));
      } else {
        i++;
        expect(i < text.length && '"\\/bfnrt'.includes(text[i]!));
        i++;
      }
    }
    throw i;
  };
  const value = (): void => {
    space();
    const c = text[i];
    if (c === '{' || c === '[') {
      const close = c === '{' ? '}' : ']';
      i++;
      space();
      if (text[i] === close) {
        i++;
        return;
      }
      for (;;) {
        if (c === '{') {
          space();
          expect(text[i] === '"');
          string();
          space();
          expect(text[i] === ':');
          i++;
        }
        value();
        space();
        if (text[i] === ',') i++;
        else {
          expect(text[i] === close);
          i++;
          return;
        }
      }
    }
    if (c === '"') return string();
    for (const literal of ['true', 'false', 'null']) {
      if (text.startsWith(literal, i)) {
        i += literal.length;
        return;
      }
    }
    const number = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/.exec(text.slice(i, i + 400));
    expect(number !== null);
    i += number![0].length;
  };
  try {
    value();
    space();
    expect(i >= text.length);
    return -1;
  } catch (at) {
    return typeof at === 'number' ? Math.min(at, text.length) : -2;
  }
}

/**
 * A value as an error line shows it: JSON-quoted, with every control and format character
 * escaped (JSON leaves DEL, the C1 controls and bidirectional overrides raw, which would reach
 * the operator's terminal or log as they are).
 */
export function quoted(value: unknown): string {
  return oneLine(JSON.stringify(value) ?? String(value));
}

/** `text` with each control or format character written as its `\u` escape. */
function oneLine(text: string): string {
  return text.replace(/[\p{Cc}\p{Cf}]/gu, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}
