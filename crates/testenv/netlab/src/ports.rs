//! Free ports for the test servers, chosen **outside the kernel's ephemeral port range**.
//!
//! A test stops a server and starts it again on the same port (Headscale, the apiserver: what
//! a crash looks like to their clients). A port that the kernel handed out for `bind(:0)` is an
//! ephemeral port: while the server is down, any outgoing connection on the machine (another
//! test's clients, in CI the whole other test group) may get it as its source port, and the
//! restarted server then fails with "address already in use". Ports below (or above) the
//! ephemeral range are never given to outgoing connections, so a stopped server's port stays
//! free unless another server takes it, which [`free_tcp_port`] avoids within a process and
//! makes unlikely across processes (random start).

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::ops::RangeInclusive;
use std::sync::{Mutex, PoisonError};

/// Lowest port handed out: well above the well-known and commonly configured ports.
const LOWEST: u16 = 10_000;
/// Used when the ephemeral range cannot be read: Linux's default.
const DEFAULT_EPHEMERAL: RangeInclusive<u16> = 32_768..=60_999;

/// Ports this process handed out (a server may not have bound it yet).
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

/// A TCP port free on every address now (bound on 0.0.0.0 to check), outside the ephemeral
/// range and not handed out before by this process.
pub fn free_tcp_port() -> io::Result<u16> {
    pick(|port| TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok())
}

/// A UDP port, as [`free_tcp_port`].
pub fn free_udp_port() -> io::Result<u16> {
    pick(|port| UdpSocket::bind((Ipv4Addr::UNSPECIFIED, port)).is_ok())
}

fn pick(is_free: impl Fn(u16) -> bool) -> io::Result<u16> {
    let candidates = candidate_ports(&ephemeral_range());
    if candidates.is_empty() {
        return Err(io::Error::other(
            "no port outside the ephemeral range (net.ipv4.ip_local_port_range covers them all)",
        ));
    }
    let start = (RandomState::new().hash_one(std::process::id()) as usize) % candidates.len();
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    let rotated = candidates[start..].iter().chain(&candidates[..start]);
    for &port in rotated {
        if !handed_out.contains(&port) && is_free(port) {
            handed_out.insert(port);
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        "every port outside the ephemeral range is in use",
    ))
}

/// `net.ipv4.ip_local_port_range`.
fn ephemeral_range() -> RangeInclusive<u16> {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| parse_range(&text))
        .unwrap_or(DEFAULT_EPHEMERAL)
}

fn parse_range(text: &str) -> Option<RangeInclusive<u16>> {
    let mut parts = text.split_whitespace().map(str::parse::<u16>);
    let (low, high) = (parts.next()?.ok()?, parts.next()?.ok()?);
    (low <= high).then_some(low..=high)
}

/// The ports from [`LOWEST`] up that are not in `ephemeral`.
fn candidate_ports(ephemeral: &RangeInclusive<u16>) -> Vec<u16> {
    (LOWEST..=u16::MAX)
        .filter(|port| !ephemeral.contains(port))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_read_as_the_kernel_writes_it() {
        assert_eq!(parse_range("32768\t60999\n"), Some(32_768..=60_999));
        assert_eq!(parse_range("1024 65535"), Some(1024..=65_535));
        assert_eq!(parse_range("60999 32768"), None, "inverted");
        assert_eq!(parse_range("32768"), None);
        assert_eq!(parse_range("a b"), None);
    }

    #[test]
    fn candidates_avoid_the_ephemeral_range_and_the_low_ports() {
        let candidates = candidate_ports(&DEFAULT_EPHEMERAL);
        assert_eq!(candidates.first(), Some(&LOWEST));
        assert!(candidates.contains(&32_767) && candidates.contains(&61_000));
        assert!(!candidates.contains(&32_768) && !candidates.contains(&60_999));
        assert_eq!(candidates.len(), (32_768 - 10_000) + (65_535 - 60_999));
        assert!(candidate_ports(&(1024..=65_535)).is_empty());
    }

    #[test]
    fn ports_handed_out_are_free_outside_the_range_and_never_repeated() {
        let ephemeral = ephemeral_range();
        let ports: Vec<u16> = (0..20)
            .map(|_| free_tcp_port().expect("a free port"))
            .collect();
        let unique: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for port in &ports {
            assert!(!ephemeral.contains(port), "{port} in {ephemeral:?}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, *port)).expect("still free");
        }
        let udp = free_udp_port().expect("a free UDP port");
        assert!(!ephemeral.contains(&udp) && !unique.contains(&udp));
    }
}
