//! A DNS A-record lookup over UDP against one named server (RFC 1035, no recursion of our own):
//! what the readiness probe of the local DNS server and the rung-4 drill use to see which
//! address a name points at, and with which TTL. Not a general resolver: one question, the
//! first A answer, CNAMEs skipped.

use std::io::{Error, ErrorKind, Result};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An A record: the address and its TTL in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct A {
    pub addr: Ipv4Addr,
    pub ttl: u32,
}

fn bad(what: &str) -> Error {
    Error::new(ErrorKind::InvalidData, what.to_string())
}

/// The query message for `name`'s A record with the given id (recursion desired).
pub fn query(id: u16, name: &str) -> Result<Vec<u8>> {
    let mut q = Vec::with_capacity(18 + name.len());
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        if label.is_empty() || label.len() > 63 || !label.is_ascii() {
            return Err(Error::new(ErrorKind::InvalidInput, "bad DNS name"));
        }
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    Ok(q)
}

/// Skips a (possibly compressed) name at `at`; returns the offset after it.
fn skip_name(m: &[u8], mut at: usize) -> Result<usize> {
    loop {
        let len = *m.get(at).ok_or_else(|| bad("truncated name"))? as usize;
        match len {
            0 => return Ok(at + 1),
            l if l & 0xC0 == 0xC0 => return Ok(at + 2),
            l if l < 64 => at += 1 + l,
            _ => return Err(bad("bad label")),
        }
    }
}

fn u16_at(m: &[u8], at: usize) -> Result<u16> {
    Ok(u16::from_be_bytes(
        m.get(at..at + 2)
            .ok_or_else(|| bad("truncated"))?
            .try_into()
            .expect("2 bytes"),
    ))
}

/// The first A record of a response to query `id`; `None` for NXDOMAIN or no A answer.
pub fn parse(id: u16, m: &[u8]) -> Result<Option<A>> {
    if m.len() < 12 || u16_at(m, 0)? != id || m[2] & 0x80 == 0 {
        return Err(bad("not the response to our query"));
    }
    match m[3] & 0x0F {
        0 => {}
        3 => return Ok(None),
        rcode => return Err(bad(&format!("DNS error rcode {rcode}"))),
    }
    let (questions, answers) = (u16_at(m, 4)?, u16_at(m, 6)?);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(m, at)? + 4;
    }
    for _ in 0..answers {
        at = skip_name(m, at)?;
        let (rtype, class) = (u16_at(m, at)?, u16_at(m, at + 2)?);
        let ttl = u32::from(u16_at(m, at + 4)?) << 16 | u32::from(u16_at(m, at + 6)?);
        let len = u16_at(m, at + 8)? as usize;
        at += 10;
        let data = m.get(at..at + len).ok_or_else(|| bad("truncated record"))?;
        if rtype == 1 && class == 1 && len == 4 {
            let addr = Ipv4Addr::new(data[0], data[1], data[2], data[3]);
            return Ok(Some(A { addr, ttl }));
        }
        at += len;
    }
    Ok(None)
}

/// Asks `server` for `name`'s A record, waiting at most `timeout`.
pub fn resolve_a(server: SocketAddr, name: &str, timeout: Duration) -> Result<Option<A>> {
    let id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0x5a5a, |d| d.subsec_nanos() as u16);
    let bind: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("addr")
    } else {
        "[::]:0".parse().expect("addr")
    };
    let sock = UdpSocket::bind(bind)?;
    sock.set_read_timeout(Some(timeout))?;
    sock.connect(server)?;
    sock.send(&query(id, name)?)?;
    let mut buf = [0u8; 1500];
    loop {
        let n = sock.recv(&mut buf)?;
        match parse(id, &buf[..n]) {
            // A stray datagram (an earlier query's late answer): keep waiting for ours.
            Err(e) if e.to_string() == "not the response to our query" => continue,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_is_the_rfc_1035_message() {
        let q = query(0x1234, "go.zlink.test").unwrap();
        assert_eq!(
            q,
            b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x02go\x05zlink\x04test\x00\x00\x01\x00\x01"
        );
        assert!(query(1, "a..b").is_err());
        assert!(query(1, &"x".repeat(64)).is_err());
    }

    #[test]
    fn the_first_a_answer_after_a_cname_is_read_with_its_ttl() {
        let mut m = query(7, "go.zlink.test").unwrap();
        m[2] = 0x81; // response, RD
        m[3] = 0x80; // RA, rcode 0
        m[7] = 2; // two answers
                  // CNAME via a pointer to the question's name, then an A record.
        m.extend_from_slice(b"\xc0\x0c\x00\x05\x00\x01\x00\x00\x00\x3c\x00\x02\xc0\x0c");
        m.extend_from_slice(b"\xc0\x0c\x00\x01\x00\x01\x00\x01\x00\x05\x00\x04\x7f\x00\x02\x01");
        assert_eq!(
            parse(7, &m).unwrap(),
            Some(A {
                addr: Ipv4Addr::new(127, 0, 2, 1),
                ttl: 65541
            })
        );
        assert!(parse(8, &m).is_err(), "another query's answer");
        m[3] = 0x83;
        assert_eq!(parse(7, &m).unwrap(), None, "NXDOMAIN");
        m[3] = 0x82;
        assert!(parse(7, &m).is_err(), "SERVFAIL");
        assert!(parse(7, &m[..20]).is_err());
    }

    #[test]
    fn truncated_records_are_errors_not_panics() {
        let mut m = query(9, "a.b").unwrap();
        m[2] = 0x81;
        m[7] = 1;
        m.extend_from_slice(b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04\x7f");
        assert!(parse(9, &m).is_err());
        for cut in 0..m.len() {
            let _ = parse(9, &m[..cut]);
        }
    }
}
