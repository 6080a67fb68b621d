/*
 * An open-loop HTTP/1.1 load generator in C, for latency measured at microseconds: the hedging
 * bench's load (bench/lib/openloop.ts, `pacer: 'native'`) without Node's millisecond timers.
 *
 *   openloop HOST PORT RATE SECONDS CONNECTIONS REQUESTS_FILE
 *
 * Request i leaves at start + i / RATE (CLOCK_MONOTONIC, one timerfd armed at each due time with
 * a timer slack of 1 ns), on an idle keep-alive connection (the most recently used; a new one is
 * opened when none is idle, up to CONNECTIONS; past that it waits for one, late). Its latency runs
 * from its due time to the last byte of its answer, so a late start is in it (no coordinated
 * omission), and how late it left is reported apart.
 *
 * REQUESTS_FILE holds the request bytes to send, cycled: a little-endian uint32 count, then for
 * each a uint32 length and that many bytes (one whole HTTP/1.1 request). Answers must carry a
 * content-length (no chunked bodies: refused with an error). One thread, one epoll loop.
 *
 * Interim 1xx answers are skipped; answers to HEAD and 204/304 answers have no body. An answer
 * that says `connection: close`, has bytes after it, or comes before its request was all written
 * ends its connection. Requests waiting for a connection take new ones when others die.
 *
 * Prints one line a request, in order: "due_us latency_us late_us ok" (ok: 1 for a 2xx answer,
 * 0 for another status, a failed or refused connection, or no answer 30 s, or OPENLOOP_DRAIN_MS,
 * after the last due time), then "done SENT OK FAILED". Errors on stderr, exit 2 for bad
 * arguments, 1 for anything else (a refused connection before the schedule starts among them).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define BUF_BYTES (256 * 1024)
#define PREOPEN 16
/* How long after the last due time answers still outstanding are waited for (then failed):
   30 s, or OPENLOOP_DRAIN_MS. */
static int64_t drain_ns = 30 * 1000000000LL;

enum state { DEAD, CONNECTING, IDLE, BUSY };

struct conn {
  int fd;
  enum state state;
  long req;          /* the request in flight (BUSY, or CONNECTING with one to send) */
  size_t written;    /* bytes of it written */
  char *buf;
  size_t have;       /* bytes read of the answer */
  int stacked;       /* on the idle stack (perhaps from before it died: then skipped there) */
};

struct req {
  const char *bytes;
  uint32_t len;
};

static struct conn *conns;
static int nconns, maxconns;
static int *idle; /* a stack of idle connection indexes, the most recently used on top */
static int nidle;
static long *queue; /* requests due with no connection to take them, oldest first */
static long qhead, qtail;
static struct req *reqs;
static uint32_t nreqs;
static int64_t *lat_ns, *late_ns;
static unsigned char *ok;
static long total, sent, settled, okcount, failcount;
static int64_t start_ns;
static double interval_ns;
static int ep;
static struct sockaddr_in addr;
static int started; /* the schedule has begun: a connection failing now fails its request */

static void die(const char *what) {
  fprintf(stderr, "openloop: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t due_ns(long i) {
  return start_ns + (int64_t)(i * interval_ns);
}

static void settle(long i, int good) {
  lat_ns[i] = now_ns() - due_ns(i);
  ok[i] = (unsigned char)good;
  if (good) okcount++;
  else failcount++;
  settled++;
}

static int open_conn(void) {
  int c = -1;
  for (int k = 0; k < nconns; k++)
    if (conns[k].state == DEAD) { c = k; break; }
  if (c < 0) {
    if (nconns == maxconns) return -1;
    c = nconns++;
    conns[c].buf = malloc(BUF_BYTES);
    if (conns[c].buf == NULL) die("malloc");
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0 && errno != EINPROGRESS) die("connect");
  struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP, .data.u32 = (uint32_t)c};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) die("epoll_ctl");
  conns[c].fd = fd;
  conns[c].state = CONNECTING;
  conns[c].req = -1;
  conns[c].written = 0;
  conns[c].have = 0;
  return c;
}

