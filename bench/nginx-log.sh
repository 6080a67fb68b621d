#!/usr/bin/env bash
# What an access log costs nginx, for scale against Lakefront's (`bench/ab-cpu.sh ... dist
# dist::--access-log=FILE`): two nginx instances with 2 workers each over the bench upstream, the
# peer configuration of bench/peers/nginx.conf.tmpl, one with `access_log off`, one writing a JSON
# line a request (buffer=64k flush=100ms). RUNS interleaved `wrk -t1 -c64 -d4s` runs of POST 256 B
# each; prints each one's median CPU (master and workers, from /proc) in microseconds a request.
#   bench/nginx-log.sh [RUNS]
set -euo pipefail
RUNS=${1:-8}
cd "$(dirname "$0")/.."
DIR=$(mktemp -d)
node dist/bench/upstream.js --ports 0,0,0 > "$DIR/up.json" & UPPID=$!
declare -A PIDS PORT
cleanup() {
  for v in "${!PIDS[@]}"; do kill "${PIDS[$v]}" 2>/dev/null || true; done
  kill $UPPID 2>/dev/null || true
  sleep 0.3
  rm -rf "$DIR"
}
trap cleanup EXIT
sleep 0.8
SERVERS=$(node -e "console.log(JSON.parse(require('fs').readFileSync('$DIR/up.json','utf8')).ports.map((p)=>'        server 127.0.0.1:'+p+';').join('\\\\n'))")
for v in off on; do
  D=$DIR/$v; mkdir -p "$D"
  PORT[$v]=$(node -e "const s=require('net').createServer().listen(0,'127.0.0.1',()=>{console.log(s.address().port);s.close()})")
  LOG='access_log off;'
  if [ $v = on ]; then
    LOG="log_format js escape=json '{\"time\":\"\$time_iso8601\",\"client\":\"\$remote_addr\",\"method\":\"\$request_method\",\"path\":\"\$uri\",\"status\":\$status,\"node\":\"\$upstream_addr\",\"bytes\":\$body_bytes_sent,\"us\":\$request_time}'; access_log $D/access.log js buffer=64k flush=100ms;"
  fi
  sed -e "s|{{WORKERS}}|2|; s|{{DIR}}|$D|g; s|{{PORT}}|${PORT[$v]}|; s|{{KEEPALIVE}}|192|; s|    access_log off;|    $LOG|; s|{{SERVERS}}|$SERVERS|" bench/peers/nginx.conf.tmpl > "$D/nginx.conf"
  /usr/sbin/nginx -p "$D" -c "$D/nginx.conf" & PIDS[$v]=$!
done
sleep 1
HZ=$(getconf CLK_TCK)
cpu() { local t=0 p; for p in $1 $(pgrep -P "$1"); do read -ra a < "/proc/$p/stat"; t=$((t + a[13] + a[14])); done; echo $t; }
for v in off on; do wrk -t1 -c64 -d2s -s bench/wrk/post256.lua "http://127.0.0.1:${PORT[$v]}" > /dev/null; done
for _ in $(seq "$RUNS"); do for v in off on; do
  c0=$(cpu "${PIDS[$v]}")
  n=$(wrk -t1 -c64 -d4s -s bench/wrk/post256.lua "http://127.0.0.1:${PORT[$v]}" | awk '/requests in/ {print $1}')
  c1=$(cpu "${PIDS[$v]}")
  echo "$v $(( (c1 - c0) * 1000000000 / HZ / n ))"
  sleep 0.3
done; done > "$DIR/res.txt"
for v in off on; do
  awk -v v=$v '$1==v {print $2/1000}' "$DIR/res.txt" | sort -n | awk -v v=$v '{a[NR]=$1} END {printf "nginx-2w, access log %s: median %.2f us a request [", v, a[int((NR+1)/2)]; for (i=1;i<=NR;i++) printf "%.1f%s", a[i], (i<NR?" ":""); print "]"}'
done
echo "lines logged: $(wc -l < "$DIR/on/access.log")"
