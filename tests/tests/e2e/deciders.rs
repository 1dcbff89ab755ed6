//! "Every rung answers identically" (SYSTEM.md invariant 7), checked over generated links:
//! each link goes down primary's path (the stored row → the cached value, through memcached's
//! JSON → the kit's decider → response) and down lastresort's (what the replicator writes to S3
//! for that row at replication time → the object read back strictly → through memcached's
//! JSON → the same decider → response), and both answers must be the same at any later time:
//! status, `Location`, `Cache-Control`, content type and body. Only `x-zlink-tier` differs.
//! Pure: no servers.

use http::HeaderValue;
use http_body_util::BodyExt;
use primary::cache::{CachedLink, Lookup};
use proptest::prelude::*;
use std::collections::HashMap;
use std::sync::Arc;
use zlink_redirect::decide::{decide_located, Answer, Located, Outcome};
use zlink_redirect::pipeline::respond;
use zlink_redirect::{Resp, Target};
use zlink_store::Link;
use zlink_wire::{blob, LinkStatus};

/// primary: row → memcached value → decision at `now`.
fn primary_answer(link: &Link, now: i64) -> Resp {
    let cached = CachedLink::from(link);
    let json = serde_json::to_vec(&cached).unwrap();
    let back: CachedLink = serde_json::from_slice(&json).unwrap();
    assert!(
        back.is_valid(),
        "primary would not trust its own value: {back:?}"
    );
    let lookup = Lookup::Found(Arc::new(Located::new(back)));
    respond(
        decide_located(lookup.view(), lookup.location(), now),
        "primary",
        &cache_control(),
    )
}

/// lastresort: what S3 holds for the row (replicated at `replicated_at`) → decision at `now`.
fn lastresort_answer(link: &Link, replicated_at: i64, now: i64) -> Resp {
    let outcome = match replicator::apply::desired_for_link(link, replicated_at) {
        replicator::apply::Desired::Tombstone(_) => Outcome::Gone,
        replicator::apply::Desired::Blob(b) => {
            let meta: HashMap<String, String> = blob::metadata(&b)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
            let body = blob::render(&b);
            let target = lastresort::lookup::target_of(&meta, body.as_bytes())
                .expect("lastresort reads what the replicator writes");
            // The body alone (metadata lost) says the same.
            assert_eq!(
                lastresort::lookup::target_of(&HashMap::new(), body.as_bytes()).as_ref(),
                Some(&target)
            );
            let json = serde_json::to_vec(&target).unwrap();
            let back: Target = serde_json::from_slice(&json).unwrap();
            assert!(back.is_valid(), "lastresort would not trust its own value");
            Outcome::found(back)
        }
    };
    respond(
        decide_located(outcome.view(), outcome.location(), now),
        "lastresort",
        &cache_control(),
    )
}

fn cache_control() -> HeaderValue {
    HeaderValue::from_static("private, max-age=90")
}

fn body(r: Resp) -> Vec<u8> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(r.into_body().collect())
        .unwrap()
        .to_bytes()
        .to_vec()
}

fn link() -> impl Strategy<Value = Link> {
    let host = "[a-z]{1,10}(\\.[a-z]{2,6}){1,2}";
    let path = "(/[A-Za-z0-9._~%-]{0,12}){0,3}(\\?[a-z]{1,5}=[A-Za-z0-9 <>\"&']{0,8})?";
    (
        prop_oneof!["https", "http"],
        host,
        path,
        prop_oneof![Just(301u16), Just(302), Just(307), Just(308)],
        prop_oneof![
            Just(LinkStatus::Active),
            Just(LinkStatus::Disabled),
            Just(LinkStatus::Expired),
            Just(LinkStatus::Deleted)
        ],
        proptest::option::of(0i64..2_000),
        1i64..1_000,
    )
        .prop_filter_map(
            "not a valid destination",
            |(scheme, host, path, code, status, exp, version)| {
                let url =
                    zlink_wire::longurl::normalize(&format!("{scheme}://{host}{path}")).ok()?;
                Some(Link {
                    key: "abc1234".into(),
                    url,
                    owner: "k".into(),
                    status,
                    redirect_code: code,
                    created_at_ms: 0,
                    expires_at_ms: exp,
                    version,
                    idem: None,
                    disabled_by: None,
                    alias: None,
                })
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn both_tiers_answer_every_link_identically(
        link in link(),
        replicated_at in 0i64..1_000,
        later in 0i64..2_000,
    ) {
        let now = replicated_at + later;
        let p = primary_answer(&link, now);
        let l = lastresort_answer(&link, replicated_at, now);
        prop_assert_eq!(p.status(), l.status(), "{:?} at {}", link, now);
        for h in [http::header::LOCATION, http::header::CACHE_CONTROL, http::header::CONTENT_TYPE] {
            prop_assert_eq!(p.headers().get(&h), l.headers().get(&h), "{} of {:?}", h, link);
        }
        prop_assert_eq!(p.headers().get("x-zlink-tier").map(|v| v.as_bytes()), p.status().is_redirection().then_some(&b"primary"[..]));
        prop_assert_eq!(l.headers().get("x-zlink-tier").map(|v| v.as_bytes()), l.status().is_redirection().then_some(&b"lastresort"[..]));
        prop_assert_eq!(p.headers().len(), l.headers().len());
        prop_assert_eq!(body(p), body(l));
    }
}
