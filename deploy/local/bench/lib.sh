# shellcheck shell=bash
# Shared by the benchmark scripts (bench-all, bench-ab, bench-lastresort); sourced after
# deploy/local/lib.sh, never executed. WORK is the calling run's scratch directory.

bench_nginx_bin() { command -v nginx || echo /usr/sbin/nginx; }

# The yardstick: an nginx that only answers `return 302` (WORKERS, default 2; access log off,
# the same keepalive as the tiers), started in WORK on the bench-nginx port, and over HTTPS on
# the bench-nginx-tls port with the frontend's certificate and the tiers' TLS settings; prints
# its URL.
bench_nginx_start() {
  local work="$1" workers="${2:-2}" port tls_port cert nginx
  port="$(zl_port bench-nginx)" tls_port="$(zl_port bench-nginx-tls)" nginx="$(bench_nginx_bin)"
  cert="$(zl_tls_site_dir frontend)/tls-combined.pem"
  [[ -x "$nginx" ]] || zl_die "nginx missing: run deploy/local/install"
  cat >"$work/nginx.conf" <<CONF
worker_processes $workers;
pid $work/nginx.pid;
error_log $work/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 100000;
  ssl_protocols TLSv1.2 TLSv1.3;
  ssl_ecdh_curve X25519:prime256v1:secp384r1;
  ssl_session_cache shared:yardstick:10m;
  ssl_session_timeout 1d;
  server {
    listen 127.0.0.1:$port;
    listen 127.0.0.1:$tls_port ssl;
    ssl_certificate $cert;
    ssl_certificate_key $cert;
    location / { return 302 https://example.com/; }
  }
}
CONF
  "$nginx" -t -q -p "$work" -c "$work/nginx.conf" -e "$work/error.log" || zl_die "bench nginx: bad config"
  "$nginx" -p "$work" -c "$work/nginx.conf" -e "$work/error.log" ||
    zl_die "bench nginx did not start (port $port taken by another run?)"
  zl_wait_for "bench nginx" 10 curl -s -o /dev/null "http://127.0.0.1:$port/x" >&2
  echo "http://127.0.0.1:$port"
}
bench_nginx_stop() {
  local work="$1"
  [[ -f "$work/nginx.pid" ]] || return 0
  "$(bench_nginx_bin)" -p "$work" -c "$work/nginx.conf" -e "$work/error.log" -s stop 2>/dev/null || true
}

# NAME=PID of every running process of the topology (and the yardstick nginx of WORK): each
# load step reads their CPU time before and after, so each row says who paid for the requests.
bench_procs() {
  local work="$1" c pid out=""
  for c in $(zl_components); do
    pid="$(zl_pid "$c")" && out+="$c=$pid,"
  done
  [[ -f "$work/nginx.pid" ]] && out+="bench-nginx=$(cat "$work/nginx.pid"),"
  echo "${out%,}"
}

# bench_load WORK STEP URL SLUGS SCRIPT SECS: a 2 s warm-up (caches, keep-alive pools), then
# the measured run (wrk -t2 -c16 through zlink-xtask load); prints its RESULT line.
bench_load() {
  local work="$1" step="$2" url="$3" slugs="$4" script="$5" secs="$6"
  SLUGS_FILE="$slugs" wrk -t2 -c16 -d2s -s "$script" "$url" >/dev/null
  "$(zl_bin zlink-xtask)" load --step "$step" --script "$script" --secs "$secs" \
    --procs "$(bench_procs "$work")" "$url" "$slugs"
}

# Click ingest on a topic, consumer group and counter process of a run's own (bench-all,
# bench-clicks-ab): the topology's counter may have a backlog that is neither the run's events
# nor its time. The topic has 6 partitions, as `clicks`; WORK/kafka-topics.log keeps Kafka's
# words.
bench_topic_create() {
  local work="$1" topic="$2"
  zl_kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$ZLINK_KAFKA" \
    --create --if-not-exists --topic "$topic" --partitions 6 --replication-factor 1 >>"$work/kafka-topics.log" 2>&1
}
bench_topic_delete() {
  local work="$1" topic="$2"
  zl_kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$ZLINK_KAFKA" \
    --delete --if-exists --topic "$topic" >>"$work/kafka-topics.log" 2>&1 || true
}
# bench_counter_start PIDFILE LOG TOPIC GROUP [COUNTER_BIN [OPTION...]]: a click counter
# counting TOPIC as GROUP on the bench-counter port, in the background, a child of the calling
# shell (so it can be waited for), its pid in PIDFILE before anything can fail (so a cleanup
# finds it); returns once it is ready, non-zero if it was not within 60 s.
bench_counter_start() {
  local pidfile="$1" log="$2" topic="$3" group="$4" bin="${5:-$(zl_bin counter)}"
  local args=("${@:6}")
  (
    zl_primary_env
    export RUST_LOG=warn
    exec "$bin" run --listen "127.0.0.1:$(zl_port bench-counter)" \
      --group-id "$group" --clicks-topic "$topic" "${args[@]}"
  ) >"$log" 2>&1 &
  echo $! >"$pidfile"
  zl_wait_for "bench counter" 60 curl -sf -o /dev/null "http://127.0.0.1:$(zl_port bench-counter)/readyz"
}
# bench_clicks_restore WAS_RUNNING: starts the topology's click counter again if it ran before
# the benchmark stopped it (1) and is not running now; never fails (for EXIT traps).
bench_clicks_restore() {
  if [[ "$1" == 1 ]] && ! zl_pid clicks >/dev/null; then { zl_start clicks && zl_wait_ready clicks; } >/dev/null 2>&1 || true; fi
}

