#!/usr/bin/env bash
# User-space instructions per request on a replicated route (n = 3, w = r = 2, strict), counted
# by valgrind's callgrind on the worker thread: bench/ir.sh's method, over three upstream nodes
# that answer every request at once with `x-lakefront-version: 1`.
#   bench/ir-quorum.sh DIST kvput|kvget WARM N      e.g. bench/ir-quorum.sh dist kvput 10000 10000
set -euo pipefail
DIST=$1; WL=$2; WARM=$3; N=$4
cd "$(dirname "$0")/.."
D=$(mktemp -d)
node dist/bench/upstream.js --ports 0,0,0 --version 1 > "$D/up.json" & UPPID=$!
VPID=
trap 'kill -TERM $VPID 2>/dev/null || true; kill $UPPID 2>/dev/null || true; rm -rf "$D"' EXIT
sleep 0.8
node -e "const fs=require('fs');const p=JSON.parse(fs.readFileSync('$D/up.json','utf8')).ports;fs.writeFileSync('$D/lf.json',JSON.stringify({clusters:[{name:'s',nodes:p.map((x,i)=>({id:'node-'+i,url:'http://127.0.0.1:'+x}))}],routes:[{path:'/kv/*',cluster:'s',quorum:{n:3,w:2,r:2,sloppy:false}}]}))"
valgrind --tool=callgrind --instr-atstart=no --separate-threads=yes --smc-check=all-non-file --callgrind-out-file="$D/cg.%p" \
  node "$DIST/src/cli.js" --config "$D/lf.json" --port 0 --threads 1 --host 127.0.0.1 --health-interval-ms 600000 > "$D/lf.log" 2> "$D/vg.log" & VPID=$!
URL=
for _ in $(seq 120); do URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$D/lf.log" | head -1 || true); [ -n "$URL" ] && break; sleep 0.5; done
node dist/bench/count.js "$URL" "$WARM" "$WL" > /dev/null
callgrind_control -i on "$VPID" > /dev/null 2>&1
node dist/bench/count.js "$URL" "$N" "$WL" > "$D/res.json"
callgrind_control -d "$VPID" > /dev/null 2>&1
callgrind_control -i off "$VPID" > /dev/null 2>&1
sleep 1
WORKER=$(grep -h "^summary:" "$D"/cg.*.1-* | awk '$2>m {m=$2} END {print m}')
echo "$DIST $WL: $(( WORKER / N )) instructions a request on the worker thread over $N requests; $(cat "$D/res.json")"
