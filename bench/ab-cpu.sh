#!/usr/bin/env bash
# Side-by-side CPU of builds of Lakefront, split into user and system time:
#   bench/ab-cpu.sh bench/wrk/post256.lua THREADS RUNS DIST[::FLAGS]...
# Each DIST is a compiled tree (a `dist/`) inside the repository, so it resolves node_modules.
# FLAGS, after `::`, are extra flags for that build, written without spaces (`--flag=value`,
# several separated by commas): e.g. `dist dist::--access-log=/tmp/access.log` compares the same
# build with and without an access log. `floor:DIST` runs DIST's bench/floor-proxy.js (the least a
# uWS + Node proxy does) instead of Lakefront, for what Lakefront's own work costs
# (`floor:DIST::--pipelining`: the floor that pipelines).
# Every build is started once over the bench upstream and warmed for 2 s with wrk; then RUNS
# rounds, each running every build in turn for 4 s (wrk, one thread, 64 connections), reading
# its process's user and system CPU from /proc. Prints the medians (and the per-run totals) in
# microseconds a request. Unlike bench/ab.sh (a fresh process per run), the builds stay warm.
set -euo pipefail
LUA=$1; TH=$2; RUNS=$3; shift 3
cd "$(dirname "$0")/.."
OUT=$(mktemp); UP=$(mktemp)
node dist/bench/upstream.js --ports 0,0,0 > "$UP" & UPPID=$!
declare -A PIDS URLS LOGS
cleanup() {
  for d in "${!PIDS[@]}"; do kill -TERM "${PIDS[$d]}" 2>/dev/null || true; rm -f "${LOGS[$d]}"; done
  kill $UPPID 2>/dev/null || true
  rm -f "$OUT" "$UP"
}
trap cleanup EXIT
sleep 0.8
NODES=$(node -e "const p=JSON.parse(require('fs').readFileSync('$UP','utf8')).ports;console.log(p.map((x,i)=>'n'+i+'=http://127.0.0.1:'+x).join(','))")
for d in "$@"; do
  LOGS[$d]=$(mktemp)
  dir=$d; extra=()
  if [[ $d == *::* ]]; then dir=${d%%::*}; IFS=, read -ra extra <<< "${d#*::}"; fi
  if [[ $dir == floor:* ]]; then
    node "${dir#floor:}/bench/floor-proxy.js" "${extra[@]}" --nodes "$NODES" --port 0 --threads "$TH" > "${LOGS[$d]}" 2>&1 & PIDS[$d]=$!
  else
    node "$dir/src/cli.js" "${extra[@]}" --nodes "$NODES" --port 0 --threads "$TH" --host 127.0.0.1 --health-interval-ms 1000 > "${LOGS[$d]}" 2>&1 & PIDS[$d]=$!
  fi
  for _ in $(seq 40); do
    URLS[$d]=$(grep -o 'http://127.0.0.1:[0-9]*' "${LOGS[$d]}" | head -1 || true)
    [ -z "${URLS[$d]}" ] && URLS[$d]=$(grep -o '"port":[0-9]*' "${LOGS[$d]}" | head -1 | sed 's|"port":|http://127.0.0.1:|' || true)
    [ -n "${URLS[$d]}" ] && break; sleep 0.25
  done
  wrk -t1 -c64 -d2s -s "$LUA" "${URLS[$d]}" > /dev/null
done
HZ=$(getconf CLK_TCK)
for _ in $(seq "$RUNS"); do for d in "$@"; do
  pid=${PIDS[$d]}; read -ra a < "/proc/$pid/stat"; u0=${a[13]}; s0=${a[14]}
  n=$(wrk -t1 -c64 -d4s -s "$LUA" "${URLS[$d]}" | awk '/requests in/ {print $1}')
  read -ra a < "/proc/$pid/stat"
  echo "$d $(( (${a[13]} - u0) * 1000000000 / HZ / n )) $(( (${a[14]} - s0) * 1000000000 / HZ / n )) $(( n / 4 ))" >> "$OUT"
  sleep 0.3
done; done
node -e '
const rows = require("fs").readFileSync(process.argv[1], "utf8").trim().split("\n").map((l) => l.split(" "));
const m = (a) => { a = a.slice().sort((x, y) => x - y); return a[(a.length - 1) >> 1]; };
for (const d of [...new Set(rows.map((r) => r[0]))]) {
  const rs = rows.filter((r) => r[0] === d);
  const u = rs.map((r) => r[1] / 1000), s = rs.map((r) => r[2] / 1000), t = rs.map((r) => (+r[1] + +r[2]) / 1000);
  console.log(d.padEnd(24), "user", m(u).toFixed(2), "sys", m(s).toFixed(2), "total", m(t).toFixed(2), "[" + t.map((x) => x.toFixed(1)).join(" ") + "]", "req/s", m(rs.map((r) => +r[3])));
}' "$OUT"
