# shellcheck shell=bash
# The clustered engines (ZLINK_CLUSTER=1): a 3-node Cassandra ring and a 3-broker KRaft Kafka
# with its own 3-node controller quorum, instead of one node of each, as production runs them.
# Sourced by deploy/local/lib.sh, never executed.
#
# Node N (cassandra-N, kafka-N, kafka-controller-N) listens on its own loopback address
# 127.0.0.(N+1) with the ports the single node uses (as Cassandra's own ccm does), so the
# driver's and librdkafka's view of the cluster (peers, advertised listeners) is the addresses
# they connect to. Keyspaces are
# created at replication factor 3 (every read and write at LOCAL_QUORUM, LWTs at LOCAL_SERIAL:
# any one node may be lost); every topic, the internal ones included, at replication factor 3
# with min.insync.replicas=2 and no unclean leader election (any one broker may be lost).
# Every client gets the full contact-point and bootstrap lists.
#
# The clients' way to a node goes through a fault proxy of its own (Toxiproxy, as every other
# slowed or blackholed hop): node N also has a client address 127.0.1.(N+1), where its proxy
# (named cassandra-N, kafka-N) listens and forwards to the node; the node advertises that
# address to clients (Cassandra's broadcast_rpc_address, the brokers' client listener), so
# the driver and librdkafka, which learn the cluster's members from the cluster, reach every
# member through its proxy. The nodes' own traffic (gossip, replication, the controllers)
# stays direct. So a node's faults are kill and hang (SIGSTOP) of the process, and slow and
# blackhole of the node as its clients see it (a gray failure: the cluster finds it healthy);
# `restart` (a graceful stop, then a start, as an upgrade does) is the rolling-restart step.
# ZLINK_FAULT_PROXIES=0: clients connect to the nodes' own addresses.
# Not with ZLINK_NETNS=1 (the last-resort site reaches Kafka through one gateway port).
#
# Cost on this 2-core box: `up` from an empty run dir took 84-93 s (the ring's nodes join one
# after another: 47-53 s; the schema at replication factor 3: 20-23 s) and the nine JVMs hold
# about 6 GiB (1 GiB heap per Cassandra node, 512 MiB per broker, 256 MiB per controller).
# `up` records the mode in the run dir, so later `ctl` calls need not repeat it.

[[ -z "${ZLINK_CLUSTER:-}" && -f "$ZLINK_RUN/cluster" ]] && ZLINK_CLUSTER=1
zl_cluster() { [[ "${ZLINK_CLUSTER:-0}" == 1 ]]; }
ZL_CLUSTER_SIZE=3

