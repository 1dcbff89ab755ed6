//! The clustered engines' wiring (deploy/local/lib/cluster.sh): a 3-node ring that holds the
//! keyspace at replication factor 3, a driver that starts with a dead contact point, and the
//! link producers' settings following a new partition leader when the leader hangs.
//!
//! They need the clustered engines, which deploy/local/test starts after the single-node run
//! (ZLINK_CLUSTER=1 on their own ports) and runs these against with `--ignored`; a plain
//! `cargo test` leaves them out. Without the cluster's variables they fail, never pass.

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;
use std::collections::BTreeSet;
use std::time::Duration;
use zlink_store::config::StoreConfig;

const NEEDS: &str = "needs the clustered engines: deploy/local/test runs it (ZLINK_CLUSTER=1)";

fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set: {NEEDS}"))
}

fn store(nodes: Vec<String>, keyspace: &str) -> StoreConfig {
    StoreConfig {
        cql_nodes: nodes,
        keyspace: keyspace.to_string(),
        cql_timeout_ms: 10_000,
        cql_speculative_ms: 50,
        cql_keepalive_ms: 2000,
        cql_keepalive_timeout_ms: 10000,
    }
}

fn cql_nodes() -> Vec<String> {
    env("ZLINK_TEST_CLUSTER_CQL")
        .split(',')
        .map(str::to_string)
        .collect()
}

