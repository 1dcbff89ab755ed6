#!/usr/bin/env bash
# Core scaling on a larger machine (the lent 16-core one; nothing there but this folder and
# the work tree): the bare hyper floor, the tiers' accept loop and lastresort (spool on; S3 a
# stand-in replaying recorded objects, Kafka and memcached absent, so lastresort's best case),
# each pinned to N cores with N runtime workers, wrk -t8 -c128 pinned to LOAD_CPUS; ROUNDS runs
# of SECS each: req/s and the server's CPU µs per request (from /proc), into $OUT/scaling.txt.
# Made into .zlink/scaling/ by deploy/local/bench-scaling-pack, run there from the repo root as
#   bash .zlink/scaling/run.sh        (knobs: SECS 8, ROUNDS 2, CORES "1 2 4 8", LOAD_CPUS 8-15)
set -u
D="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"; OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
export LD_LIBRARY_PATH="$D/lib"
secs="${SECS:-8}" rounds="${ROUNDS:-2}" load="${LOAD_CPUS:-8-15}" cores="${CORES:-1 2 4 8}"
res="$OUT/scaling.txt"; : >"$res"
nproc; uname -r; head -3 /proc/cpuinfo | tail -1 >>"$res"
python3 "$D/s3stand.py" 127.0.0.1:9000 "$D/objects" & s3=$!
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_up() { for _ in $(seq 100); do curl -s -o /dev/null "$1" && return 0; sleep 0.1; done; echo "not up: $1"; return 1; }
for n in $cores; do
  cpus="0-$((n - 1))"
  for row in floor-bare floor-kit lastresort; do
    port=$((9100 + n))
    case "$row" in
      floor-bare) taskset -c "$cpus" "$D/bin/zlink-floor" "127.0.0.1:$port" bare "$n" 2>/dev/null & ;;
      floor-kit) taskset -c "$cpus" "$D/bin/zlink-floor" "127.0.0.1:$port" kit "$n" 2>/dev/null & ;;
      lastresort)
        rm -rf "/tmp/spool-$n"
        ZLINK_S3_ENDPOINT=http://127.0.0.1:9000 ZLINK_S3_BUCKET=links ZLINK_S3_ACCESS_KEY=bench ZLINK_S3_SECRET_KEY=benchbenchbench \
        ZLINK_IP_HASH_SALT=device-bench-salt-0123456789abcdef ZLINK_SHORT_DOMAINS=go.zlink.test ZLINK_WORKER_THREADS="$n" RUST_LOG=warn \
          taskset -c "$cpus" "$D/bin/lastresort" --listen "127.0.0.1:$port" --instance bench --kafka 127.0.0.1:9 \
          --spool-dir "/tmp/spool-$n" 2>>"$OUT/lastresort.log" &
        ;;
    esac
    pid=$!
    wait_up "http://127.0.0.1:$port/healthz" || { kill $pid; continue; }
    if [[ "$row" == lastresort ]]; then
      for _ in $(seq 100); do [[ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/readyz")" == 200 ]] && break; sleep 0.1; done
    fi
    SLUGS_FILE="$D/slugs" taskset -c "$load" "$D/bin/wrk" -t8 -c128 -d2s -s deploy/local/bench/slugs.lua "http://127.0.0.1:$port" >/dev/null
    for ((r = 1; r <= rounds; r++)); do
      t0=$(ticks $pid)
      line=$(SLUGS_FILE="$D/slugs" taskset -c "$load" "$D/bin/wrk" -t8 -c128 -d"${secs}s" --timeout 2s -s deploy/local/bench/slugs.lua "http://127.0.0.1:$port" | grep '^RESULT')
      t1=$(ticks $pid)
      reqs=$(sed -n 's/.* requests=\([0-9]*\).*/\1/p' <<<"$line")
      cpu=$(awk -v d=$((t1 - t0)) -v r="$reqs" 'BEGIN { printf "%.2f", (r > 0 ? d / 100 * 1e6 / r : 0) }')
      echo "cores=$n row=$row round=$r $line cpu_us=$cpu" | tee -a "$res"
    done
    [[ "$row" == lastresort && ( $n == 1 || $n == 8 ) ]] && curl -s "http://127.0.0.1:$port/metrics" >"$OUT/lastresort-$n.metrics"
    kill $pid; wait $pid 2>/dev/null
  done
done
kill $s3
