//! Traces across the real topology: a link's creation is one trace from the API request through
//! the outbox, the Kafka message and the replicator to the S3 write; a redirect is one trace
//! from the request through the click spool to the replayed Kafka message — on primary and on
//! lastresort. Proven three ways: the `traceparent` header of the Kafka messages, the services'
//! JSON log lines (`trace_id`), and the spans they export over OTLP to a receiver this test
//! runs (decoded with the OTLP protobuf definitions).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use rdkafka::message::Message;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use zlink_clients::clock::{Clock, SystemClock};
use zlink_clients::trace;
use zlink_e2e::*;

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attrs: HashMap<String, String>,
}

/// An OTLP/HTTP receiver: `POST /v1/traces` (protobuf) → decoded spans.
struct Collector {
    endpoint: String,
    spans: Arc<Mutex<Vec<Got>>>,
}

impl Collector {
    async fn start() -> Collector {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let spans = Arc::new(Mutex::new(Vec::new()));
        let sink = spans.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let sink = sink.clone();
                let svc =
                    hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let sink = sink.clone();
                        async move {
                            let path = req.uri().path().to_string();
                            let body = req.into_body().collect().await?.to_bytes();
                            if path == "/v1/traces" {
                                let decoded =
                                    ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                                sink.lock().unwrap().extend(flatten(decoded));
                            }
                            Ok::<_, hyper::Error>(http::Response::new(Full::new(Bytes::new())))
                        }
                    });
                tokio::spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, svc)
                        .await;
                });
            }
        });
        Collector { endpoint, spans }
    }

    /// Waits (at most 30 s) until a span named `name` of trace `trace_id` arrived.
    async fn span(&self, trace_id: &str, name: &str) -> Got {
        let found = || {
            self.spans
                .lock()
                .unwrap()
                .iter()
                .find(|s| s.trace_id == trace_id && s.name == name)
                .cloned()
        };
        assert!(
            eventually(Duration::from_secs(30), || async { found().is_some() }).await,
            "span {name} of trace {trace_id}; got {:#?}",
            self.spans.lock().unwrap()
        );
        found().unwrap()
    }
}

fn flatten(req: ExportTraceServiceRequest) -> Vec<Got> {
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.clone())
    {
        Some(Any::StringValue(s)) => s,
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    let mut out = Vec::new();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == "service.name")
            .map(|kv| text(&kv.value))
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Got {
                    service: service.clone(),
                    name: s.name,
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent: hex(&s.parent_span_id),
                    attrs: s
                        .attributes
                        .iter()
                        .map(|kv| (kv.key.clone(), text(&kv.value)))
                        .collect(),
                });
            }
        }
    }
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A sampled `traceparent` with a fresh trace id; returns (header, trace id, span id).
fn traceparent() -> (String, String, String) {
    let trace = uuid::Uuid::new_v4().simple().to_string();
    let span = uuid::Uuid::new_v4().simple().to_string()[..16].to_string();
    (format!("00-{trace}-{span}-01"), trace, span)
}

/// GET `url` with a `traceparent` header.
async fn traced_get(client: &reqwest::Client, url: &str, traceparent: &str) -> reqwest::Response {
    client
        .get(url)
        .header("traceparent", traceparent)
        .send()
        .await
        .unwrap()
}

/// The `traceparent` header of the first message keyed `key` in `topic` (at most 60 s).
async fn kafka_traceparent(brokers: &str, topic: &str, key: &str) -> String {
    let consumer = topic_reader(brokers, topic, "tp-reader");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while tokio::time::Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            if m.key() != Some(key.as_bytes()) {
                continue;
            }
            return trace::kafka_traceparent(m.headers())
                .unwrap_or_else(|| panic!("message for {key} in {topic} has no traceparent"))
                .to_string();
        }
    }
    panic!("no message for {key} in {topic} within 60 s")
}

