//! The continuous store ↔ S3 audit (`replicator::audit`), against the real S3 and store: S3
//! broken behind the replicator's back is found and repaired with nobody running anything.

use super::*;
use replicator::audit::AuditArgs;

/// The body S3 serves for `slug` parses to `url`.
async fn serves(infra: &Infra, n: &Names, slug: &str, url: &str) -> bool {
    let Ok(r) = client()
        .get(infra.blob_url(&n.s3_prefix, slug))
        .send()
        .await
    else {
        return false;
    };
    if r.status() != StatusCode::OK {
        return false;
    }
    let body = r.bytes().await.unwrap_or_default();
    blob::parse(&body).is_ok_and(|b| b.url == url)
}

fn count(v: &prometheus::IntCounterVec, label: &str) -> u64 {
    v.with_label_values(&[label]).get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audit_finds_and_repairs_deleted_tampered_and_orphaned_objects_by_itself() {
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    // A pass every 6 s in 3 slices; no read-back, so only the sweep can repair.
    let audit = AuditArgs {
        period_secs: 6,
        slices: 3,
        recheck_secs: 0,
        concurrency: 4,
    };
    let r = spawn_replicator_audited(&infra, &ks, &infra.kafka, |_| {}, audit).await;
    let key = create_key(&p.state, "alice", false).await;
    let url = |slug: &str| format!("https://example.com/{slug}");
    for slug in ["aud-ok", "aud-deleted", "aud-tampered"] {
        let c = create(&p.base, &key, json!({"url": url(slug), "slug": slug})).await;
        assert_eq!(c.status(), StatusCode::CREATED);
    }
    for slug in ["aud-ok", "aud-deleted", "aud-tampered"] {
        let blob = infra.blob_url(&n.s3_prefix, slug);
        assert!(wait_blob(&blob, StatusCode::OK, Duration::from_secs(10)).await);
    }
    let m = r.metrics.clone();
    let before = |k| count(&m.audit_found, k);
    let (missing0, stale0, orphan0) = (before("missing"), before("stale"), before("orphan"));

    // Behind the replicator's back, as an admin or a bug with bucket rights would.
    r.s3.delete("aud-deleted").await.unwrap();
    let evil = Blob {
        url: "https://evil.example/".into(),
        code: 302,
        version: 1,
        expires_at_ms: None,
    };
    r.s3.put("aud-tampered", &evil).await.unwrap();
    r.s3.put("aud-no-such-link", &evil).await.unwrap();
    assert!(!serves(&infra, &n, "aud-deleted", &url("aud-deleted")).await);
    assert!(serves(&infra, &n, "aud-tampered", "https://evil.example/").await);

    // Two passes at most (one may be half over when the damage is done), with room to spare.
    let repaired = eventually(Duration::from_secs(40), || async {
        serves(&infra, &n, "aud-deleted", &url("aud-deleted")).await
            && serves(&infra, &n, "aud-tampered", &url("aud-tampered")).await
            && blob_status(&infra.blob_url(&n.s3_prefix, "aud-no-such-link")).await
                == StatusCode::NOT_FOUND
            // (The counters move once each repair is journalled, just after the S3 request.)
            && [("missing", missing0), ("stale", stale0), ("orphan", orphan0)]
                .iter()
                .all(|(k, k0)| count(&m.audit_repaired, k) == k0 + 1)
    })
    .await;
    assert!(repaired, "the audit did not repair S3 within 40 s");
    assert!(serves(&infra, &n, "aud-ok", &url("aud-ok")).await);
    assert_eq!(count(&m.audit_found, "missing"), missing0 + 1);
    assert_eq!(count(&m.audit_found, "stale"), stale0 + 1);
    assert_eq!(count(&m.audit_found, "orphan"), orphan0 + 1);
    for kind in ["missing", "stale", "orphan"] {
        assert_eq!(
            count(&m.audit_repaired, kind),
            count(&m.audit_found, kind),
            "{kind}"
        );
        assert_eq!(m.audit_drift.with_label_values(&[kind]).get(), 0, "{kind}");
    }
    assert_eq!(
        m.audit_leader.get(),
        1,
        "one replicator: it holds the lease"
    );
    // The bucket's one page was listed whole; the links' pass may still be under way when
    // the repairs are done (they can fall in its first slices), so it is waited for.
    assert!(m.audit_passes.with_label_values(&["objects"]).get() >= 1);
    let passed = eventually(Duration::from_secs(20), || async {
        m.audit_passes.with_label_values(&["links"]).get() >= 1
    })
    .await;
    assert!(passed, "no whole pass over the links in 20 s of 6-s passes");
    // Each repair is named in the change journal, so a lastresort forgets what it cached.
    let journal = r.s3.list_journal(0, 1000).await.unwrap();
    let mut named = Vec::new();
    for name in journal {
        named.extend(r.s3.get_journal(&name).await.unwrap().unwrap_or_default());
    }
    for slug in ["aud-deleted", "aud-tampered", "aud-no-such-link"] {
        assert!(named.iter().any(|k| k == slug), "{slug} not in {named:?}");
    }
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_object_s3_lost_after_acknowledging_it_is_read_back_and_rewritten() {
    let Setup { infra, ks, n } = setup().await;
    let p = spawn_primary(&infra, &ks, &kafka_flags(&infra.kafka, &n), None).await;
    // No sweep: only the read-back of each write can notice.
    let audit = AuditArgs {
        period_secs: 0,
        slices: 1,
        recheck_secs: 4,
        concurrency: 4,
    };
    let r = spawn_replicator_audited(&infra, &ks, &infra.kafka, |_| {}, audit).await;
    let key = create_key(&p.state, "alice", false).await;
    let target = "https://example.com/aud-lost";
    let c = create(&p.base, &key, json!({"url": target, "slug": "aud-lost"})).await;
    assert_eq!(c.status(), StatusCode::CREATED);
    let blob = infra.blob_url(&n.s3_prefix, "aud-lost");
    assert!(wait_blob(&blob, StatusCode::OK, Duration::from_secs(10)).await);
    // S3 "loses" the write it acknowledged (the local SeaweedFS did on SIGKILL).
    r.s3.delete("aud-lost").await.unwrap();
    assert_eq!(blob_status(&blob).await, StatusCode::NOT_FOUND);
    let m = &r.metrics;
    // (The counters move once the repair is journalled and recorded, just after the PUT.)
    let back = eventually(Duration::from_secs(20), || async {
        serves(&infra, &n, "aud-lost", target).await && count(&m.audit_repaired, "missing") == 1
    })
    .await;
    assert!(back, "the read-back did not rewrite the lost object");
    assert_eq!(count(&m.audit_found, "missing"), 1);
    assert_eq!(count(&m.audit_repaired, "missing"), 1);
    assert!(count(&m.audit_checked, "recheck") >= 1);
    assert_eq!(count(&m.audit_checked, "sweep"), 0, "no sweep ran");
    assert_eq!(m.audit_leader.get(), 0, "no sweep: no lease taken");
    r.stop().await;
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicators_sweep_one_at_a_time_and_the_other_takes_over() {
    let Setup { infra, ks, n: _ } = setup().await;
    let audit = || AuditArgs {
        period_secs: 6,
        slices: 3,
        recheck_secs: 0,
        concurrency: 4,
    };
    // As deployed in k8s (the StatefulSet runs two): one lease, one sweeper.
    let a = spawn_replicator_audited(&infra, &ks, &infra.kafka, |_| {}, audit()).await;
    let b = spawn_replicator_audited(&infra, &ks, &infra.kafka, |_| {}, audit()).await;
    let (ma, mb) = (a.metrics.clone(), b.metrics.clone());
    let one = eventually(Duration::from_secs(15), || async {
        ma.audit_leader.get() + mb.audit_leader.get() == 1
            && ma.audit_slices.get() + mb.audit_slices.get() >= 2
    })
    .await;
    assert!(one, "exactly one replicator must hold the audit lease");
    let (leader, other, mo) = if ma.audit_leader.get() == 1 {
        (a, b, mb)
    } else {
        (b, a, ma)
    };
    assert_eq!(mo.audit_slices.get(), 0, "the other does not sweep");
    // The sweeper goes away (without releasing: as a crash would): the lease lapses (30 s)
    // and the other takes it, going on from the shared cursor.
    leader.stop().await;
    let took_over = eventually(Duration::from_secs(50), || async {
        mo.audit_leader.get() == 1 && mo.audit_slices.get() >= 1
    })
    .await;
    assert!(
        took_over,
        "the other replicator did not take the sweep over"
    );
    other.stop().await;
}
