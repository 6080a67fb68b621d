// usage: node ws.js HOST:PORT MODE N SECONDS
// MODE idle:   N tunnels to /rpc/ws, idle; report how many the server closed, and when
// MODE flood:  N raw clients: handshake, then write 64 KiB binary frames (echoed by the node) as fast
//              as the socket takes them, never reading; report bytes written and how it ended
// MODE tiny:   N raw clients each writing 1-byte binary frames in 4 KiB batches for SECONDS, reading (and discarding) echoes
const net = require('net');
const [hp, mode, nS, sS] = process.argv.slice(2); const [host, port] = hp.split(':'); const N = +nS, secs = +sS;
const t0 = Date.now(); const closes = {}; let opened = 0, written = 0, failed = 0, readBytes = 0; const how = {};
function frame(len) { // masked binary frame, mask 0
  let h;
  if (len < 126) h = Buffer.from([0x82, 0x80 | len, 0, 0, 0, 0]);
  else if (len < 65536) { h = Buffer.alloc(8); h[0] = 0x82; h[1] = 0x80 | 126; h.writeUInt16BE(len, 2); }
  else { h = Buffer.alloc(14); h[0] = 0x82; h[1] = 0x80 | 127; h.writeBigUInt64BE(BigInt(len), 2); }
  return Buffer.concat([h, Buffer.alloc(len, 0)]); // zero mask: payload as is
}
const big = frame(65536), tinyBatch = Buffer.concat(Array(4096 / 7 | 0).fill(frame(1)));
function one(i) {
  const s = net.connect(+port, host); let up = false, buf = Buffer.alloc(0);
  s.on('error', (e) => { how[e.code] = (how[e.code] || 0) + 1; });
  s.on('close', () => { if (Date.now() - t0 < secs * 1000) { const k = Math.round((Date.now() - t0) / 1000); closes[k] = (closes[k] || 0) + 1; } });
  s.on('connect', () => s.write(`GET /rpc/ws HTTP/1.1\r\nHost: x\r\nx-lakefront-board: b${i}\r\nupgrade: websocket\r\nconnection: upgrade\r\nsec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`));
  s.on('data', (d) => {
    if (!up) { buf = Buffer.concat([buf, d]); const e = buf.indexOf('\r\n\r\n'); if (e < 0) return; up = true; opened++;
      if (!buf.toString().startsWith('HTTP/1.1 101')) { failed++; console.log(buf.toString().split('\r\n')[0]); s.destroy(); return; }
      if (mode === 'flood') { s.pause(); const pump = () => { while (s.writable && s.write(big)) written += big.length; if (s.writable) written += big.length; }; s.on('drain', pump); pump(); }
      if (mode === 'tiny') { const pump = () => { if (Date.now() - t0 > secs * 1000) return; while (s.writable && s.write(tinyBatch)) { written += tinyBatch.length; if (written % (1 << 20) < tinyBatch.length) return setImmediate(pump); } }; s.on('drain', pump); pump(); }
      return; }
    readBytes += d.length;
  });
  return s;
}
const socks = []; for (let i = 0; i < N; i++) socks.push(one(i));
setTimeout(() => {
  const still = socks.filter((s) => !s.destroyed && s.readyState === 'open').length;
  console.log(`${mode}: N=${N} upgraded=${opened - failed} refused=${failed} still open at ${secs}s=${still}; server closes by second ${JSON.stringify(closes)}; errors ${JSON.stringify(how)}; written ${(written / 1e6).toFixed(1)} MB; echoed back ${(readBytes / 1e6).toFixed(1)} MB`);
  for (const s of socks) s.destroy(); setTimeout(() => process.exit(0), 200);
}, secs * 1000);
