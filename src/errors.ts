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

/** A configuration value that cannot be used. `message` is one line naming the value. */
export class ConfigError extends LakefrontError {
  constructor(message: string) {
    super('LF_ERR_CONFIG', 500, message);
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
 * Why `JSON.parse` refused a text, without quoting any of it: V8's message quotes the text around
 * the error ("KEY2bbbbbb"...), which a log line must not carry when the file holds secrets (a
 * keys file given as the configuration, a hints file with authorization headers).
 */
export function jsonProblem(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  const at = /at position (\d+)/.exec(message);
  if (at) return `a syntax error at character ${Number(at[1]) + 1}`;
  if (/end of JSON/.test(message)) return 'it ends too soon';
  if (/^Unexpected token/.test(message)) return 'an unexpected character';
  return 'a syntax error';
}
