//! The HTTP API as a test client uses it, and polling until a condition holds.

use super::*;

/// `POST /api/v1/links` with `body` as `key`.
pub async fn create(base: &str, key: &str, body: serde_json::Value) -> reqwest::Response {
    client()
        .post(format!("{base}/api/v1/links"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .expect("request")
}

/// PATCHes a link's status through the API and asserts 200.
pub async fn set_status(base: &str, key: &str, slug: &str, status: &str) {
    let r = patch_status(base, key, slug, status).await;
    assert_eq!(r.status(), reqwest::StatusCode::OK, "PATCH {slug} {status}");
}

/// GET `url` with `key` as the bearer token; the answer's JSON body.
pub async fn get_json(url: &str, key: &str) -> serde_json::Value {
    client()
        .get(url)
        .bearer_auth(key)
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("a JSON body")
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(20))
        .build()
        .expect("client")
}

/// Polls `url` until a GET answers 2xx, or `within` passes.
pub async fn eventually_ok(url: &str, within: Duration) -> bool {
    let url = url.to_string();
    eventually(within, || {
        let u = url.clone();
        async move {
            client()
                .get(&u)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        }
    })
    .await
}

/// Polls `check` every 20 ms until it returns true or `within` passes.
pub async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `PATCH /api/v1/links/{slug}` with `{"status": status}` as `key`.
pub async fn patch_status(base: &str, key: &str, slug: &str, status: &str) -> reqwest::Response {
    client()
        .patch(format!("{base}/api/v1/links/{slug}"))
        .bearer_auth(key)
        .json(&serde_json::json!({ "status": status }))
        .send()
        .await
        .expect("request")
}

/// `DELETE /api/v1/links/{slug}` as `key`.
pub async fn delete_link(base: &str, key: &str, slug: &str) -> reqwest::Response {
    client()
        .delete(format!("{base}/api/v1/links/{slug}"))
        .bearer_auth(key)
        .send()
        .await
        .expect("request")
}
