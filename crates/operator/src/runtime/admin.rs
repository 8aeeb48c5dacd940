//! Admin HTTP server: `/metrics`, `/livez`, `/readyz`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use tailnet_telemetry::exposition::Format;

/// Readiness: the process has its Kubernetes client and watches running (leader or not: a
/// standby replica is ready to take over).
#[derive(Clone, Default)]
pub struct Health {
    pub ready: Arc<AtomicBool>,
}

#[derive(Clone)]
struct AdminState {
    metrics: Metrics,
    health: Health,
}

/// OpenMetrics when the scraper asks for it (Prometheus does), else the Prometheus text
/// format (curl, `promtool check metrics`).
async fn metrics_handler(
    State(state): State<AdminState>,
    headers: axum::http::HeaderMap,
) -> impl IntoResponse {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|value| value.to_str().ok());
    let format = Format::negotiate(accept);
    (
        [(header::CONTENT_TYPE, format.content_type())],
        state.metrics.encode_as(format),
    )
}

async fn livez_handler() -> &'static str {
    "ok\n"
}

async fn readyz_handler(State(state): State<AdminState>) -> (StatusCode, &'static str) {
    if state.health.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting\n")
    }
}

/// Serves until `shutdown` is cancelled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Metrics,
    health: Health,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/livez", get(livez_handler))
        .route("/readyz", get(readyz_handler))
        .with_state(AdminState { metrics, health });
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}
