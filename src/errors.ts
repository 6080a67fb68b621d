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