static void watch(int c, uint32_t events) {
  struct epoll_event ev = {.events = events, .data.u32 = (uint32_t)c};
  if (epoll_ctl(ep, EPOLL_CTL_MOD, conns[c].fd, &ev) < 0) die("epoll_ctl");
}

static void kill_conn(int c) {
  struct conn *k = &conns[c];
  if ((k->state == BUSY || k->state == CONNECTING) && k->req >= 0) settle(k->req, 0);
  epoll_ctl(ep, EPOLL_CTL_DEL, k->fd, NULL);
  close(k->fd);
  k->state = DEAD;
  k->req = -1;
}

/* Writes what is left of the connection's request; watches for writability while some is. */
static void flush(int c) {
  struct conn *k = &conns[c];
  const struct req *r = &reqs[k->req % nreqs];
  while (k->written < r->len) {
    ssize_t n = write(k->fd, r->bytes + k->written, r->len - k->written);
    if (n < 0) {
      if (errno == EAGAIN) { watch(c, EPOLLIN | EPOLLOUT | EPOLLRDHUP); return; }
      kill_conn(c);
      return;
    }
    k->written += (size_t)n;
  }
  watch(c, EPOLLIN | EPOLLRDHUP);
}

static void send_on(int c, long i) {
  struct conn *k = &conns[c];
  late_ns[i] = now_ns() - due_ns(i);
  k->req = i;
  k->written = 0;
  k->have = 0;
  if (k->state == CONNECTING) return; /* sent once connected */
  k->state = BUSY;
  flush(c);
}

/* Request i is due: on an idle connection, a new one, or queued for the next one free. */
static void dispatch(long i) {
  while (nidle > 0) {
    int c = idle[--nidle];
    conns[c].stacked = 0;
    if (conns[c].state == IDLE) { send_on(c, i); return; }
  }
  int c = qhead < qtail ? -1 : open_conn(); /* none jumps ahead of those already waiting */
  if (c >= 0) { send_on(c, i); return; }
  queue[qtail++] = i;
}

/* Queued requests onto new connections where some died (nothing else would send them). */
static void drain_queue(void) {
  while (qhead < qtail) {
    int c = open_conn();
    if (c < 0) return;
    send_on(c, queue[qhead++]);
  }
}

/* Past the drain deadline: whatever is still waiting fails. */
static void give_up(void) {
  for (int c = 0; c < nconns; c++)
    if (conns[c].state == BUSY || (conns[c].state == CONNECTING && conns[c].req >= 0)) kill_conn(c);
  while (qhead < qtail) {
    long i = queue[qhead++];
    late_ns[i] = now_ns() - due_ns(i);
    settle(i, 0);
  }
}

static void released(int c) {
  if (qhead < qtail) { send_on(c, queue[qhead++]); return; }
  conns[c].state = IDLE;
  conns[c].req = -1;
  if (!conns[c].stacked) {
    conns[c].stacked = 1;
    idle[nidle++] = c;
  }
}

/* Finds a header's value in [head, end): case-insensitive name, returns NULL when absent. */
static const char *header(const char *head, const char *end, const char *name, size_t *vlen) {
  size_t nlen = strlen(name);
  for (const char *line = memchr(head, '\n', (size_t)(end - head)); line != NULL && line + 1 < end;) {
    line++;
    const char *eol = memchr(line, '\n', (size_t)(end - line));
    if (eol == NULL) eol = end;
    if ((size_t)(eol - line) > nlen && strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
      const char *v = line + nlen + 1;
      while (v < eol && (*v == ' ' || *v == '\t')) v++;
      const char *ve = eol;
      while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ')) ve--;
      *vlen = (size_t)(ve - v);
      return v;
    }
    line = eol < end ? eol : NULL;
  }
  return NULL;
}

/* An answer with no body whatever its content-length: to a HEAD, or a 204 or 304. */
static int bodiless(long i, int status) {
  const struct req *r = &reqs[i % nreqs];
  return status == 204 || status == 304 || (r->len >= 5 && memcmp(r->bytes, "HEAD ", 5) == 0);
}

