# shellcheck shell=bash
# The engines as single nodes: Cassandra, Kafka, SeaweedFS (S3), memcached: how each starts
# and when it is ready (the clustered engines: deploy/local/lib/cluster.sh).
# Sourced by deploy/local/lib.sh, never executed.

# The JVM engines (Cassandra and Kafka nodes) run at a lower CPU priority than everything else:
# in production they have machines of their own, here nine of them share two cores with the
# tiers under test. Measured on the clustered topology (2026-11-28): the box 100% busy with
# 20-100 runnable threads through a broker's restart; at equal priority a primary's 503 (its
# own 175 ms deadline) reached nginx after nginx's 250 ms read timeout, so both primaries were
# taken out of rotation for fail_timeout by one late answer each (and in CI 36 redirects got
# an answer from no rung, max 2.1 s). A niced engine still gets all the CPU the tiers leave
# (they use a few percent); ZLINK_ENGINE_NICE=0 runs them at equal priority. (That
# measurement was made with plain `nice`, which, as below, did not reach across sessions.)
ZL_ENGINE_NICE="${ZLINK_ENGINE_NICE:-10}"
# Where the kernel groups processes by session (`sched_autogroup_enabled` 1, as on these
# machines), `nice` alone does not do this: every component zl_spawn starts is a session of its
# own, the CPU is shared between sessions first, and a process's nice counts only inside its
# session. So on the clustered topology an engine also sets its session's nice
# (/proc/self/autogroup) before it becomes the JVM. Measured there (2026-11-29): during a broker's
# restart, a memcached round trip's max 42 → 33 ms, a primary's redirect max 81 → 40 ms,
# through Toxiproxy 127 → 50 ms. The single-node topology keeps plain `nice` until a whole test
# run has been measured with it (its cargo tests share one session against the engines').
# zl_engine_prio [NICE]: sets ZL_PRIO, the command prefix that runs an engine at NICE (default
# the engine nice).
zl_engine_prio() {
  local nice="${1:-$ZL_ENGINE_NICE}"
  if [[ "${ZLINK_CLUSTER:-0}" == 1 ]]; then
    # shellcheck disable=SC2016
    ZL_PRIO=(bash -c 'echo "$0" >/proc/self/autogroup 2>/dev/null; exec nice -n "$0" "$@"' "$nice")
  else
    ZL_PRIO=(nice -n "$nice")
  fi
}
# A Kafka node of the clustered topology that starts again while the rest serve (a heal after a
# kill, a step of a rolling restart) starts at this nice, and gets the engine nice once it is
# ready (zl_start_again). In production it starts on a machine of its own; here its start (the
# JVM, its JIT, its logs' recovery: 6-12 CPU-s) took the CPU the store ring serves creates with.
# Measured with deploy/local/slowbox 0.8 (the run capped at 0.8 of a CPU, as slow as CI's box),
# `ctl drill --fault kill:kafka-2 --rate 50`: creates not answered 201 in the restart's phase
# 14 of 131 → 1 of 135, slowest create → every rung 26.4 → 5.5 s, the restart 122 → 125 s
# (docs/drill-results.md, 2026-12-01).
# For at most ZL_ENGINE_RESTART_YIELD_S: at nice 19 under the 15-phase clustered drill on a box
# capped at 0.9 CPU the restart took 269 s, near the 300 s a broker gets to be ready; past the
# yield it competes as any engine, so it is back within the yield plus its start at the engine nice.
ZL_ENGINE_RESTART_NICE="${ZLINK_ENGINE_RESTART_NICE:-19}"
ZL_ENGINE_RESTART_YIELD_S="${ZLINK_ENGINE_RESTART_YIELD_S:-120}"
# zl_engine_renice PID NICE: PID's session (autogroup) and every thread of PID at NICE.
zl_engine_renice() {
  local pid="$1" nice="$2" t
  echo "$nice" >"/proc/$pid/autogroup" 2>/dev/null || true
  for t in /proc/"$pid"/task/*; do renice -n "$nice" -p "${t##*/}" >/dev/null 2>&1 || true; done
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
  # On the one-box ring (ZLINK_CLUSTER=1) a node's life is minutes (a test run, a drill), and
  # its C2 JIT was still compiling under the drill's load 3-4 minutes after the start: 46 % of
  # a core over the three nodes, 25 % a minute later. With C1 only, as the ring's Kafka nodes,
  # the test command's 15-phase clustered drill on a fresh ring (one A/B pair, 2026-12-04,
  # docs/drill-results.md) took the nodes 151 CPU-s instead of 226, the box's baseline phase
  # 69 % busy instead of 94 %, and its p99 from 36 to 9 ms; both passed. Once C2 is done its
  # faster code is worth as much as the compiling cost, so the single node the tests and
  # benchmarks use keeps C2. ZLINK_CASSANDRA_C1=0|1 overrides either way.
  local jit=()
  [[ "${ZLINK_CASSANDRA_C1:-$(zl_cluster && echo 1)}" == 1 ]] && jit=(-XX:TieredStopAtLevel=1)
  zl_engine_prio
  zl_spawn "$name" "${ZL_PRIO[@]}" java "-Xms$heap" "-Xmx$heap" -Xss512k -XX:+ExitOnOutOfMemoryError "${jit[@]}" "${jvm_opts[@]}" \
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
# failure detection). A broker also has an SSL listener (the kafka-tls port, the certificate of
# zl_tls_kafka) for the clients that cross a network (the lastresorts). A broker with a
# CLIENT_ADDR other than ADDR (its fault proxy's) tells clients to come there, and the brokers
# replicate among themselves on a listener of their own (INTERNAL, the kafka-internal port),
# directly. Its log dir is formatted with the topology's cluster id before its first start.
zl_spawn_kafka() {
  local name="$1" dir="$2" roles="$3" id="$4" addr="$5" voters="$6" extra="$7" client="${8:-$5}"
  local listeners=() advertised=() heap=512m internal=PLAINTEXT
  if [[ "$roles" == *broker* ]]; then
    listeners+=("PLAINTEXT://$addr:$(zl_port kafka)" "SSL://$addr:$(zl_port kafka-tls)")
    advertised+=("PLAINTEXT://$client:$(zl_port kafka)" "SSL://$client:$(zl_port kafka-tls)")
    zl_tls_kafka || return 1
    if [[ "$client" != "$addr" ]]; then
      internal=INTERNAL
      listeners+=("INTERNAL://$addr:$(zl_port kafka-internal)")
      advertised+=("INTERNAL://$addr:$(zl_port kafka-internal)")
    fi
  fi
  [[ "$roles" == *controller* ]] && listeners+=("CONTROLLER://$addr:$(zl_port kafka-controller)")
  # A controller-only node holds the cluster's metadata, not its data.
  [[ "$roles" == controller ]] && heap=256m
  # On the one-box ring (ZLINK_CLUSTER=1: six Kafka and three Cassandra JVMs on the box's
  # cores) a restarted broker competes for CPU with the rest, and its start is mostly the JIT:
  # 12.4 CPU-s with C2, 5.9 with C1 only (idle ring, kill + restart of kafka-2). Under the
  # drill's load (`ctl drill --fault kill:kafka-2 --rate 50`) a C2 start took 130 s, past the
  # readiness timeout; C1 starts took 33 s and, in the test command's 15-phase drill, 68 s.
  # C1 code is slower when hot, so the single-node Kafka the benchmarks use keeps C2.
  local jit=()
  zl_cluster && jit=(-XX:TieredStopAtLevel=1)
  mkdir -p "$dir"
  {
    cat <<EOF
process.roles=$roles
node.id=$id
controller.quorum.voters=$voters
listeners=$(IFS=,; echo "${listeners[*]}")
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT
ssl.keystore.type=PEM
ssl.keystore.location=$ZLINK_RUN/tls/kafka/tls-combined.pem
ssl.client.auth=none
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
  zl_engine_prio "${ZL_START_NICE:-}"
  zl_spawn "$name" "${ZL_PRIO[@]}" java "-Xms256m" "-Xmx$heap" "${jit[@]}" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$ZLINK_ROOT/deploy/local/conf/kafka-log4j2.properties" \
    -Dkafka.logs.dir="$ZLINK_RUN/logs" \
    -cp "$KAFKA_LIB/*" kafka.Kafka "$dir/server.properties"
}
zl_ready_kafka() {
  zl_probe kafka 127.0.0.1 "$(zl_port kafka)" || return 1
  zl_tls_handshake 127.0.0.1 "$(zl_port kafka-tls)" || return 1
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
  zl_tls_s3 || return 1
  local pem="$ZLINK_RUN/tls/s3/tls-combined.pem"
  # `weed mini` saves its flags to DATA/mini.options and reloads them; absolute paths only.
  # Plain HTTP on s3 (readiness, fault scripts, benchmarks' unsigned reads) and HTTPS on s3-tls
  # (every zlink client: zl_addr s3).
  zl_spawn s3 "$WEED" mini -dir="$dir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -s3.port="$(zl_port s3)" -master.port="$(zl_port weed-master)" \
    -volume.port="$(zl_port weed-volume)" -filer.port="$(zl_port weed-filer)" \
    -admin.port="$(zl_port weed-admin)" -metricsPort="$(zl_port weed-metrics)" \
    -master.port.grpc="$(zl_port weed-master-grpc)" -volume.port.grpc="$(zl_port weed-volume-grpc)" \
    -filer.port.grpc="$(zl_port weed-filer-grpc)" -admin.port.grpc="$(zl_port weed-admin-grpc)" \
    -s3.port.grpc="$(zl_port weed-s3-grpc)" \
    -s3.port.https="$(zl_port s3-tls)" -s3.cert.file="$pem" -s3.key.file="$pem" \
    -s3.config="$dir/s3.json" -bucket="$S3_BUCKET" -master.telemetry=false \
    -webdav=false -admin.ui=false -s3.port.iceberg=0 -s3.port.lance=0
}
# Ready = an unsigned GET of a missing key in the bucket answers 404 (an open port is not ready),
# over HTTP and over HTTPS with the certificate verified.
zl_ready_s3() {
  [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 \
    "http://127.0.0.1:$(zl_port s3)/$S3_BUCKET/zlink-readiness-probe")" == 404 ]] &&
    [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 --cacert "$(zl_tls_ca)" \
      "https://127.0.0.1:$(zl_port s3-tls)/$S3_BUCKET/zlink-readiness-probe")" == 404 ]]
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
