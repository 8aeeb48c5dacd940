//! Userspace TCP forwarders between network namespaces.
//!
//! The listening socket is created inside the listen-side netns and each upstream connection
//! inside the connect-side netns (a socket stays in the netns it was created in), so no
//! interface, route or firewall rule is needed to join the two. Threads, not async tasks: a
//! forwarder must outlive the async runtime of the test that happened to create it.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::{NetlabError, Result};
use crate::netns::{self, Netns};

const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one error line per forwarder in this interval: a target that is down on purpose (a
/// fault test stops Headscale) is retried by its clients many times a second, and a line per
/// attempt would bury the test's own output (CI keeps only a part of it).
const ERROR_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// Forwards every connection accepted on `listen` (in one netns) to `target` (in another).
/// Stops accepting and closes open connections on drop.
#[derive(Debug)]
pub struct TcpForwarder {
    local_addr: SocketAddr,
    listener: Arc<TcpListener>,
    stopping: Arc<AtomicBool>,
    connections: Arc<Connections>,
    accept_thread: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Connections {
    next_id: AtomicU64,
    open: Mutex<HashMap<u64, TcpStream>>,
    errors: Mutex<ErrorReport>,
}

/// When the last error line was printed and how many errors were not printed since.
#[derive(Debug, Default)]
struct ErrorReport {
    last_printed: Option<Instant>,
    suppressed: u64,
}

impl ErrorReport {
    /// The line to print for `error` now, or `None` when one was printed less than
    /// [`ERROR_REPORT_INTERVAL`] ago (the error is counted and named with the next line).
    fn line(&mut self, now: Instant, target: SocketAddr, error: &str) -> Option<String> {
        if self
            .last_printed
            .is_some_and(|last| now.duration_since(last) < ERROR_REPORT_INTERVAL)
        {
            self.suppressed += 1;
            return None;
        }
        self.last_printed = Some(now);
        let more = std::mem::take(&mut self.suppressed);
        Some(if more == 0 {
            format!("netlab forwarder to {target}: {error}")
        } else {
            format!(
                "netlab forwarder to {target}: {error} (and {more} errors not printed since the last line)"
            )
        })
    }
}

impl Connections {
    fn report(&self, target: SocketAddr, error: &str) {
        let line = self
            .errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .line(Instant::now(), target, error);
        if let Some(line) = line {
            eprintln!("{line}");
        }
    }
}

impl TcpForwarder {
    /// Listens on `listen` inside `listen_in` (`None` = the test process's own netns) and
    /// connects to `target` from inside `connect_in` (`None` = own netns). Port 0 picks a free
    /// port; see [`TcpForwarder::local_addr`].
    pub fn start(
        listen_in: Option<&Netns>,
        listen: SocketAddr,
        connect_in: Option<&Netns>,
        target: SocketAddr,
    ) -> Result<TcpForwarder> {
        let listener = match listen_in {
            Some(netns) => netns.bind_tcp(listen)?,
            None => TcpListener::bind(listen)
                .map_err(|e| NetlabError::io(format!("binding {listen}"), e))?,
        };
        let local_addr = listener
            .local_addr()
            .map_err(|e| NetlabError::io("reading a forwarder's local address", e))?;
        let connect_netns = connect_in
            .map(|netns| {
                netns
                    .open()
                    .map(|file| (Arc::new(file), netns.name().to_owned()))
            })
            .transpose()?;
        let listener = Arc::new(listener);
        let stopping = Arc::new(AtomicBool::new(false));
        let connections = Arc::new(Connections::default());
        let accept_thread = {
            let (listener, stopping, connections) =
                (listener.clone(), stopping.clone(), connections.clone());
            std::thread::Builder::new()
                .name(format!("fwd-{local_addr}"))
                .spawn(move || {
                    accept_loop(&listener, &stopping, &connections, connect_netns, target)
                })
                .map_err(|e| NetlabError::io("spawning a forwarder thread", e))?
        };
        Ok(TcpForwarder {
            local_addr,
            listener,
            stopping,
            connections,
            accept_thread: Some(accept_thread),
        })
    }

    /// The address the forwarder listens on (inside its listen-side netns).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }
}

impl Drop for TcpForwarder {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        // shutdown(2) on a listening socket wakes the thread blocked in accept(2).
        // SAFETY: the fd stays open until the Arc'd listener is dropped after the join below.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
        let open = self
            .connections
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for stream in open.values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(
    listener: &TcpListener,
    stopping: &AtomicBool,
    connections: &Arc<Connections>,
    connect_netns: Option<(Arc<File>, String)>,
    target: SocketAddr,
) {
    for client in listener.incoming() {
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else {
            // E.g. EMFILE: back off instead of spinning.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let connection_shared = connections.clone();
        let connect_netns = connect_netns.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("fwd-conn-{target}"))
            .spawn(move || {
                if let Err(error) = forward_one(client, &connection_shared, connect_netns, target) {
                    connection_shared.report(target, &error.to_string());
                }
            });
        if let Err(error) = spawned {
            connections.report(target, &format!("cannot spawn a thread: {error}"));
        }
    }
}

/// Runs on its own thread, which may enter the connect-side netns (it is never reused).
fn forward_one(
    client: TcpStream,
    connections: &Connections,
    connect_netns: Option<(Arc<File>, String)>,
    target: SocketAddr,
) -> io::Result<()> {
    if let Some((netns_file, _)) = &connect_netns {
        netns::enter(netns_file)?;
    }
    let upstream = match TcpStream::connect_timeout(&target, UPSTREAM_CONNECT_TIMEOUT) {
        Ok(upstream) => upstream,
        Err(error) => {
            let _ = client.shutdown(Shutdown::Both);
            return Err(error);
        }
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);

    let client_id = connections.register(&client);
    let upstream_id = connections.register(&upstream);
    let (client_reader, upstream_writer) = (client.try_clone()?, upstream.try_clone()?);
    let to_upstream = std::thread::Builder::new()
        .name(format!("fwd-up-{target}"))
        .spawn(move || pipe(client_reader, upstream_writer))?;
    pipe(upstream, client);
    let _ = to_upstream.join();
    connections.forget(client_id);
    connections.forget(upstream_id);
    Ok(())
}

/// Copies until EOF, then half-closes the writer so the peer sees the EOF. On an error both
/// sockets are shut down so the opposite direction does not hang.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    match io::copy(&mut from, &mut to) {
        Ok(_) => {
            let _ = to.shutdown(Shutdown::Write);
        }
        Err(_) => {
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        }
    }
}

impl Connections {
    fn register(&self, stream: &TcpStream) -> Option<u64> {
        let clone = stream.try_clone().ok()?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, clone);
        Some(id)
    }

    fn forget(&self, id: Option<u64>) {
        if let Some(id) = id {
            self.open
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_errors_are_printed_once_per_interval_with_the_count_of_the_others() {
        let target: SocketAddr = "127.0.0.1:9".parse().expect("address");
        let mut report = ErrorReport::default();
        let start = Instant::now();
        assert_eq!(
            report.line(start, target, "refused").as_deref(),
            Some("netlab forwarder to 127.0.0.1:9: refused")
        );
        for ms in [1, 100, 4_999] {
            let at = start + Duration::from_millis(ms);
            assert_eq!(report.line(at, target, "refused"), None, "at {ms} ms");
        }
        let later = start + ERROR_REPORT_INTERVAL;
        assert_eq!(
            report.line(later, target, "reset").as_deref(),
            Some(
                "netlab forwarder to 127.0.0.1:9: reset (and 3 errors not printed since the last line)"
            )
        );
        let much_later = later + ERROR_REPORT_INTERVAL * 2;
        assert_eq!(
            report.line(much_later, target, "refused").as_deref(),
            Some("netlab forwarder to 127.0.0.1:9: refused"),
            "the count starts again after a printed line"
        );
    }
}
