# shellcheck shell=bash
# zlink's own processes: primaries, the replicator, the click counter, lastresorts.
# Sourced by deploy/local/lib.sh, never executed.

# ---------------------------------------------------------------- primary
# ZLINK_BIN_DIR: where the binaries are, if not this build (bench-ab starts an older build);
# else ZL_SERVE_BINS from the `serve` profile's build when ZLINK_PROFILE=serve (zl_build).
zl_bin() {
  if [[ -z "${ZLINK_BIN_DIR:-}" && "$ZLINK_PROFILE" == serve && " ${ZL_SERVE_BINS[*]} " == *" $1 "* ]]; then
    echo "$CARGO_TARGET_DIR/serve/$1"
  else
    echo "${ZLINK_BIN_DIR:-$CARGO_TARGET_DIR/release}/$1"
  fi
}
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
    # The sites whose certificates the domain API shows (each site's HTTPS listener; in the
    # network-namespace mode the gateway forwards the last-resort site's port), and the CA.
    export ZLINK_TLS_SITES="frontend=127.0.0.1:$(zl_port nginx-frontend-tls),lastresort=127.0.0.1:$(zl_port nginx-lastresort-tls)"
    export ZLINK_TLS_CA_FILE="$(zl_tls_ca)"
    zl_worker_threads
    zl_spawn "$name" "$(zl_bin primary)" serve \
      --listen "127.0.0.1:$(zl_port "$name")" --instance "$name" --spool-dir "$ZLINK_RUN/spool/$name" --canaries \
      --public-base-url "$(zl_public_base_url)" --local-deployment
  )
}
# The base of every short URL the primaries hand out: the frontend (not a primary's own
# address, which would die with it and never fail over); ZLINK_PUBLIC_BASE_URL overrides.
# The same links also answer under the rung-4 name, http://$ZLINK_DNS_NAME:<site port>/.
zl_public_base_url() { echo "${ZLINK_PUBLIC_BASE_URL:-http://127.0.0.1:$(zl_port nginx-frontend)}"; }
zl_ready_primary() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port "$1")/readyz")" == 200 ]]; }
ZL_TIMEOUT_primary=60

# ---------------------------------------------------------------- replicator
zl_s3_env() {
  # HTTPS, verified against the local CA (the certificate from zl_tls_s3).
  export ZLINK_S3_ENDPOINT="https://$(zl_addr s3)"
  export ZLINK_S3_CA_FILE="$(zl_tls_ca)"
  export ZLINK_S3_BUCKET="$S3_BUCKET"
  export ZLINK_S3_ACCESS_KEY="$S3_ACCESS_KEY"
  export ZLINK_S3_SECRET_KEY="$S3_SECRET_KEY"
}
# `replicator reconcile [--dry-run]` against this topology: the repair of S3 from the store.
zl_reconcile() { (zl_primary_env && zl_s3_env && exec "$(zl_bin replicator)" reconcile "$@"); }
zl_start_replicator() {
  (
    zl_primary_env
    zl_s3_env
    export RUST_LOG="${RUST_LOG:-info}"
    # Static group membership (one instance here): it takes its partitions back at once after
    # a restart of its own or of Kafka, so ε holds (ARCHITECTURE.md, "Budgets").
    # The S3 audit: a whole pass every 2 minutes here (a few thousand links: ~30 reads a
    # second), so a page broken behind the system's back is repaired within minutes;
    # production keeps the default day (docs/design/canaries.md).
    zl_spawn replicator "$(zl_bin replicator)" run --listen "127.0.0.1:$(zl_port replicator)" \
      --group-instance-id replicator \
      --audit-period-secs "${ZLINK_AUDIT_PERIOD_SECS:-120}" --audit-slices "${ZLINK_AUDIT_SLICES:-32}"
  )
}
zl_ready_replicator() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port replicator)/readyz")" == 200 ]]; }
ZL_TIMEOUT_replicator=60

# ---------------------------------------------------------------- clicks (the click counter)
zl_start_clicks() {
  (
    zl_primary_env
    export RUST_LOG="${RUST_LOG:-info}"
    zl_spawn clicks "$(zl_bin counter)" run --listen "127.0.0.1:$(zl_port clicks)" \
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
    # Click replay crosses the WAN: TLS to the brokers, verified against the local CA.
    ZLINK_KAFKA_CA_FILE="$(zl_tls_ca)"
    export ZLINK_IP_HASH_SALT ZLINK_KAFKA_CA_FILE ZLINK_SHORT_DOMAINS RUST_LOG="${RUST_LOG:-info}"
    zl_worker_threads
    zl_spawn "$name" $(zl_site_exec) "$(zl_bin lastresort)" --listen "127.0.0.1:$(zl_port "$name")" --instance "$name" \
      --memcached "127.0.0.1:$(zl_port memcached-lr)" --kafka "$(zl_kafka_tls_bootstrap)" \
      --spool-dir "$ZLINK_RUN/spool/$name" --nginx-click-log "$(zl_nginx_click_log)"
  )
}
zl_ready_lastresort() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port "$1")/readyz")" == 200 ]]; }
ZL_TIMEOUT_lastresort=30
