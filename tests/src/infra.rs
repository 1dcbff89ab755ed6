//! The shared servers of a test run (`ZLINK_TEST_*`), per-test keyspaces and Kafka topics,
//! and reading what landed in Kafka and the store.

use super::*;

/// Addresses of the shared servers.
pub struct Infra {
    pub cql: String,
    pub memcached: String,
    pub kafka: String,
    /// The same Kafka over TLS (the broker's SSL listener), its certificate issued by the CA in
    /// `s3_ca_file`: what the tests' lastresort processes replay clicks to.
    pub kafka_tls: String,
    pub s3_endpoint: String,
    /// The same S3 over HTTPS, its certificate issued by the CA in `s3_ca_file`: what every
    /// last-resort host of the tests reads (rung 3 and the lastresort processes).
    pub s3_tls_endpoint: String,
    /// The test servers' CA (S3's and Kafka's certificates).
    pub s3_ca_file: String,
    pub s3_bucket: String,
    pub s3_access_key: String,
    pub s3_secret_key: String,
}

impl Infra {
    pub fn from_env() -> Infra {
        in_process_logs();
        let get = |k: &str| {
            std::env::var(k).unwrap_or_else(|_| {
                panic!("{k} is not set: run the tests with deploy/local/test, which starts the real servers")
            })
        };
        Infra {
            cql: get("ZLINK_TEST_CQL"),
            memcached: get("ZLINK_TEST_MEMCACHED"),
            kafka: get("ZLINK_TEST_KAFKA"),
            kafka_tls: get("ZLINK_TEST_KAFKA_TLS"),
            s3_endpoint: get("ZLINK_TEST_S3_ENDPOINT"),
            s3_tls_endpoint: get("ZLINK_TEST_S3_TLS_ENDPOINT"),
            s3_ca_file: get("ZLINK_TEST_S3_CA_FILE"),
            s3_bucket: get("ZLINK_TEST_S3_BUCKET"),
            s3_access_key: get("ZLINK_TEST_S3_ACCESS_KEY"),
            s3_secret_key: get("ZLINK_TEST_S3_SECRET_KEY"),
        }
    }

    pub fn store_config(&self, keyspace: &str) -> StoreConfig {
        StoreConfig {
            cql_nodes: vec![self.cql.clone()],
            keyspace: keyspace.to_string(),
            cql_timeout_ms: 5000,
            cql_speculative_ms: 50,
            cql_keepalive_ms: 2000,
            cql_keepalive_timeout_ms: 10000,
        }
    }
}

/// A keyspace that no other test uses, with the schema applied.
pub async fn fresh_keyspace(infra: &Infra) -> String {
    let ks = format!("t_{}", uuid::Uuid::new_v4().simple());
    zlink_store::schema::migrate(&infra.store_config(&ks), 1)
        .await
        .expect("schema applied");
    ks
}

/// Per-test names: topics, consumer group and S3 prefix derived from the keyspace.
pub struct Names {
    pub links_topic: String,
    pub dlq_topic: String,
    pub group: String,
    pub s3_prefix: String,
}

pub fn names(keyspace: &str) -> Names {
    Names {
        links_topic: format!("links-{keyspace}"),
        dlq_topic: format!("dlq-{keyspace}"),
        group: format!("g-{keyspace}"),
        s3_prefix: format!("{keyspace}/"),
    }
}

/// A fresh keyspace with its own topics created: links (3 partitions), dead letters (1) and
/// clicks (3). Returns the keyspace, its names and the clicks topic.
pub async fn pipeline_keyspace(infra: &Infra) -> (String, Names, String) {
    let ks = fresh_keyspace(infra).await;
    let n = names(&ks);
    let clicks_topic = format!("clicks-{ks}");
    create_topics(
        &infra.kafka,
        &[(&n.links_topic, 3), (&n.dlq_topic, 1), (&clicks_topic, 3)],
    )
    .await;
    (ks, n, clicks_topic)
}

