//! The canary links (zlink_wire::canary) that every rung's probes follow: a primary with
//! `--canaries` creates them, the keeper's next pass finds them and writes nothing, their
//! redirects are no clicks, and no client can claim their slugs.

use super::*;
use zlink_wire::canary;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn canaries_are_kept_redirect_without_clicks_and_cannot_be_claimed() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let a = spawn_primary(&infra, &ks, &["--canaries"], None).await;
    for (n, slug, url) in canary::all() {
        let started = std::time::Instant::now();
        let r = loop {
            let r = get(&a.url(&format!("/{slug}"))).await;
            if r.status() != StatusCode::NOT_FOUND || started.elapsed() > Duration::from_secs(10) {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(r.status(), StatusCode::FOUND, "canary {n}");
        assert_eq!(location(&r), Some(url.clone()));
        let l = a
            .state
            .store
            .links
            .get_serial(&slug)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (l.owner.as_str(), l.status, l.version, l.url.as_str()),
            (
                canary::OWNER,
                zlink_wire::LinkStatus::Active,
                1,
                url.as_str()
            )
        );
    }
    assert!(
        a.events.clicks.lock().unwrap().is_empty(),
        "a canary's redirect is a probe, not a click"
    );

    // The keeper's next pass (any primary's) finds them all: nothing is written twice.
    let before = a.state.store.links.get_serial(&canary::slug(1)).await;
    let now = a.state.clock.now_ms();
    let created = primary::canary::ensure(&a.state.store, false, now).await;
    assert_eq!(created.unwrap(), 0);
    let after = a.state.store.links.get_serial(&canary::slug(1)).await;
    assert_eq!(after.unwrap(), before.unwrap());

    // Their slugs are reserved: no client can claim one, even one that does not exist yet.
    let key = create_key(&a.state, "alice", false).await;
    for slug in ["zlink-canary-1", "zlink-canary-9", "Zlink-Canary-x"] {
        let r = create(
            &a.base,
            &key,
            json!({"url": "https://example.com/", "slug": slug}),
        )
        .await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{slug}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "invalid_slug", "{slug}");
    }
    a.stop().await;
}
