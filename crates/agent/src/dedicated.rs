//! One backend connection per HTTP/1.1 client connection, driven by the client connection's
//! own task.
//!
//! hyper-util's pooled client hands every request to the connection's dispatcher through a
//! pool checkout and a channel to a separately spawned connection task (on a multi-threaded
//! runtime often another worker), and back. An HTTP/1.1 client connection sends one request at
//! a time, so it can keep one backend connection of its own: the request is written by a
//! [`SendRequest`] whose connection future is polled by the same task as the client
//! connection ([`Driver`], joined with the server connection in `serve_connection`), so a
//! request and its answer cross no task or thread.
//!
//! A connection's first request still goes through the pool: a client that sends one request
//! and closes (`Connection: close`, new TLS connections) then reuses a pooled backend
//! connection instead of opening one of its own that only one request would use.
//!
//! Bounded: at most [`MAX_DRIVEN`] backend connections per client connection (the current
//! one and one that is finishing after its route changed or it was replaced); the slot
//! that hands a new connection to the driver holds one. A backend connection ends with its
//! client connection. HTTP/2 clients (many requests at once) and WebSocket upgrades keep
//! using the pooled client.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::Context;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use crate::backend::BackendConnector;
use crate::body::{BoxError, ProxyBody};

/// The current backend connection and one that is still finishing.
const MAX_DRIVEN: usize = 2;

type BackendConnection = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The per-client-connection handle the requests use.
pub struct DedicatedBackend {
    /// The route (by its shared name) and the sender of the connection to its backend; taken
    /// out while a request is in flight, so a request that is dropped half-way (timeout,
    /// client gone) also drops its connection instead of leaving it in an unknown state.
    current: Mutex<Current>,
    handoff: Arc<Handoff>,
    /// A request came before (the first one goes through the pool).
    seen_request: AtomicBool,
}

/// The route (by its shared name) of the current backend connection and, unless a request is
/// in flight, its sender. The name stays while the sender is out, so giving the sender back
/// costs no reference count of the shared name.
#[derive(Default)]
struct Current {
    route: Option<Arc<str>>,
    sender: Option<SendRequest<ProxyBody>>,
}

/// A new backend connection on its way to the driver. Only the client connection's own task
/// hands one over (from a request it serves) and that task polls the driver right after the
/// server connection, so the driver looks at the flag and needs no waker of its own.
#[derive(Default)]
struct Handoff {
    waiting: AtomicBool,
    connection: Mutex<Option<BackendConnection>>,
}

/// Polls the backend connections of one client connection; see [`Driver::poll_driven`].
pub struct Driver {
    handoff: Arc<Handoff>,
    driven: Vec<BackendConnection>,
}

pub fn dedicated() -> (DedicatedBackend, Driver) {
    let handoff = Arc::new(Handoff::default());
    (
        DedicatedBackend {
            current: Mutex::new(Current::default()),
            handoff: handoff.clone(),
            seen_request: AtomicBool::new(false),
        },
        Driver {
            handoff,
            driven: Vec::with_capacity(MAX_DRIVEN),
        },
    )
}

impl Driver {
    /// Takes over a connection handed over since the last call and polls every backend
    /// connection; a finished one is dropped. Never finishes by itself: the caller polls it
    /// alongside the server connection, after it on every wake-up of the task.
    pub fn poll_driven(&mut self, cx: &mut Context<'_>) {
        if self.handoff.waiting.swap(false, Ordering::Acquire)
            && let Some(connection) = self
                .handoff
                .connection
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
        {
            if self.driven.len() >= MAX_DRIVEN {
                // The oldest one's sender was replaced; it has nothing in flight that a
                // request still waits for (HTTP/1.1: one request at a time).
                drop(self.driven.remove(0));
            }
            self.driven.push(connection);
        }
        self.driven
            .retain_mut(|connection| connection.as_mut().poll(cx).is_pending());
    }
}

impl DedicatedBackend {
    /// False for the connection's first request (pooled), true from the second on.
    pub fn claim(&self) -> bool {
        self.seen_request.swap(true, Ordering::Relaxed)
    }

    fn take(&self, route: &Arc<str>) -> Option<SendRequest<ProxyBody>> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let sender = current.sender.take()?;
        let same_route = current
            .route
            .as_ref()
            .is_some_and(|name| Arc::ptr_eq(name, route));
        // Another route's connection, or a closed one: dropping the sender lets its
        // connection finish.
        (same_route && !sender.is_closed()).then_some(sender)
    }

    /// To the driver; one still waiting there (not reached while requests are sequential)
    /// runs as a task of its own instead.
    fn hand_over(&self, connection: BackendConnection) {
        let mut slot = self
            .handoff
            .connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(earlier) = slot.replace(connection) {
            tokio::spawn(earlier);
        }
        self.handoff.waiting.store(true, Ordering::Release);
    }

    fn put_back(&self, route: &Arc<str>, sender: SendRequest<ProxyBody>) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if !current
            .route
            .as_ref()
            .is_some_and(|name| Arc::ptr_eq(name, route))
        {
            current.route = Some(route.clone());
        }
        current.sender = Some(sender);
    }

    /// Sends `request` (origin-form URI, Host set) on this client connection's backend
    /// connection for `route`, opening one if there is none or it was closed. A request the
    /// old connection did not take (it closed meanwhile) goes to a fresh one.
    pub async fn send(
        &self,
        route: &Arc<str>,
        connector: &BackendConnector,
        request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, BoxError> {
        let mut request = request;
        if let Some(mut sender) = self.take(route)
            && sender.ready().await.is_ok()
        {
            match sender.try_send_request(request).await {
                Ok(response) => {
                    self.put_back(route, sender);
                    return Ok(response);
                }
                Err(mut error) => match error.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(error.into_error().into()),
                },
            }
        }
        // Boxed: connecting (TCP, TLS, the HTTP/1 handshake) is a large future that only a
        // connection's first dedicated request needs; inline, every request's future would
        // carry (and move) its size.
        Box::pin(self.send_on_new_connection(route, connector, request)).await
    }

    async fn send_on_new_connection(
        &self,
        route: &Arc<str>,
        connector: &BackendConnector,
        request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, BoxError> {
        let stream = connector.connect().await?;
        let (mut sender, connection) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await?;
        let connection: BackendConnection = Box::pin(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "backend connection ended with an error");
            }
        });
        self.hand_over(connection);
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        self.put_back(route, sender);
        Ok(response)
    }
}
