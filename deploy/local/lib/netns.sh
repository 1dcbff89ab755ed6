# shellcheck shell=bash
# The network-namespace mode (ZLINK_NETNS=1): the last-resort site in its own namespace.
# Sourced by deploy/local/lib.sh, never executed.

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
  zl_port memcached-lr; zl_port nginx-lastresort; zl_port nginx-lastresort-tls; zl_port nginx-lastresort-status
}
# A gateway's routes, one "NAME LISTEN UPSTREAM" line each. gw-dc: a site port P on the host's
# 127.0.0.1:P → the site's wan address; Kafka and S3 offered on the dc's ends of the wan and s3
# links. gw-site: the mirror image; the site reaches S3 at the address it is configured with
# (zl_addr s3), over its own link.
zl_gw_routes() {
  local side="$1" p k kt s w
  k="$(zl_port kafka)" kt="$(zl_port kafka-tls)" s="$(zl_port s3-tls)" w="$(zl_netns_addr wan-site)"
  for p in $(zl_site_ports); do
    if [[ "$side" == dc ]]; then echo "site-$p 127.0.0.1:$p $w:$p"; else echo "site-$p $w:$p 127.0.0.1:$p"; fi
  done
  # On the dc's link addresses Kafka and S3 get ports of their own (gw-kafka, gw-s3): SeaweedFS
  # refuses to start while its port is bound on any address.
  local dk="$(zl_netns_addr wan-dc):$(zl_port gw-kafka)" ds="$(zl_netns_addr s3-dc):$(zl_port gw-s3)"
  local dkt="$(zl_netns_addr wan-dc):$(zl_port gw-kafka-tls)"
  if [[ "$side" == dc ]]; then
    echo "kafka $dk 127.0.0.1:$k"
    echo "kafka-tls $dkt 127.0.0.1:$kt"
    echo "s3 $ds 127.0.0.1:$s"
  else
    echo "kafka 127.0.0.1:$k $dk"
    echo "kafka-tls 127.0.0.1:$kt $dkt"
    echo "s3 $(zl_addr s3) $ds"
  fi
}
zl_start_gw() {
  local side="$1" ns=()
  zl_netns_up
  zl_gw_routes "$side" | "$(zl_bin zlink-xtask)" topology proxies >"$ZLINK_RUN/gw-$side.json" || return 1
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
