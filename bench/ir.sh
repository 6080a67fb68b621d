#!/usr/bin/env bash
# User-space instructions per proxied request, counted by valgrind's callgrind: deterministic to
# about 1% where CPU time moves by 10% from run to run. Blind to the kernel; compare builds with it.
# The worker thread's own count is the steady one: background JIT compiles land on other threads.
#   bench/ir.sh DIST WORKLOAD WARM N      e.g. bench/ir.sh dist post256 20000 20000
# DIST is a compiled tree inside the repository (dist, or a copy such as .ab/base). Lakefront runs
# one worker thread under callgrind with counting off; WARM requests warm the JIT, then counting is
# switched on for N requests. Needs valgrind (apt-get install valgrind).
# Workloads kvput and kvget run on a replicated route instead (n = 3, w = r = 2, strict) over
# nodes that answer with `x-lakefront-version: 1`: e.g. bench/ir.sh dist kvput 10000 10000.
# IR_FRONT=floor counts bench/floor-proxy.js (the least a uWS + Node proxy does) instead of Lakefront.
# IR_CACHE=1 also simulates the caches and branch predictors (slower) and prints the worker's misses
# a request: instruction and data L1 misses are where Lakefront and the floor differ (RESULTS.md).
# IR_NODE_FLAGS are node flags for the counted process, IR_KEEP a directory that keeps its
# callgrind files: e.g. IR_NODE_FLAGS="--no-short-builtin-calls --perf-basic-prof" names V8's
# builtins (Builtins_...) and writes the JIT names to /tmp/perf-PID.map (PID: the callgrind files'),
# and `callgrind_annotate --tree=caller` on the worker's file (the largest) shows who calls them.
set -euo pipefail
DIST=$1; WL=$2; WARM=$3; N=$4
cd "$(dirname "$0")/.."
D=$(mktemp -d)
UPARGS=(); [[ $WL == kv* ]] && UPARGS=(--version 1)
node dist/bench/upstream.js --ports 0,0,0 "${UPARGS[@]}" > "$D/up.json" & UPPID=$!
VPID=
trap 'kill -TERM $VPID 2>/dev/null || true; kill $UPPID 2>/dev/null || true; [[ -n ${IR_KEEP:-} ]] && mkdir -p "$IR_KEEP" && cp "$D"/cg.* "$IR_KEEP"/; rm -rf "$D"' EXIT
sleep 0.8
NODES=$(node -e "const p=JSON.parse(require('fs').readFileSync('$D/up.json','utf8')).ports;console.log(p.map((x,i)=>'node-'+i+'=http://127.0.0.1:'+x).join(','))")
FRONT=(--nodes "$NODES")
if [[ $WL == kv* ]]; then
  node -e "const fs=require('fs');const p=JSON.parse(fs.readFileSync('$D/up.json','utf8')).ports;fs.writeFileSync('$D/lf.json',JSON.stringify({clusters:[{name:'s',nodes:p.map((x,i)=>({id:'node-'+i,url:'http://127.0.0.1:'+x}))}],routes:[{path:'/kv/*',cluster:'s',quorum:{n:3,w:2,r:2,sloppy:false}}]}))"
  FRONT=(--config "$D/lf.json")
fi
CMD=("$DIST/src/cli.js" "${FRONT[@]}" --port 0 --threads 1 --host 127.0.0.1 --health-interval-ms 600000 ${LF_ARGS:-})
LABEL=$DIST
if [[ -n ${IR_FRONT:-} ]]; then
  [[ $IR_FRONT == floor ]] || { echo "IR_FRONT=$IR_FRONT: only floor is known" >&2; exit 2; }
  [[ $WL == kv* || -n ${LF_ARGS:-} ]] && { echo "IR_FRONT=floor: a plain route only (no $WL, no LF_ARGS)" >&2; exit 2; }
  CMD=("$DIST/bench/floor-proxy.js" --port 0 --threads 1 --nodes "$NODES")
  LABEL="floor:$DIST"
fi
SIM=(); [[ ${IR_CACHE:-} == 1 ]] && SIM=(--cache-sim=yes --branch-sim=yes)
valgrind --tool=callgrind "${SIM[@]}" --instr-atstart=no --separate-threads=yes --smc-check=all-non-file --callgrind-out-file="$D/cg.%p" \
  node ${IR_NODE_FLAGS:-} "${CMD[@]}" > "$D/lf.log" 2> "$D/vg.log" & VPID=$!
URL=
for _ in $(seq 120); do
  URL=$(grep -o 'http://127.0.0.1:[0-9]*' "$D/lf.log" | head -1 || true)
  [ -z "$URL" ] && URL=$(grep -o '"port":[0-9]*' "$D/lf.log" | head -1 | sed 's|"port":|http://127.0.0.1:|' || true)
  [ -n "$URL" ] && break; sleep 0.5
done
node dist/bench/count.js "$URL" "$WARM" "$WL" > /dev/null
callgrind_control -i on "$VPID" > /dev/null 2>&1
node dist/bench/count.js "$URL" "$N" "$WL" > "$D/res.json"
callgrind_control -d "$VPID" > /dev/null 2>&1
callgrind_control -i off "$VPID" > /dev/null 2>&1
sleep 1
# One file per thread: the worker's own thread is the busiest; the rest (V8's compiler and GC
# helpers, the main thread) are reported apart because background compiles make them vary.
IR=$(grep -h "^summary:" "$D"/cg.*.1-* | awk '{s+=$2} END {print s}')
WORKER=$(grep -h "^summary:" "$D"/cg.*.1-* | awk '$2>m {m=$2} END {print m}')
echo "$LABEL $WL: $(( WORKER / N )) instructions a request on the worker thread ($(( IR / N )) on all threads) over $N requests; $(cat "$D/res.json")"
if [[ ${IR_CACHE:-} == 1 ]]; then
  EVENTS=$(grep -h "^events:" "$D"/cg.*.1-* | head -1 | cut -d' ' -f2-)
  grep -h "^summary:" "$D"/cg.*.1-* | sort -k2 -n | tail -1 | awk -v n="$N" -v ev="$EVENTS" '{ split(ev, e, " "); printf "worker thread, a request:"; for (i = 2; i <= NF; i++) printf " %s %d", e[i-1], int($i / n); print "" }'
fi