static void readable(int c) {
  struct conn *k = &conns[c];
  for (;;) {
    if (k->have == BUF_BYTES) { errno = EMSGSIZE; die("an answer over the buffer"); }
    ssize_t n = read(k->fd, k->buf + k->have, BUF_BYTES - k->have);
    if (n == 0) { kill_conn(c); return; }
    if (n < 0) {
      if (errno == EAGAIN) return;
      kill_conn(c);
      return;
    }
    if (k->state != BUSY) { kill_conn(c); return; } /* bytes nobody asked for */
    k->have += (size_t)n;
  parse:;
    char *end_head = memmem(k->buf, k->have, "\r\n\r\n", 4);
    if (end_head == NULL) continue;
    size_t head_len = (size_t)(end_head - k->buf) + 4;
    int status = head_len > 12 ? atoi(k->buf + 9) : 0;
    if (status >= 100 && status < 200 && status != 101) {
      /* An interim answer (100 Continue, 103 Early Hints): the final one follows. */
      memmove(k->buf, k->buf + head_len, k->have - head_len);
      k->have -= head_len;
      goto parse;
    }
    size_t vlen;
    const char *te = header(k->buf, end_head, "transfer-encoding", &vlen);
    if (te != NULL) { errno = ENOTSUP; die("a chunked answer (only content-length is read)"); }
    const char *cl = header(k->buf, end_head, "content-length", &vlen);
    size_t body = cl == NULL || bodiless(k->req, status) ? 0 : strtoul(cl, NULL, 10);
    if (k->have < head_len + body) continue;
    const char *conn_hdr = header(k->buf, end_head, "connection", &vlen);
    int closing = conn_hdr != NULL && vlen == 5 && strncasecmp(conn_hdr, "close", 5) == 0;
    /* Bytes past the answer, or an answer before the whole request left: the connection's
       framing is lost, so it is not used again. */
    if (k->have > head_len + body || k->written < reqs[k->req % nreqs].len) closing = 1;
    settle(k->req, status >= 200 && status < 300);
    k->req = -1;
    k->have = 0;
    if (closing) { kill_conn(c); return; }
    released(c);
    return;
  }
}

static void writable(int c) {
  struct conn *k = &conns[c];
  if (k->state == CONNECTING) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(k->fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      if (!started) { errno = err; die("connect"); }
      kill_conn(c); /* its request failed; the next one due tries again */
      return;
    }
    if (k->req >= 0) { k->state = BUSY; flush(c); }
    else { watch(c, EPOLLIN | EPOLLRDHUP); released(c); }
    return;
  }
  if (k->state == BUSY) flush(c);
}

static char *read_file(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) die(path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *data = malloc((size_t)n);
  if (data == NULL || fread(data, 1, (size_t)n, f) != (size_t)n) die(path);
  fclose(f);
  *size = (size_t)n;
  return data;
}