/// The `primary serve` flags that publish link events and clicks to those topics.
pub fn kafka_flags<'a>(infra: &'a Infra, n: &'a Names, clicks_topic: &'a str) -> [&'a str; 6] {
    [
        "--kafka",
        &infra.kafka,
        "--links-topic",
        &n.links_topic,
        "--clicks-topic",
        clicks_topic,
    ]
}

/// Creates the test's own topics on `brokers`.
pub async fn create_topics(brokers: &str, topics: &[(&str, i32)]) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    let admin: AdminClient<rdkafka::client::DefaultClientContext> =
        rdkafka::config::ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .expect("admin client");
    let new: Vec<_> = topics
        .iter()
        .map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for r in admin
        .create_topics(&new, &opts)
        .await
        .expect("create topics")
    {
        match r {
            Ok(_) | Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => panic!("creating topic {t}: {e}"),
        }
    }
}

impl Infra {
    pub fn s3_config(&self, prefix: &str) -> replicator::s3::S3Config {
        replicator::s3::S3Config {
            s3_endpoint: self.s3_endpoint.clone(),
            s3_bucket: self.s3_bucket.clone(),
            s3_prefix: prefix.to_string(),
            s3_region: "us-east-1".into(),
            s3_access_key: self.s3_access_key.clone(),
            s3_secret_key: zlink_clients::Secret(self.s3_secret_key.clone()),
            blob_cache_control: "public, max-age=300".into(),
            s3_timeout_ms: 5000,
            s3_ca_file: None,
        }
    }

    /// [`Infra::s3_config`] over HTTPS, trusting the test servers' CA.
    pub fn s3_tls_config(&self, prefix: &str) -> replicator::s3::S3Config {
        replicator::s3::S3Config {
            s3_endpoint: self.s3_tls_endpoint.clone(),
            s3_ca_file: Some(self.s3_ca_file.clone().into()),
            ..self.s3_config(prefix)
        }
    }

    /// The unsigned URL of a slug's blob (what nginx and lastresort read).
    pub fn blob_url(&self, prefix: &str, slug: &str) -> String {
        format!("{}/{}/{prefix}{slug}", self.s3_endpoint, self.s3_bucket)
    }

