#!/usr/bin/env python3
"""Writes the four zlink Grafana dashboards (dashboards/*.json) from the panel lists below: one
source for the JSON and for the checks (deploy/grafana/check parses every query with promtool
and, against a running Prometheus, asserts each returns series).

    deploy/grafana/build.py          rewrite dashboards/*.json
    deploy/grafana/build.py --check  exit 1 if the committed JSON differs from what this writes
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}

# (title, unit, [(legend, PromQL)]). Queries over metrics that exist only after a failure end in
# `or vector(0)` so that a healthy system still draws (and the check still sees) a series.
DASHBOARDS = {
    "zlink-redirects": ("zlink — redirect health per rung", [
        ("Redirects answered per rung", "reqps", [
            ("rung 1: primary", 'sum(rate(zlink_primary_requests_total{route="redirect"}[1m])) or vector(0)'),
            ("rung 2: lastresort (failed over)", 'sum(rate(zlink_lastresort_requests_total{via="failover"}[1m])) or vector(0)'),
            ("lastresort direct (rung 4, probes)", 'sum(rate(zlink_lastresort_requests_total{via="direct"}[1m])) or vector(0)'),
            ("last-resort host nginx (rung 3 when no lastresort is up)", 'sum(rate(nginx_http_requests_total{tier="lastresort"}[1m]))'),
        ]),
        ("Ladder alerts firing", "short", [
            ("{{alertname}}", 'sum by (alertname) (ALERTS{alertname=~"ZlinkRung.*|ZlinkPrimariesDown|ZlinkLastresortDown|ZlinkCanariesNotProbed", alertstate="firing"}) or vector(0)'),
        ]),
        ("Canaries: can each rung serve its canary? (1 yes, 0 no)", "short", [
            ("rung {{rung}}: {{probe}}", 'min by (rung, probe) (probe_success{job="canary"})'),
        ]),
        ("Canary probe time", "s", [
            ("rung {{rung}}: {{probe}}", 'max by (rung, probe) (probe_duration_seconds{job="canary"})'),
        ]),
        ("S3 copy vs store: drift found, repaired, outstanding (the audit)", "short", [
            ("found {{kind}} /15m", 'sum by (kind) (increase(zlink_replicator_audit_drift_found_total[15m]))'),
            ("outstanding {{kind}}", 'sum by (kind) (zlink_replicator_audit_drift)'),
        ]),
        ("S3 audit: pass position (0..1) and checks", "short", [
            ("position", 'max(zlink_replicator_audit_position_ratio)'),
            ("checks/s {{source}}", 'sum by (source) (rate(zlink_replicator_audit_checked_total[5m]))'),
        ]),
        ("Primary redirect latency", "s", [
            ("p50", 'histogram_quantile(0.5, sum by (le) (rate(zlink_primary_redirect_duration_seconds_bucket[1m])))'),
            ("p95", 'histogram_quantile(0.95, sum by (le) (rate(zlink_primary_redirect_duration_seconds_bucket[1m])))'),
            ("p99", 'histogram_quantile(0.99, sum by (le) (rate(zlink_primary_redirect_duration_seconds_bucket[1m])))'),
        ]),
        ("5xx ratio per tier", "percentunit", [
            # 0 (not "no data") while a tier answers without 5xx.
            ("{{job}}", '(sum by (job) (rate({__name__=~"zlink_(primary|lastresort)_requests_total", status=~"5.."}[1m])) or 0 * sum by (job) (rate({__name__=~"zlink_(primary|lastresort)_requests_total"}[1m]))) / sum by (job) (rate({__name__=~"zlink_(primary|lastresort)_requests_total"}[1m]))'),
        ]),
        ("Primary lookups by layer", "reqps", [
            ("{{layer}}", 'sum by (layer) (rate(zlink_primary_cache_lookups_total[1m]))'),
        ]),
        ("Lastresort lookups by layer", "reqps", [
            ("{{layer}}", 'sum by (layer) (rate(zlink_lastresort_lookups_total[1m]))'),
        ]),
        ("Lastresort S3 read latency", "s", [
            ("p99", 'histogram_quantile(0.99, sum by (le) (rate(zlink_lastresort_s3_get_seconds_bucket[5m])))'),
        ]),
        ("Circuit breakers (0 closed, 1 open, 2 half-open)", "short", [
            ("{{component}} → {{dependency}}", 'max by (component, dependency) ({__name__=~"zlink_.+_breaker_state"})'),
        ]),
    ]),
    "zlink-pipeline": ("zlink — replication and analytics pipeline", [
        ("Create → S3 (ε = 5 s)", "s", [
            ("p50", 'histogram_quantile(0.5, sum by (le) (rate(zlink_replicator_create_to_s3_seconds_bucket[5m])))'),
            ("p99", 'histogram_quantile(0.99, sum by (le) (rate(zlink_replicator_create_to_s3_seconds_bucket[5m])))'),
        ]),
        ("Consumer lag", "short", [
            ("replicator (link events)", 'sum(zlink_replicator_consumer_lag) or vector(0)'),
            ("click counter (clicks)", 'sum(zlink_clicks_consumer_lag) or vector(0)'),
        ]),
        ("Replicator S3 failures", "ops", [
            ("{{kind}}", 'sum by (kind) (rate(zlink_replicator_s3_failures_total[5m])) or vector(0)'),
        ]),
        ("Clicks into spools and out to Kafka", "ops", [
            ("spooled {{job}}", 'sum by (job) (rate({__name__=~"zlink_(primary|lastresort)_clicks_spooled_total"}[1m]))'),
            ("replayed {{job}}", 'sum by (job) (rate({__name__=~"zlink_(primary|lastresort)_clicks_replayed_total"}[1m]))'),
            ("rung-3 clicks ingested", 'sum(rate(zlink_lastresort_nginx_clicks_ingested_total[1m]))'),
        ]),
        ("Clicks waiting in local spools", "short", [
            ("{{component}}", 'max by (component) ({__name__=~"zlink_(primary|lastresort)_spool_pending_records"})'),
        ]),
        ("Age of the oldest spooled click", "s", [
            ("{{component}}", 'max by (component) ({__name__=~"zlink_(primary|lastresort)_spool_oldest_age_seconds"})'),
        ]),
        ("Click → counted", "s", [
            ("p99", 'histogram_quantile(0.99, sum by (le) (rate(zlink_clicks_click_to_count_seconds_bucket[5m])))'),
        ]),
        ("Counter batches and clicks by outcome", "ops", [
            ("batches", 'sum(rate(zlink_clicks_batches_total[5m]))'),
            ("{{outcome}}", 'sum by (outcome) (rate(zlink_clicks_events_total[5m]))'),
        ]),
    ]),
    "zlink-writes": ("zlink — write path", [
        ("Creates by status", "reqps", [
            ("{{status}}", 'sum by (status) (rate(zlink_primary_requests_total{route="links"}[5m])) or vector(0)'),
        ]),
        ("Status changes by status", "reqps", [
            ("{{status}}", 'sum by (status) (rate(zlink_primary_requests_total{route="link"}[5m])) or vector(0)'),
        ]),
        ("Requests refused by a rate limit", "reqps", [
            ("{{limit}}", 'sum by (limit) (rate(zlink_primary_rate_limited_total[5m])) or vector(0)'),
        ]),
        ("Link events published / publish errors", "ops", [
            ("{{topic}} {{kind}}", 'sum by (topic, kind) (rate(zlink_primary_events_total[5m])) or vector(0)'),
            ("publish errors", 'sum(rate(zlink_primary_publish_errors_total[5m]))'),
        ]),
        ("Outbox: events past the fast path", "short", [
            ("rows", 'max(zlink_primary_outbox_backlog_rows) or vector(0)'),
            ("oldest (s)", 'max(zlink_primary_outbox_oldest_age_seconds) or vector(0)'),
        ]),
        ("Store failures by operation", "ops", [
            ("{{op}}", 'sum by (op) (rate(zlink_primary_store_errors_total[5m])) or vector(0)'),
        ]),
    ]),
    "zlink-infrastructure": ("zlink — infrastructure", [
        ("Scrape targets up", "short", [
            ("{{job}}", 'sum by (job) (up)'),
        ]),
        ("nginx connections", "short", [
            ("{{tier}} active", 'sum by (tier) (nginx_connections_active)'),
        ]),
        ("nginx requests", "reqps", [
            ("{{tier}}", 'sum by (tier) (rate(nginx_http_requests_total[1m]))'),
        ]),
        ("memcached errors by kind", "ops", [
            ("{{job}} {{kind}}", 'sum by (job, kind) (rate({__name__=~"zlink_(primary|lastresort)_memcached_errors_total"}[5m])) or vector(0)'),
        ]),
        ("Dependency budgets blown", "ops", [
            ("{{component}} → {{dependency}}", 'sum by (component, dependency) (rate({__name__=~"zlink_.+_dependency_timeouts_total"}[5m])) or vector(0)'),
        ]),
        ("Spool disk use", "bytes", [
            ("{{component}}", 'max by (component) ({__name__=~"zlink_(primary|lastresort)_spool_disk_bytes"})'),
        ]),
        ("Scrape duration", "s", [
            ("{{job}}", 'max by (job) (scrape_duration_seconds)'),
        ]),
    ]),
}


def dashboard(uid, title, panels):
    out = []
    for i, (ptitle, unit, targets) in enumerate(panels):
        out.append({
            "id": i + 1, "type": "timeseries", "title": ptitle, "datasource": DS,
            "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(65 + j), "datasource": DS, "expr": expr, "legendFormat": legend}
                        for j, (legend, expr) in enumerate(targets)],
        })
    return {
        "__inputs": [{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource",
                      "pluginId": "prometheus", "pluginName": "Prometheus"}],
        "uid": uid, "title": title, "tags": ["zlink"], "timezone": "utc",
        "schemaVersion": 39, "version": 1, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "DS_PROMETHEUS", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus"}]},
        "panels": out,
    }


def render():
    return {f"{uid}.json": json.dumps(dashboard(uid, title, panels), indent=2, ensure_ascii=False) + "\n"
            for uid, (title, panels) in DASHBOARDS.items()}


def main():
    d = os.path.join(HERE, "dashboards")
    os.makedirs(d, exist_ok=True)
    files = render()
    if "--check" in sys.argv:
        stale = [n for n, text in files.items()
                 if not os.path.exists(os.path.join(d, n)) or open(os.path.join(d, n), encoding="utf-8").read() != text]
        if stale:
            sys.exit(f"dashboards out of date (run deploy/grafana/build.py): {stale}")
        return
    for name, text in files.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
