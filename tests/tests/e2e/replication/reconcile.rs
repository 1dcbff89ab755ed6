use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconcile_reports_and_repairs_missing_tampered_and_orphaned_objects() {
    use replicator::reconcile::{reconcile, ReconcileArgs, ReconcileStore};
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    let r = spawn_replicator(&infra, &ks, &infra.kafka).await;
    let key = create_key(&p.state, "alice", false).await;
    for slug in ["rec-ok", "rec-deleted", "rec-tampered", "rec-disabled"] {
        let c = create(
            &p.base,
            &key,
            json!({"url": format!("https://example.com/{slug}"), "slug": slug}),
        )
        .await;
        assert_eq!(c.status(), StatusCode::CREATED);
    }
    for slug in ["rec-ok", "rec-deleted", "rec-tampered", "rec-disabled"] {
        assert!(
            wait_blob(
                &infra.blob_url(&n.s3_prefix, slug),
                StatusCode::OK,
                Duration::from_secs(5)
            )
            .await
        );
    }
    let s3 = r.s3.clone();
    r.stop().await; // nothing repairs behind reconcile's back from here on
    let store = Arc::new(
        ReconcileStore::prepare(p.state.store.db.clone())
            .await
            .unwrap(),
    );
    let args = |dry_run| ReconcileArgs {
        dry_run,
        splits: 8,
        concurrency: 4,
    };
    let run = |dry_run| {
        let (store, s3) = (store.clone(), s3.clone());
        async move {
            let mut lines = Vec::new();
            let report = reconcile(
                store,
                s3,
                &args(dry_run),
                chrono::Utc::now().timestamp_millis(),
                |l| lines.push(l.to_string()),
            )
            .await
            .unwrap();
            (report, lines)
        }
    };
    let (healthy, _) = run(true).await;
    assert_eq!((healthy.links, healthy.drift()), (4, 0), "{healthy:?}");

    // Break S3 in each way: delete, tamper (admin PUT of another body), orphan (a disabled
    // link's object put back, and an object with no link at all).
    s3.delete("rec-deleted").await.unwrap();
    let evil = Blob {
        url: "https://evil.example/".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    s3.put("rec-tampered", &evil).await.unwrap();
    let gone = Blob {
        url: "https://example.com/rec-disabled".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    p.state
        .store
        .links
        .transition(
            "rec-disabled",
            zlink_wire::LinkStatus::Active,
            1,
            zlink_wire::LinkStatus::Disabled,
            None,
        )
        .await
        .unwrap();
    s3.put("rec-disabled", &gone).await.unwrap();
    s3.put("no-such-link", &gone).await.unwrap();
    // A tombstone of a live link would make lastresort answer 410 for it.
    let tomb = blob::Tombstone {
        reason: blob::GoneReason::Disabled,
        version: 1,
    };
    s3.put_tombstone("rec-ok", &tomb).await.unwrap();

    let (dry, lines) = run(true).await;
    assert_eq!(
        (dry.missing, dry.stale, dry.orphans, dry.repaired),
        (1, 1, 3, 0),
        "{dry:?} {lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("missing\trec-deleted")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("stale\trec-tampered")),
        "{lines:?}"
    );
    // An object with no link at all is reported by its full key.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("orphan\t{}no-such-link\t", n.s3_prefix))),
        "{lines:?}"
    );

    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("orphan\t{}.gone/rec-ok\t", n.s3_prefix))),
        "{lines:?}"
    );

    let (fixed, _) = run(false).await;
    assert_eq!(fixed.repaired, 5, "{fixed:?}");
    assert!(s3.get_tombstone("rec-ok").await.unwrap().is_none());
    assert_eq!(
        s3.get_tombstone("rec-disabled").await.unwrap(),
        Some(blob::Tombstone {
            reason: blob::GoneReason::Disabled,
            version: 2
        })
    );
    let (after, lines) = run(true).await;
    assert_eq!(after.drift(), 0, "{after:?} {lines:?}");
    let text = client()
        .get(infra.blob_url(&n.s3_prefix, "rec-tampered"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        blob::parse(text.as_bytes()).unwrap().url,
        "https://example.com/rec-tampered"
    );
    assert_eq!(
        blob_status(&infra.blob_url(&n.s3_prefix, "rec-disabled")).await,
        StatusCode::NOT_FOUND
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicator_sigkilled_mid_stream_loses_no_object() {
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    let key = create_key(&p.state, "alice", false).await;
    // As deployed: a stable instance id (static group membership), so the restarted process
    // takes its partitions back at once instead of waiting out the killed one's 30 s session.
    let instance = format!("replicator-{ks}");
    let spawn = || {
        let mut cmd = tokio::process::Command::new(bin("replicator"));
        cmd.arg("run")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .envs(infra.env_for_services(&ks, &infra.kafka))
            .env("ZLINK_GROUP_INSTANCE_ID", &instance);
        cmd.env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("replicator binary")
    };
    let mut child = spawn();

    let mut tasks = Vec::new();
    for i in 0..150 {
        let (base, key) = (p.base.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let r = create(
                &base,
                &key,
                json!({"url": format!("https://example.com/k/{i}")}),
            )
            .await;
            assert_eq!(r.status(), StatusCode::CREATED);
            r.json::<Value>().await.unwrap()["slug"]
                .as_str()
                .unwrap()
                .to_string()
        }));
    }
    let mut slugs = Vec::new();
    for t in tasks {
        slugs.push(t.await.unwrap());
    }
    // Mid-stream: once some objects are written and others are still to come, SIGKILL.
    let first = infra.blob_url(&n.s3_prefix, &slugs[0]);
    assert!(
        wait_blob(&first, StatusCode::OK, Duration::from_secs(20)).await,
        "replication started"
    );
    child.kill().await.expect("SIGKILL");
    let mut child = spawn();
    for slug in &slugs {
        assert!(
            wait_blob(
                &infra.blob_url(&n.s3_prefix, slug),
                StatusCode::OK,
                Duration::from_secs(30)
            )
            .await,
            "{slug} missing after the replicator restarted"
        );
    }
    // The group commits the next offset to read: exactly the end of each partition. (It once
    // committed one past it, which skips an event after every restart.)
    assert!(
        caught_up(
            &infra.kafka,
            &n.group,
            &n.links_topic,
            Duration::from_secs(30)
        )
        .await,
        "committed offsets end at the high watermark"
    );
    child.kill().await.ok();
    p.stop().await;
}
