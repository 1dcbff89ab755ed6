//! The blob parser on arbitrary bytes: it must never panic, and it may accept only bodies
//! that the writer produces byte for byte (so nothing crafted can smuggle a redirect past it).
#![no_main]

use libfuzzer_sys::fuzz_target;
use zlink_wire::blob;

fuzz_target!(|data: &[u8]| {
    if let Ok(b) = blob::parse(data) {
        assert_eq!(blob::render(&b).as_bytes(), data);
        assert!(zlink_wire::longurl::normalize(&b.url).as_deref() == Ok(b.url.as_str()));
    }
    // Metadata: the input's lines as the values of the five keys.
    let text = String::from_utf8_lossy(data);
    let values: Vec<&str> = text.splitn(5, '\n').collect();
    let keys = [
        blob::meta::SCHEMA,
        blob::meta::URL,
        blob::meta::CODE,
        blob::meta::VERSION,
        blob::meta::EXPIRES_MS,
    ];
    if let Ok(m) = blob::parse_metadata(|k| {
        keys.iter()
            .position(|x| *x == k)
            .and_then(|i| values.get(i).copied())
    }) {
        assert!(zlink_wire::link::is_redirect_code(m.code) && m.version >= 1);
    }
});
