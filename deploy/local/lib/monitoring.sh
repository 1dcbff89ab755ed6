# shellcheck shell=bash
# Prometheus, Alertmanager, the alert receiver, the nginx exporters and the canary prober.
# Sourced by deploy/local/lib.sh, never executed.

# ---------------------------------------------------------------- monitoring
# Prometheus scrapes every process on its own address (the ops network: never through a public
# nginx), both nginx tiers through prometheus-nginx-exporter (stub_status on a status-only
# listener) and evaluates deploy/prometheus/rules; Alertmanager sends every alert, firing and
# resolved, to a local webhook receiver that appends them to $ZLINK_RUN/alerts.jsonl.
# Scrape and evaluation interval: ZLINK_SCRAPE_INTERVAL (5s).
zl_alerts_file() { echo "$ZLINK_RUN/alerts.jsonl"; }
# The configuration is rendered from deploy/local/topology.tsv (every row with a scrape job is a
# target, labelled job, component and tier) by `zlink-xtask topology prometheus`, then checked.
zl_prometheus_config() {
  local dir="$ZLINK_RUN/prometheus"
  mkdir -p "$dir"
  "$(zl_bin zlink-xtask)" topology prometheus --root "$ZLINK_ROOT" --base "$ZLINK_PORT_BASE" \
    --interval "${ZLINK_SCRAPE_INTERVAL:-5s}" --tls-targets "$dir/tls-targets.json" >"$dir/prometheus.yml.tmp" || return 1
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
# zl_alerts_active_is NAME DOMAIN N: Prometheus has exactly N alerts NAME (pending or firing)
# with label domain=DOMAIN.
zl_alerts_active_is() {
  local n
  n="$(curl -sf -m 5 "http://127.0.0.1:$(zl_port prometheus)/api/v1/alerts" | python3 -c '
import json, sys
name, domain = sys.argv[1:3]
alerts = json.load(sys.stdin)["data"]["alerts"]
print(sum(1 for a in alerts if a["labels"].get("alertname") == name and a["labels"].get("domain") == domain))
' "$1" "$2")" || return 1
  [[ "$n" == "$3" ]]
}
ZL_TIMEOUT_prometheus=60
zl_start_alertmanager() {
  local dir="$ZLINK_RUN/alertmanager"
  mkdir -p "$dir"
  # One route: every alert to the local receiver, grouped by name, sent at once and resolved too.
  "$(zl_bin zlink-xtask)" topology alertmanager --root "$ZLINK_ROOT" --base "$ZLINK_PORT_BASE" \
    >"$dir/alertmanager.yml" || return 1
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
# The canary prober: Prometheus's `canary` job asks it to probe every rung
# (deploy/local/probes.tsv) with the modules `zlink-xtask topology blackbox` renders.
zl_start_blackbox() {
  local dir="$ZLINK_RUN/blackbox"
  mkdir -p "$dir"
  zl_tls_ensure || return 1
  "$(zl_bin zlink-xtask)" topology blackbox --dns-name "$ZLINK_DNS_NAME" --ca-file "$(zl_tls_ca)" >"$dir/blackbox.yml" || return 1
  prometheus-blackbox-exporter --config.check --config.file="$dir/blackbox.yml" >>"$(zl_logfile blackbox)" 2>&1 ||
    { zl_log "blackbox config invalid; see $(zl_logfile blackbox)"; return 1; }
  zl_spawn blackbox prometheus-blackbox-exporter --config.file="$dir/blackbox.yml" \
    --web.listen-address="127.0.0.1:$(zl_port blackbox)"
}
zl_ready_blackbox() { curl -sf -m 2 "http://127.0.0.1:$(zl_port blackbox)/-/healthy" >/dev/null; }
ZL_TIMEOUT_blackbox=10
# The host's filesystems (free and total bytes per mount): every disk a component writes to
# (store and broker data, S3 volumes, the nginx click log, the spools) is one of them; and the
# kernel's count of connects dropped at a full listen queue (ZlinkListenQueueOverflow).
zl_start_node_exporter() {
  zl_spawn node-exporter prometheus-node-exporter --collector.disable-defaults --collector.filesystem \
    --collector.netstat --collector.netstat.fields='^TcpExt_(ListenOverflows|ListenDrops)$' \
    --web.listen-address="127.0.0.1:$(zl_port node-exporter)"
}
zl_ready_node_exporter() { curl -sf -m 2 "http://127.0.0.1:$(zl_port node-exporter)/metrics" >/dev/null; }
ZL_TIMEOUT_node_exporter=10
