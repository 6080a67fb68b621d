// usage: node bignode.cjs PORT [BYTES] -- answers every request with BYTES (1 MiB) (for the nginx comparison)
const body = Buffer.alloc(Number(process.argv[3] ?? 1 << 20), 0x7a);
require('http').createServer((q, r) => { q.resume(); q.on('end', () => r.writeHead(200, { 'content-type': 'application/octet-stream' }).end(body)); }).listen(+process.argv[2], '127.0.0.1');