    pub fn env_for_services(&self, keyspace: &str, brokers: &str) -> Vec<(String, String)> {
        let n = names(keyspace);
        [
            ("ZLINK_CQL_NODES", self.cql.as_str()),
            ("ZLINK_KEYSPACE", keyspace),
            ("ZLINK_KAFKA", brokers),
            ("ZLINK_LINKS_TOPIC", &n.links_topic),
            ("ZLINK_LINKS_DLQ_TOPIC", &n.dlq_topic),
            ("ZLINK_REPLICATOR_GROUP", &n.group),
            ("ZLINK_S3_ENDPOINT", &self.s3_endpoint),
            ("ZLINK_S3_BUCKET", &self.s3_bucket),
            ("ZLINK_S3_PREFIX", &n.s3_prefix),
            ("ZLINK_S3_ACCESS_KEY", &self.s3_access_key),
            ("ZLINK_S3_SECRET_KEY", &self.s3_secret_key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }
}

/// A consumer of `topic` from its first message, in a group of its own (`<label>-<uuid>`)
/// that commits nothing: reads what is there without disturbing anyone.
pub fn topic_reader(brokers: &str, topic: &str, label: &str) -> rdkafka::consumer::StreamConsumer {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    let consumer: StreamConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{label}-{}", uuid::Uuid::new_v4()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    consumer
}

/// The click events of one `clicks` message, checked for the form the replayer sends: one
/// event per line, a message of one event keyed by its slug, a message of several unkeyed and
/// every event in the partition its slug hashes to (`partition_of`), where `partitions` is the
/// topic's partition count.
pub fn clicks_of_message(
    m: &rdkafka::message::BorrowedMessage<'_>,
    partitions: u32,
) -> Vec<ClickEvent> {
    use rdkafka::Message;
    let events: Vec<ClickEvent> = zlink_wire::events::click_lines(m.payload().unwrap_or_default())
        .map(|l| serde_json::from_slice(l).expect("a click event per line"))
        .collect();
    assert!(!events.is_empty(), "a clicks message holds a click");
    if let [one] = events.as_slice() {
        assert_eq!(
            m.key(),
            Some(one.key.as_bytes()),
            "a lone click is keyed by its slug"
        );
    } else {
        assert_eq!(m.key(), None, "a message of several clicks has no key");
    }
    for e in &events {
        assert_eq!(
            m.partition(),
            zlink_clients::clicks::partition_of(e.key.as_bytes(), partitions),
            "{} is in the partition its slug hashes to",
            e.key
        );
    }
    events
}

/// The partition count of `topic` (at most 5 s).
pub fn partition_count(brokers: &str, topic: &str) -> u32 {
    use rdkafka::consumer::Consumer;
    let c: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .unwrap();
    md.topics()[0].partitions().len() as u32
}

/// Every click in Kafka `topic` (from the beginning), until `want` ids were all seen or 60 s.
pub async fn clicks_in_kafka(
    brokers: &str,
    topic: &str,
    want: &std::collections::HashSet<uuid::Uuid>,
) -> (std::collections::HashSet<uuid::Uuid>, Vec<ClickEvent>) {
    let consumer = topic_reader(brokers, topic, "clicks-reader");
    let (mut seen, mut events) = (std::collections::HashSet::new(), Vec::new());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut partitions = None;
    while !want.is_subset(&seen) && tokio::time::Instant::now() < deadline {
        if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_secs(1), consumer.recv()).await {
            let n = *partitions.get_or_insert_with(|| partition_count(brokers, topic));
            for ev in clicks_of_message(&m, n) {
                seen.insert(ev.id);
                events.push(ev);
            }
        }
    }
    (seen, events)
}

/// Counts rows of a table in a test keyspace (to prove bad input stored nothing).
pub async fn count_rows(infra: &Infra, keyspace: &str, table: &str) -> i64 {
    let session = scylla::client::session_builder::SessionBuilder::new()
        .known_node(&infra.cql)
        .build()
        .await
        .expect("session");
    // Both names come from the test itself ([a-z0-9_]).
    let rows = session
        .query_unpaged(format!("SELECT COUNT(*) FROM {keyspace}.{table}"), &[])
        .await
        .expect("count")
        .into_rows_result()
        .expect("rows");
    rows.first_row::<(i64,)>().expect("one row").0
}

/// (partition, committed offset, high watermark) of every partition of `topic` for `group`.
pub fn group_offsets(brokers: &str, group: &str, topic: &str) -> Vec<(i32, Option<i64>, i64)> {
    let c: rdkafka::consumer::BaseConsumer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .unwrap();
    use rdkafka::consumer::Consumer;
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in md.topics()[0].partitions() {
        tpl.add_partition(topic, p.id());
    }
    let committed = c.committed_offsets(tpl, Duration::from_secs(5)).unwrap();
    committed
        .elements()
        .iter()
        .map(|e| {
            let high = c
                .fetch_watermarks(topic, e.partition(), Duration::from_secs(5))
                .map(|(_, h)| h)
                .unwrap_or(-1);
            (e.partition(), e.offset().to_raw(), high)
        })
        .collect()
}

/// True once consumer group `group` has committed the end of every partition of `topic`:
/// everything produced so far has been counted and acknowledged.
pub async fn caught_up(brokers: &str, group: &str, topic: &str, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (b, g, t) = (brokers.to_string(), group.to_string(), topic.to_string());
        let offsets = tokio::task::spawn_blocking(move || group_offsets(&b, &g, &t))
            .await
            .unwrap();
        // A partition nothing was ever written to has no committed offset.
        if offsets
            .iter()
            .all(|(_, c, h)| c.filter(|c| *c >= 0).unwrap_or(0) == *h)
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            eprintln!("group {group} not caught up on {topic}: {offsets:?}");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The logs of the services a test runs in-process (primary, replicator, lastresort), at
/// `warn` (or `ZLINK_TEST_LOG`), through libtest's capture: shown with a failing test's output,
/// so a failure says what the services saw. Installed once per test binary.
fn in_process_logs() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = std::env::var("ZLINK_TEST_LOG").unwrap_or_else(|_| "warn".into());
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_target(false)
            .with_test_writer()
            .try_init();
    });
}