# The address of node N of either engine (cassandra-N, kafka-controller-N, kafka-N).
zl_node_addr() { echo "127.0.0.$((1 + ${1##*-}))"; }
# Where clients reach a store node or a broker: its fault proxy's address, or the node's own.
zl_node_client_addr() {
  if zl_fault_proxies; then echo "127.0.1.$((1 + ${1##*-}))"; else zl_node_addr "$1"; fi
}
zl_store_nodes() { local i; for ((i = 1; i <= ZL_CLUSTER_SIZE; i++)); do echo "cassandra-$i"; done; }
zl_brokers() { local i; for ((i = 1; i <= ZL_CLUSTER_SIZE; i++)); do echo "kafka-$i"; done; }
# The engines' components in start order: the ring's nodes, the controllers, the brokers (or
# the single nodes).
zl_engines() {
  if zl_cluster; then zl_store_nodes; zl_kafka_controllers; zl_brokers; else echo cassandra kafka; fi
}
# zl_node_endpoints ADDR_FN PORT NAME...: ADDR:PORT of each node, comma-separated, ADDR the
# node's own (zl_node_addr) or its clients' (zl_node_client_addr).
zl_node_endpoints() {
  local addr_fn="$1" port n out=""
  port="$(zl_port "$2")"; shift 2
  for n in "$@"; do out+="$("$addr_fn" "$n"):$port,"; done
  echo "${out%,}"
}
# What the clients are given: every contact point, every bootstrap broker (comma-separated).
zl_cql_nodes() {
  if zl_cluster; then zl_node_endpoints zl_node_client_addr cql $(zl_store_nodes); else zl_addr cassandra; fi
}
zl_kafka_bootstrap() {
  if zl_cluster; then zl_node_endpoints zl_node_client_addr kafka $(zl_brokers); else echo "127.0.0.1:$(zl_port kafka)"; fi
}
# The same over TLS (the brokers' SSL listeners): the lastresorts' click replay.
zl_kafka_tls_bootstrap() {
  if zl_cluster; then zl_node_endpoints zl_node_client_addr kafka-tls $(zl_brokers); else echo "127.0.0.1:$(zl_port kafka-tls)"; fi
}
# A ring node or a broker (those with a fault proxy in cluster mode).
zl_cluster_proxied() { zl_cluster && [[ "$1" =~ ^(cassandra|kafka)-[0-9]+$ ]]; }
# The fault proxies of the ring's nodes and the brokers, as zl_start_toxiproxy's route lines.
zl_cluster_proxies() {
  local n port
  for n in $(zl_store_nodes) $(zl_brokers); do
    port=cql; [[ "$n" == kafka-* ]] && port=kafka
    echo "$n $(zl_node_client_addr "$n"):$(zl_port "$port") $(zl_node_addr "$n"):$(zl_port "$port")"
    # A broker's SSL listener has a proxy of its own (kafka-N-tls), faulted with kafka-N.
    if [[ "$n" == kafka-* ]]; then
      echo "$n-tls $(zl_node_client_addr "$n"):$(zl_port kafka-tls) $(zl_node_addr "$n"):$(zl_port kafka-tls)"
    fi
  done
}
# The keyspace's replication factor.
zl_replication_factor() { if zl_cluster; then echo "$ZL_CLUSTER_SIZE"; else echo 1; fi; }

# ---------------------------------------------------------------- the Cassandra ring
# One token per node, evenly spaced over Murmur3's range, and no bootstrap streaming: the ring
# is new and empty (ccm does the same). A node that replaces a lost one joins with
# -Dcassandra.replace_address_first_boot instead (docs/runbook.md, "Replacing a store node").
zl_ring_token() {
  case "${1##*-}" in
    1) echo -9223372036854775808 ;;
    2) echo -3074457345618258603 ;;
    3) echo 3074457345618258602 ;;
    *) zl_die "zl_ring_token: no token for $1" ;;
  esac
}
zl_start_cassandra_node() {
  local name="$1"
  ZLINK_CASSANDRA_HEAP="${ZLINK_CASSANDRA_HEAP:-1g}" zl_spawn_cassandra "$name" "$ZLINK_RUN/$name" \
    "$(zl_node_addr "$name")" "$(zl_node_addr cassandra-1):$(zl_port cassandra-storage)" true \
    "initial_token: $(zl_ring_token "$name")
auto_bootstrap: false
dynamic_snitch: ${ZLINK_DYNAMIC_SNITCH:-false}
broadcast_rpc_address: $(zl_node_client_addr "$name")"
}
# Ready = it serves CQL on its own address (a node opens CQL only once it has joined the ring).
zl_ready_cassandra_node() { zl_probe cql "$(zl_node_addr "$1")" "$(zl_port cql)"; }
ZL_TIMEOUT_cassandra_node=300

