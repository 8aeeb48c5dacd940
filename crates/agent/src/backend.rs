//! Connections to ingress backends: plain TCP, or TLS verified against the route's CA bundle
//! with the configured server name. Errors say which step failed, so the proxy can answer 502
//! and count `connect` and `tls` failures apart.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::relay::tune_tcp;
use crate::tls::{CaBundle, TlsError};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectFailure {
    Connect,
    Timeout,
    Tls,
}

impl ConnectFailure {
    pub fn label(self) -> &'static str {
        match self {
            ConnectFailure::Connect => "connect",
            ConnectFailure::Timeout => "timeout",
            ConnectFailure::Tls => "tls",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendConnectError {
    #[error("connecting to backend {address}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    #[error("no TCP connection to backend {address} within {seconds}s")]
    Timeout { address: String, seconds: u64 },
    #[error("backend TLS: the CA bundle is not usable")]
    CaBundle {
        #[source]
        source: TlsError,
    },
    #[error("backend TLS: {server_name:?} is not a valid server name")]
    ServerName { server_name: String },
    #[error("backend TLS handshake with {address} (server name {server_name}) failed")]
    Handshake {
        address: String,
        server_name: String,
        #[source]
        source: io::Error,
    },
}

impl BackendConnectError {
    pub fn failure(&self) -> ConnectFailure {
        match self {
            BackendConnectError::Connect { .. } => ConnectFailure::Connect,
            BackendConnectError::Timeout { .. } => ConnectFailure::Timeout,
            BackendConnectError::CaBundle { .. }
            | BackendConnectError::ServerName { .. }
            | BackendConnectError::Handshake { .. } => ConnectFailure::Tls,
        }
    }
}

#[derive(Debug)]
pub struct BackendTls {
    pub server_name: String,
    pub ca: CaBundle,
}

/// A `tower` connector for hyper-util's pooled client; it ignores the request URI's authority
/// and always connects to the configured backend.
#[derive(Clone, Debug)]
pub struct BackendConnector {
    host: Arc<str>,
    port: u16,
    tls: Option<Arc<BackendTls>>,
    connect_timeout: Duration,
}

impl BackendConnector {
    pub fn new(host: &str, port: u16, tls: Option<BackendTls>, connect_timeout: Duration) -> Self {
        BackendConnector {
            host: host.into(),
            port,
            tls: tls.map(Arc::new),
            connect_timeout,
        }
    }

    pub async fn connect(&self) -> Result<BackendStream, BackendConnectError> {
        let address = format!("{}:{}", self.host, self.port);
        let tcp = match tokio::time::timeout(
            self.connect_timeout,
            TcpStream::connect((&*self.host, self.port)),
        )
        .await
        {
            Ok(Ok(tcp)) => tcp,
            Ok(Err(source)) => return Err(BackendConnectError::Connect { address, source }),
            Err(_) => {
                return Err(BackendConnectError::Timeout {
                    address,
                    seconds: self.connect_timeout.as_secs(),
                });
            }
        };
        tune_tcp(&tcp);
        let Some(tls) = &self.tls else {
            return Ok(BackendStream::Plain(tcp));
        };
        let config = tls
            .ca
            .client_config()
            .map_err(|source| BackendConnectError::CaBundle { source })?;
        let server_name = ServerName::try_from(tls.server_name.clone()).map_err(|_| {
            BackendConnectError::ServerName {
                server_name: tls.server_name.clone(),
            }
        })?;
        let handshake = TlsConnector::from(config).connect(server_name, tcp);
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(stream)) => Ok(BackendStream::Tls(Box::new(stream))),
            Ok(Err(source)) => Err(BackendConnectError::Handshake {
                address,
                server_name: tls.server_name.clone(),
                source,
            }),
            Err(_) => Err(BackendConnectError::Handshake {
                address,
                server_name: tls.server_name.clone(),
                source: io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"),
            }),
        }
    }
}

impl tower_service::Service<Uri> for BackendConnector {
    type Response = TokioIo<BackendStream>;
    type Error = BackendConnectError;
    type Future =
        Pin<Box<dyn Future<Output = Result<TokioIo<BackendStream>, BackendConnectError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Uri) -> Self::Future {
        let connector = self.clone();
        Box::pin(async move { connector.connect().await.map(TokioIo::new) })
    }
}

pub enum BackendStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Connection for BackendStream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

impl AsyncRead for BackendStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            BackendStream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for BackendStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            BackendStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            BackendStream::Plain(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            BackendStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            BackendStream::Plain(stream) => stream.is_write_vectored(),
            BackendStream::Tls(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            BackendStream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            BackendStream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            BackendStream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The connect failure buried in a pooled client's error, if that is what it was.
pub fn connect_failure(error: &(dyn std::error::Error + 'static)) -> Option<ConnectFailure> {
    let mut source = Some(error);
    while let Some(current) = source {
        if let Some(connect) = current.downcast_ref::<BackendConnectError>() {
            return Some(connect.failure());
        }
        source = current.source();
    }
    None
}
