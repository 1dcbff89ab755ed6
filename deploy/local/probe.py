#!/usr/bin/env python3
"""Readiness probes that speak each server's own protocol (an open port is not ready).

usage: probe.py cql|kafka|memcached HOST PORT   -> exit 0 when the server answered correctly
"""
import socket
import struct
import sys


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def cql(sock):
    # CQL native protocol v4 OPTIONS frame; a ready node answers SUPPORTED (opcode 0x06).
    sock.sendall(struct.pack(">BBhBi", 0x04, 0, 0, 0x05, 0))
    version, _flags, _stream, opcode, length = struct.unpack(">BBhBi", recv_exact(sock, 9))
    recv_exact(sock, length)
    return version == 0x84 and opcode == 0x06


def kafka(sock):
    # ApiVersions v0 (api key 18); a ready broker answers with error code 0.
    client = b"zlink-probe"
    body = struct.pack(">hhih", 18, 0, 1, len(client)) + client
    sock.sendall(struct.pack(">i", len(body)) + body)
    (length,) = struct.unpack(">i", recv_exact(sock, 4))
    resp = recv_exact(sock, length)
    correlation, error = struct.unpack(">ih", resp[:6])
    return correlation == 1 and error == 0


def memcached(sock):
    sock.sendall(b"version\r\n")
    return recv_exact(sock, 8).startswith(b"VERSION ")


def main():
    kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    check = {"cql": cql, "kafka": kafka, "memcached": memcached}[kind]
    try:
        with socket.create_connection((host, port), timeout=2) as sock:
            sock.settimeout(2)
            ok = check(sock)
    except (OSError, ConnectionError, struct.error):
        ok = False
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
