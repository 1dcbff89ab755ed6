# shellcheck shell=bash
# Shared by deploy/local/{install,up,ctl,test}: where things live, which port each component
# uses, and the supervision every component shares (spawn, probe, start, stop, kill, status).
# Sourced, never executed. What each component is lives in deploy/local/lib/, one file per
# concern: engines.sh (the single-node engines), cluster.sh (the clustered ones,
# ZLINK_CLUSTER=1), services.sh (zlink's processes), edge.sh (the nginx tiers, rung 4's DNS),
# monitoring.sh, faults.sh (fault proxies, `zl_fault`), netns.sh (ZLINK_NETNS=1). Each
# defines zl_start_<kind>, zl_ready_<kind> and ZL_TIMEOUT_<kind> for its components (zl_kind
# maps a component to its kind).
#
# Every server binds 127.0.0.1. Logs, pids and data live under one run dir ($ZLINK_RUN);
# downloads live in a cache outside the clone ($ZLINK_CACHE) so a second run is fast.

set -euo pipefail

ZLINK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ZLINK_CACHE="${ZLINK_CACHE:-$HOME/.cache/zlink}"
ZLINK_RUN="${ZLINK_RUN:-$ZLINK_ROOT/.zlink/local}"
# Every port is ZLINK_PORT_BASE + its offset in deploy/local/topology.tsv (see zl_port), so two
# topologies need bases at least 1000 apart.
ZLINK_PORT_BASE="${ZLINK_PORT_BASE:-21000}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ZLINK_CACHE/target}"

CASSANDRA_VERSION=5.0.9
KAFKA_VERSION=4.2.1
SEAWEEDFS_VERSION=4.48
CASSANDRA_LIB="$ZLINK_CACHE/cassandra-$CASSANDRA_VERSION/lib"
KAFKA_LIB="$ZLINK_CACHE/kafka-$KAFKA_VERSION/lib"
WEED="$ZLINK_CACHE/seaweedfs-$SEAWEEDFS_VERSION/bin/weed"
# Toxiproxy (pinned): its binaries are named `server` and `cli`.
TOXIPROXY_VERSION=2.12.0
TOXIPROXY="$ZLINK_CACHE/toxiproxy-$TOXIPROXY_VERSION/bin/server"
TOXIPROXY_CLI="$ZLINK_CACHE/toxiproxy-$TOXIPROXY_VERSION/bin/cli"
# cargo-machete (pinned): the lint step fails on a dependency no crate uses.
MACHETE_VERSION=0.9.2
MACHETE="$ZLINK_CACHE/cargo-machete-$MACHETE_VERSION/bin/cargo-machete"
# cargo-deny (pinned): the supply-chain check (deploy/local/audit-deps, deny.toml).
DENY_VERSION=0.20.2
DENY="$ZLINK_CACHE/cargo-deny-$DENY_VERSION/bin/cargo-deny"
# The offline validators of the deployment manifests (deploy/k8s/check), pinned: PyPI's
# kubernetes-validate (built-in kinds, strict) and check-jsonschema (the Compose file), and
# prometheus-operator's schemas from npm (deploy/k8s/validate/package-lock.json).
KUBERNETES_VALIDATE_VERSION=1.37.0
CHECK_JSONSCHEMA_VERSION=0.39.0
MANIFEST_TOOLS="$ZLINK_CACHE/manifest-tools-kv$KUBERNETES_VALIDATE_VERSION-cj$CHECK_JSONSCHEMA_VERSION"
zl_crd_validator_dir() {
  echo "$ZLINK_CACHE/crd-validate-$(sha256sum <"$ZLINK_ROOT/deploy/k8s/validate/package-lock.json" | cut -c1-16)"
}
# The fixed cluster id Kafka's log dir is formatted with (base64 of 16 bytes).
KAFKA_CLUSTER_ID="emxpbmstbG9jYWwtMDAwMQ"
# Topics and their partition counts: the one place they are set.
KAFKA_TOPICS="links:6 clicks:6 links-dlq:1"
S3_BUCKET="${ZLINK_S3_BUCKET:-links}"
# S3 credentials of the services' identity (local only; never used outside 127.0.0.1).
S3_ACCESS_KEY="zlink-local"
S3_SECRET_KEY="zlink-local-secret-not-for-production"
# As many primaries and last-resort proxies as deploy/local/topology.tsv has rows for.
PRIMARY_COUNT="$(grep -c '^primary-[0-9]' "$ZLINK_ROOT/deploy/local/topology.tsv")"
LASTRESORT_COUNT="$(grep -c '^lastresort-[0-9]' "$ZLINK_ROOT/deploy/local/topology.tsv")"

