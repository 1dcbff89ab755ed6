use super::*;

#[test]
fn traceparent_round_trips_and_rejects_what_w3c_rejects() {
    let v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let t = TraceContext::parse(v).unwrap();
    assert_eq!(t.trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
    assert_eq!(t.span_id, 0x00f067aa0ba902b7);
    assert!(t.sampled);
    assert_eq!(t.header(), v);
    assert_eq!(t.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    // A later version may add fields.
    assert!(TraceContext::parse(&format!("01{}-extra", &v[2..])).is_some());
    for bad in [
        "",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
        "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "é0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ] {
        assert_eq!(TraceContext::parse(bad), None, "{bad:?}");
    }
}

#[test]
fn children_keep_the_trace_and_the_decision() {
    let p = TraceContext::continue_from(Some(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    ));
    let c = p.child();
    assert_eq!((c.trace_id, c.sampled), (p.trace_id, true));
    assert_ne!(c.span_id, p.span_id);
    // Garbage starts a new trace.
    let r = TraceContext::continue_from(Some("nonsense"));
    assert_ne!(r.trace_id, p.trace_id);
    assert!(TraceContext::parse(&r.header()).is_some());
}

#[test]
fn ratio_sampling_is_a_function_of_the_id() {
    assert!(!ratio_sampled(u128::MAX, 0.0));
    assert!(ratio_sampled(u128::MAX, 1.0));
    assert!(ratio_sampled(5, 0.01));
    assert!(!ratio_sampled(u128::from(u64::MAX - 5), 0.01));
    let n = (0..10_000u128)
        .filter(|i| {
            ratio_sampled(
                i.wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835),
                0.1,
            )
        })
        .count();
    assert!((800..1200).contains(&n), "{n}");
}

#[tokio::test]
async fn the_current_trace_follows_the_task() {
    assert_eq!(current(), None);
    let root = Span::server("redirect.handle", Some("garbage"));
    let ctx = *root.ctx();
    let inner = in_scope(ctx, async {
        Span::in_current("memcached.get").ctx().trace_id
    })
    .await;
    assert_eq!(inner, ctx.trace_id);
    let remote = Span::server(
        "redirect.handle",
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
    );
    assert_eq!(remote.ctx().trace_id, 0x4bf92f3577b34da6a3ce929d0e0e4736);
    assert_ne!(remote.ctx().span_id, 0x00f067aa0ba902b7);
}

#[test]
fn spans_without_an_exporter_record_nothing() {
    let p = TraceContext::root();
    let mut s = Span::child("redirect.handle", &p);
    s.set("slug", "abc");
    assert!(!s.is_recording());
    assert_eq!(s.ctx().trace_id, p.trace_id);
}
