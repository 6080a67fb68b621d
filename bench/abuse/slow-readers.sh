#!/bin/sh
# Clients that read late or never, against Lakefront (2 threads) over one node in its own process;
# a good client (mon.py) asks /health every 0.5 s meanwhile and the process's RSS is sampled.
#   bench/abuse/slow-readers.sh http DIST N [BYTES]  N clients each GET a BYTES answer (1 MiB) and never read
#   bench/abuse/slow-readers.sh tiny DIST N SECS     N WebSocket clients send 1-byte messages as fast as they can
#   bench/abuse/slow-readers.sh flood DIST N SECS    N WebSocket clients send 64 KiB messages, never reading
# DIST: a compiled tree (dist). Extra Lakefront flags in LFARGS, environment in LFENV. Ports 18080/18081.
set -u
MODE=$1; DIST=$2; N=$3; ARG=${4:-}
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
export MONDIR=$(mktemp -d)
if [ "$MODE" = http ]; then
  node "$HERE/bignode.cjs" 18081 "${ARG:-1048576}" & U=$!
else
  node "$ROOT/dist/bench/upstream.js" --ports 18081 --websocket > /dev/null & U=$!
fi
env ${LFENV:-} node "$DIST/src/cli.js" --nodes a=http://127.0.0.1:18081 --port 18080 --host 127.0.0.1 --threads 2 ${LFARGS:-} > "$MONDIR/lf.log" 2>&1 & L=$!
trap 'kill $L $U 2>/dev/null; rm -rf "$MONDIR"' EXIT
sleep 1.5
if [ "$MODE" = http ]; then
  python3 "$HERE/mon.py" $L 127.0.0.1:18080 30 run /health &
  M=$!
  BIGPATH=/rpc/big python3 "$HERE/noread.py" 127.0.0.1:18080 "$N" 20
else
  python3 "$HERE/mon.py" $L 127.0.0.1:18080 $((ARG + 3)) run /health &
  M=$!
  node "$HERE/ws.cjs" 127.0.0.1:18080 "$MODE" "$N" "$ARG"
fi
wait $M
awk 'NR%4==1{printf "%s %s %s| ", $2, $3, $5} END{print ""}' "$MONDIR/run.mon"
