//! `GET /api/v1/links/{slug}/qr`: the PNG decodes (with a QR reader) to the short URL, the SVG
//! is a plain SVG document, and only the owner or an admin gets either.

use super::*;

async fn qr(base: &str, key: &str, slug: &str, query: &str) -> reqwest::Response {
    client()
        .get(format!("{base}/api/v1/links/{slug}/qr?{query}"))
        .bearer_auth(key)
        .send()
        .await
        .expect("request")
}

/// The text a QR reader finds in a PNG.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_qr_code_reads_back_as_the_short_url_for_its_owner_only() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let alice = create_key(&p.state, "alice", false).await;
    let mallory = create_key(&p.state, "mallory", false).await;
    let admin = create_key(&p.state, "ops", true).await;
    let r = create(
        &p.base,
        &alice,
        json!({"url": "https://example.com/poster", "slug": "poster-2026"}),
    )
    .await;
    let short_url = r.json::<Value>().await.unwrap()["short_url"]
        .as_str()
        .unwrap()
        .to_string();

    for (key, size) in [(&alice, "256"), (&admin, "1000")] {
        let r = qr(
            &p.base,
            key,
            "poster-2026",
            &format!("format=png&size={size}"),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["content-type"], "image/png");
        let bytes = r.bytes().await.unwrap();
        assert_eq!(read_qr(&bytes), short_url);
    }
    let r = qr(&p.base, &alice, "poster-2026", "").await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "image/svg+xml");
    assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    let svg = r.text().await.unwrap();
    assert!(svg.starts_with("<?xml") && svg.contains("<svg"), "{svg}");
    assert!(!svg.contains("<script") && !svg.contains("href"));

    assert_eq!(
        qr(&p.base, &mallory, "poster-2026", "").await.status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        qr(&p.base, &alice, "not-there", "").await.status(),
        StatusCode::NOT_FOUND
    );
    for bad in ["format=gif", "size=9999", "size=1", "x=1"] {
        let r = qr(&p.base, &alice, "poster-2026", bad).await;
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }
    // A disabled link keeps its code (it may come back); a deleted one has none.
    set_status(&p.base, &alice, "poster-2026", "DISABLED").await;
    assert_eq!(
        qr(&p.base, &alice, "poster-2026", "").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        delete_link(&p.base, &alice, "poster-2026").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        qr(&p.base, &alice, "poster-2026", "").await.status(),
        StatusCode::GONE
    );
    p.stop().await;
}
