//! Admin listener on the pod IP: `/metrics`, `/livez`, `/readyz`, `/status`. Never on
//! loopback: tailscaled forwards the tailnet IP's unclaimed ports there.
//!
//! At most [`ADMIN_MAX_CONNECTIONS`] connections are open at once (kubelet's probes and a
//! Prometheus scrape need a handful); one beyond is reset at once and counted in
//! `tailnet_agent_admin_connections_refused_total`, so a client that opens connections and
//! sends nothing cannot pile up tasks and buffers (each also ends after 10 s without a full
//! request head).

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tailnet_telemetry::exposition::Format;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::limits::{Gate, refuse};
use crate::metrics::Metrics;
use crate::state::AgentState;

#[derive(Clone)]
pub struct Admin {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub state: Arc<AgentState>,
}

/// Admin connections open at once; more are reset.
pub const ADMIN_MAX_CONNECTIONS: u32 = 32;

pub async fn serve(listener: TcpListener, admin: Admin, stop: CancellationToken) {
    serve_limited(listener, admin, stop, ADMIN_MAX_CONNECTIONS).await;
}

async fn serve_limited(listener: TcpListener, admin: Admin, stop: CancellationToken, limit: u32) {
    let gate = Gate::new(limit);
    loop {
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    warn!(%error, "admin accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Some(slot) = gate.try_enter() else {
            admin.metrics.admin_connections_refused.inc();
            debug!(%peer, "admin connection limit reached; resetting the connection");
            refuse(stream);
            continue;
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |request| {
                let admin = admin.clone();
                async move { Ok::<_, Infallible>(answer(&admin, &request)) }
            });
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10));
            if let Err(error) = builder
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                debug!(%peer, %error, "admin connection ended with an error");
            }
        });
    }
}

fn answer(admin: &Admin, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET only\n".into());
    }
    match request.uri().path() {
        "/livez" => text(StatusCode::OK, "ok\n".into()),
        "/readyz" => match admin.state.readiness() {
            Ok(()) => {
                admin.metrics.ready.set(1);
                text(StatusCode::OK, "ok\n".into())
            }
            Err(reasons) => {
                admin.metrics.ready.set(0);
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!("not ready:\n- {}\n", reasons.join("\n- ")),
                )
            }
        },
        "/status" => match serde_json::to_vec_pretty(&admin.state.report()) {
            Ok(json) => with_type(StatusCode::OK, json, "application/json"),
            Err(error) => text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("status could not be encoded: {error}\n"),
            ),
        },
        "/metrics" => {
            admin
                .metrics
                .ready
                .set(i64::from(admin.state.readiness().is_ok()));
            // OpenMetrics when asked for (Prometheus), else the Prometheus text format.
            let accept = request
                .headers()
                .get(header::ACCEPT)
                .and_then(|value| value.to_str().ok());
            let format = Format::negotiate(accept);
            match format.encode(&admin.registry) {
                Ok(body) => with_type(StatusCode::OK, body.into_bytes(), format.content_type()),
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("metrics could not be encoded: {error}\n"),
                ),
            }
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    with_type(status, body.into_bytes(), "text/plain; charset=utf-8")
}

fn with_type(
    status: StatusCode,
    body: Vec<u8>,
    content_type: &'static str,
) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    async fn get_livez(address: std::net::SocketAddr) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(address).await?;
        stream
            .write_all(b"GET /livez HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    async fn get(
        address: std::net::SocketAddr,
        path: &str,
        accept: &str,
    ) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(address).await?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: a\r\n{accept}Connection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// The bug: only OpenMetrics was served, whose counter families are named without
    /// `_total`, so `curl …/metrics | promtool check metrics` found 8 counters without HELP.
    /// Now the text format unless the scraper asks for OpenMetrics, as Prometheus does.
    #[tokio::test]
    async fn metrics_follow_the_accept_header() -> std::io::Result<()> {
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        metrics.localapi_errors.inc();
        drop(crate::metrics::ActiveConnection::open(&metrics, "db"));
        let admin = Admin {
            registry: Arc::new(registry),
            metrics,
            state: Arc::new(AgentState::new()),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let stop = CancellationToken::new();
        tokio::spawn(serve_limited(listener, admin, stop.clone(), 4));
        let text = get(address, "/metrics", "").await?;
        for expected in [
            "content-type: text/plain; version=0.0.4; charset=utf-8",
            "# HELP tailnet_agent_connections_total Connections accepted, by listener.\n# TYPE tailnet_agent_connections_total counter\ntailnet_agent_connections_total{listener=\"db\"} 1\n",
            "# HELP tailnet_agent_localapi_errors_total ",
            "# TYPE tailnet_agent_build_info gauge",
            "# TYPE process_cpu_seconds_total counter",
        ] {
            assert!(text.contains(expected), "{expected:?} missing:\n{text}");
        }
        assert!(!text.contains("# EOF"), "{text}");
        let open = get(
            address,
            "/metrics",
            "Accept: application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5\r\n",
        )
        .await?;
        assert!(
            open.contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{open}"
        );
        assert!(
            open.contains("# HELP tailnet_agent_connections Connections accepted"),
            "{open}"
        );
        assert!(open.ends_with("# EOF\n"), "{open}");
        stop.cancel();
        Ok(())
    }

    /// The bug: the admin listener spawned a task per connection without bound. Now the
    /// connection beyond the limit is reset while the open ones sit idle, and served again
    /// once one of them closed.
    #[tokio::test]
    async fn connections_beyond_the_limit_are_reset_and_counted() -> std::io::Result<()> {
        const LIMIT: u32 = 3;
        let mut registry = Registry::default();
        let metrics = Arc::new(Metrics::new(&mut registry));
        let admin = Admin {
            registry: Arc::new(registry),
            metrics: metrics.clone(),
            state: Arc::new(AgentState::new()),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let stop = CancellationToken::new();
        tokio::spawn(serve_limited(listener, admin, stop.clone(), LIMIT));
        // Idle connections (no request) fill the slots …
        let mut idle = Vec::new();
        for _ in 0..LIMIT {
            idle.push(TcpStream::connect(address).await?);
        }
        // … so the next one is reset at once (before the 10 s header timeout of the others).
        let refused = tokio::time::timeout(Duration::from_secs(5), get_livez(address))
            .await
            .map_err(std::io::Error::other)?;
        assert!(
            refused.as_ref().is_err() || refused.as_ref().is_ok_and(String::is_empty),
            "served beyond the limit: {refused:?}"
        );
        assert_eq!(metrics.admin_connections_refused.get(), 1);
        // One idle connection closes: served again (its slot is freed when the server sees
        // the close, so poll).
        drop(idle.pop());
        let served = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                if let Ok(answer) = get_livez(address).await
                    && answer.contains("200 OK")
                {
                    return answer;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .map_err(std::io::Error::other)?;
        assert!(served.ends_with("ok\n"), "{served}");
        stop.cancel();
        Ok(())
    }
}
