//! Ports for the few things that cannot be told to bind port 0 and report what they got
//! (`--metrics-port 0` means disabled, upstream; pebble and containers take a number).

use std::net::Ipv4Addr;

/// How many fresh ports a caller tries before giving up: a port found free here can be
/// taken by someone else before the real listener binds it.
pub const ATTEMPTS: usize = 3;

/// A loopback TCP port nobody listens on right now. Racy by nature (bind, release,
/// rebind): use it only with a retry on "address in use", see [`ATTEMPTS`].
pub fn free_port() -> u16 {
    std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

/// A loopback UDP port nobody listens on right now (same race as [`free_port`]).
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback UDP port")
}