# Components in start order; `down` stops them in reverse.
zl_components() {
  if zl_fault_proxies; then echo toxiproxy; fi
  zl_engines
  echo s3 memcached
  local i
  for ((i = 1; i <= PRIMARY_COUNT; i++)); do echo "primary-$i"; done
  echo replicator clicks
  if zl_netns; then echo gw-dc gw-site; fi
  echo memcached-lr
  for ((i = 1; i <= LASTRESORT_COUNT; i++)); do echo "lastresort-$i"; done
  echo nginx-lastresort nginx-frontend dns
  echo alert-receiver alertmanager nginx-exporter-frontend nginx-exporter-lastresort blackbox node-exporter prometheus
}

# Ports: ZLINK_PORT_BASE + the offset deploy/local/topology.tsv gives each name.
declare -gA ZL_PORT_OFFSET=()
while read -r _zl_name _zl_off _; do
  [[ -z "$_zl_name" || "$_zl_name" == \#* ]] && continue
  ZL_PORT_OFFSET[$_zl_name]="$_zl_off"
done <"$ZLINK_ROOT/deploy/local/topology.tsv"
unset _zl_name _zl_off
zl_port() {
  local off="${ZL_PORT_OFFSET[$1]:-}"
  [[ -n "$off" ]] || { echo "zl_port: unknown port name $1 (deploy/local/topology.tsv)" >&2; return 1; }
  echo $((ZLINK_PORT_BASE + off))
}

zl_log() { printf '%s zlink: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
zl_die() { zl_log "ERROR: $*"; exit 1; }

zl_pidfile() { echo "$ZLINK_RUN/pids/$1.pid"; }
zl_logfile() { echo "$ZLINK_RUN/logs/$1.log"; }

# The process exists and is not a zombie (dead, waiting for an adopting parent to reap it).
zl_alive() {
  local state
  kill -0 "$1" 2>/dev/null || return 1
  state="$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)"
  [[ "$state" != Z ]]
}

# Prints the PID of a running component, or fails.
zl_pid() {
  local f pid
  f="$(zl_pidfile "$1")"
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  [[ -n "$pid" ]] && zl_alive "$pid" && echo "$pid"
}

# Starts a command as its own session (so stop/kill reach its whole process group),
# stdout/stderr appended to the component log, PID recorded.
zl_spawn() {
  local name="$1"; shift
  mkdir -p "$ZLINK_RUN/pids" "$ZLINK_RUN/logs"
  printf '\n=== %s start: %s\n' "$(date -Is)" "$*" >>"$(zl_logfile "$name")"
  # zlink services log JSON lines (trace_id on every line of a request); others ignore it.
  ZLINK_LOG_FORMAT="${ZLINK_LOG_FORMAT:-json}" setsid "$@" >>"$(zl_logfile "$name")" 2>&1 </dev/null &
  echo $! >"$(zl_pidfile "$name")"
}

# Polls until "$@" succeeds or the deadline passes. No fixed sleeps: 0.2 s between probes.
zl_wait_for() {
  local what="$1" timeout="$2"; shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      zl_log "$what not ready after ${timeout}s"
      return 1
    fi
    sleep 0.2
  done
}

# The Cargo profile the hot-path binaries run from (ZLINK_PROFILE, sticky to the run dir as
# ZLINK_CLUSTER is): `release` (default) runs every binary from the one release build, as the
# tests do; `serve` runs primary, lastresort, the click counter and zlink-floor from the `serve`
# profile (Cargo.toml: fat LTO, one codegen unit; what the production images build), which costs
# about 3.5 min of linking per binary, too much for the test command, and is what the
# benchmarks measure (docs/benchmarks.md, "Link-time optimisation").
[[ -z "${ZLINK_PROFILE:-}" && -f "$ZLINK_RUN/profile-serve" ]] && ZLINK_PROFILE=serve
ZLINK_PROFILE="${ZLINK_PROFILE:-release}"
[[ "$ZLINK_PROFILE" == release || "$ZLINK_PROFILE" == serve ]] ||
  zl_die "ZLINK_PROFILE: release or serve, not '$ZLINK_PROFILE'"
ZL_SERVE_BINS=(primary lastresort counter zlink-floor)

# Builds every binary of the workspace (release; extra cargo arguments, e.g. -q, after). Always
# the whole workspace, which every script then finds built: a `-p` build resolves features of its
# own and compiles a dozen crates again (and the tests resolve the binaries' features,
# deploy/local/check-features). With ZLINK_PROFILE=serve, then ZL_SERVE_BINS in that profile,
# selected from the whole workspace for the same reason (only their own crates are built).
zl_build() {
  (cd "$ZLINK_ROOT" && cargo build --release --locked --workspace --bins "$@") || return 1
  [[ "$ZLINK_PROFILE" == serve ]] || return 0
  (cd "$ZLINK_ROOT" && cargo build --profile serve --locked --workspace "${ZL_SERVE_BINS[@]/#/--bin=}" "$@")
}

# Readiness probes in each server's own protocol (probe/, no dependencies: built in seconds,
# before the servers it probes; `test` and `up` build it first).
zl_probe() {
  local bin; bin="$(zl_bin zlink-probe)"
  [[ -x "$bin" ]] || (cd "$ZLINK_ROOT" && cargo build --release --locked -q -p zlink-probe) || return 1
  "$bin" "$@"
}

# ---------------------------------------------------------------- generic control
zl_kind() {
  case "$1" in
    primary-*) echo primary ;; lastresort-*) echo lastresort ;; memcached-lr) echo memcached_lr ;;
    nginx-exporter-*) echo nginx_exporter ;; nginx-*) echo nginx ;;
    cassandra-*) echo cassandra_node ;; kafka-controller-*) echo kafka_controller ;;
    kafka-*) echo kafka_node ;;
    alert-receiver) echo alert_receiver ;; node-exporter) echo node_exporter ;; gw-dc) echo gw_dc ;; gw-site) echo gw_site ;;
    *) echo "$1" ;;
  esac
}