# bench_topology_pids: the pid of every running component of the topology.
bench_topology_pids() {
  local c pid
  for c in $(zl_components); do pid="$(zl_pid "$c")" && echo "$pid"; done
}

# bench_cpu_ticks PID: the process's user + system CPU so far in clock ticks, its threads that
# already exited included (/proc/PID/stat, read after the command name, which may hold spaces).
bench_cpu_ticks() {
  local f
  read -r -a f < <(sed 's/^.*) //' "/proc/$1/stat")
  echo $((f[11] + f[12]))
}

# bench_pin CPUS PID...: every thread of each process (and of its children) onto CPUS; never
# fails (a process may be gone).
bench_pin() {
  local cpus="$1" p c; shift
  for p in "$@"; do
    taskset -a -p -c "$cpus" "$p" >/dev/null 2>&1 || true
    for c in $(pgrep -P "$p" 2>/dev/null); do taskset -a -p -c "$cpus" "$c" >/dev/null 2>&1 || true; done
  done
}

# bench_thread_snap PID FILE: every live thread's CPU so far into FILE ("tid ticks name" a line;
# /proc/PID/task/*/stat, the name as the thread set it). bench_thread_report BEFORE AFTER TOTAL
# prints the CPU seconds between two snapshots per thread kind (the name without its trailing
# number: a JVM's "MutationStage-3" is "MutationStage"), largest first, and what the process
# spent beyond its live threads (TOTAL: its own ticks over the same span, from
# bench_cpu_ticks) as "(exited threads)".
bench_thread_snap() {
  python3 - "$1" >"$2" <<'PY' || true
import os, sys
base = f"/proc/{sys.argv[1]}/task"
for tid in os.listdir(base):
    try:
        s = open(f"{base}/{tid}/stat").read()
    except OSError:
        continue  # exited meanwhile
    name, rest = s[s.index("(") + 1 : s.rindex(")")], s[s.rindex(")") + 2 :].split()
    print(tid, int(rest[11]) + int(rest[12]), name)
PY
}
bench_thread_report() {
  python3 - "$1" "$2" "$3" <<'PY'
import re, sys, collections
def load(p):
    out = {}
    for line in open(p):
        tid, ticks, name = line.rstrip("\n").split(" ", 2)
        out[tid] = (int(ticks), name)
    return out
before, after, total = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
kinds = collections.Counter()
for tid, (ticks, name) in after.items():
    kind = re.sub(r"[-#: ]*\d+$", "", name) or name
    kinds[kind] += ticks - before.get(tid, (0, ""))[0]
live = sum(kinds.values())
kinds["(exited threads)"] = max(0, total - live)
for kind, ticks in kinds.most_common(8):
    if ticks > 0:
        print(f"  {kind:28} {ticks / 100:8.2f} s  {100 * ticks / max(total, 1):5.1f} %")
PY
}

# bench_build_label: what the running redirect tiers were built as, read from primary-1's
# executable (a run measures the processes that run, whatever the environment says): empty for
# this checkout's release build, " (serve profile)" for its `serve` build (ZLINK_PROFILE=serve),
# " (binaries: DIR)" for any other (bench-ab's side A, a saved build).
bench_build_label() {
  local pid exe
  pid="$(zl_pid primary-1)" || return 0
  exe="$(readlink "/proc/$pid/exe" 2>/dev/null)" || return 0
  case "$(dirname "$exe")" in
    "$CARGO_TARGET_DIR/release") ;;
    "$CARGO_TARGET_DIR/serve") echo " (serve profile)" ;;
    *) echo " (binaries: $(dirname "$exe"))" ;;
  esac
}