fn keyspace(tag: &str) -> String {
    format!(
        "cl_{tag}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

#[tokio::test]
#[ignore = "needs the clustered engines: deploy/local/test runs it (ZLINK_CLUSTER=1)"]
async fn the_keyspace_is_replicated_on_three_nodes_that_see_each_other() {
    let nodes = cql_nodes();
    assert_eq!(nodes.len(), 3, "three contact points: {nodes:?}");
    let ks = keyspace("rf");
    zlink_store::schema::migrate(&store(nodes.clone(), &ks), 3)
        .await
        .expect("migrate at RF 3");
    // Every node, asked on its own, knows the keyspace at RF 3 and the other two nodes.
    for node in &nodes {
        let s = scylla::client::session_builder::SessionBuilder::new()
            .known_node(node)
            .build()
            .await
            .expect("connect");
        let res = s
            .query_unpaged(
                "SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?",
                (&ks,),
            )
            .await
            .expect("read keyspace")
            .into_rows_result()
            .expect("rows");
        let (repl,): (std::collections::HashMap<String, String>,) =
            res.single_row().expect("one keyspace");
        assert!(
            repl.get("class")
                .is_some_and(|c| c.ends_with("NetworkTopologyStrategy")),
            "{repl:?}"
        );
        let factors: Vec<&String> = repl
            .iter()
            .filter(|(k, _)| *k != "class")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(factors, [&"3".to_string()], "{node}: {repl:?}");
        let peers = s
            .query_unpaged("SELECT peer FROM system.peers_v2", &[])
            .await
            .expect("read peers")
            .into_rows_result()
            .expect("rows")
            .rows_num();
        assert_eq!(peers, 2, "{node} sees the other two nodes");
    }
}

#[tokio::test]
#[ignore = "needs the clustered engines: deploy/local/test runs it (ZLINK_CLUSTER=1)"]
async fn the_store_connects_and_serves_with_a_dead_contact_point_first() {
    let mut nodes = cql_nodes();
    let port = nodes[0].rsplit_once(':').expect("host:port").1.to_string();
    // Nothing listens on 127.0.0.9: a contact point whose host is gone.
    nodes.insert(0, format!("127.0.0.9:{port}"));
    let ks = keyspace("dead");
    let cfg = store(nodes[1..].to_vec(), &ks);
    zlink_store::schema::migrate(&cfg, 3)
        .await
        .expect("migrate");
    let db = zlink_store::Db::connect(&store(nodes, &ks))
        .await
        .expect("connects with one contact point dead");
    for _ in 0..20 {
        db.ping().await.expect("every statement answered");
    }
    let (known, connected) = db.nodes();
    assert_eq!(
        (known, connected),
        (3, 3),
        "the ring's nodes, learnt from the live ones"
    );
}

/// SIGCONT for a process group stopped by the test, whatever happens to the test.
struct Thaw(i32);
impl Drop for Thaw {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", "--", &format!("-{}", self.0)])
            .status();
    }
}

#[tokio::test]
#[ignore = "needs the clustered engines: deploy/local/test runs it (ZLINK_CLUSTER=1)"]
async fn a_producer_follows_the_new_leader_when_the_leader_hangs_and_nothing_doubles() {
    let brokers = env("ZLINK_TEST_CLUSTER_KAFKA");
    let run = env("ZLINK_TEST_CLUSTER_RUN");
    let topic = format!("cluster-test-{}", uuid::Uuid::new_v4().simple());
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<rdkafka::client::DefaultClientContext> =
            rdkafka::config::ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .create()
                .expect("admin client");
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(20)));
        let t =
            NewTopic::new(&topic, 1, TopicReplication::Fixed(3)).set("min.insync.replicas", "2");
        for r in admin.create_topics([&t], &opts).await.expect("create") {
            r.expect("topic created");
        }
    }
    let producer: FutureProducer = zlink_clients::kafka::producer(&brokers, "cluster-test")
        .set("message.timeout.ms", "30000")
        .create()
        .expect("producer");
    let send = |i: usize| {
        let (producer, topic) = (producer.clone(), topic.clone());
        async move {
            let payload = format!("m{i}");
            producer
                .send(
                    FutureRecord::to(&topic).key("k").payload(&payload),
                    Duration::from_secs(30),
                )
                .await
                .map(|_| ())
                .map_err(|(e, _)| e)
        }
    };
    send(0).await.expect("first message, every broker up");
    // The partition's leader, and its broker's process (pid file of kafka-<id>).
    // The reader has the services' settings: without them a metadata request that lands on the
    // hung broker waits 60 s (librdkafka's default `socket.timeout.ms`).
    let mut config = rdkafka::config::ClientConfig::new();
    config
        .set("bootstrap.servers", &brokers)
        .set("group.id", format!("{topic}-check"))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false");
    zlink_clients::kafka::reconnect_fast(&mut config);
    let consumer: BaseConsumer = config.create().expect("consumer");
    let leader = leader_other_than(&consumer, &topic, -1);
    let pid: i32 = std::fs::read_to_string(format!("{run}/pids/kafka-{leader}.pid"))
        .expect("leader's pid file")
        .trim()
        .parse()
        .expect("pid");
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", "--", &format!("-{pid}")])
        .status()
        .expect("kill -STOP");
    assert!(stopped.success());
    let thaw = Thaw(pid);
    // Sent while the leader hangs: every one acknowledged (by the new leader, once elected).
    let sends: Vec<_> = (1..=50).map(send).collect();
    for (i, r) in futures_join(sends).await.into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("message {} not acknowledged: {e}", i + 1));
    }
    // Leadership moved off the hung broker (a metadata request may itself land on the hung
    // broker and time out: asked again until an answer comes or the deadline passes).
    leader_other_than(&consumer, &topic, leader);
    drop(thaw);
    // Exactly the 51 messages, each once (idempotent producer: a retried send is not doubled).
    consumer.subscribe(&[&topic]).expect("subscribe");
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < 51 && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(500)) {
            seen.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
        }
    }
    // A little longer: a duplicate would arrive now.
    let extra = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < extra {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            seen.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).to_string());
        }
    }
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(distinct.len(), 51, "every message: {seen:?}");
    assert_eq!(seen.len(), 51, "none twice: {seen:?}");
}

/// The partition's leader once the metadata names one other than `not` (and not "none"),
/// asking for at most 30 s; panics with the last answer otherwise.
fn leader_other_than(consumer: &BaseConsumer, topic: &str, not: i32) -> i32 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::from("no answer yet");
    while std::time::Instant::now() < deadline {
        match consumer.fetch_metadata(Some(topic), Duration::from_secs(3)) {
            Ok(md) => {
                let leader = md.topics()[0].partitions()[0].leader();
                if leader > 0 && leader != not {
                    return leader;
                }
                last = format!("leader {leader}");
            }
            Err(e) => last = format!("metadata: {e}"),
        }
    }
    panic!("no partition leader other than {not} within 30 s ({last})");
}

async fn futures_join<F>(fs: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}