/// JSON log lines of a service's log file.
fn log_lines(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Waits (at most 20 s) for a log line of `path` matching `pred`.
async fn logged(path: &std::path::Path, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let find = || log_lines(path).into_iter().find(|l| pred(l));
    assert!(
        eventually(Duration::from_secs(20), || async { find().is_some() }).await,
        "{what} in {}:\n{}",
        path.display(),
        std::fs::read_to_string(path).unwrap_or_default()
    );
    find().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_trace_from_request_to_kafka_to_s3_and_from_redirect_to_replayed_click() {
    let infra = Infra::from_env();
    let (ks, n, clicks_topic) = pipeline_keyspace(&infra).await;
    let otlp = Collector::start().await;
    let logs = TempDir::new("trace-logs");
    let key = {
        let db = zlink_store::Db::connect(&infra.store_config(&ks))
            .await
            .unwrap();
        let keys = zlink_store::keys::Keys::prepare(Arc::new(db))
            .await
            .unwrap();
        let (key, key_id) = primary::auth::generate_key();
        keys.insert(
            &primary::auth::hash_key(&key),
            &key_id,
            "tracer",
            false,
            SystemClock.now_ms(),
        )
        .await
        .unwrap();
        key
    };
    // Only traces the caller sampled are exported (ratio 0), so every span below is ours.
    // Trusted proxy: 127.0.0.1 only, so a request from 127.0.0.2 is an untrusted client.
    let trace_flags = [
        "--otlp-endpoint",
        &otlp.endpoint,
        "--trace-sample-ratio",
        "0",
        "--log-sample-ratio",
        "0",
        "--trusted-proxies",
        "127.0.0.1",
    ];
    let mut flags: Vec<&str> = vec![
        "--links-topic",
        &n.links_topic,
        "--clicks-topic",
        &clicks_topic,
    ];
    flags.extend(trace_flags);
    let (argv, spool) = ServiceProcess::primary_argv(&infra, &ks, &infra.kafka, &flags);
    let primary_log = logs.path().join("primary.json");
    let primary = ServiceProcess::start_with("primary", &argv, Some(spool), Some(&primary_log))
        .ready()
        .await;
    let replicator_log = logs.path().join("replicator.json");
    let replicator = {
        let file = std::fs::File::create(&replicator_log).unwrap();
        tokio::process::Command::new(bin("replicator"))
            .args(["run", "--listen", "127.0.0.1:0"])
            .args([
                "--otlp-endpoint",
                &otlp.endpoint,
                "--trace-sample-ratio",
                "0",
            ])
            .envs(infra.env_for_services(&ks, &infra.kafka))
            .env("RUST_LOG", "info")
            .env("ZLINK_LOG_FORMAT", "json")
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .expect("replicator binary")
    };

    // 1. Create: API request → outbox → Kafka → replicator → S3, one trace.
    let (tp, trace, caller_span) = traceparent();
    let r = client()
        .post(primary.url("/api/v1/links"))
        .bearer_auth(&key)
        .header("traceparent", &tp)
        .json(&json!({"url": "https://example.com/traced", "slug": "traced-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let api = otlp.span(&trace, "api.request").await;
    assert_eq!(
        (api.service.as_str(), api.parent.as_str()),
        ("primary", caller_span.as_str()),
        "the API span continues the caller's"
    );
    assert_eq!(api.attrs["status_code"], "201");
    let produce = otlp.span(&trace, "kafka.produce").await;
    assert_eq!(produce.parent, api.span_id, "published under the request");
    let header = kafka_traceparent(&infra.kafka, &n.links_topic, "traced-1").await;
    assert_eq!(
        header,
        format!("00-{trace}-{}-01", produce.span_id),
        "the link event names its produce span as parent"
    );
    let apply = otlp.span(&trace, "replicate.apply").await;
    assert_eq!(
        (apply.service.as_str(), apply.parent.as_str()),
        ("replicator", produce.span_id.as_str())
    );
    let put = otlp.span(&trace, "s3.put").await;
    assert_eq!(
        (put.parent.as_str(), put.attrs["slug"].as_str()),
        (apply.span_id.as_str(), "traced-1")
    );
    let created = logged(&primary_log, "the create log line", |l| {
        l["message"] == "link created"
    })
    .await;
    assert_eq!(created["trace_id"], trace.as_str());
    let applied = logged(&replicator_log, "the replicator's log line", |l| {
        l["message"] == "link event applied" && l["slug"] == "traced-1"
    })
    .await;
    assert_eq!(applied["trace_id"], trace.as_str());

    // 2. Redirect on primary: request → spool → replayed click, one trace; the miss is logged.
    let (tp2, trace2, _) = traceparent();
    let r = traced_get(&client(), &primary.url("/traced-1"), &tp2).await;
    assert_eq!(r.status(), StatusCode::FOUND);
    // At once (within the local cache's 2 s): a local-cache hit, sampled (ratio 0: no line).
    let (tp3, trace3, _) = traceparent();
    let hit = traced_get(&client(), &primary.url("/traced-1"), &tp3).await;
    assert_eq!(hit.status(), StatusCode::FOUND);
    let handle = otlp.span(&trace2, "redirect.handle").await;
    assert_eq!(handle.attrs["cache_layer"], "store");
    assert_eq!(handle.attrs["status_code"], "302");
    let select = otlp.span(&trace2, "scylla.select").await;
    assert_eq!(select.parent, handle.span_id);
    let replay = otlp.span(&trace2, "kafka.produce").await;
    assert_eq!(
        replay.parent, handle.span_id,
        "the replayed click continues the redirect"
    );
    assert_eq!(
        otlp.span(&trace3, "redirect.handle").await.attrs["cache_layer"],
        "local"
    );
    let header = kafka_traceparent(&infra.kafka, &clicks_topic, "traced-1").await;
    assert_eq!(header, format!("00-{trace2}-{}-01", replay.span_id));
    let line = logged(&primary_log, "the redirect log line", |l| {
        l["event"] == "redirect" && l["trace_id"] == trace2.as_str()
    })
    .await;
    assert_eq!(
        (&line["slug"], &line["cache_layer"], &line["status_code"]),
        (&json!("traced-1"), &json!("store"), &json!(302))
    );
    // An unknown slug is always logged.
    let (tp4, trace4, _) = traceparent();
    let unknown = traced_get(&client(), &primary.url("/no-such-link"), &tp4).await;
    assert_eq!(unknown.status(), StatusCode::NOT_FOUND);
    logged(&primary_log, "the 404's log line", |l| {
        l["trace_id"] == trace4.as_str()
    })
    .await;
    let hit_lines: Vec<Value> = log_lines(&primary_log)
        .into_iter()
        .filter(|l| l["trace_id"] == trace3.as_str() && l["event"] == "redirect")
        .collect();
    assert!(
        hit_lines.is_empty(),
        "local hits are sampled: {hit_lines:?}"
    );

    // 3. An untrusted caller's traceparent is not continued: a new trace starts.
    let (tp5, trace5, _) = traceparent();
    let untrusted = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().ok())
        .build()
        .unwrap();
    let r = traced_get(&untrusted, &primary.url("/no-such-link-2"), &tp5).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let line = logged(&primary_log, "the untrusted request's log line", |l| {
        l["event"] == "redirect" && l["slug"] == "no-such-link-2"
    })
    .await;
    let started = line["trace_id"].as_str().unwrap();
    assert_ne!(started, trace5, "a client cannot choose its trace");
    assert_eq!(started.len(), 32);

    // 4. Lastresort: request → S3 → spool → replayed click, one trace.
    let blob = infra.blob_url(&n.s3_prefix, "traced-1");
    assert!(
        eventually(Duration::from_secs(20), || async {
            client()
                .get(&blob)
                .send()
                .await
                .is_ok_and(|r| r.status() == StatusCode::OK)
        })
        .await,
        "blob written"
    );
    let lr_log = logs.path().join("lastresort.json");
    let mut lr_extra: Vec<&str> = vec!["--clicks-topic", &clicks_topic];
    lr_extra.extend(trace_flags);
    let (lr_argv, lr_spool) = lastresort_argv(&infra, &infra.s3_endpoint, &n.s3_prefix, &lr_extra);
    let lastresort = ServiceProcess::start_with("lastresort", &lr_argv, lr_spool, Some(&lr_log))
        .ready()
        .await;
    let (tp6, trace6, caller6) = traceparent();
    let r = traced_get(&client(), &lastresort.url("/traced-1"), &tp6).await;
    assert_eq!(r.status(), StatusCode::FOUND);
    let handle = otlp.span(&trace6, "redirect.handle").await;
    assert_eq!(
        (
            handle.service.as_str(),
            handle.parent.as_str(),
            handle.attrs["cache_layer"].as_str()
        ),
        ("lastresort", caller6.as_str(), "s3")
    );
    assert_eq!(otlp.span(&trace6, "s3.get").await.parent, handle.span_id);
    let replay = otlp.span(&trace6, "kafka.produce").await;
    assert_eq!(replay.parent, handle.span_id);
    let line = logged(&lr_log, "lastresort's redirect log line", |l| {
        l["event"] == "redirect" && l["trace_id"] == trace6.as_str()
    })
    .await;
    assert_eq!(line["cache_layer"], "s3");
    // Both clicks of traced-1 (primary's and lastresort's) are in Kafka under their traces.
    let want = [trace2.as_str(), trace6.as_str()];
    assert!(
        eventually(Duration::from_secs(30), || {
            let (brokers, topic) = (infra.kafka.clone(), clicks_topic.clone());
            async move { all_click_traces(&brokers, &topic).await.len() >= 2 }
        })
        .await
    );
    let traces = all_click_traces(&infra.kafka, &clicks_topic).await;
    for t in want {
        assert!(traces.iter().any(|h| h.contains(t)), "{t} in {traces:?}");
    }
    drop(replicator);
    primary.terminate().await;
    lastresort.terminate().await;
}

/// Every click message's traceparent in `topic` so far.
async fn all_click_traces(brokers: &str, topic: &str) -> Vec<String> {
    let consumer = topic_reader(brokers, topic, "tp-all");
    let mut out = Vec::new();
    while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(3), consumer.recv()).await {
        out.extend(trace::kafka_traceparent(m.headers()).map(str::to_string));
    }
    out
}
