#!/usr/bin/env bash
# Core scaling on a larger machine (the lent 16-core one; nothing there but this folder and
# the work tree): the bare hyper floor, the tiers' accept loop and lastresort (spool on; S3 a
# stand-in replaying recorded objects, Kafka and memcached absent, so every click stays in the
# spool as while the datacenter is down), each pinned to N cores with N runtime workers, wrk
# -t8 -c128 pinned to LOAD_CPUS; ROUNDS runs of SECS each: req/s and the server's CPU µs per
# request (from /proc), into $OUT/scaling.txt. A second build packed as bin/lastresort-b is run
# as its own row (an A/B in one lease). The spool's cap is raised (SPOOL_MAX) so that no click
# is refused, and each lastresort row prints how many were (refused=). Where perf works (the
# machine's or the packed one, perf.tar.xz), lastresort is profiled at PERF_CORES for PERF_SECS
# under the same load: $OUT/perf-ROW-N.txt (by symbol) and perf stat (IPC, switches).
# Made into .zlink/scaling/ by deploy/local/bench-scaling-pack, run there from the repo root as
#   bash .zlink/scaling/run.sh  (knobs: SECS 8, ROUNDS 2, CORES "1 2 4 8", LOAD_CPUS 8-15,
#                                ROWS "floor-bare floor-kit lastresort [lastresort-b]",
#                                PERF_CORES "1 8", PERF_SECS 4)
set -u
D="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export LD_LIBRARY_PATH="$D/lib"
secs="${SECS:-8}" rounds="${ROUNDS:-2}" load="${LOAD_CPUS:-8-15}" cores="${CORES:-1 2 4 8}"
rows="${ROWS:-floor-bare floor-kit lastresort$([[ -x "$D/bin/lastresort-b" ]] && echo ' lastresort-b')}"
perf_cores="${PERF_CORES:-1 8}" perf_secs="${PERF_SECS:-4}"
res="$OUT/scaling.txt"; : >"$res"
{ nproc; uname -r; grep -m1 'model name' /proc/cpuinfo; df -T /tmp | tail -1; } | tee -a "$res"
# perf: the machine's if it runs, else the packed one (with its libraries).
perf=""
if command -v perf >/dev/null && perf stat -e task-clock -- true >/dev/null 2>&1; then perf=perf
elif [[ -f "$D/perf.tar.xz" ]]; then
  mkdir -p /tmp/perfpack && tar -xJf "$D/perf.tar.xz" -C /tmp/perfpack &&
    LD_LIBRARY_PATH=/tmp/perfpack/lib /tmp/perfpack/perf stat -e task-clock -- true >/dev/null 2>"$OUT/perf-probe.err" &&
    perf="env LD_LIBRARY_PATH=/tmp/perfpack/lib /tmp/perfpack/perf"
fi
echo "perf: ${perf:-none}" | tee -a "$res"
python3 "$D/s3stand.py" 127.0.0.1:9000 "$D/objects" & s3=$!
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_up() { for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; echo "not up: $1"; return 1; }
wrk_run() { SLUGS_FILE="$D/slugs" taskset -c "$load" "$D/bin/wrk" -t8 -c128 -d"$1" --timeout 2s -s deploy/local/bench/slugs.lua "http://127.0.0.1:$2"; }
for n in $cores; do
  cpus="0-$((n - 1))"
  for row in $rows; do
    port=$((9100 + n))
    case "$row" in
      floor-bare) taskset -c "$cpus" "$D/bin/zlink-floor" "127.0.0.1:$port" bare "$n" 2>/dev/null & ;;
      floor-kit) taskset -c "$cpus" "$D/bin/zlink-floor" "127.0.0.1:$port" kit "$n" 2>/dev/null & ;;
      lastresort*)
        bin="$D/bin/$row"
        rm -rf "/tmp/spool-$n"
        ZLINK_S3_ENDPOINT=http://127.0.0.1:9000 ZLINK_S3_BUCKET=links ZLINK_S3_ACCESS_KEY=bench ZLINK_S3_SECRET_KEY=benchbenchbench \
        ZLINK_IP_HASH_SALT=device-bench-salt-0123456789abcdef ZLINK_SHORT_DOMAINS=go.zlink.test ZLINK_WORKER_THREADS="$n" RUST_LOG=warn \
        ZLINK_SPOOL_MAX_BYTES="${SPOOL_MAX:-$((24 << 30))}" \
          taskset -c "$cpus" "$bin" --listen "127.0.0.1:$port" --instance bench --kafka 127.0.0.1:9 \
          --spool-dir "/tmp/spool-$n" 2>>"$OUT/$row.log" &
        ;;
    esac
    pid=$!
    wait_up "http://127.0.0.1:$port/healthz" || { kill $pid; continue; }
    if [[ "$row" == lastresort* ]]; then
      for _ in $(seq 100); do [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" == 200 ]] && break; sleep 0.1; done
    fi
    wrk_run 2s "$port" >/dev/null
    for ((r = 1; r <= rounds; r++)); do
      t0=$(ticks $pid)
      line=$(wrk_run "${secs}s" "$port" | grep '^RESULT')
      t1=$(ticks $pid)
      reqs=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$line")
      cpu=$(awk -v d=$((t1 - t0)) -v r="$reqs" 'BEGIN { printf "%.2f", (r > 0 ? d / 100 * 1e6 / r : 0) }')
      extra=""
      [[ "$row" == lastresort* ]] &&
        extra=" refused=$(curl -s "http://127.0.0.1:$port/metrics" | awk '/^zlink_lastresort_clicks_refused_total/ { s += $2 } END { print s + 0 }')"
      echo "cores=$n row=$row round=$r $line cpu_us=$cpu$extra" | tee -a "$res"
    done
    if [[ "$row" == lastresort* && -n "$perf" && " $perf_cores " == *" $n "* ]]; then
      wrk_run "$((2 * perf_secs + 2))s" "$port" >/dev/null &
      w=$!
      sleep 1
      timeout $((perf_secs + 20)) $perf stat -e task-clock,context-switches,cpu-migrations,page-faults,cycles,instructions -p $pid -- sleep "$perf_secs" 2>"$OUT/perfstat-$row-$n.txt"
      timeout $((perf_secs + 20)) $perf record -F 1999 -g -p $pid -o "/tmp/perf-$row-$n.data" -- sleep "$perf_secs" 2>/dev/null
      wait $w
      timeout 120 $perf report -i "/tmp/perf-$row-$n.data" --stdio --no-children --sort symbol --percent-limit 0.3 -g none 2>/dev/null |
        grep -v '^$' | cut -c1-160 | head -150 >"$OUT/perf-$row-$n.txt"
      # Who calls the kernel's busiest symbols (futex waits and wakes, page faults, ...).
      timeout 120 $perf report -i "/tmp/perf-$row-$n.data" --stdio --no-children --sort symbol --percent-limit 2 \
        -g caller,1,callee --max-stack 10 2>/dev/null | grep -v '^$' | cut -c1-160 | head -600 >"$OUT/perf-callers-$row-$n.txt"
    fi
    [[ "$row" == lastresort* && ( $n == 1 || $n == 8 ) ]] && curl -s "http://127.0.0.1:$port/metrics" >"$OUT/$row-$n.metrics"
    kill $pid; wait $pid 2>/dev/null
    rm -rf "/tmp/spool-$n"
  done
done
kill $s3
