# shellcheck shell=bash
# The nginx tiers (rendered from nginx/*.conf) and rung 4's DNS (dnsmasq).
# Sourced by deploy/local/lib.sh, never executed.

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
# The connection guard (a stream server in both tiers) needs Debian's stream module, a dynamic
# one there (libnginx-mod-stream, installed by deploy/local/install).
zl_nginx_modules() {
  local mod=/usr/lib/nginx/modules/ngx_stream_module.so
  if [[ -f "$mod" ]]; then echo "load_module $mod;"; fi
}
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
  local site="${name#nginx-}"
  zl_tls_ensure || return 1
  local common=("RUN=$ZLINK_RUN" "LOGS=$ZLINK_RUN/logs" "LISTEN=127.0.0.1:$(zl_port "$name")" "MODULES=$(zl_nginx_modules)"
    "TLS_LISTEN=127.0.0.1:$(zl_port "$name-tls")" "SITE_TLS_LISTEN=listen $(zl_site_addr "$site"):$(zl_port site-tls);"
    "TLS_DIR=$(zl_tls_site_dir "$site")" "HTTPS_ONLY=$(zl_https_only)" "DEFAULT_HOSTS=$(zl_default_hosts_map)"
    "HTTPS_PORTS=$(printf '        %s ":%s";\n        %s ":%s";' "$(zl_port "$name")" "$(zl_port "$name-tls")" "$(zl_port site)" "$(zl_port site-tls)")")
  case "$name" in
    nginx-frontend)
      mapfile -t overrides < <(zl_nginx_overrides FRONTEND)
      for ((i = 1; i <= PRIMARY_COUNT; i++)); do
        servers+="        server $(zl_addr "primary-$i") max_fails=1 fail_timeout=$ft;"$'\n'
      done
      # The failover hop between sites is HTTPS (the host's certificate verified against the CA).
      backups="        server 127.0.0.1:$(zl_port nginx-lastresort-tls) max_fails=1 fail_timeout=$ft;"
      "$(zl_bin zlink-xtask)" render-nginx "$ZLINK_ROOT/nginx/frontend.conf" "$out" "${common[@]}" \
        "SITE_LISTEN=listen $(zl_site_addr frontend):$(zl_port site);" "PRIMARY_SERVERS=${servers%$'\n'}" "LASTRESORT_HOST_SERVERS=$backups" \
        "RATE_LIMIT_EXEMPT=$ZLINK_LOAD_GENERATOR" "STATUS_LISTEN=127.0.0.1:$(zl_port nginx-frontend-status)" \
        "TLS_CA=$(zl_tls_ca)" "LASTRESORT_TLS_NAME=$ZLINK_DNS_NAME" \
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
        "S3_SCHEME=https" "S3_HOSTPORT=$(zl_addr s3)" "S3_CA=$(zl_tls_ca)" "S3_TLS_NAME=localhost" "S3_BUCKET=$S3_BUCKET" "S3_PREFIX=${ZLINK_S3_PREFIX:-}" \
        "STATIC=$ZLINK_ROOT/nginx/static" "CLICK_LOG=$(zl_nginx_click_log)" \
        "RATE_LIMIT_EXEMPT=$exempt" "STATUS_LISTEN=127.0.0.1:$(zl_port nginx-lastresort-status)" \
        "RUNG3_PROBE_UPSTREAM=127.0.0.1:$(zl_port nginx-lastresort)" \
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
  # The unix sockets between its connection guard and its http server: nginx removes them when it
  # stops, but a killed nginx leaves them behind, and bind() would then fail.
  rm -f "$ZLINK_RUN/$name.sock" "$ZLINK_RUN/$name-tls.sock"
  "${ns[@]}" "$(zl_nginx_bin)" -t -q -p "$ZLINK_RUN" -c "$conf" -e "$ZLINK_RUN/logs/$name.error.log" >>"$(zl_logfile "$name")" 2>&1 ||
    zl_die "$name: nginx -t failed; see $(zl_logfile "$name")"
  zl_spawn "$name" "${ns[@]}" "$(zl_nginx_bin)" -p "$ZLINK_RUN" -c "$conf" -e "$ZLINK_RUN/logs/$name.error.log" -g 'daemon off;'
}
zl_ready_nginx() { [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 2 "http://127.0.0.1:$(zl_port "$1")/nginx-health")" == 200 ]]; }
ZL_TIMEOUT_nginx=10

# ---------------------------------------------------------------- certificates
# HTTPS on both tiers (docs/design/tls.md). A local CA, made once per run dir by `zlink-xtask
# tls ca` and kept ($ZLINK_RUN/tls/ca.crt: the file the endpoints name and the tests and the
# browser trust), stands in for ACME. Each site has its own certificate directory, as separate
# hosts would: tls-combined.pem for the default domain (its names, localhost and the sites'
# addresses), <domain>/tls-combined.pem for a branded domain (`ctl tls issue DOMAIN`). nginx
# reads them at each handshake, so a new or renewed file needs no reload.
# ZLINK_HTTPS_ONLY=on: plain HTTP answers 308 to HTTPS on both tiers (off locally by default:
# the tests and the benchmarks speak both).
# The mode sticks to the run dir (`up` leaves $ZLINK_RUN/https-only), so a later `ctl fault
# restart nginx-*` renders it the same way.
[[ -z "${ZLINK_HTTPS_ONLY:-}" && -f "$ZLINK_RUN/https-only" ]] && ZLINK_HTTPS_ONLY=on
zl_https_only() { if [[ "${ZLINK_HTTPS_ONLY:-off}" == on ]]; then echo on; else echo off; fi; }
zl_tls_ca() { echo "$ZLINK_RUN/tls/ca.crt"; }
zl_tls_sites() { echo frontend lastresort; }
zl_tls_site_dir() { echo "$ZLINK_RUN/tls/sites/$1"; }
ZLINK_TLS_DAYS="${ZLINK_TLS_DAYS:-90}"
zl_tls_default_names() {
  echo ${ZLINK_SHORT_DOMAINS//,/ } localhost 127.0.0.1 "$(zl_site_addr frontend)" "$(zl_site_addr lastresort)"
}
# zl_tls_issue SITE DOMAIN|"" NAME...: a certificate from the local CA into SITE's directory;
# readable by nginx's workers (as root they run as nobody) and its owner only.
zl_tls_issue() {
  local site="$1" domain="$2" out group=()
  shift 2
  out="$(zl_tls_site_dir "$site")/${domain:+$domain/}tls-combined.pem"
  [[ "$(id -u)" == 0 ]] && group=(--group "$(id -g nobody)")
  "$(zl_bin zlink-xtask)" tls issue --ca-dir "$ZLINK_RUN/tls" --out "$out" --days "$ZLINK_TLS_DAYS" "${group[@]}" "$@"
}
# SITE's default certificate, for the default names; the names kept beside it.
zl_tls_issue_default() {
  local site="$1" names
  names="$(zl_tls_default_names)"
  # shellcheck disable=SC2086
  zl_tls_issue "$site" "" $names || return 1
  echo "$names" >"$(zl_tls_site_dir "$site")/tls-combined.names"
}
# zl_tls_server DIR NAME...: a server's certificate of the local CA for NAMEs, in
# $ZLINK_RUN/tls/DIR/tls-combined.pem; issued once (the server reads it at start).
zl_tls_server() {
  local dir="$1"; shift
  "$(zl_bin zlink-xtask)" tls ca --dir "$ZLINK_RUN/tls" || return 1
  [[ -f "$ZLINK_RUN/tls/$dir/tls-combined.pem" ]] && return 0
  "$(zl_bin zlink-xtask)" tls issue --ca-dir "$ZLINK_RUN/tls" --out "$ZLINK_RUN/tls/$dir/tls-combined.pem" \
    --days "$ZLINK_TLS_DAYS" "$@"
}
# S3's certificate (SeaweedFS): localhost for nginx, which verifies DNS names only, and
# 127.0.0.1 for the Rust clients (ZLINK_S3_ENDPOINT is an address).
zl_tls_s3() { zl_tls_server s3 localhost 127.0.0.1; }
# The brokers' certificate, one for all of them: localhost, 127.0.0.1 and every node and client
# address of the clustered mode (librdkafka checks the advertised address against it: OpenSSL
# matches IP addresses too).
zl_tls_kafka() {
  local i names=(localhost 127.0.0.1)
  for ((i = 1; i <= ZL_CLUSTER_SIZE; i++)); do names+=("127.0.0.$((1 + i))" "127.0.1.$((1 + i))"); done
  zl_tls_server kafka "${names[@]}"
}
# zl_tls_handshake HOST PORT: a TLS handshake verified against the local CA for HOST succeeds.
zl_tls_handshake() {
  python3 - "$1" "$2" "$(zl_tls_ca)" <<'PY' 2>/dev/null
import socket, ssl, sys
host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
with socket.create_connection((host, port), timeout=2) as s, ctx.wrap_socket(s, server_hostname=host):
    pass
PY
}
# The CA, and each site's default certificate where it is missing or was issued for other names
# (ZLINK_SHORT_DOMAINS changed).
zl_tls_ensure() {
  local site dir
  "$(zl_bin zlink-xtask)" tls ca --dir "$ZLINK_RUN/tls" || return 1
  for site in $(zl_tls_sites); do
    dir="$(zl_tls_site_dir "$site")"
    [[ -f "$dir/tls-combined.pem" && "$(cat "$dir/tls-combined.names" 2>/dev/null)" == "$(zl_tls_default_names)" ]] && continue
    zl_tls_issue_default "$site" || return 1
  done
  zl_tls_targets
}
# The `tls` scrape job's targets (Prometheus file service discovery, re-read on change): each
# site's HTTPS listener once per name it holds a certificate for (the short domains, and every
# branded domain with a file), labelled site and domain.
zl_tls_targets() {
  local out="$ZLINK_RUN/prometheus/tls-targets.json" site f d sep="" names
  mkdir -p "$ZLINK_RUN/prometheus"
  {
    echo "["
    for site in $(zl_tls_sites); do
      names="${ZLINK_SHORT_DOMAINS//,/ }"
      for f in "$(zl_tls_site_dir "$site")"/*/tls-combined.pem; do
        [[ -f "$f" ]] && names+=" $(basename "$(dirname "$f")")"
      done
      for d in $names; do
        printf '%s  {"targets": ["https://127.0.0.1:%s/nginx-health"], "labels": {"site": "%s", "domain": "%s"}}' \
          "$sep" "$(zl_port "nginx-$site-tls")" "$site" "${d,,}"
        sep=$',\n'
      done
    done
    printf '\n]\n'
  } >"$out.tmp" && mv "$out.tmp" "$out"
}

# A branded domain's certificate on every site (what ACME does in production), once the domain
# is a well-formed name; nginx serves it from the next handshake.
zl_tls_issue_domain() {
  local domain="${1,,}" site
  zl_is_domain "$domain" || zl_die "not a domain name: '$1'"
  zl_tls_ensure || return 1
  for site in $(zl_tls_sites); do zl_tls_issue "$site" "$domain" "$domain" || return 1; done
  zl_tls_targets
  zl_log "certificate for $domain on every site ($(zl_tls_sites))"
}
# Every certificate issued again (the same names), as a renewal: files replaced atomically.
zl_tls_renew() {
  local site dir f domain
  zl_tls_ensure || return 1
  for site in $(zl_tls_sites); do
    dir="$(zl_tls_site_dir "$site")"
    zl_tls_issue_default "$site" || return 1
    for f in "$dir"/*/tls-combined.pem; do
      [[ -f "$f" ]] || continue
      domain="$(basename "$(dirname "$f")")"
      zl_tls_issue "$site" "$domain" "$domain" || return 1
    done
  done
  zl_log "every certificate renewed on every site"
}
# A DNS name as wire::domain accepts one (lower case, dotted labels, a letter in the last).
zl_is_domain() {
  [[ ${#1} -le 253 && "$1" =~ ^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z0-9-]*[a-z-][a-z0-9-]*$ ]]
}

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
