# shellcheck shell=bash
# Shared by deploy/local/{install,up,ctl,test}: where things live, which port each component
# uses, and how a component is started, probed, stopped and killed. Sourced, never executed.
#
# Every server binds 127.0.0.1. Logs, pids and data live under one run dir ($ZLINK_RUN);
# downloads live in a cache outside the clone ($ZLINK_CACHE) so a second run is fast.

set -euo pipefail

ZLINK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
ZLINK_CACHE="${ZLINK_CACHE:-$HOME/.cache/zlink}"
ZLINK_RUN="${ZLINK_RUN:-$ZLINK_ROOT/.zlink/local}"
# Every port is ZLINK_PORT_BASE + a fixed offset (see zl_port), so two topologies need bases at
# least 1000 apart. SeaweedFS's gRPC ports are set explicitly: its default (+10000) put them in
# the kernel's ephemeral range (32768+), where an outgoing connection could hold one first.
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
PRIMARY_COUNT=2
LASTRESORT_COUNT=2

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
  echo alert-receiver alertmanager nginx-exporter-frontend nginx-exporter-lastresort prometheus
}

zl_port() {
  local off
  case "$1" in
    cql) off=42 ;;
    cassandra-storage) off=70 ;;
    kafka) off=92 ;;
    kafka-controller) off=93 ;;
    kafka-internal) off=94 ;;
    s3) off=33 ;;
    weed-master) off=133 ;;
    weed-volume) off=134 ;;
    weed-filer) off=135 ;;
    weed-admin) off=136 ;;
    weed-metrics) off=137 ;;
    weed-master-grpc) off=143 ;;
    weed-volume-grpc) off=144 ;;
    weed-filer-grpc) off=145 ;;
    weed-admin-grpc) off=146 ;;
    weed-s3-grpc) off=147 ;;
    memcached) off=11 ;;
    memcached-lr) off=12 ;;
    lastresort-*) off=$((100 + ${1#lastresort-})) ;;
    primary-*) off=$((80 + ${1#primary-})) ;;
    replicator) off=85 ;;
    clicks) off=86 ;;
    bench-nginx) off=190 ;;
    bench-counter) off=191 ;;
    nginx-frontend) off=180 ;;
    nginx-lastresort) off=181 ;;
    nginx-frontend-status) off=182 ;;
    nginx-lastresort-status) off=183 ;;
    prometheus) off=160 ;;
    alertmanager) off=161 ;;
    alert-receiver) off=162 ;;
    nginx-exporter-frontend) off=163 ;;
    nginx-exporter-lastresort) off=164 ;;
    toxiproxy) off=150 ;;
    dns) off=53 ;;
    gw-dc) off=151 ;;
    gw-site) off=152 ;;
    gw-s3) off=433 ;;
    gw-kafka) off=492 ;;
    site) off=79 ;;
    *) echo "zl_port: unknown port name $1" >&2; return 1 ;;
  esac
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

# Readiness probes in each server's own protocol (probe/, no dependencies: built in seconds,
# before the servers it probes; `test` and `up` build it first).
zl_probe() {
  local bin; bin="$(zl_bin zlink-probe)"
  [[ -x "$bin" ]] || (cd "$ZLINK_ROOT" && cargo build --release --locked -q -p zlink-probe) || return 1
  "$bin" "$@"
}

# ---------------------------------------------------------------- cassandra
zl_start_cassandra() {
  zl_spawn_cassandra cassandra "$ZLINK_RUN/cassandra" 127.0.0.1 "127.0.0.1:$(zl_port cassandra-storage)" false \
    "dynamic_snitch: false"
}
# zl_spawn_cassandra NAME DIR ADDR SEEDS HINTS RING: one Cassandra node listening on ADDR
# (storage and CQL ports the same on every address), RING: the yaml lines only a ring node has.
zl_spawn_cassandra() {
  local name="$1" dir="$2" addr="$3" seeds="$4" hints="$5" ring="$6" yaml
  mkdir -p "$dir"/{data,commitlog,saved_caches,hints,cdc_raw}
  yaml="$(sed -e "s|@DIR@|$dir|g" -e "s|@CQL_PORT@|$(zl_port cql)|g" \
    -e "s|@STORAGE_PORT@|$(zl_port cassandra-storage)|g" -e "s|@ADDR@|$addr|g" \
    -e "s|@SEEDS@|$seeds|g" -e "s|@HINTS@|$hints|g" \
    "$ZLINK_ROOT/deploy/local/conf/cassandra.yaml.tmpl")"
  printf '%s\n' "${yaml//@RING@/$ring}" >"$dir/cassandra.yaml"
  local jvm_opts
  mapfile -t jvm_opts < <(grep -v -e '^#' -e '^$' "$ZLINK_ROOT/deploy/local/conf/cassandra-jvm17.options")
  # 2 GiB of heap: every test keyspace's ~30 tables stay in the heap's schema and memtable
  # structures, and a full test run plus reruns against the same servers filled 1 GiB
  # (OutOfMemoryError after ~100 keyspaces). ZLINK_CASSANDRA_HEAP overrides (a ring node: 1g).
  local heap="${ZLINK_CASSANDRA_HEAP:-2g}"
  zl_spawn "$name" java "-Xms$heap" "-Xmx$heap" -Xss512k -XX:+ExitOnOutOfMemoryError "${jvm_opts[@]}" \
    -Dcassandra.config="file://$dir/cassandra.yaml" \
    -Dcassandra.storagedir="$dir" \
    -Dcassandra.logdir="$ZLINK_RUN/logs" \
    -Dlogback.configurationFile="$ZLINK_ROOT/deploy/local/conf/cassandra-logback.xml" \
    -Dcassandra-foreground=yes \
    -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    -Dcassandra.ring_delay_ms=0 \
    -Dcassandra.superuser_setup_delay_ms=0 \
    -Djava.net.preferIPv4Stack=true \
    -cp "$CASSANDRA_LIB/*" org.apache.cassandra.service.CassandraDaemon
}
zl_ready_cassandra() { zl_probe cql 127.0.0.1 "$(zl_port cql)"; }
ZL_TIMEOUT_cassandra=240

