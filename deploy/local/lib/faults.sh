# shellcheck shell=bash
# Fault injection: the Toxiproxy fault proxies and `zl_fault` (kill, hang, slow, blackhole,
# cut, restart) behind `ctl fault|heal`.
# Sourced by deploy/local/lib.sh, never executed.

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
    memcached | primary-*) echo "$1" ;;
    # S3's clients speak HTTPS (its fault proxy forwards the TLS bytes as they are).
    s3) echo s3-tls ;;
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
  local conf="$ZLINK_RUN/toxiproxy.json" c i
  local fronted=(memcached s3)
  zl_cluster || fronted+=(cassandra)
  for ((i = 1; i <= PRIMARY_COUNT; i++)); do fronted+=("primary-$i"); done
  if ! zl_netns; then
    for ((i = 1; i <= LASTRESORT_COUNT; i++)); do fronted+=("lastresort-$i"); done
  fi
  {
    for c in "${fronted[@]}"; do
      echo "$c $(zl_addr "$c") 127.0.0.1:$(zl_port "$(zl_proxied_port "$c")")"
    done
    if zl_cluster; then zl_cluster_proxies; fi
  } | "$(zl_bin zlink-xtask)" topology proxies >"$conf" || return 1
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

# ---------------------------------------------------------------- faults
# zl_fault fault|heal KIND NAME — what `ctl fault|heal` and the drill do to one component:
#   kill       SIGKILL the process group (a crash) | start it and wait until ready
#   hang       SIGSTOP the process group: its sockets still accept, nothing answers | SIGCONT
#   slow       every byte from NAME waits ZLINK_FAULT_SLOW_MS (1000) and flows at
#              ZLINK_FAULT_SLOW_KBPS (64 KB/s) | normal (needs a fault proxy in front of NAME)
#   blackhole  connections to NAME are accepted and every byte both ways is swallowed | normal
#   restart    a graceful stop (SIGTERM), then a start, waiting until ready: one step of a
#              rolling restart, as an upgrade does it | nothing (it is back already)
#   delete     NAME is a link key: its S3 page deleted behind the system's back (a signed
#              DELETE straight to S3) | nothing but waiting: the replicator's S3 audit repairs
#              it from the store by itself (within a pass, 2 minutes here); the page must be
#              what it was before the fault within 3 passes
#   corrupt    the same page overwritten with bytes the replicator never writes | the same
#   deny       NAME is s3: its anonymous read grant (what the last-resort hosts' nginx reads
#              pages with) withdrawn, as a changed bucket policy would: the identity file
#              rewritten and reloaded (SIGHUP), signed access untouched | the grant back
#              (no repair can restore a permission: the rung-3 canary alert says it)
#   full       NAME is primary-N or lastresort-N (as root): its click spool moved onto a small
#              filesystem of its own (a 64 MiB tmpfs mounted over the spool directory, the
#              spool copied in) that is then filled but for 16 KiB, and NAME restarted on it:
#              redirects must go on, the clicks that do not fit are refused, counted and
#              alerted on | the filler removed (space is back: spooling resumes without a
#              restart, tests/lastresort.rs proves it), then the spool moved back to the real
#              disk by a graceful restart (any stop of NAME does that move, `ctl down` too)
# zl_start_again NAME: starts NAME while the rest of the topology serves and waits until it is
# ready; a Kafka node of the clustered topology at ZL_ENGINE_RESTART_NICE until then, for at most
# ZL_ENGINE_RESTART_YIELD_S, then at the engine nice (engines.sh).
zl_start_again() {
  local name="$1" kind pid rc=0
  kind="$(zl_kind "$name")"
  if zl_cluster && [[ "$kind" == kafka_node || "$kind" == kafka_controller ]]; then
    ZL_START_NICE="$ZL_ENGINE_RESTART_NICE" zl_start "$name" || return 1
    zl_wait_ready "$name" "$ZL_ENGINE_RESTART_YIELD_S" || rc=$?
    ((rc == 1)) && return 1
    ((rc == 2)) && zl_log "$name not ready after ${ZL_ENGINE_RESTART_YIELD_S}s at nice $ZL_ENGINE_RESTART_NICE; on at nice $ZL_ENGINE_NICE"
    pid="$(zl_pid "$name")" && zl_engine_renice "$pid" "$ZL_ENGINE_NICE"
  else
    zl_start "$name" || return 1
  fi
  zl_wait_ready "$name"
}
zl_fault() {
  local action="$1" kind="$2" name="$3" pid
  case "$action:$kind" in
    fault:kill) zl_kill "$name" ;;
    heal:kill) zl_start_again "$name" ;;
    fault:restart)
      if [[ "$name" == nginx-frontend || "$name" == nginx-lastresort ]]; then
        # nginx is reloaded, as an upgrade of its config is: new workers, old ones finish.
        pid="$(zl_pid "$name")" || zl_die "$name is not running"
        zl_render_nginx "$name" >/dev/null || zl_die "rendering $name failed"
        kill -HUP "$pid"
        zl_wait_ready "$name"
      else
        zl_stop "$name" && zl_start_again "$name"
        # Behind nginx (primaries, lastresorts) a restarted server is back in rotation only
        # once nginx's fail_timeout has passed since its last failed try, which may have come
        # just before it was ready again: until then the next step of a rolling restart would
        # take the last server of the pool with it (measured: 2 creates of 203 answered 503
        # and 44 redirects went to rung 2 when the wait counted from the stop instead).
        if [[ "$name" == primary-* || "$name" == lastresort-* ]]; then
          local ft="${ZLINK_NGINX_FAIL_TIMEOUT:-5s}" ready_ms now_ms
          if [[ "$ft" == *ms ]]; then ft="${ft%ms}"; else ft=$((${ft%s} * 1000)); fi
          ready_ms=$(date +%s%3N)
          now_ms=$ready_ms
          while ((now_ms - ready_ms <= ft + 500)); do sleep 0.2; now_ms=$(date +%s%3N); done
        fi
      fi
      ;;
    heal:restart) zl_pid "$name" >/dev/null || zl_start_again "$name" ;;
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
      local t proxy proxies=("$name")
      # A broker is reached on two listeners, each through a proxy of its own.
      zl_cluster_proxied "$name" && [[ "$name" == kafka-* ]] && proxies+=("$name-tls")
      for proxy in "${proxies[@]}"; do
        for t in "$kind-down" "$kind-up"; do zl_toxi DELETE "/proxies/$proxy/toxics/$t" 2>/dev/null || true; done
        [[ "$action" == heal ]] && continue
        if [[ "$kind" == slow ]]; then
          zl_toxi POST "/proxies/$proxy/toxics" \
            "{\"name\":\"slow-down\",\"type\":\"latency\",\"stream\":\"downstream\",\"attributes\":{\"latency\":${ZLINK_FAULT_SLOW_MS:-1000},\"jitter\":0}}"
          zl_toxi POST "/proxies/$proxy/toxics" \
            "{\"name\":\"slow-up\",\"type\":\"bandwidth\",\"stream\":\"downstream\",\"attributes\":{\"rate\":${ZLINK_FAULT_SLOW_KBPS:-64}}}"
        else
          local stream
          for stream in down up; do
            zl_toxi POST "/proxies/$proxy/toxics" \
              "{\"name\":\"blackhole-$stream\",\"type\":\"timeout\",\"stream\":\"${stream}stream\",\"attributes\":{\"timeout\":0}}"
          done
        fi
      done
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
            curl -s -o /dev/null -m 2 --cacert "$(zl_tls_ca)" "https://$(zl_addr s3)/$S3_BUCKET/zlink-readiness-probe"
        fi
      fi
      ;;
    fault:delete | fault:corrupt)
      [[ "$name" =~ ^[A-Za-z0-9_-]{1,64}$ ]] || zl_die "$kind: '$name' is not a link key of the default domain"
      local url="http://127.0.0.1:$(zl_port s3)/$S3_BUCKET/${ZLINK_S3_PREFIX:-}$name"
      # The page as it was, for the heal to compare with.
      mkdir -p "$ZLINK_RUN/faults"
      curl -sS -f -m 5 -o "$ZLINK_RUN/faults/$name.page" "$url" ||
        zl_die "$kind: no S3 page for '$name' to break"
      local signed=(curl -sS -f -m 5 -o /dev/null --aws-sigv4 "aws:amz:us-east-1:s3" --user "$S3_ACCESS_KEY:$S3_SECRET_KEY")
      if [[ "$kind" == delete ]]; then
        "${signed[@]}" -X DELETE "$url"
      else
        # curl signs a body only with its hash given (x-amz-content-sha256).
        local body='<html>not a zlink page</html>'
        "${signed[@]}" -X PUT -H 'Content-Type: text/html' \
          -H "x-amz-content-sha256: $(printf '%s' "$body" | sha256sum | cut -d' ' -f1)" \
          --data-binary "$body" "$url"
      fi
      ;;
    heal:delete | heal:corrupt)
      # No human repair: the audit must put the page back as it was.
      [[ "$name" =~ ^[A-Za-z0-9_-]{1,64}$ && -f "$ZLINK_RUN/faults/$name.page" ]] ||
        zl_die "$kind: '$name' was not broken by ctl fault"
      local url="http://127.0.0.1:$(zl_port s3)/$S3_BUCKET/${ZLINK_S3_PREFIX:-}$name"
      zl_wait_for "the S3 audit repairs $name" $((3 * ${ZLINK_AUDIT_PERIOD_SECS:-120})) \
        bash -c 'curl -sS -f -m 5 "$1" 2>/dev/null | cmp -s - "$2"' _ "$url" "$ZLINK_RUN/faults/$name.page" ||
        zl_die "$name: the S3 audit did not repair its page"
      rm -f "$ZLINK_RUN/faults/$name.page"
      ;;
    fault:deny | heal:deny)
      [[ "$name" == s3 ]] || zl_die "deny: only s3 has an anonymous read grant"
      local grant="\"Read:$S3_BUCKET\"" denied='"Read:zlink-read-denied"' want=403
      if [[ "$kind:$action" == deny:fault ]]; then
        sed -i "s/$grant/$denied/" "$ZLINK_RUN/s3/s3.json"
      else
        sed -i "s/$denied/$grant/" "$ZLINK_RUN/s3/s3.json"
        want=404
      fi
      pid="$(zl_pid s3)" || zl_die "s3 is not running"
      kill -HUP "$pid"
      # An anonymous GET of a missing key: 403 once the grant is gone, 404 with it.
      zl_wait_for "s3 anonymous reads answered $want" 30 bash -c \
        '[[ "$(curl -s -o /dev/null -w "%{http_code}" -m 2 "$1")" == "$2" ]]' _ \
        "http://127.0.0.1:$(zl_port s3)/$S3_BUCKET/zlink-readiness-probe" "$want" ||
        zl_die "s3 did not reload its identities"
      ;;
    fault:full)
      [[ "$name" == primary-* || "$name" == lastresort-* ]] || zl_die "full: only primary-N and lastresort-N keep a spool"
      [[ "$(id -u)" == 0 ]] || zl_die "full: mounting a filesystem needs root"
      local dir="$ZLINK_RUN/spool/$name" real="$ZLINK_RUN/faults/$name.spool" avail
      mountpoint -q "$dir" && zl_die "full: $name's spool is on a filesystem of its own already"
      zl_stop "$name"
      mkdir -p "$ZLINK_RUN/faults" "$dir"
      # The spool must fit the small filesystem with room to spare (a backlog bigger than that:
      # no fault, the process back as it was).
      if (($(du -sb "$dir" | cut -f1) > 48 * 1024 * 1024)); then
        zl_start "$name" && zl_wait_ready "$name"
        zl_die "full: $name's spool holds over 48 MiB; not moving it onto a 64 MiB filesystem"
      fi
      rm -rf "$real"
      mv "$dir" "$real"
      mkdir "$dir"
      mount -t tmpfs -o size=64m,mode=0755 zlink-full "$dir" || zl_die "full: mounting a tmpfs on $dir failed"
      # The real copy goes only once the small filesystem holds all of it.
      cp -a "$real/." "$dir/" || zl_die "full: copying $name's spool onto $dir failed; the original is in $real"
      rm -rf "$real"
      avail=$(($(stat -f -c '%a * %S' "$dir")))
      fallocate -l $((avail - 16384)) "$dir/$ZL_FULL_FILLER" || zl_die "full: filling $dir failed"
      zl_start "$name" && zl_wait_ready "$name"
      ;;
    heal:full)
      local dir="$ZLINK_RUN/spool/$name"
      mountpoint -q "$dir" || zl_die "full: $name's spool is not on a filesystem of its own"
      rm -f "$dir/$ZL_FULL_FILLER"
      # zl_stop moves the spool back to the real disk.
      zl_stop "$name" && zl_start "$name" && zl_wait_ready "$name"
      ;;
    *) zl_die "unknown fault '$kind' (kill hang slow blackhole cut restart delete corrupt deny full)" ;;
  esac
}

# The file `ctl fault full` fills a spool's own filesystem with.
ZL_FULL_FILLER=zlink-full-filler
# After NAME stopped: a spool `ctl fault full` left on a filesystem of its own goes back to the
# real disk, every record in it (nothing is lost by a stop, `ctl down` included).
zl_spool_unmount() {
  local name="$1" dir="$ZLINK_RUN/spool/$1" real
  [[ "$name" == primary-* || "$name" == lastresort-* ]] || return 0
  mountpoint -q "$dir" 2>/dev/null || return 0
  real="$ZLINK_RUN/faults/$name.spool"
  # A fault whose copy failed left the original here, and NAME never ran on the partial copy.
  if [[ ! -d "$real" ]]; then
    rm -rf "$real.partial"
    mkdir -p "$real.partial"
    cp -a "$dir/." "$real.partial/" || zl_die "$name: copying its spool back from $dir failed"
    rm -f "$real.partial/$ZL_FULL_FILLER"
    mv "$real.partial" "$real"
  fi
  umount "$dir" && rmdir "$dir" && mv "$real" "$dir" || zl_die "$name: moving its spool back from $dir failed"
}
