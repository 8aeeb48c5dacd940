//! Admin listener on the pod IP: `/metrics`, `/livez`, `/readyz`, `/status`. Never on
//! loopback: tailscaled forwards the tailnet IP's unclaimed ports there.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::metrics::Metrics;
use crate::state::AgentState;

#[derive(Clone)]
pub struct Admin {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub state: Arc<AgentState>,
}

pub async fn serve(listener: TcpListener, admin: Admin, stop: CancellationToken) {
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
        let admin = admin.clone();
        tokio::spawn(async move {
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
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, &admin.registry) {
                Ok(()) => with_type(
                    StatusCode::OK,
                    body.into_bytes(),
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
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