# ---------------------------------------------------------------- kafka
zl_kafka_java() {
  java -Xms256m -Xmx512m -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$ZLINK_ROOT/deploy/local/conf/kafka-log4j2.properties" \
    -cp "$KAFKA_LIB/*" "$@"
}
zl_start_kafka() {
  # A single combined broker+controller node in KRaft mode, loopback only.
  zl_spawn_kafka kafka "$ZLINK_RUN/kafka" broker,controller 1 127.0.0.1 \
    "1@127.0.0.1:$(zl_port kafka-controller)" "offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1"
}
# zl_spawn_kafka NAME DIR ROLES NODE_ID ADDR VOTERS EXTRA [CLIENT_ADDR]: one KRaft node
# (ROLES: broker, controller or both) listening on ADDR (the broker on the kafka port, the
# controller on the kafka-controller port: the same ports on every address), in the controller
# quorum VOTERS, with the server.properties lines EXTRA (replication of the internal topics,
# failure detection). A broker with a CLIENT_ADDR other than ADDR (its fault proxy's) tells
# clients to come there, and the brokers replicate among themselves on a listener of their own
# (INTERNAL, the kafka-internal port), directly. Its log dir is formatted with the topology's
# cluster id before its first start.
zl_spawn_kafka() {
  local name="$1" dir="$2" roles="$3" id="$4" addr="$5" voters="$6" extra="$7" client="${8:-$5}"
  local listeners=() advertised=() heap=512m internal=PLAINTEXT
  if [[ "$roles" == *broker* ]]; then
    listeners+=("PLAINTEXT://$addr:$(zl_port kafka)")
    advertised+=("PLAINTEXT://$client:$(zl_port kafka)")
    if [[ "$client" != "$addr" ]]; then
      internal=INTERNAL
      listeners+=("INTERNAL://$addr:$(zl_port kafka-internal)")
      advertised+=("INTERNAL://$addr:$(zl_port kafka-internal)")
    fi
  fi
  [[ "$roles" == *controller* ]] && listeners+=("CONTROLLER://$addr:$(zl_port kafka-controller)")
  # A controller-only node holds the cluster's metadata, not its data.
  [[ "$roles" == controller ]] && heap=256m
  mkdir -p "$dir"
  {
    cat <<EOF
process.roles=$roles
node.id=$id
controller.quorum.voters=$voters
listeners=$(IFS=,; echo "${listeners[*]}")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$dir/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.num.partitions=6
group.initial.rebalance.delay.ms=0
log.retention.hours=168
$extra
EOF
    if [[ "$roles" == *broker* ]]; then
      printf 'advertised.listeners=%s\ninter.broker.listener.name=%s\n' \
        "$(IFS=,; echo "${advertised[*]}")" "$internal"
    fi
  } >"$dir/server.properties"
  if [[ ! -f "$dir/data/meta.properties" ]]; then
    zl_kafka_java kafka.tools.StorageTool format -t "$KAFKA_CLUSTER_ID" \
      -c "$dir/server.properties" >>"$(zl_logfile "$name")" 2>&1 ||
      zl_die "formatting the Kafka log dir of $name failed; see $(zl_logfile "$name")"
  fi
  zl_spawn "$name" java "-Xms256m" "-Xmx$heap" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$ZLINK_ROOT/deploy/local/conf/kafka-log4j2.properties" \
    -Dkafka.logs.dir="$ZLINK_RUN/logs" \
    -cp "$KAFKA_LIB/*" kafka.Kafka "$dir/server.properties"
}
zl_ready_kafka() {
  zl_probe kafka 127.0.0.1 "$(zl_port kafka)" || return 1
  # Topics exist (created once, idempotently) = ready for producers and consumers.
  [[ -f "$ZLINK_RUN/kafka/topics.ok" ]] && return 0
  zl_kafka_topics kafka "127.0.0.1:$(zl_port kafka)" 1 && touch "$ZLINK_RUN/kafka/topics.ok"
}
# zl_kafka_topics LOG BOOTSTRAP RF [--config K=V ...]: creates every topic of $KAFKA_TOPICS
# that is missing, at replication factor RF, logging to LOG's log.
zl_kafka_topics() {
  local log="$1" bootstrap="$2" rf="$3" t; shift 3
  for t in $KAFKA_TOPICS; do
    zl_kafka_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" \
      --create --if-not-exists --topic "${t%%:*}" --partitions "${t##*:}" --replication-factor "$rf" \
      "$@" >>"$(zl_logfile "$log")" 2>&1 || return 1
  done
}
ZL_TIMEOUT_kafka=120

# ---------------------------------------------------------------- s3 (SeaweedFS)
zl_start_s3() {
  local dir="$ZLINK_RUN/s3"
  mkdir -p "$dir/data"
  cat >"$dir/s3.json" <<EOF
{
  "identities": [
    {"name": "zlink", "credentials": [{"accessKey": "$S3_ACCESS_KEY", "secretKey": "$S3_SECRET_KEY"}],
     "actions": ["Admin", "Read", "List", "Tagging", "Write"]},
    {"name": "anonymous", "actions": ["Read:$S3_BUCKET"]}
  ]
}
EOF
  # `weed mini` saves its flags to DATA/mini.options and reloads them; absolute paths only.
  zl_spawn s3 "$WEED" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -s3.port="$(zl_port s3)" -master.port="$(zl_port weed-master)" \
    -volume.port="$(zl_port weed-volume)" -filer.port="$(zl_port weed-filer)" \
    -admin.port="$(zl_port weed-admin)" -metricsPort="$(zl_port weed-metrics)" \
    -master.port.grpc="$(zl_port weed-master-grpc)" -volume.port.grpc="$(zl_port weed-volume-grpc)" \
    -filer.port.grpc="$(zl_port weed-filer-grpc)" -admin.port.grpc="$(zl_port weed-admin-grpc)" \
    -s3.port.grpc="$(zl_port weed-s3-grpc)" \
    -s3.config="$dir/s3.json" -bucket="$S3_BUCKET" -master.telemetry=false \
    -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0
}
# Ready = an unsigned GET of a missing key in the bucket answers 404 (an open port is not ready).
zl_ready_s3() {
  [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 \
    "http://127.0.0.1:$(zl_port s3)/$S3_BUCKET/zlink-readiness-probe")" == 404 ]]
}
ZL_TIMEOUT_s3=60

# ---------------------------------------------------------------- memcached
zl_start_memcached() {
  local user=(); [[ "$(id -u)" == 0 ]] && user=(-u root)
  zl_spawn memcached memcached "${user[@]}" -l 127.0.0.1 -p "$(zl_port memcached)" -U 0 -m 256 -c 4096 -t 2
}
zl_ready_memcached() { zl_probe memcached 127.0.0.1 "$(zl_port memcached)"; }
# The last-resort hosts' own memcached: nothing of the primary datacenter is shared with them.
zl_start_memcached_lr() {
  local user=(); [[ "$(id -u)" == 0 ]] && user=(-u root)
  zl_spawn memcached-lr $(zl_site_exec) memcached "${user[@]}" -l 127.0.0.1 -p "$(zl_port memcached-lr)" -U 0 -m 128 -c 4096 -t 2
}
zl_ready_memcached_lr() { zl_probe memcached 127.0.0.1 "$(zl_port memcached-lr)"; }
ZL_TIMEOUT_memcached_lr=10
ZL_TIMEOUT_memcached=10

# ---------------------------------------------------------------- primary
# ZLINK_BIN_DIR: where the binaries are, if not this build (bench-ab starts an older build).
zl_bin() { echo "${ZLINK_BIN_DIR:-$CARGO_TARGET_DIR/release}/$1"; }
zl_primary_env() {
  export ZLINK_CQL_NODES="$(zl_cql_nodes)"
  export ZLINK_KEYSPACE="${ZLINK_KEYSPACE:-zlink}"
  export ZLINK_MEMCACHED="$(zl_addr memcached)"
  export ZLINK_KAFKA="$(zl_kafka_bootstrap)"
  export ZLINK_RATE_LIMIT_EXEMPT="${ZLINK_RATE_LIMIT_EXEMPT:-$ZLINK_LOAD_GENERATOR}"
  export ZLINK_SHORT_DOMAINS
}
# A random secret created on first use and kept in the run dir (mode 600). The slug key
# must never change while links exist, so it lives with the data, not in the environment.
zl_secret() {
  local f="$ZLINK_RUN/secrets/$1"
  if [[ ! -s "$f" ]]; then
    mkdir -p "$ZLINK_RUN/secrets"
    chmod 700 "$ZLINK_RUN/secrets"
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$f")
  fi
  cat "$f"
}
# Runtime workers of a redirect tier (--worker-threads): 1 here, where two cores are shared by
# every server of the topology (and the load): one worker costs less CPU per redirect than one
# per core (fewer wake-ups and context switches; ARCHITECTURE.md, "Performance"). Override
# with ZLINK_WORKER_THREADS (0: one per core).
zl_worker_threads() { export ZLINK_WORKER_THREADS="${ZLINK_WORKER_THREADS:-1}"; }
zl_start_primary() {
  local name="$1"
  zl_primary_env
  # Secrets go through the environment (never argv, which zl_spawn logs).
  (
    ZLINK_SLUG_KEY="$(zl_secret slug-key)"
    ZLINK_IP_HASH_SALT="$(zl_secret ip-hash-salt)"
    export ZLINK_SLUG_KEY ZLINK_IP_HASH_SALT RUST_LOG="${RUST_LOG:-info}"
    zl_worker_threads
    zl_spawn "$name" "$(zl_bin primary)" serve \
      --listen "127.0.0.1:$(zl_port "$name")" --instance "$name" --spool-dir "$ZLINK_RUN/spool/$name" \
      --public-base-url "${ZLINK_PUBLIC_BASE_URL:-http://127.0.0.1:$(zl_port "$name")}"
  )
}
zl_ready_primary() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port "$1")/readyz")" == 200 ]]; }
ZL_TIMEOUT_primary=60

# ---------------------------------------------------------------- replicator
zl_s3_env() {
  export ZLINK_S3_ENDPOINT="http://$(zl_addr s3)"
  export ZLINK_S3_BUCKET="$S3_BUCKET"
  export ZLINK_S3_ACCESS_KEY="$S3_ACCESS_KEY"
  export ZLINK_S3_SECRET_KEY="$S3_SECRET_KEY"
}
zl_start_replicator() {
  (
    zl_primary_env
    zl_s3_env
    export RUST_LOG="${RUST_LOG:-info}"
    # Static group membership (one instance here): it takes its partitions back at once after
    # a restart of its own or of Kafka, so ε holds (ARCHITECTURE.md, "Budgets").
    zl_spawn replicator "$(zl_bin replicator)" run --listen "127.0.0.1:$(zl_port replicator)" \
      --group-instance-id replicator
  )
}
zl_ready_replicator() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port replicator)/readyz")" == 200 ]]; }
ZL_TIMEOUT_replicator=60

# ---------------------------------------------------------------- nginx tiers
# Both configs are rendered from nginx/*.conf (the one source of truth) with the local ports;
# their timeouts default to nginx/*.budgets (ARCHITECTURE.md, "Budgets"). Overrides:
# ZLINK_NGINX_WORKERS, ZLINK_NGINX_FAIL_TIMEOUT (5s) and, per tier, ZLINK_NGINX_FRONTEND_<NAME>
# or ZLINK_NGINX_LASTRESORT_<NAME> for a NAME of that tier's .budgets file
# (e.g. ZLINK_NGINX_FRONTEND_REDIRECT_READ_TIMEOUT=300ms).
zl_nginx_bin() { command -v nginx || echo /usr/sbin/nginx; }
# The address benchmarks and drills send from: exempt from every per-address rate limit
# (nginx and primaries). Anything else from 127.0.0.0/8 (e.g. 127.0.0.2) is limited.
ZLINK_LOAD_GENERATOR="${ZLINK_LOAD_GENERATOR:-127.0.0.1}"
# NAME=VALUE arguments for every ZLINK_NGINX_<TIER>_<NAME> variable set in the environment.
zl_nginx_overrides() {
  local tier="$1" var
  [[ -n "${ZLINK_NGINX_WORKERS:-}" ]] && echo "WORKERS=$ZLINK_NGINX_WORKERS"
  for var in $(compgen -e | grep "^ZLINK_NGINX_${tier}_" || true); do
    echo "${var#ZLINK_NGINX_${tier}_}=${!var}"
  done
}
# Renders nginx-frontend or nginx-lastresort into $ZLINK_RUN/nginx/NAME.conf and prints the path.
zl_render_nginx() {
  local name="$1" out="$ZLINK_RUN/nginx/$1.conf" servers="" backups="" i
  local ft="${ZLINK_NGINX_FAIL_TIMEOUT:-5s}" overrides
  mkdir -p "$ZLINK_RUN/nginx" "$ZLINK_RUN/$name-tmp" "$ZLINK_RUN/logs"
  local common=("RUN=$ZLINK_RUN" "LOGS=$ZLINK_RUN/logs" "LISTEN=127.0.0.1:$(zl_port "$name")")
  case "$name" in
    nginx-frontend)
      mapfile -t overrides < <(zl_nginx_overrides FRONTEND)
      for ((i = 1; i <= PRIMARY_COUNT; i++)); do
        servers+="        server $(zl_addr "primary-$i") max_fails=1 fail_timeout=$ft;"$'\n'
      done
      backups="        server 127.0.0.1:$(zl_port nginx-lastresort) max_fails=1 fail_timeout=$ft;"
      "$(zl_bin zlink-xtask)" render-nginx "$ZLINK_ROOT/nginx/frontend.conf" "$out" "${common[@]}" \
        "SITE_LISTEN=listen $(zl_site_addr frontend):$(zl_port site);" "PRIMARY_SERVERS=${servers%$'\n'}" "LASTRESORT_HOST_SERVERS=$backups" \
        "RATE_LIMIT_EXEMPT=$ZLINK_LOAD_GENERATOR" "STATUS_LISTEN=127.0.0.1:$(zl_port nginx-frontend-status)" \
        "${overrides[@]}" >&2 || return 1
      ;;
    nginx-lastresort)
      mapfile -t overrides < <(zl_nginx_overrides LASTRESORT)
      # In the network-namespace mode the load generator reaches the site over its users link.
      local exempt="$ZLINK_LOAD_GENERATOR"
      if zl_netns; then exempt="$(zl_netns_addr users-host)"; fi
      for ((i = 1; i <= LASTRESORT_COUNT; i++)); do
        servers+="        server $(zl_addr "lastresort-$i") max_fails=1 fail_timeout=$ft;"$'\n'
      done
      "$(zl_bin zlink-xtask)" render-nginx "$ZLINK_ROOT/nginx/lastresort.conf" "$out" "${common[@]}" \
        "SITE_LISTEN=listen $(zl_site_addr lastresort):$(zl_port site);" "LASTRESORT_SERVERS=${servers%$'\n'}" "TRUSTED_PROXIES=127.0.0.0/8" \
        "S3_HOSTPORT=$(zl_addr s3)" "S3_BUCKET=$S3_BUCKET" "S3_PREFIX=${ZLINK_S3_PREFIX:-}" \
        "STATIC=$ZLINK_ROOT/nginx/static" "CLICK_LOG=$(zl_nginx_click_log)" \
        "DEFAULT_HOSTS=$(zl_default_hosts_map)" \
        "RATE_LIMIT_EXEMPT=$exempt" "STATUS_LISTEN=127.0.0.1:$(zl_port nginx-lastresort-status)" \
        "${overrides[@]}" >&2 || return 1
      ;;
    *) zl_die "zl_render_nginx: unknown nginx $name" ;;
  esac
  echo "$out"
}
zl_start_nginx() {
  local name="$1" conf
  conf="$(zl_render_nginx "$name")" || zl_die "rendering $name failed"
  local ns=()
  [[ "$name" == nginx-lastresort ]] && read -ra ns <<<"$(zl_site_exec)"
  "${ns[@]}" "$(zl_nginx_bin)" -t -q -p "$ZLINK_RUN" -c "$conf" -e "$ZLINK_RUN/logs/$name.error.log" >>"$(zl_logfile "$name")" 2>&1 ||
    zl_die "$name: nginx -t failed; see $(zl_logfile "$name")"
  zl_spawn "$name" "${ns[@]}" "$(zl_nginx_bin)" -p "$ZLINK_RUN" -c "$conf" -e "$ZLINK_RUN/logs/$name.error.log" -g 'daemon off;'
}
zl_ready_nginx() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port "$1")/nginx-health")" == 200 ]]; }
ZL_TIMEOUT_nginx=10

# ---------------------------------------------------------------- dns (rung 4)
# The service's DNS name ($ZLINK_DNS_NAME) as the world would resolve it: dnsmasq on
# 127.0.0.1 (port base + 53) answers it from $ZLINK_RUN/dns/hosts with a 5 s TTL and nothing
# else (no upstream, no /etc/hosts). Each site has its own public address on the same port (the
# site port, base + 79): the frontend's nginx also listens on 127.0.1.1, the last-resort host's
# on 127.0.2.1 (the users link's address in the network-namespace mode). `ctl dns frontend|lastresort` points the name at one of them (rung 4).
ZLINK_DNS_NAME="${ZLINK_DNS_NAME:-go.zlink.test}"
# The default domain's names (comma-separated) for both tiers and the last-resort host's nginx:
# every other host name is a branded domain (wire::domain). IP literals and localhost always are.
ZLINK_SHORT_DOMAINS="${ZLINK_SHORT_DOMAINS:-$ZLINK_DNS_NAME}"
# The same names as lines of nginx/lastresort.conf's `map $host $zl_s3_dir`.
zl_default_hosts_map() {
  local d
  for d in ${ZLINK_SHORT_DOMAINS//,/ }; do printf '        "%s" "";\n' "${d,,}"; done
}
ZLINK_DNS_TTL="${ZLINK_DNS_TTL:-5}"
zl_site_addr() {
  case "$1" in
    frontend) echo 127.0.1.1 ;;
    lastresort) if zl_netns; then zl_netns_addr users-site; else echo 127.0.2.1; fi ;;
    *) zl_die "unknown site '$1' (frontend, lastresort)" ;;
  esac
}
# The site the name points at now (frontend until flipped).
zl_dns_site() {
  local f="$ZLINK_RUN/dns/site"
  if [[ -s "$f" ]]; then cat "$f"; else echo frontend; fi
}
# Writes the record for SITE (atomically) and makes a running dnsmasq re-read it (SIGHUP).
zl_dns_point() {
  local site="$1" addr pid
  addr="$(zl_site_addr "$site")"
  mkdir -p "$ZLINK_RUN/dns"
  printf '%s %s\n' "$addr" "$ZLINK_DNS_NAME" >"$ZLINK_RUN/dns/hosts.tmp"
  mv "$ZLINK_RUN/dns/hosts.tmp" "$ZLINK_RUN/dns/hosts"
  echo "$site" >"$ZLINK_RUN/dns/site"
  if pid="$(zl_pid dns)"; then kill -HUP "$pid"; fi
}
zl_start_dns() {
  zl_dns_point "$(zl_dns_site)"
  local user=(); [[ "$(id -u)" == 0 ]] && user=(--user=root)
  zl_spawn dns "$(command -v dnsmasq || echo /usr/sbin/dnsmasq)" --keep-in-foreground --conf-file=/dev/null --pid-file= "${user[@]}" \
    --no-resolv --no-hosts --no-poll --bind-interfaces --listen-address=127.0.0.1 \
    --port="$(zl_port dns)" --addn-hosts="$ZLINK_RUN/dns/hosts" --local-ttl="$ZLINK_DNS_TTL" \
    --local=/"${ZLINK_DNS_NAME#*.}"/ --log-facility=-
}
# Ready = it answers the name with the address of the site it should point at.
zl_ready_dns() {
  zl_probe dns 127.0.0.1 "$(zl_port dns)" "$ZLINK_DNS_NAME" "$(zl_site_addr "$(zl_dns_site)")" >/dev/null
}
ZL_TIMEOUT_dns=10

# ---------------------------------------------------------------- clicks (the click counter)
zl_start_clicks() {
  (
    zl_primary_env
    export RUST_LOG="${RUST_LOG:-info}"
    zl_spawn clicks "$(zl_bin primary)" count-clicks --listen "127.0.0.1:$(zl_port clicks)" \
      --group-instance-id clicks
  )
}
zl_ready_clicks() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port clicks)/readyz")" == 200 ]]; }
ZL_TIMEOUT_clicks=60

# ---------------------------------------------------------------- lastresort
# The rung-3 click log nginx-lastresort writes and the lastresort processes ingest.
zl_nginx_click_log() { echo "$ZLINK_RUN/logs/nginx-lastresort.clicks.json"; }
zl_start_lastresort() {
  local name="$1"
  (
    zl_s3_env
    # Only what a last-resort host would have: S3, its memcached, Kafka for click replay (may be
    # down), the shared IP-hash salt. Nothing of primary's.
    ZLINK_IP_HASH_SALT="$(zl_secret ip-hash-salt)"
    export ZLINK_IP_HASH_SALT ZLINK_SHORT_DOMAINS RUST_LOG="${RUST_LOG:-info}"
    zl_worker_threads
    zl_spawn "$name" $(zl_site_exec) "$(zl_bin lastresort)" --listen "127.0.0.1:$(zl_port "$name")" --instance "$name" \
      --memcached "127.0.0.1:$(zl_port memcached-lr)" --kafka "$(zl_kafka_bootstrap)" \
      --spool-dir "$ZLINK_RUN/spool/$name" --nginx-click-log "$(zl_nginx_click_log)"
  )
}
zl_ready_lastresort() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port "$1")/readyz")" == 200 ]]; }
ZL_TIMEOUT_lastresort=30

# ---------------------------------------------------------------- monitoring
# Prometheus scrapes every process on its own address (the ops network: never through a public
# nginx), both nginx tiers through prometheus-nginx-exporter (stub_status on a status-only
# listener) and evaluates deploy/prometheus/rules; Alertmanager sends every alert, firing and
# resolved, to a local webhook receiver that appends them to $ZLINK_RUN/alerts.jsonl.
# Scrape and evaluation interval: ZLINK_SCRAPE_INTERVAL (5s).
zl_alerts_file() { echo "$ZLINK_RUN/alerts.jsonl"; }
# Labels: job, component (the instance) and tier (its place in the ladder: frontend, primary,
# lastresort, pipeline, monitoring).
zl_scrape_job() {
  local job="$1" tier="$2" c; shift 2
  printf '  - job_name: %s\n    static_configs:\n' "$job"
  for c in "$@"; do
    printf "      - targets: ['127.0.0.1:%s']\n        labels: {component: %s, tier: %s}\n" "$(zl_port "$c")" "$c" "$tier"
  done
}
zl_prometheus_config() {
  local dir="$ZLINK_RUN/prometheus" i tier every="${ZLINK_SCRAPE_INTERVAL:-5s}"
  local primaries=() lastresorts=()
  for ((i = 1; i <= PRIMARY_COUNT; i++)); do primaries+=("primary-$i"); done
  for ((i = 1; i <= LASTRESORT_COUNT; i++)); do lastresorts+=("lastresort-$i"); done
  mkdir -p "$dir"
  {
    printf 'global:\n  scrape_interval: %s\n  evaluation_interval: %s\n  scrape_timeout: 4s\n' "$every" "$every"
    printf '  external_labels: {site: local}\nrule_files:\n  - %s/deploy/prometheus/rules/*.yml\n' "$ZLINK_ROOT"
    printf "alerting:\n  alertmanagers:\n    - static_configs: [{targets: ['127.0.0.1:%s']}]\n" "$(zl_port alertmanager)"
    printf 'scrape_configs:\n'
    zl_scrape_job primary primary "${primaries[@]}"
    zl_scrape_job lastresort lastresort "${lastresorts[@]}"
    zl_scrape_job replicator pipeline replicator
    zl_scrape_job clicks pipeline clicks
    zl_scrape_job prometheus monitoring prometheus
    zl_scrape_job alertmanager monitoring alertmanager
    printf '  - job_name: nginx\n    static_configs:\n'
    for tier in frontend lastresort; do
      printf "      - targets: ['127.0.0.1:%s']\n        labels: {component: nginx-%s, tier: %s}\n" \
        "$(zl_port "nginx-exporter-$tier")" "$tier" "$tier"
    done
  } >"$dir/prometheus.yml.tmp"
  promtool check config "$dir/prometheus.yml.tmp" >>"$(zl_logfile prometheus)" 2>&1 ||
    { zl_log "prometheus config invalid; see $(zl_logfile prometheus)"; return 1; }
  mv "$dir/prometheus.yml.tmp" "$dir/prometheus.yml"
}
zl_start_prometheus() {
  zl_prometheus_config || return 1
  zl_spawn prometheus prometheus --config.file="$ZLINK_RUN/prometheus/prometheus.yml" \
    --storage.tsdb.path="$ZLINK_RUN/prometheus/data" --storage.tsdb.retention.time=2d \
    --web.listen-address="127.0.0.1:$(zl_port prometheus)" --web.enable-lifecycle
}
zl_ready_prometheus() { curl -sf -m 2 "http://127.0.0.1:$(zl_port prometheus)/-/ready" >/dev/null; }
ZL_TIMEOUT_prometheus=60
zl_start_alertmanager() {
  local dir="$ZLINK_RUN/alertmanager"
  mkdir -p "$dir"
  # One route: every alert to the local receiver, grouped by name, sent at once and resolved too.
  cat >"$dir/alertmanager.yml" <<YML
route:
  receiver: local-file
  group_by: [alertname]
  group_wait: 1s
  group_interval: 5s
  repeat_interval: 4h
receivers:
  - name: local-file
    webhook_configs:
      - url: http://127.0.0.1:$(zl_port alert-receiver)/
        send_resolved: true
YML
  amtool check-config "$dir/alertmanager.yml" >>"$(zl_logfile alertmanager)" 2>&1 ||
    { zl_log "alertmanager config invalid; see $(zl_logfile alertmanager)"; return 1; }
  # A single node: no cluster listener.
  zl_spawn alertmanager prometheus-alertmanager --config.file="$dir/alertmanager.yml" \
    --storage.path="$dir/data" --web.listen-address="127.0.0.1:$(zl_port alertmanager)" \
    --cluster.listen-address=
}
zl_ready_alertmanager() { curl -sf -m 2 "http://127.0.0.1:$(zl_port alertmanager)/-/ready" >/dev/null; }
ZL_TIMEOUT_alertmanager=30
zl_start_alert_receiver() {
  zl_spawn alert-receiver "$(zl_bin zlink-xtask)" alert-receiver \
    "$(zl_port alert-receiver)" "$(zl_alerts_file)"
}
zl_ready_alert_receiver() { curl -sf -m 2 "http://127.0.0.1:$(zl_port alert-receiver)/" >/dev/null; }
ZL_TIMEOUT_alert_receiver=10
zl_start_nginx_exporter() {
  local name="$1" tier="${1#nginx-exporter-}"
  zl_spawn "$name" prometheus-nginx-exporter \
    -nginx.scrape-uri="http://127.0.0.1:$(zl_port "nginx-$tier-status")/stub_status" \
    -web.listen-address="127.0.0.1:$(zl_port "$name")"
}
zl_ready_nginx_exporter() { curl -sf -m 2 "http://127.0.0.1:$(zl_port "$1")/metrics" >/dev/null; }
ZL_TIMEOUT_nginx_exporter=10

# ---------------------------------------------------------------- fault proxies (Toxiproxy)
# The hops a drill slows down or blackholes go through one local Toxiproxy (a real TCP fault
# proxy): primaries → cassandra and memcached; replicator, lastresorts and the lastresort host
# → s3; the frontend → primaries; the lastresort host → lastresort processes. Each proxy is
# named after the component it fronts and listens on that component's port + 200; with no
# fault injected it only forwards bytes. ZLINK_FAULT_PROXIES=0 connects everything directly
# (benchmarks of the nginx tiers), and then only kill and hang faults are available.
# (`up` records the choice in the run dir: later `ctl` calls keep it.)
[[ -z "${ZLINK_FAULT_PROXIES:-}" && -f "$ZLINK_RUN/no-fault-proxies" ]] && ZLINK_FAULT_PROXIES=0
zl_fault_proxies() { [[ "${ZLINK_FAULT_PROXIES:-1}" == 1 ]]; }
# Components with a fault proxy in front, and the port name each is reached on.
zl_proxied_port() {
  case "$1" in
    # (A ring node's and a broker's proxy listen on its client address: zl_node_client_addr.)
    cassandra) zl_cluster && return 1; echo cql ;;
    memcached | s3 | primary-*) echo "$1" ;;
    # (In the network-namespace mode the site's own hops stay inside the site.)
    lastresort-*) zl_netns && return 1; echo "$1" ;;
    *) return 1 ;;
  esac
}
# host:port to connect to NAME: its fault proxy when there is one, else NAME itself.
zl_addr() {
  local port
  if zl_fault_proxies && port="$(zl_proxied_port "$1")"; then
    echo "127.0.0.1:$(($(zl_port "$port") + 200))"
  else
    port="$(zl_proxied_port "$1" || echo "$1")"
    echo "127.0.0.1:$(zl_port "$port")"
  fi
}
zl_start_toxiproxy() {
  local conf="$ZLINK_RUN/toxiproxy.json" sep="" c i
  local fronted=(memcached s3)
  zl_cluster || fronted+=(cassandra)
  for ((i = 1; i <= PRIMARY_COUNT; i++)); do fronted+=("primary-$i"); done
  if ! zl_netns; then
    for ((i = 1; i <= LASTRESORT_COUNT; i++)); do fronted+=("lastresort-$i"); done
  fi
  {
    echo "["
    for c in "${fronted[@]}"; do
      printf '%s  {"name": "%s", "listen": "%s", "upstream": "127.0.0.1:%s", "enabled": true}\n' \
        "$sep" "$c" "$(zl_addr "$c")" "$(zl_port "$(zl_proxied_port "$c")")"
      sep=","
    done
    if zl_cluster; then zl_cluster_proxies | sed "s/^/$sep  /"; fi
    echo "]"
  } >"$conf"
  zl_spawn toxiproxy "$TOXIPROXY" -host 127.0.0.1 -port "$(zl_port toxiproxy)" -config "$conf"
}
zl_ready_toxiproxy() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port toxiproxy)/proxies")" == 200 ]]; }
ZL_TIMEOUT_toxiproxy=10
# The Toxiproxy API: zl_toxi METHOD PATH [JSON].
zl_toxi() {
  local args=(-sS -f -m 5 -o /dev/null -X "$1" "http://127.0.0.1:$(zl_port toxiproxy)$2")
  [[ $# -ge 3 ]] && args+=(-H 'Content-Type: application/json' -d "$3")
  curl "${args[@]}"
}

# ---------------------------------------------------------------- network-namespace mode
# ZLINK_NETNS=1 (root only): the last-resort site — memcached-lr, the lastresort processes,
# nginx-lastresort — runs in its own network namespace, joined to the host (the primary
# datacenter, where S3 also lives) by three veth pairs, each a /30 of 10.231.<base/1000>.0/24:
#   wan     .1 dc  <-> .2 site   between the datacenters: the frontend's failover to the
#                                last-resort host, the site's click replay into Kafka, scrapes
#   s3      .5 dc  <-> .6 site   the site's own way to S3 (not through the primary site)
#   users   .9 host <-> .10 site the site's users: its public address (rung 4, the drill's
#                                --site load) is .10
# Two Toxiproxy gateways forward the ports that cross (no fault toxics on them): gw-dc on the
# host (127.0.0.1:P of a site component → wan; Kafka and S3 offered on the dc's link
# addresses), gw-site in the namespace (the site's ports offered on its wan address; Kafka and
# S3 on the site's 127.0.0.1 → the links). So every address stays what it is without the mode.
# `ctl fault cut wan|site-s3` takes a link down, `ctl heal cut ...` brings it back.
# (`up` records the mode in the run dir, so later `ctl` calls need not repeat it.)
[[ -z "${ZLINK_NETNS:-}" && -f "$ZLINK_RUN/netns" ]] && ZLINK_NETNS=1
# The clustered engines (ZLINK_CLUSTER=1): their own file.
source "$ZLINK_ROOT/deploy/local/cluster.sh"
zl_netns() { [[ "${ZLINK_NETNS:-0}" == 1 ]]; }
ZL_NS="zlink-site-$ZLINK_PORT_BASE"
zl_site_exec() { if zl_netns; then echo ip netns exec "$ZL_NS"; fi; }
zl_netns_addr() {
  local net="10.231.$(((ZLINK_PORT_BASE / 1000) % 256))"
  case "$1" in
    wan-dc) echo "$net.1" ;; wan-site) echo "$net.2" ;;
    s3-dc) echo "$net.5" ;; s3-site) echo "$net.6" ;;
    users-host) echo "$net.9" ;; users-site) echo "$net.10" ;;
    *) zl_die "zl_netns_addr: unknown $1" ;;
  esac
}
# The host-side interface of a link (the cut is made there).
zl_netns_dev() { echo "zl${ZLINK_PORT_BASE}${1:0:1}d"; }
# Creates the namespace and the three links (idempotent).
zl_netns_up() {
  [[ "$(id -u)" == 0 ]] || zl_die "ZLINK_NETNS=1 needs root (network namespaces, veth pairs)"
  ip netns list | grep -qw "$ZL_NS" || ip netns add "$ZL_NS"
  ip -n "$ZL_NS" link set lo up
  local link host site
  for link in wan s3 users; do
    host="$(zl_netns_dev "$link")" site="zl${ZLINK_PORT_BASE}${link:0:1}s"
    if ! ip link show "$host" >/dev/null 2>&1; then
      ip link add "$host" type veth peer name "$site" netns "$ZL_NS"
      local h="${link}-dc" s="${link}-site"
      [[ "$link" == users ]] && h=users-host
      ip addr add "$(zl_netns_addr "$h")/30" dev "$host"
      ip -n "$ZL_NS" addr add "$(zl_netns_addr "$s")/30" dev "$site"
    fi
    ip link set "$host" up
    ip -n "$ZL_NS" link set "$site" up
  done
}
# Removes the namespace (its ends of the links go with it, and so the host ends).
zl_netns_down() {
  ip netns list 2>/dev/null | grep -qw "$ZL_NS" || return 0
  ip netns del "$ZL_NS"
}
# The site's ports: what its components listen on.
zl_site_ports() {
  local i
  for ((i = 1; i <= LASTRESORT_COUNT; i++)); do zl_port "lastresort-$i"; done
  zl_port memcached-lr; zl_port nginx-lastresort; zl_port nginx-lastresort-status
}
# A gateway's routes, one "NAME LISTEN UPSTREAM" line each. gw-dc: a site port P on the host's
# 127.0.0.1:P → the site's wan address; Kafka and S3 offered on the dc's ends of the wan and s3
# links. gw-site: the mirror image; the site reaches S3 at the address it is configured with
# (zl_addr s3), over its own link.
zl_gw_routes() {
  local side="$1" p k s w
  k="$(zl_port kafka)" s="$(zl_port s3)" w="$(zl_netns_addr wan-site)"
  for p in $(zl_site_ports); do
    if [[ "$side" == dc ]]; then echo "site-$p 127.0.0.1:$p $w:$p"; else echo "site-$p $w:$p 127.0.0.1:$p"; fi
  done
  # On the dc's link addresses Kafka and S3 get ports of their own (gw-kafka, gw-s3): SeaweedFS
  # refuses to start while its port is bound on any address.
  local dk="$(zl_netns_addr wan-dc):$(zl_port gw-kafka)" ds="$(zl_netns_addr s3-dc):$(zl_port gw-s3)"
  if [[ "$side" == dc ]]; then
    echo "kafka $dk 127.0.0.1:$k"
    echo "s3 $ds 127.0.0.1:$s"
  else
    echo "kafka 127.0.0.1:$k $dk"
    echo "s3 $(zl_addr s3) $ds"
  fi
}
zl_start_gw() {
  local side="$1" ns=()
  zl_netns_up
  zl_gw_routes "$side" | awk 'BEGIN { print "[" }
    { printf "%s  {\"name\": \"%s\", \"listen\": \"%s\", \"upstream\": \"%s\", \"enabled\": true}\n", (NR > 1 ? "," : ""), $1, $2, $3 }
    END { print "]" }' >"$ZLINK_RUN/gw-$side.json"
  [[ "$side" == site ]] && ns=(ip netns exec "$ZL_NS")
  zl_spawn "gw-$side" "${ns[@]}" "$TOXIPROXY" -host 127.0.0.1 -port "$(zl_port "gw-$side")" \
    -config "$ZLINK_RUN/gw-$side.json"
}
zl_start_gw_dc() { zl_start_gw dc; }
zl_start_gw_site() { zl_start_gw site; }
zl_ready_gw_dc() { curl -sf -m 2 -o /dev/null "http://127.0.0.1:$(zl_port gw-dc)/proxies"; }
zl_ready_gw_site() { ip netns exec "$ZL_NS" curl -sf -m 2 -o /dev/null "http://127.0.0.1:$(zl_port gw-site)/proxies"; }
ZL_TIMEOUT_gw_dc=10
ZL_TIMEOUT_gw_site=10

# ---------------------------------------------------------------- faults
# zl_fault fault|heal KIND NAME — what `ctl fault|heal` and the drill do to one component:
#   kill       SIGKILL the process group (a crash) | start it and wait until ready
#   hang       SIGSTOP the process group: its sockets still accept, nothing answers | SIGCONT
#   slow       every byte from NAME waits ZLINK_FAULT_SLOW_MS (1000) and flows at
#              ZLINK_FAULT_SLOW_KBPS (64 KB/s) | normal (needs a fault proxy in front of NAME)
#   blackhole  connections to NAME are accepted and every byte both ways is swallowed | normal
#   restart    a graceful stop (SIGTERM), then a start, waiting until ready: one step of a
#              rolling restart, as an upgrade does it | nothing (it is back already)
zl_fault() {
  local action="$1" kind="$2" name="$3" pid
  case "$action:$kind" in
    fault:kill) zl_kill "$name" ;;
    heal:kill) zl_start "$name" && zl_wait_ready "$name" ;;
    fault:restart)
      if [[ "$name" == nginx-frontend || "$name" == nginx-lastresort ]]; then
        # nginx is reloaded, as an upgrade of its config is: new workers, old ones finish.
        pid="$(zl_pid "$name")" || zl_die "$name is not running"
        zl_render_nginx "$name" >/dev/null || zl_die "rendering $name failed"
        kill -HUP "$pid"
        zl_wait_ready "$name"
      else
        zl_stop "$name" && zl_start "$name" && zl_wait_ready "$name"
        # Behind nginx (primaries, lastresorts) a restarted server is back in rotation only
        # once nginx's fail_timeout has passed since its last failed try, which may have come
        # just before it was ready again: until then the next step of a rolling restart would
        # take the last server of the pool with it (measured: 2 creates of 203 answered 503
        # and 44 redirects went to rung 2 when the wait counted from the stop instead).
        if [[ "$name" == primary-* || "$name" == lastresort-* ]]; then
          local ft="${ZLINK_NGINX_FAIL_TIMEOUT:-5s}" ready_ms now_ms
          if [[ "$ft" == *ms ]]; then ft="${ft%ms}"; else ft=$((${ft%s} * 1000)); fi
          ready_ms=$(($(date +%s%3N)))
          now_ms=$ready_ms
          while ((now_ms - ready_ms <= ft + 500)); do sleep 0.2; now_ms=$(date +%s%3N); done
        fi
      fi
      ;;
    heal:restart) zl_pid "$name" >/dev/null || { zl_start "$name" && zl_wait_ready "$name"; } ;;
    fault:hang)
      pid="$(zl_pid "$name")" || zl_die "$name is not running"
      kill -STOP -- "-$pid" 2>/dev/null || kill -STOP "$pid"
      ;;
    heal:hang)
      pid="$(zl_pid "$name")" || zl_die "$name is not running"
      kill -CONT -- "-$pid" 2>/dev/null || kill -CONT "$pid"
      zl_wait_ready "$name"
      ;;
    fault:slow | fault:blackhole | heal:slow | heal:blackhole)
      zl_fault_proxies && { zl_proxied_port "$name" >/dev/null || zl_cluster_proxied "$name"; } ||
        zl_die "$kind needs a fault proxy in front of $name (proxied: cassandra memcached s3 primary-N lastresort-N, cassandra-N kafka-N; ZLINK_FAULT_PROXIES=1)"
      local t
      for t in "$kind-down" "$kind-up"; do zl_toxi DELETE "/proxies/$name/toxics/$t" 2>/dev/null || true; done
      [[ "$action" == heal ]] && return 0
      if [[ "$kind" == slow ]]; then
        zl_toxi POST "/proxies/$name/toxics" \
          "{\"name\":\"slow-down\",\"type\":\"latency\",\"stream\":\"downstream\",\"attributes\":{\"latency\":${ZLINK_FAULT_SLOW_MS:-1000},\"jitter\":0}}"
        zl_toxi POST "/proxies/$name/toxics" \
          "{\"name\":\"slow-up\",\"type\":\"bandwidth\",\"stream\":\"downstream\",\"attributes\":{\"rate\":${ZLINK_FAULT_SLOW_KBPS:-64}}}"
      else
        local stream
        for stream in down up; do
          zl_toxi POST "/proxies/$name/toxics" \
            "{\"name\":\"blackhole-$stream\",\"type\":\"timeout\",\"stream\":\"${stream}stream\",\"attributes\":{\"timeout\":0}}"
        done
      fi
      ;;
    fault:cut | heal:cut)
      zl_netns || zl_die "cut needs the network-namespace mode (ZLINK_NETNS=1)"
      local dev
      case "$name" in
        wan) dev="$(zl_netns_dev wan)" ;;
        site-s3) dev="$(zl_netns_dev s3)" ;;
        *) zl_die "cut: unknown link '$name' (wan, site-s3)" ;;
      esac
      if [[ "$action" == fault ]]; then
        ip link set "$dev" down
      else
        ip link set "$dev" up
        # Across the link again: the site answers the dc (wan), or reads S3 (site-s3).
        if [[ "$name" == wan ]]; then
          zl_wait_ready nginx-lastresort
        else
          zl_wait_for "the site reads S3 again" 30 ip netns exec "$ZL_NS" \
            curl -s -o /dev/null -m 2 "http://$(zl_addr s3)/$S3_BUCKET/zlink-readiness-probe"
        fi
      fi
      ;;
    *) zl_die "unknown fault '$kind' (kill hang slow blackhole cut restart)" ;;
  esac
}

# ---------------------------------------------------------------- generic control
zl_kind() {
  case "$1" in
    primary-*) echo primary ;; lastresort-*) echo lastresort ;; memcached-lr) echo memcached_lr ;;
    nginx-exporter-*) echo nginx_exporter ;; nginx-*) echo nginx ;;
    cassandra-*) echo cassandra_node ;; kafka-controller-*) echo kafka_controller ;;
    kafka-*) echo kafka_node ;;
    alert-receiver) echo alert_receiver ;; gw-dc) echo gw_dc ;; gw-site) echo gw_site ;;
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

zl_wait_ready() {
  local name="$1" kind timeout pid
  kind="$(zl_kind "$name")"
  timeout="ZL_TIMEOUT_$kind"
  local deadline=$((SECONDS + ${!timeout}))
  until zl_is_ready "$name" >/dev/null 2>&1; do
    if ! pid="$(zl_pid "$name")"; then
      zl_log "$name exited while starting; last lines of $(zl_logfile "$name"):"
      tail -n 30 "$(zl_logfile "$name")" >&2 || true
      return 1
    fi
    if ((SECONDS >= deadline)); then
      zl_log "$name (pid $pid) not ready after ${!timeout}s; see $(zl_logfile "$name")"
      return 1
    fi
    sleep 0.2
  done
}

# Graceful stop: SIGTERM to the process group, wait for exit, SIGKILL after the grace period.
zl_stop() {
  local name="$1" grace="${2:-30}" pid
  pid="$(zl_pid "$name")" || { rm -f "$(zl_pidfile "$name")"; return 0; }
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
