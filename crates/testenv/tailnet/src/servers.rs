//! Plain TCP test servers on std threads, bound inside a netns. Threads rather than tasks so a
//! server shared between tests does not die with the async runtime of the test that made it.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use tno_netlab::Netns;

use crate::error::{Result, TailnetError};

/// What a [`TcpTestServer`] does with each connection.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Sends every byte back until the peer closes.
    Echo,
    /// Writes this text, then closes.
    Banner(String),
    /// Completes a TLS handshake with this server configuration, writes the text inside the
    /// TLS session, then closes (a stand-in for a remote HTTPS API with its own certificate).
    TlsBanner {
        config: Arc<rustls::ServerConfig>,
        text: String,
    },
    /// DNS over TCP (RFC 1035 4.2.2: two-byte length, message) as [`DnsTestServer`] answers.
    Dns {
        zone: String,
        records: Vec<DnsRecord>,
    },
}

/// A TCP server that runs until dropped.
#[derive(Debug)]
pub struct TcpTestServer {
    local_addr: SocketAddr,
    listener: Arc<TcpListener>,
    stopping: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

impl TcpTestServer {
    /// Binds `addr` inside `netns` (`None` = the test process's netns) and serves.
    pub fn start(netns: Option<&Netns>, addr: SocketAddr, behaviour: Behaviour) -> Result<Self> {
        let listener = match netns {
            Some(netns) => netns.bind_tcp(addr)?,
            None => TcpListener::bind(addr)
                .map_err(|e| TailnetError::io(format!("binding test server on {addr}"), e))?,
        };
        let local_addr = listener
            .local_addr()
            .map_err(|e| TailnetError::io("reading a test server's address", e))?;
        let listener = Arc::new(listener);
        let stopping = Arc::new(AtomicBool::new(false));
        let accept_thread = {
            let (listener, stopping) = (listener.clone(), stopping.clone());
            std::thread::Builder::new()
                .name(format!("test-server-{local_addr}"))
                .spawn(move || serve(&listener, &stopping, &behaviour))
                .map_err(|e| TailnetError::io("spawning a test server thread", e))?
        };
        Ok(TcpTestServer {
            local_addr,
            listener,
            stopping,
            accept_thread: Some(accept_thread),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for TcpTestServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // shutdown(2) wakes the thread blocked in accept(2).
        // SAFETY: the listener (and so the fd) is alive until after the join.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, stopping: &AtomicBool, behaviour: &Behaviour) {
    for stream in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else {
            // E.g. EMFILE: back off instead of spinning.
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        };
        let behaviour = behaviour.clone();
        let _ = std::thread::Builder::new()
            .name("test-server-conn".into())
            .spawn(move || handle(stream, &behaviour));
    }
}

fn handle(mut stream: TcpStream, behaviour: &Behaviour) {
    match behaviour {
        Behaviour::Echo => {
            let mut buffer = [0u8; 16 * 1024];
            while let Ok(read) = stream.read(&mut buffer) {
                if read == 0 || stream.write_all(&buffer[..read]).is_err() {
                    break;
                }
            }
        }
        Behaviour::Banner(text) => {
            let _ = stream.write_all(text.as_bytes());
        }
        Behaviour::Dns { zone, records } => {
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
            let mut length = [0u8; 2];
            while stream.read_exact(&mut length).is_ok() {
                let mut query = vec![0u8; usize::from(u16::from_be_bytes(length))];
                if stream.read_exact(&mut query).is_err() {
                    break;
                }
                let Some(answer) = dns_answer(&query, zone, records) else {
                    break;
                };
                let Ok(len) = u16::try_from(answer.len()) else {
                    break;
                };
                if stream.write_all(&len.to_be_bytes()).is_err()
                    || stream.write_all(&answer).is_err()
                {
                    break;
                }
            }
        }
        Behaviour::TlsBanner { config, text } => {
            // A client that never finishes the handshake must not hold the thread forever.
            let _ = stream.set_read_timeout(Some(std::time::Duration::from_secs(10)));
            if let Ok(connection) = rustls::ServerConnection::new(config.clone()) {
                let mut tls = rustls::StreamOwned::new(connection, stream);
                if tls.write_all(text.as_bytes()).is_ok() && tls.flush().is_ok() {
                    tls.conn.send_close_notify();
                    let _ = tls.conn.complete_io(&mut tls.sock);
                }
                let _ = tls.sock.shutdown(Shutdown::Both);
            }
            return;
        }
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// A tiny authoritative DNS server over UDP and TCP (the remote site's resolver, wired as
/// Headscale split DNS; tailscaled in userspace mode asks a resolver behind a subnet route
/// over TCP): answers `A`/`AAAA` for its names, `NXDOMAIN` for other names in its zone and
/// `REFUSED` for everything else. Runs until dropped.
#[derive(Debug)]
pub struct DnsTestServer {
    local_addr: SocketAddr,
    socket: Arc<std::net::UdpSocket>,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _tcp: TcpTestServer,
}

/// A name and its addresses, as [`DnsTestServer`] answers them.
#[derive(Clone, Debug)]
pub struct DnsRecord {
    pub name: String,
    pub addresses: Vec<std::net::IpAddr>,
}

impl DnsTestServer {
    /// Binds UDP `addr` inside `netns` and answers for `records`; names under `zone` that it
    /// does not know get NXDOMAIN.
    pub fn start(
        netns: &Netns,
        addr: SocketAddr,
        zone: &str,
        records: Vec<DnsRecord>,
    ) -> Result<Self> {
        let socket = netns
            .in_netns(move || std::net::UdpSocket::bind(addr))?
            .map_err(|e| TailnetError::io(format!("binding DNS server on {addr}"), e))?;
        let local_addr = socket
            .local_addr()
            .map_err(|e| TailnetError::io("reading the DNS server's address", e))?;
        let socket = Arc::new(socket);
        let stopping = Arc::new(AtomicBool::new(false));
        let zone = zone.trim_end_matches('.').to_ascii_lowercase();
        let tcp = TcpTestServer::start(
            Some(netns),
            addr,
            Behaviour::Dns {
                zone: zone.clone(),
                records: records.clone(),
            },
        )?;
        let thread = {
            let (socket, stopping) = (socket.clone(), stopping.clone());
            std::thread::Builder::new()
                .name(format!("dns-server-{local_addr}"))
                .spawn(move || {
                    let mut buffer = [0u8; 1500];
                    while !stopping.load(Ordering::SeqCst) {
                        let Ok((len, peer)) = socket.recv_from(&mut buffer) else {
                            continue;
                        };
                        if let Some(answer) = dns_answer(&buffer[..len], &zone, &records) {
                            let _ = socket.send_to(&answer, peer);
                        }
                    }
                })
                .map_err(|e| TailnetError::io("spawning the DNS server thread", e))?
        };
        Ok(DnsTestServer {
            local_addr,
            socket,
            stopping,
            thread: Some(thread),
            _tcp: tcp,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for DnsTestServer {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // shutdown(2) wakes the thread blocked in recvfrom(2).
        // SAFETY: the socket (and so the fd) is alive until after the join.
        unsafe { libc::shutdown(self.socket.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The response to one DNS query, `None` for a malformed one.
fn dns_answer(query: &[u8], zone: &str, records: &[DnsRecord]) -> Option<Vec<u8>> {
    const TYPE_A: u16 = 1;
    const TYPE_AAAA: u16 = 28;
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    // The first question only.
    let mut at = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len & 0xC0 != 0 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let qtype = u16::from_be_bytes([*query.get(at)?, *query.get(at + 1)?]);
    let question_end = at + 4;
    query.get(..question_end)?;
    let name = labels.join(".");
    let in_zone = name == zone || name.ends_with(&format!(".{zone}"));
    let known = records.iter().find(|r| r.name == name);
    let answers: Vec<std::net::IpAddr> = known
        .map(|r| {
            r.addresses
                .iter()
                .copied()
                .filter(|a| match qtype {
                    TYPE_A => a.is_ipv4(),
                    TYPE_AAAA => a.is_ipv6(),
                    _ => false,
                })
                .collect()
        })
        .unwrap_or_default();
    let rcode: u8 = match (in_zone, known) {
        (false, _) => 5,   // REFUSED
        (true, None) => 3, // NXDOMAIN
        (true, Some(_)) => 0,
    };
    let mut out = Vec::with_capacity(question_end + answers.len() * 28);
    out.extend_from_slice(&query[..2]); // id
    // QR, AA, and the query's RD; RA; rcode.
    out.push(0x84 | (query[2] & 0x01));
    out.push(0x80 | rcode);
    out.extend_from_slice(&[0, 1]); // one question
    out.extend_from_slice(&u16::try_from(answers.len()).ok()?.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]); // no authority, no additional
    out.extend_from_slice(&query[12..question_end]);
    for address in answers {
        out.extend_from_slice(&[0xC0, 0x0C]); // the question's name
        let (rtype, data) = match address {
            std::net::IpAddr::V4(v4) => (TYPE_A, v4.octets().to_vec()),
            std::net::IpAddr::V6(v6) => (TYPE_AAAA, v6.octets().to_vec()),
        };
        out.extend_from_slice(&rtype.to_be_bytes());
        out.extend_from_slice(&[0, 1]); // IN
        out.extend_from_slice(&30u32.to_be_bytes()); // TTL
        out.extend_from_slice(&u16::try_from(data.len()).ok()?.to_be_bytes());
        out.extend_from_slice(&data);
    }
    Some(out)
}

#[cfg(test)]
mod dns_tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(u8::try_from(label.len()).expect("label"));
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn answers_its_names_and_refuses_others() {
        let records = vec![DnsRecord {
            name: "db.site.internal".into(),
            addresses: vec![
                "192.0.2.10".parse().expect("ip"),
                "fd00:5ee::10".parse().expect("ip"),
            ],
        }];
        let a = dns_answer(&query("db.site.internal", 1), "site.internal", &records).expect("a");
        assert_eq!((a[0], a[1], a[3] & 0x0F, a[7]), (0x12, 0x34, 0, 1));
        assert_eq!(&a[a.len() - 4..], &[192, 0, 2, 10]);
        let aaaa =
            dns_answer(&query("DB.site.internal", 28), "site.internal", &records).expect("aaaa");
        assert_eq!(aaaa[7], 1);
        assert_eq!(aaaa[aaaa.len() - 16], 0xfd);
        let nx = dns_answer(&query("x.site.internal", 1), "site.internal", &records).expect("nx");
        assert_eq!((nx[3] & 0x0F, nx[7]), (3, 0));
        let refused = dns_answer(&query("example.com", 1), "site.internal", &records).expect("r");
        assert_eq!(refused[3] & 0x0F, 5);
    }
}