int main(int argc, char **argv) {
  if (argc != 7) {
    fprintf(stderr, "usage: openloop HOST PORT RATE SECONDS CONNECTIONS REQUESTS_FILE\n");
    return 2;
  }
  double rate = atof(argv[3]), seconds = atof(argv[4]);
  maxconns = atoi(argv[5]);
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)atoi(argv[2]));
  if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1 || rate <= 0 || seconds <= 0 || maxconns <= 0) {
    fprintf(stderr, "openloop: bad arguments (an IPv4 address, a rate, seconds and connections above 0)\n");
    return 2;
  }
  size_t size;
  char *data = read_file(argv[6], &size);
  if (size < 4) { fprintf(stderr, "openloop: %s: no request count\n", argv[6]); return 2; }
  memcpy(&nreqs, data, 4);
  reqs = calloc(nreqs, sizeof *reqs);
  size_t at = 4;
  for (uint32_t i = 0; i < nreqs; i++) {
    if (at + 4 > size) { fprintf(stderr, "openloop: %s: ends early\n", argv[6]); return 2; }
    memcpy(&reqs[i].len, data + at, 4);
    at += 4;
    if (at + reqs[i].len > size) { fprintf(stderr, "openloop: %s: ends early\n", argv[6]); return 2; }
    reqs[i].bytes = data + at;
    at += reqs[i].len;
  }
  if (nreqs == 0) { fprintf(stderr, "openloop: %s: no requests\n", argv[6]); return 2; }

  const char *drain = getenv("OPENLOOP_DRAIN_MS");
  if (drain != NULL && atof(drain) > 0) drain_ns = (int64_t)(atof(drain) * 1e6);
  total = (long)(rate * seconds + 0.5);
  interval_ns = 1e9 / rate;
  conns = calloc((size_t)maxconns, sizeof *conns);
  idle = calloc((size_t)maxconns, sizeof *idle);
  queue = calloc((size_t)total, sizeof *queue);
  lat_ns = calloc((size_t)total, sizeof *lat_ns);
  late_ns = calloc((size_t)total, sizeof *late_ns);
  ok = calloc((size_t)total, 1);
  if (!conns || !idle || !queue || !lat_ns || !late_ns || !ok) die("calloc");
  /* The timer's wake-ups as asked, not gathered into the default 50 us of slack. */
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  /* A write to a connection the server reset fails with EPIPE, not a signal that ends the run. */
  signal(SIGPIPE, SIG_IGN);
  ep = epoll_create1(EPOLL_CLOEXEC);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (ep < 0 || tfd < 0) die("epoll/timerfd");
  struct epoll_event tev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev) < 0) die("epoll_ctl");

  /* Connections opened before the schedule starts, so no early request waits for a handshake. */
  int pre = maxconns < PREOPEN ? maxconns : PREOPEN;
  for (int i = 0; i < pre; i++) open_conn();
  struct epoll_event events[64];
  while (nidle < pre) {
    int n = epoll_wait(ep, events, 64, 5000);
    if (n <= 0) { fprintf(stderr, "openloop: could not connect to %s:%s\n", argv[1], argv[2]); return 1; }
    for (int e = 0; e < n; e++) {
      uint32_t c = events[e].data.u32;
      if (c == UINT32_MAX) continue;
      if (events[e].events & (EPOLLERR | EPOLLHUP)) { errno = ECONNREFUSED; die("connect"); }
      if (events[e].events & EPOLLOUT) writable((int)c);
    }
  }
  start_ns = now_ns() + 1000000;
  started = 1;
  int armed = 0;
  while (settled < total) {
    /* Everything due by now leaves; the timer is set for the next one, or, all sent, for the
       drain deadline. */
    int64_t now = now_ns();
    while (sent < total && due_ns(sent) <= now) dispatch(sent++);
    drain_queue();
    if (sent == total && now >= due_ns(total - 1) + drain_ns) {
      give_up();
      break;
    }
    if (!armed) {
      int64_t next = sent < total ? due_ns(sent) : due_ns(total - 1) + drain_ns;
      struct itimerspec its = {.it_value = {.tv_sec = next / 1000000000, .tv_nsec = next % 1000000000}};
      if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) die("timerfd_settime");
      armed = 1;
    }
    /* The last requests may have failed just now, as they left (a write to a reset connection). */
    if (settled == total) break;
    int n = epoll_wait(ep, events, 64, -1);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    for (int e = 0; e < n; e++) {
      uint32_t c = events[e].data.u32;
      if (c == UINT32_MAX) {
        uint64_t expirations;
        if (read(tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN) die("timerfd read");
        armed = 0;
        continue;
      }
      if (conns[c].state == DEAD) continue;
      if (events[e].events & EPOLLOUT) writable((int)c);
      if (conns[c].state != DEAD && (events[e].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))) {
        if (conns[c].state == CONNECTING && (events[e].events & (EPOLLHUP | EPOLLERR))) { kill_conn((int)c); continue; }
        readable((int)c);
      }
    }
  }
  /* A buffered stdout: one line a request. */
  static char out[1 << 20];
  setvbuf(stdout, out, _IOFBF, sizeof out);
  for (long i = 0; i < total; i++)
    printf("%lld %lld %lld %d\n", (long long)((due_ns(i) - start_ns) / 1000), (long long)(lat_ns[i] / 1000), (long long)(late_ns[i] / 1000), ok[i]);
  printf("done %ld %ld %ld\n", sent, okcount, failcount);
  return 0;
}
