#!/usr/bin/env python3
# usage: mon.py PID HOST:PORT SECONDS OUTLABEL  -- samples RSS/fds and a good client's latency every 0.5s
import sys, time, socket, os, json
pid, hp, secs, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
host, port = hp.split(':'); port = int(port)
path = sys.argv[5] if len(sys.argv) > 5 else '/rpc/query.execute'
def rss():
    try:
        for l in open(f'/proc/{pid}/status'):
            if l.startswith('VmRSS'): return int(l.split()[1])//1024
    except Exception: return -1
def fds():
    try: return len(os.listdir(f'/proc/{pid}/fd'))
    except Exception: return -1
def good():
    t = time.time()
    try:
        s = socket.create_connection((host, port), timeout=5)
        req = (f'GET {path} HTTP/1.1\r\nHost: x\r\nconnection: close\r\n\r\n' if path.startswith(('/health','/stats')) else f'POST {path} HTTP/1.1\r\nHost: x\r\nx-lakefront-board: good\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}')
        s.sendall(req.encode()); data = b''
        while True:
            c = s.recv(65536)
            if not c: break
            data += c
        s.close()
        st = data.split(b' ', 2)[1].decode() if data else 'EMPTY'
        return st, round((time.time()-t)*1000)
    except Exception as e:
        return type(e).__name__, round((time.time()-t)*1000)
end = time.time() + secs; peak_r = 0; peak_f = 0; bad = 0; n = 0; maxlat = 0; lines = []
while time.time() < end:
    r, f = rss(), fds(); st, lat = good(); n += 1
    peak_r = max(peak_r, r); peak_f = max(peak_f, f); maxlat = max(maxlat, lat)
    if st != '200' or lat > 1000: bad += 1
    lines.append(f'{time.time():.1f} rss={r}MB fds={f} good={st} {lat}ms')
    time.sleep(0.5)
open(os.path.join(os.environ.get('MONDIR', '/tmp'), f'{label}.mon'), 'w').write('\n'.join(lines) + '\n')
print(f'[{label}] peakRSS={peak_r}MB peakFDs={peak_f} good: {n} probes, {bad} bad/slow(>1s), max {maxlat}ms; end rss={rss()}MB fds={fds()}')
