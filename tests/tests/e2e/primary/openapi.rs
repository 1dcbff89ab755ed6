//! The OpenAPI document against the running router: every documented path answers with exactly
//! the documented methods (the 405 `Allow` of a method no route takes), and the link and domain
//! views it describes are the JSON the API returns.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use zlink_e2e::*;

fn properties(doc: &Value, schema: &str) -> BTreeSet<String> {
    doc["components"]["schemas"][schema]["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("{schema} in the document"))
        .keys()
        .cloned()
        .collect()
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_exactly_the_routes_and_methods_primary_serves() {
    let infra = Infra::from_env();
    let ks = fresh_keyspace(&infra).await;
    let p = spawn_primary(&infra, &ks, &[], None).await;
    let admin = create_key(&p.state, "ops", true).await;

    let r = client()
        .get(p.url("/api/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "application/json");
    let doc: Value = r.json().await.unwrap();
    assert!(
        doc["openapi"].as_str().unwrap().starts_with("3.1"),
        "{}",
        doc["openapi"]
    );

    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 15, "{:?}", paths.keys());
    for (path, ops) in paths {
        let documented: BTreeSet<String> = ops
            .as_object()
            .unwrap()
            .keys()
            .filter(|m| ["get", "post", "put", "patch", "delete"].contains(&m.as_str()))
            .map(|m| m.to_uppercase())
            .collect();
        let url = p.url(
            &path
                .replace("{slug}", "abc-1")
                .replace("{id}", "k1")
                .replace("{domain}", "go.example.com"),
        );
        // No route takes PUT: its 405 names the methods the route does take.
        let r = client().request(Method::PUT, &url).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "PUT {path}");
        let allowed: BTreeSet<String> = r.headers()["allow"]
            .to_str()
            .unwrap()
            .split(',')
            .map(|m| m.trim().to_string())
            .filter(|m| m != "HEAD")
            .collect();
        assert_eq!(allowed, documented, "{path}: served vs documented methods");
    }

    // The views are what the handlers write.
    let r = create(
        &p.base,
        &admin,
        json!({"url": "https://example.com/doc", "alias": "a"}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    assert_eq!(keys(&r.json().await.unwrap()), properties(&doc, "LinkView"));
    let r = client()
        .post(p.url("/api/v1/domains"))
        .bearer_auth(&admin)
        .json(&json!({"domain": "doc.example.com"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // `https` only where the service knows its sites (--tls-sites): every key documented,
    // every required one there.
    let got = keys(&r.json().await.unwrap());
    let required: BTreeSet<String> = doc["components"]["schemas"]["DomainView"]["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    assert!(got.is_subset(&properties(&doc, "DomainView")), "{got:?}");
    assert!(required.is_subset(&got), "{required:?} {got:?}");
    assert!(!required.contains("https"));
    // Request bodies are the handlers' own types: unknown fields are refused by both.
    let create_props = properties(&doc, "CreateRequest");
    assert!(
        create_props.contains("domain") && create_props.contains("slug"),
        "{create_props:?}"
    );
}
