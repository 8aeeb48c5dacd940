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
