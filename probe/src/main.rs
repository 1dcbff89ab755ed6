//! `zlink-probe cql|kafka|memcached HOST PORT`, `zlink-probe http HOST PORT PATH` or
//! `zlink-probe dns HOST PORT NAME [ADDR]`: exits 0 when the server answered its own protocol
//! correctly (an open port is not ready; for http, a 200 to `GET PATH`; for dns, an A record
//! for NAME, equal to ADDR if given, printed as `ADDR TTL`). No dependencies: `deploy/local/test` builds it in seconds, before the
//! servers it probes have started, and the container images use it as their health check.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

fn read_exact(s: &mut TcpStream, n: usize) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0; n];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

/// CQL native protocol v4 OPTIONS; a ready node answers SUPPORTED (opcode 0x06).
fn cql(s: &mut TcpStream) -> std::io::Result<bool> {
    s.write_all(&[0x04, 0, 0, 0, 0x05, 0, 0, 0, 0])?;
    let h = read_exact(s, 9)?;
    let len = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) as usize;
    if len > 1 << 20 {
        return Ok(false);
    }
    read_exact(s, len)?;
    Ok(h[0] == 0x84 && h[4] == 0x06)
}

/// Kafka ApiVersions v0 (api key 18); a ready broker answers with error code 0.
fn kafka(s: &mut TcpStream) -> std::io::Result<bool> {
    let client = b"zlink-probe";
    let mut body = Vec::new();
    body.extend_from_slice(&18i16.to_be_bytes());
    body.extend_from_slice(&0i16.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes());
    body.extend_from_slice(&(client.len() as i16).to_be_bytes());
    body.extend_from_slice(client);
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    s.write_all(&frame)?;
    let len = i32::from_be_bytes(read_exact(s, 4)?.try_into().expect("4 bytes"));
    if !(6..=1 << 20).contains(&len) {
        return Ok(false);
    }
    let resp = read_exact(s, len as usize)?;
    let correlation = i32::from_be_bytes(resp[0..4].try_into().expect("4 bytes"));
    let error = i16::from_be_bytes(resp[4..6].try_into().expect("2 bytes"));
    Ok(correlation == 1 && error == 0)
}

fn memcached(s: &mut TcpStream) -> std::io::Result<bool> {
    s.write_all(b"version\r\n")?;
    Ok(read_exact(s, 8)?.starts_with(b"VERSION "))
}

/// `GET path` over HTTP/1.0; ready when the status is 200.
fn http(s: &mut TcpStream, host: &str, path: &str) -> std::io::Result<bool> {
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: zlink-probe\r\n\r\n"
    )?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head)?;
    Ok(head.starts_with(b"HTTP/1.") && &head[8..12] == b" 200")
}

fn probe(kind: &str, host: &str, port: u16, path: &str) -> std::io::Result<bool> {
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or(std::io::ErrorKind::NotFound)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    match kind {
        "cql" => cql(&mut s),
        "kafka" => kafka(&mut s),
        "memcached" => memcached(&mut s),
        "http" => http(&mut s, host, path),
        _ => Ok(false),
    }
}

/// The A record of `name` at the DNS server `host:port`, printed; equal to `want` if given.
fn dns(host: &str, port: &str, name: &str, want: Option<&String>) -> bool {
    let Some(server) = port
        .parse::<u16>()
        .ok()
        .and_then(|p| (host, p).to_socket_addrs().ok()?.next())
    else {
        return false;
    };
    match zlink_probe::dns::resolve_a(server, name, Duration::from_secs(2)) {
        Ok(Some(a)) => {
            println!("{} {}", a.addr, a.ttl);
            want.is_none_or(|w| *w == a.addr.to_string())
        }
        _ => false,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [k, h, p, name, want @ ..] = args.as_slice() {
        if k == "dns" && want.len() <= 1 {
            std::process::exit(if dns(h, p, name, want.first()) { 0 } else { 1 });
        }
    }
    let (kind, host, port, path) = match args.as_slice() {
        [k, h, p] if matches!(k.as_str(), "cql" | "kafka" | "memcached") => (k, h, p, "/"),
        [k, h, p, path]
            if k == "http" && path.starts_with('/') && !path.contains(char::is_whitespace) =>
        {
            (k, h, p, path.as_str())
        }
        _ => {
            eprintln!(
                "usage: zlink-probe cql|kafka|memcached HOST PORT | zlink-probe http HOST PORT /PATH \
                 | zlink-probe dns HOST PORT NAME [ADDR]"
            );
            std::process::exit(2);
        }
    };
    let ok = port
        .parse()
        .is_ok_and(|port| probe(kind, host, port, path).unwrap_or(false));
    std::process::exit(if ok { 0 } else { 1 });
}
