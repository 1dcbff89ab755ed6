use super::*;

/// Invariant 9: a corpus of bad requests, each answered 4xx with a JSON error; nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_gets_4xx_json_and_stores_nothing() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let key = create_key(&p.state, "alice", false).await;
    let links = p.url("/api/v1/links");
    let c = client();
    let json_post = |body: String| {
        c.post(&links)
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body)
    };

    let mut cases: Vec<(&str, reqwest::RequestBuilder, u16)> = Vec::new();
    for url in [
        "javascript:alert(1)",
        "ftp://example.com/",
        "data:text/html,<script>alert(1)</script>",
        "//example.com",
        "example.com",
        "https://",
        "https://exa mple.com/",
        "https://example.com/\r\nSet-Cookie: x=1",
        "https://example.com/\u{0}",
        "https://example.com/\u{202E}exe.pdf",
        "https://user:pass@example.com/",
        "",
    ] {
        cases.push(("bad url", json_post(json!({"url": url}).to_string()), 422));
    }
    cases.push((
        "url too long",
        json_post(json!({"url": format!("https://e.com/{}", "a".repeat(8200))}).to_string()),
        422,
    ));
    for slug in [
        "ab",
        "has space",
        "../../etc",
        "<script>",
        "semi;colon",
        "api",
        "HEALTHZ",
        "abcDEF1",
        "é-slug",
        &"x".repeat(65),
    ] {
        cases.push((
            "bad slug",
            json_post(json!({"url": "https://e.com/", "slug": slug}).to_string()),
            422,
        ));
    }
    for exp in ["yesterday", "2001-01-01T00:00:00Z", "3000-01-01T00:00:00Z"] {
        cases.push((
            "bad expiry",
            json_post(json!({"url": "https://e.com/", "expires_at": exp}).to_string()),
            422,
        ));
    }
    cases.push((
        "bad code",
        json_post(json!({"url": "https://e.com/", "redirect_code": 200}).to_string()),
        422,
    ));
    cases.push((
        "unknown field",
        json_post(json!({"url": "https://e.com/", "owner": "root"}).to_string()),
        422,
    ));
    cases.push((
        "url not a string",
        json_post(json!({"url": 5}).to_string()),
        422,
    ));
    cases.push(("missing url", json_post("{}".into()), 422));
    cases.push(("not json", json_post("{\"url\":".into()), 400));
    cases.push((
        "binary",
        json_post(String::from_utf8_lossy(&[0xff, 0xfe, 0x00]).into_owned()),
        400,
    ));
    cases.push((
        "too large",
        json_post(format!(
            "{{\"url\":\"https://e.com/{}\"}}",
            "a".repeat(20_000)
        )),
        413,
    ));
    cases.push((
        "wrong content type",
        c.post(&links)
            .bearer_auth(&key)
            .header("content-type", "text/plain")
            .body("{}"),
        415,
    ));
    cases.push((
        "no auth",
        c.post(&links).json(&json!({"url": "https://e.com/"})),
        401,
    ));
    cases.push((
        "unknown key",
        c.post(&links)
            .bearer_auth("zl_0000_0000")
            .json(&json!({"url": "https://e.com/"})),
        401,
    ));
    cases.push((
        "not bearer",
        c.post(&links)
            .header("authorization", format!("Basic {key}"))
            .json(&json!({"url": "https://e.com/"})),
        401,
    ));
    cases.push((
        "bad idempotency key",
        c.post(&links)
            .bearer_auth(&key)
            .header("idempotency-key", "a".repeat(300))
            .json(&json!({"url": "https://e.com/"})),
        422,
    ));
    cases.push((
        "wrong method",
        c.put(&links)
            .bearer_auth(&key)
            .json(&json!({"url": "https://e.com/"})),
        405,
    ));

    for (what, req, want) in cases {
        let r = req.send().await.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.status().as_u16(), want, "{what}");
        assert_eq!(r.headers()["content-type"], "application/json", "{what}");
        let body: Value = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("{what}: body is not JSON: {e}"));
        assert!(
            body["error"]["code"].is_string() && body["error"]["message"].is_string(),
            "{what}: {body}"
        );
    }
    assert_eq!(count_rows(&infra, &ks, "links").await, 0);
    assert_eq!(count_rows(&infra, &ks, "idempotency").await, 0);
    // The process is still serving.
    assert_eq!(get(&p.url("/healthz")).await.status(), StatusCode::OK);
    p.stop().await;
}
