#!/usr/bin/env python3
# usage: [BIGPATH=/big] noread.py HOST:PORT N SECONDS   (BIGPATH: a path answering 1 MiB instead of the demo's /kv)
# PUTs a 1 MiB value at /kv/noread-big, then opens N connections that each GET it and never read.
# Reports when the server closed them (probed by a 1-byte recv at the end and on the way).
import socket, sys, time, http.client
host, port = sys.argv[1].split(':'); port = int(port); N = int(sys.argv[2]); secs = float(sys.argv[3])
import os
BIG = os.environ.get('BIGPATH', '/kv/noread-big')
c = http.client.HTTPConnection(host, port)
if BIG == '/kv/noread-big': c.request('PUT', '/kv/noread-big', body=b'z' * (1 << 20) ); 
if BIG == '/kv/noread-big': r = c.getresponse(); print('PUT', r.status, r.read()[:80])
c.request('GET', BIG, headers={'x-lakefront-board': 'big'}); r = c.getresponse(); print('GET', r.status, len(r.read())); c.close()
socks = []
for i in range(N):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect((host, port)); s.sendall(b'GET ' + BIG.encode() + b' HTTP/1.1\r\nHost: x\r\nx-lakefront-board: big\r\n\r\n'); socks.append(s)
t = time.time()
print(f'{N} non-reading clients holding a 1 MiB answer each; sleeping {secs}s')
time.sleep(secs)
# now see which are still open: drain each and see whether the answer was complete
full = closed = 0
for s in socks:
    s.settimeout(2); n = 0
    try:
        while True:
            d = s.recv(1 << 20)
            if not d: closed += 1; break
            n += len(d)
            if n >= (1 << 20): full += 1; break
    except socket.timeout: pass
    except Exception: closed += 1
    s.close()
print(f'after {secs}s: {full} got the whole answer when finally reading, {closed} were closed by the server')
