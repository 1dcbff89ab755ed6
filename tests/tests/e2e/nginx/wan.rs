//! The failover hop between sites (frontend → last-resort host, HTTPS): its connect budget
//! holds a TLS handshake across a WAN round trip, and when no rung answers the client gets the
//! JSON 503, never nginx's own error page.

use super::*;
use zlink_e2e::faults::{Fault, OwnToxiproxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hop_between_sites_waits_out_a_wan_handshake_and_no_rung_left_is_a_json_503() {
    let infra = Infra::from_env();
    // A last-resort host whose lastresort processes are all down: it answers from S3 itself,
    // here 404 (nothing under the prefix). Any answer of its own shows the hop got through.
    let click_dir = TempDir::new("wan-clicklog");
    let click_log = click_dir.path().join("clicks.json").display().to_string();
    let host = OwnNginx::start(
        "lastresort.conf",
        &lastresort_host_values(dead_server(), &infra, "no-such-prefix/", &click_log),
    )
    .await;
    // The WAN between the sites: everything the host sends arrives 150 ms late, so connecting
    // (TCP, then the TLS handshake, which nginx's connect timeout covers) takes over 150 ms.
    let toxi = OwnToxiproxy::start().await;
    let wan = toxi.proxy("wan", &host.tls_hostport()).await;
    toxi.inject("wan", Fault::Slow(Duration::from_millis(150)))
        .await;
    let fe = OwnNginx::start(
        "frontend.conf",
        &[
            ("PRIMARY_SERVERS", dead_server()),
            (
                "LASTRESORT_HOST_SERVERS",
                upstream_servers(&[wan], "max_fails=1 fail_timeout=5s"),
            ),
        ],
    )
    .await;
    // (With the connect budget of a LAN hop, 100 ms, each of these was nginx's HTML 504:
    // "upstream timed out while SSL handshaking".)
    for i in 0..3 {
        let r = get(&fe.url(&format!("/wan-{i}")), "Mozilla/5.0 wan").await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "the host's own answer");
    }
    let log = fe.access_log("nginx-frontend.access.json", 3).await;
    assert!(
        log.iter().all(|l| l["status"] == "404"
            && l["failed_over"] == "true"
            && l["upstream_status"].as_str().unwrap().ends_with(": 404")),
        "{log:?}"
    );

    // No rung left (the host refuses connections too): the JSON 503 with Retry-After.
    let down = OwnNginx::start(
        "frontend.conf",
        &[
            ("PRIMARY_SERVERS", dead_server()),
            ("LASTRESORT_HOST_SERVERS", dead_server()),
        ],
    )
    .await;
    for path in ["/wan-0", "/wan-1"] {
        let r = get(&down.url(path), "Mozilla/5.0 wan").await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()["content-type"], "application/json");
        assert_eq!(r.headers()["retry-after"], "5");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unavailable", "{body}");
    }
}