zl_known() {
  local c
  for c in $(zl_components); do [[ "$c" == "$1" ]] && return 0; done
  zl_die "unknown component '$1' (known: $(zl_components | tr '\n' ' '))"
}

zl_is_ready() {
  local kind; kind="$(zl_kind "$1")"
  case "$kind" in
    primary | lastresort | nginx | nginx_exporter | cassandra_node | kafka_node | kafka_controller) "zl_ready_$kind" "$1" ;;
    *) "zl_ready_$kind" ;;
  esac
}

# Starts a component unless it is already running. Does not wait.
zl_start() {
  local name="$1" kind
  kind="$(zl_kind "$name")"
  if zl_pid "$name" >/dev/null; then return 0; fi
  mkdir -p "$ZLINK_RUN/pids" "$ZLINK_RUN/logs"
  case "$kind" in
    primary | lastresort | nginx | nginx_exporter | cassandra_node | kafka_node | kafka_controller) "zl_start_$kind" "$name" ;;
    *) "zl_start_$kind" ;;
  esac
}

# Waits until a component is ready, for at most its kind's ZL_TIMEOUT_<kind> seconds (1 and a
# log line when it is not, or when it exited), or for at most SECONDS when given: then running
# out is a step of the caller's, not an error (2, no log line).
zl_wait_ready() {
  local name="$1" limit="${2:-}" kind timeout pid
  kind="$(zl_kind "$name")"
  timeout="ZL_TIMEOUT_$kind"
  local deadline=$((SECONDS + ${limit:-${!timeout}}))
  until zl_is_ready "$name" >/dev/null 2>&1; do
    if ! pid="$(zl_pid "$name")"; then
      zl_log "$name exited while starting; last lines of $(zl_logfile "$name"):"
      tail -n 30 "$(zl_logfile "$name")" >&2 || true
      return 1
    fi
    if ((SECONDS >= deadline)); then
      [[ -n "$limit" ]] && return 2
      zl_log "$name (pid $pid) not ready after ${!timeout}s; see $(zl_logfile "$name")"
      return 1
    fi
    sleep 0.2
  done
}

# Graceful stop: SIGTERM to the process group, wait for exit, SIGKILL after the grace period.
zl_stop() {
  local name="$1" grace="${2:-30}" pid
  pid="$(zl_pid "$name")" || { rm -f "$(zl_pidfile "$name")"; zl_spool_unmount "$name"; return 0; }
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + grace))
  while zl_alive "$pid"; do
    if ((SECONDS >= deadline)); then
      zl_log "$name did not stop within ${grace}s; sending SIGKILL"
      kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    sleep 0.1
  done
  rm -f "$(zl_pidfile "$name")"
  zl_spool_unmount "$name"
}

# SIGKILL, no grace: what a crash looks like. Waits until the process is gone.
zl_kill() {
  local name="$1" pid
  pid="$(zl_pid "$name")" || return 0
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  # Gone, or a zombie its (adopting) parent has not reaped yet: dead either way.
  while zl_alive "$pid"; do sleep 0.05; done
  rm -f "$(zl_pidfile "$name")"
}

zl_status_line() {
  local name="$1" pid state
  if pid="$(zl_pid "$name")"; then
    if zl_is_ready "$name" >/dev/null 2>&1; then state=ready; else state=starting; fi
  else
    pid=-; state=stopped
  fi
  printf '%-16s %-9s pid=%-8s log=%s\n' "$name" "$state" "$pid" "$(zl_logfile "$name")"
}

# Starts several components at once and waits until every one is ready.
zl_up() {
  local c failed=0
  for c in "$@"; do zl_start "$c"; done
  for c in "$@"; do zl_wait_ready "$c" || failed=1; done
  return "$failed"
}

# ---------------------------------------------------------------- the components
for _zl_part in engines cluster services edge monitoring faults netns; do
  source "$ZLINK_ROOT/deploy/local/lib/$_zl_part.sh"
done
unset _zl_part
