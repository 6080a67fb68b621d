#!/usr/bin/env bash
# Side-by-side CPU check of two builds of Lakefront (a hot-path change before and after):
#   bench/ab.sh bench/wrk/post256.lua THREADS RUNS DIST_A DIST_B
# DIST_A and DIST_B are compiled trees (a `dist/` each) inside the repository, so they resolve
# node_modules. Runs are interleaved A B A B ...; each starts Lakefront over the bench upstream,
# warms it for 1 s with wrk, then reads the process's CPU time over a 4 s wrk run (64
# connections). Prints medians and ranges of CPU us per request and of req/s.
set -euo pipefail
LUA=$1; TH=$2; RUNS=$3; A=$4; B=$5
cd "$(dirname "$0")/.."
OUT=$(mktemp); UP=$(mktemp); LF=$(mktemp)
node dist/bench/upstream.js --ports 0,0,0 > "$UP" & UPPID=$!
trap 'kill $UPPID 2>/dev/null; rm -f "$OUT" "$UP" "$LF"' EXIT
sleep 0.8
NODES=$(node -e "const p=JSON.parse(require('fs').readFileSync('$UP','utf8')).ports;console.log(p.map((x,i)=>'n'+i+'=http://127.0.0.1:'+x).join(','))")
run() {
  node "$1/src/cli.js" --nodes "$NODES" --port 0 --threads "$TH" --host 127.0.0.1 > "$LF" 2>&1 & local pid=$!
  sleep 1.0
  local url; url=$(grep -o 'http://127.0.0.1:[0-9]*' "$LF" | head -1)
  wrk -t1 -c64 -d1s -s "$LUA" "$url" > /dev/null
  local a; read -ra a < "/proc/$pid/stat"; local c0=$(( ${a[13]} + ${a[14]} ))
  local r; r=$(wrk -t1 -c64 -d4s -s "$LUA" "$url" | awk '/requests in/ {print $1}')
  read -ra a < "/proc/$pid/stat"; local c1=$(( ${a[13]} + ${a[14]} ))
  echo "$(( (c1 - c0) * 10000000 / r )) $(( r / 4 ))"
  kill -TERM "$pid"; wait "$pid" 2>/dev/null || true
}
for _ in $(seq "$RUNS"); do echo "A $(run "$A")" >> "$OUT"; echo "B $(run "$B")" >> "$OUT"; done
node -e '
const lines = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => l.split(" "));
for (const k of ["A", "B"]) {
  const c = lines.filter((l) => l[0] === k).map((l) => +l[1] / 1000).sort((x, y) => x - y);
  const r = lines.filter((l) => l[0] === k).map((l) => +l[2]).sort((x, y) => x - y);
  const m = (a) => a[(a.length - 1) >> 1];
  console.log(k, "cpu_us/req median", m(c).toFixed(1), "min", c[0].toFixed(1), "max", c.at(-1).toFixed(1), " req/s median", m(r));
}' "$OUT"
