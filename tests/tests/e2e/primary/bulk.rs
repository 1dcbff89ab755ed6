//! `POST /api/v1/links/bulk`: 1,000 links in one request with a result per item, items that
//! fail alone, idempotent retries, the key's write limit per item, bad requests refused whole.

use super::*;

async fn bulk(base: &str, key: &str, body: &Value, idem: Option<&str>) -> reqwest::Response {
    let mut req = client()
        .post(format!("{base}/api/v1/links/bulk"))
        .bearer_auth(key)
        .json(body);
    if let Some(k) = idem {
        req = req.header("idempotency-key", k);
    }
    req.send().await.expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_thousand_links_in_one_request_each_with_its_own_result() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let alice = create_key(&p.state, "alice", false).await;
    let r = create(
        &p.base,
        &alice,
        json!({"url": "https://example.com/old", "slug": "already-here"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);

    // 1,000 items: auto slugs, custom slugs, and five that must fail alone.
    let mut items: Vec<Value> = (0..1000)
        .map(|i| match i % 4 {
            0 => {
                json!({"url": format!("https://example.com/bulk/{i}"), "slug": format!("bulk-{i}")})
            }
            _ => {
                json!({"url": format!("https://example.com/bulk/{i}?n={i}"), "redirect_code": 301})
            }
        })
        .collect();
    let failing = [
        (
            10,
            json!({"url": "javascript:alert(1)"}),
            422,
            "invalid_url",
        ),
        (
            11,
            json!({"url": "https://example.com/", "colour": "red"}),
            422,
            "invalid_request",
        ),
        (
            12,
            json!({"url": "https://example.com/", "slug": "already-here"}),
            409,
            "slug_taken",
        ),
        (
            13,
            json!({"url": "https://example.com/", "slug": "api"}),
            422,
            "invalid_slug",
        ),
        (14, json!("not an object"), 422, "invalid_request"),
    ];
    for (i, item, _, _) in &failing {
        items[*i] = item.clone();
    }
    let body = json!({ "links": items });
    let started = std::time::Instant::now();
    let r = bulk(&p.base, &alice, &body, Some("bulk-1")).await;
    let took = started.elapsed();
    assert_eq!(r.status(), StatusCode::OK);
    let out: Value = r.json().await.unwrap();
    eprintln!("bulk create of 1,000 links: {} ms", took.as_millis());
    assert_eq!(
        (
            out["created"].as_u64(),
            out["replayed"].as_u64(),
            out["failed"].as_u64()
        ),
        (Some(995), Some(0), Some(5)),
        "{}",
        out["results"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["status"] != 201)
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let results = out["results"].as_array().unwrap();
    assert_eq!(results.len(), 1000);
    let mut slugs = Vec::new();
    for (i, res) in results.iter().enumerate() {
        assert_eq!(res["index"], i);
        if let Some((_, _, status, code)) = failing.iter().find(|f| f.0 == i) {
            assert_eq!(res["status"], *status, "{res}");
            assert_eq!(res["error"]["code"], *code, "{res}");
            continue;
        }
        assert_eq!(res["status"], 201, "{res}");
        let link = &res["link"];
        let want_url = items[i]["url"].as_str().unwrap();
        assert_eq!(link["url"], want_url);
        if i % 4 == 0 {
            assert_eq!(link["slug"], format!("bulk-{i}"));
        } else {
            assert_eq!(link["redirect_code"], 301);
        }
        slugs.push((
            link["slug"].as_str().unwrap().to_string(),
            want_url.to_string(),
        ));
    }
    let distinct: HashSet<&String> = slugs.iter().map(|(s, _)| s).collect();
    assert_eq!(distinct.len(), 995);
    for (slug, url) in slugs.iter().step_by(97) {
        let r = get(&p.url(&format!("/{slug}"))).await;
        assert!(r.status().is_redirection(), "{slug}");
        assert_eq!(location(&r).as_deref(), Some(url.as_str()));
    }

    // The same request again: every link comes back as it was made, nothing new; the
    // failures fail the same way.
    let again: Value = bulk(&p.base, &alice, &body, Some("bulk-1"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            again["created"].as_u64(),
            again["replayed"].as_u64(),
            again["failed"].as_u64()
        ),
        (Some(0), Some(995), Some(5))
    );
    let again_slugs: Vec<String> = again["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["status"] == 201)
        .map(|r| r["link"]["slug"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        again_slugs,
        slugs.iter().map(|(s, _)| s.clone()).collect::<Vec<_>>()
    );

    // The key names this request only: another body under it (two items changed), or a single
    // create under it, is refused as a whole and writes nothing.
    let mut changed = items.clone();
    changed[1] = json!({"url": "https://example.com/changed"});
    changed[2] = json!({"url": "https://example.com/new", "slug": "bulk-not-made"});
    let r = bulk(
        &p.base,
        &alice,
        &json!({ "links": changed }),
        Some("bulk-1"),
    )
    .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let err: Value = r.json().await.unwrap();
    assert_eq!(err["error"]["code"], "idempotency_key_reused", "{err}");
    let r = client()
        .post(p.url("/api/v1/links"))
        .bearer_auth(&alice)
        .header("idempotency-key", "bulk-1")
        .json(&json!({"url": "https://example.com/new", "slug": "bulk-not-made"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        get(&p.url("/bulk-not-made")).await.status(),
        StatusCode::NOT_FOUND
    );
    p.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_past_the_keys_write_limit_get_429_each_and_bad_requests_are_refused_whole() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &["--limit-writes-per-key", "1/m:5"], None).await;
    let alice = create_key(&p.state, "alice", false).await;
    let items: Vec<Value> = (0..8)
        .map(|i| json!({"url": format!("https://example.com/{i}")}))
        .collect();
    let out: Value = bulk(&p.base, &alice, &json!({ "links": items }), None)
        .await
        .json()
        .await
        .unwrap();
    let statuses: Vec<u64> = out["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, [201, 201, 201, 201, 201, 429, 429, 429]);
    assert_eq!(out["results"][7]["error"]["code"], "rate_limited");
    // The bucket is empty: the next request is refused whole.
    let r = bulk(
        &p.base,
        &alice,
        &json!({"links": [{"url": "https://example.com/"}]}),
        None,
    )
    .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));

    let admin = create_key(&p.state, "ops", true).await;
    let too_many: Vec<Value> = (0..1001)
        .map(|_| json!({"url": "https://example.com/"}))
        .collect();
    for (body, status) in [
        (json!({"links": []}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!({ "links": too_many }),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
        (json!({"items": []}), StatusCode::UNPROCESSABLE_ENTITY),
        (
            json!([{"url": "https://example.com/"}]),
            StatusCode::UNPROCESSABLE_ENTITY,
        ),
    ] {
        let r = bulk(&p.base, &admin, &body, None).await;
        assert_eq!(r.status(), status, "{body}");
        let e: Value = r.json().await.unwrap();
        assert!(e["error"]["code"].is_string(), "{e}");
    }
    let r = client()
        .post(format!("{}/api/v1/links/bulk", p.base))
        .bearer_auth(&admin)
        .header("content-type", "application/json")
        .body("{\"links\": [")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = client()
        .post(format!("{}/api/v1/links/bulk", p.base))
        .json(&json!({"links": [{"url": "https://example.com/"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = client()
        .get(format!("{}/api/v1/links/bulk", p.base))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    // Nothing from the refused requests was stored: admin made no links.
    let listed: Value = get_json(&format!("{}/api/v1/links", p.base), &admin).await;
    assert_eq!(listed["links"].as_array().unwrap().len(), 0);
    p.stop().await;
}

/// Issue 40: a bulk request larger than its deadline allows is answered with what was done: 200
/// with a result per item (the late ones `503 timeout` each), never a 503 for the whole request
/// while items are written; a retry with the same Idempotency-Key (here on another primary with
/// the default deadline) replays what was done and creates the rest, each link once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bulk_past_its_deadline_answers_each_item_and_a_retry_finishes_it() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    // 300 ms for the whole request: far less than 1,000 creates take.
    let hasty = spawn_primary(&infra, &ks, &["--request-timeout-ms", "300"], None).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let alice = create_key(&p.state, "alice", false).await;
    let items: Vec<Value> = (0..1000)
        .map(|i| json!({"url": format!("https://example.com/late/{i}"), "slug": format!("late-{i}")}))
        .collect();
    let body = json!({ "links": items });

    let r = bulk(&hasty.base, &alice, &body, Some("late-bulk-1")).await;
    assert_eq!(r.status(), StatusCode::OK, "never 503 as a whole");
    let v: Value = r.json().await.unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 1000);
    let mut first = std::collections::BTreeSet::new();
    let mut timeouts = 0;
    for item in results {
        match item["status"].as_u64().unwrap() {
            201 => {
                first.insert(item["index"].as_u64().unwrap());
            }
            // Past the deadline, or a store statement over its own budget on this busy box
            // (an item that fails alone).
            503 => match item["error"]["code"].as_str() {
                Some("timeout") => timeouts += 1,
                Some("unavailable") => {}
                _ => panic!("{item}"),
            },
            other => panic!("item answered {other}: {item}"),
        }
    }
    assert!(timeouts > 0, "the deadline was reached: {}", v["created"]);
    assert_eq!(v["created"], first.len());
    for i in first.iter().take(3) {
        let r = client()
            .get(p.url(&format!("/late-{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::FOUND,
            "item {i} reported created exists"
        );
    }

    // The retry: what the first attempt did is replayed, the rest created.
    let mut done = first.clone();
    for attempt in 0..5 {
        let r = bulk(&p.base, &alice, &body, Some("late-bulk-1")).await;
        assert_eq!(r.status(), StatusCode::OK);
        let v: Value = r.json().await.unwrap();
        for item in v["results"].as_array().unwrap() {
            let i = item["index"].as_u64().unwrap();
            if item["status"] == 201 {
                if first.contains(&i) {
                    assert_eq!(item["replayed"], true, "attempt {attempt}: {item}");
                }
                done.insert(i);
            }
        }
        if done.len() == 1000 {
            break;
        }
    }
    assert_eq!(done.len(), 1000, "the retry created every item");
    for i in [0, 499, 999] {
        let r = client()
            .get(p.url(&format!("/late-{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::FOUND);
        assert_eq!(
            r.headers()["location"],
            format!("https://example.com/late/{i}").as_str()
        );
    }
    // late-99 and late-990..999: eleven links, none twice (a filtered list may spread them over
    // pages: every page is followed).
    let mut slugs = super::listing::list_all(&p.base, &alice, "limit=100&q=late-99").await;
    slugs.sort();
    let mut want: Vec<String> = std::iter::once(99)
        .chain(990..1000)
        .map(|i| format!("late-{i}"))
        .collect();
    want.sort();
    assert_eq!(slugs, want);
}
