//! `zlink-probe cql|kafka|memcached HOST PORT`: exits 0 when the server answered its own
//! protocol correctly (an open port is not ready). No dependencies: `deploy/local/test` builds
//! it in seconds, before the servers it probes have started, while the rest builds.

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

fn probe(kind: &str, host: &str, port: u16) -> std::io::Result<bool> {
    let check: fn(&mut TcpStream) -> std::io::Result<bool> = match kind {
        "cql" => cql,
        "kafka" => kafka,
        "memcached" => memcached,
        _ => return Ok(false),
    };
    let addr = (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or(std::io::ErrorKind::NotFound)?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.set_write_timeout(Some(Duration::from_secs(2)))?;
    check(&mut s)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [kind, host, port] = args.as_slice() else {
        eprintln!("usage: zlink-probe cql|kafka|memcached HOST PORT");
        std::process::exit(2);
    };
    if !matches!(kind.as_str(), "cql" | "kafka" | "memcached") {
        eprintln!("zlink-probe: unknown kind {kind:?}");
        std::process::exit(2);
    }
    let ok = port
        .parse()
        .is_ok_and(|port| probe(kind, host, port).unwrap_or(false));
    std::process::exit(if ok { 0 } else { 1 });
}
