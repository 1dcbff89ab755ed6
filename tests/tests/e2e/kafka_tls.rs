//! Kafka over TLS (issue 42, part 3): the last-resort hosts replay clicks across the WAN, so
//! their Kafka client speaks TLS and verifies the broker's certificate and name. Against the
//! shared broker's SSL listener (a certificate of the test servers' CA).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use reqwest::StatusCode;
use zlink_clients::kafka::KafkaTlsArgs;
use zlink_e2e::*;
use zlink_wire::blob::Blob;

/// A client context that keeps librdkafka's logs and error reasons (why a handshake failed is
/// said there, not in the metadata call's error).
#[derive(Clone, Default)]
struct Reasons(Arc<Mutex<Vec<String>>>);

impl ClientContext for Reasons {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        self.0.lock().unwrap().push(format!("{fac}: {message}"));
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.0.lock().unwrap().push(format!("{error}: {reason}"));
    }
}

impl ConsumerContext for Reasons {}

/// Brokers in the metadata of `brokers` as seen with `tls`, or the errors librdkafka gave.
fn metadata(brokers: &str, tls: &KafkaTlsArgs) -> Result<usize, Vec<String>> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers)
        .set("socket.timeout.ms", "3000")
        .set("reconnect.backoff.max.ms", "500");
    tls.apply(&mut c);
    let reasons = Reasons::default();
    let client: BaseConsumer<Reasons> = c.create_with_context(reasons.clone()).unwrap();
    match client.fetch_metadata(None, Duration::from_secs(4)) {
        Ok(md) => Ok(md.brokers().len()),
        Err(e) => {
            // Error events are delivered by polling.
            let _ = client.poll(Duration::from_millis(100));
            let mut all = reasons.0.lock().unwrap().clone();
            all.push(e.to_string());
            Err(all)
        }
    }
}

fn with_ca(path: &str) -> KafkaTlsArgs {
    KafkaTlsArgs {
        kafka_tls: false,
        kafka_ca_file: Some(path.into()),
    }
}

/// The client trusts the broker only through the CA it is given, and only under a name its
/// certificate holds; every refusal names the certificate.
#[test]
fn the_kafka_client_verifies_the_brokers_certificate_and_name() {
    let infra = Infra::from_env();
    assert!(
        metadata(&infra.kafka_tls, &with_ca(&infra.s3_ca_file)).expect("metadata over TLS") >= 1
    );

    let refused = |tls: &KafkaTlsArgs, brokers: &str, what: &str| {
        let reasons = metadata(brokers, tls).expect_err(what);
        assert!(
            reasons
                .iter()
                .any(|r| r.to_lowercase().contains("certificate")),
            "{what}: {reasons:?}"
        );
    };
    // The system's roots only.
    let system = KafkaTlsArgs {
        kafka_tls: true,
        kafka_ca_file: None,
    };
    refused(&system, &infra.kafka_tls, "system roots");
    // Another CA.
    let other = test_ca_cert().display().to_string();
    refused(&with_ca(&other), &infra.kafka_tls, "another CA");
    // The right CA, the broker reached under a name its certificate does not hold ("127.1" is
    // 127.0.0.1 to the resolver, and no name or address of the certificate).
    let port = infra.kafka_tls.rsplit(':').next().unwrap();
    refused(
        &with_ca(&infra.s3_ca_file),
        &format!("127.1:{port}"),
        "a name not in the certificate",
    );
    // Plain Kafka on the TLS listener gets nothing either.
    assert!(metadata(&infra.kafka_tls, &KafkaTlsArgs::default()).is_err());
}

/// A lastresort replays its clicks over verified TLS; with a CA that does not sign the broker's
/// certificate it still redirects (Kafka is never on the redirect path) and keeps the click in
/// its spool instead of sending it anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lastresort_replays_clicks_over_tls_and_keeps_them_from_an_unverified_broker() {
    let infra = Infra::from_env();
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let topic = format!("clicks-tls-{tag}");
    create_topics(&infra.kafka, &[(&topic, 1)]).await;
    let prefix = format!("lr-kafka-tls-{tag}/");
    let writer = replicator::s3::S3Store::new(&infra.s3_tls_config(&prefix)).expect("S3 client");
    let blob = Blob {
        url: "https://example.com/clicked-over-tls".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    writer.put("ktls", &blob).await.unwrap();

    let click = |base: String| async move {
        let r = client().get(format!("{base}/ktls")).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::FOUND);
        r.headers()["x-zlink-click-id"]
            .to_str()
            .unwrap()
            .parse::<uuid::Uuid>()
            .unwrap()
    };

    // The default test flags: --kafka is the TLS listener, --kafka-ca-file the servers' CA.
    let lr = spawn_lastresort(
        &infra,
        &infra.s3_tls_endpoint,
        &prefix,
        &["--clicks-topic", &topic],
    )
    .await;
    let mut want = HashSet::new();
    for _ in 0..5 {
        want.insert(click(lr.url("")).await);
    }
    let (seen, _) = clicks_in_kafka(&infra.kafka, &topic, &want).await;
    assert!(
        want.is_subset(&seen),
        "clicks replayed over TLS reach Kafka"
    );
    lr.stop().await;

    // Another CA: redirects go on, clicks wait in the spool.
    let other = test_ca_cert().display().to_string();
    let lr = spawn_lastresort(
        &infra,
        &infra.s3_tls_endpoint,
        &prefix,
        &[
            "--clicks-topic",
            &topic,
            "--kafka",
            &infra.kafka_tls,
            "--kafka-ca-file",
            &other,
        ],
    )
    .await;
    click(lr.url("")).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let metrics = lr.url("/metrics");
    let pending = metric(&metrics, "zlink_lastresort_spool_pending_records").await;
    assert!(pending >= 1.0, "the click waits in the spool: {pending}");
    assert_eq!(
        metric(&metrics, "zlink_lastresort_clicks_replayed_total").await,
        0.0,
        "no click is acknowledged by a broker whose certificate is not verified"
    );
    lr.stop().await;
}