# ---------------------------------------------------------------- the Kafka cluster
# Three brokers (kafka-N, node ids 1-3, the data) and, as production KRaft runs them, a quorum of
# three dedicated controllers (kafka-controller-N, node ids 101-103, on the same addresses, on
# the controller port: the metadata, who leads what). With combined nodes a hung broker was
# also, one time in three, the active controller: the others had to notice (1 s), elect a new
# one (a split vote cost 1.4 s more) and give every broker a fresh session before fencing the
# hung one — it was fenced 4.7 s after it stopped and links created meanwhile reached S3 5.3 s
# after their create (ε is 5 s). Dedicated controllers keep a broker's hang a broker's problem.
#
# Failure detection sized for ε: a broker that stops heartbeating (killed or hung) is fenced
# after 2 s, which moves its partitions' leadership to an in-sync replica and takes it out of
# every ISR (Kafka's default, 9 s, alone kept new links out of S3 past ε). A follower that
# falls 5 s behind leaves the ISR. A controller that hangs is replaced by an election after 1 s
# without its fetches (controller.quorum.fetch.timeout.ms, default 2 s); produces and fetches
# never wait for a controller.
zl_kafka_controllers() { local i; for ((i = 1; i <= ZL_CLUSTER_SIZE; i++)); do echo "kafka-controller-$i"; done; }
zl_kafka_cluster_props() {
  cat <<EOF
offsets.topic.replication.factor=$ZL_CLUSTER_SIZE
transaction.state.log.replication.factor=$ZL_CLUSTER_SIZE
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=$ZL_CLUSTER_SIZE
share.coordinator.state.topic.min.isr=2
default.replication.factor=$ZL_CLUSTER_SIZE
min.insync.replicas=2
unclean.leader.election.enable=false
broker.heartbeat.interval.ms=400
broker.session.timeout.ms=2000
replica.lag.time.max.ms=5000
controller.quorum.fetch.timeout.ms=1000
controller.quorum.election.timeout.ms=500
EOF
}
# A controller's node id: 100 + N (brokers are 1..N).
zl_kafka_controller_id() { echo "$((100 + ${1##*-}))"; }
zl_kafka_voters() {
  local n out=""
  for n in $(zl_kafka_controllers); do
    out+="$(zl_kafka_controller_id "$n")@$(zl_node_endpoints zl_node_addr kafka-controller "$n"),"
  done
  echo "${out%,}"
}
zl_start_kafka_node() {
  local name="$1"
  zl_spawn_kafka "$name" "$ZLINK_RUN/$name" broker "${name##*-}" "$(zl_node_addr "$name")" \
    "$(zl_kafka_voters)" "$(zl_kafka_cluster_props)" "$(zl_node_client_addr "$name")"
}
zl_ready_kafka_node() {
  zl_probe kafka "$(zl_node_addr "$1")" "$(zl_port kafka)" && zl_tls_handshake "$(zl_node_addr "$1")" "$(zl_port kafka-tls)"
}
# As a store node's: a broker restarted while the ring is under load starts on whatever CPU
# the other JVMs leave it (130 s seen under the drill's 50 req/s with C2; see zl_spawn_kafka).
ZL_TIMEOUT_kafka_node=300
zl_start_kafka_controller() {
  local name="$1"
  zl_spawn_kafka "$name" "$ZLINK_RUN/$name" controller "$(zl_kafka_controller_id "$name")" "$(zl_node_addr "$name")" \
    "$(zl_kafka_voters)" "$(zl_kafka_cluster_props)"
}
# Ready = its controller port accepts connections (the quorum itself shows in the brokers').
zl_ready_kafka_controller() { (exec 3<>"/dev/tcp/$(zl_node_addr "$1")/$(zl_port kafka-controller)") 2>/dev/null; }
ZL_TIMEOUT_kafka_controller=60
# The topics at replication factor 3, min.insync.replicas=2 (once every broker is up).
zl_cluster_topics() {
  [[ -f "$ZLINK_RUN/kafka-1/topics.ok" ]] && return 0
  zl_kafka_topics kafka-1 "$(zl_kafka_bootstrap)" "$ZL_CLUSTER_SIZE" --config min.insync.replicas=2 &&
    touch "$ZLINK_RUN/kafka-1/topics.ok"
}

# Starts the engines and waits until they serve: the single nodes, or the ring one node at a
# time (a node joins only once the one before it is up) with the brokers alongside, then the
# topics.
zl_up_engines() {
  if ! zl_cluster; then
    zl_up cassandra kafka
    return
  fi
  zl_netns && zl_die "ZLINK_CLUSTER=1 does not combine with ZLINK_NETNS=1"
  local n b
  for b in $(zl_kafka_controllers) $(zl_brokers); do zl_start "$b"; done
  for n in $(zl_store_nodes); do zl_up "$n" || return 1; done
  for b in $(zl_kafka_controllers) $(zl_brokers); do zl_wait_ready "$b" || return 1; done
  zl_wait_for "the Kafka topics at replication factor $ZL_CLUSTER_SIZE" 60 zl_cluster_topics ||
    zl_die "creating the topics failed; see $(zl_logfile kafka-1)"
}
