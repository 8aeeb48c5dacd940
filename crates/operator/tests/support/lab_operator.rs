//! This crate's operator binary run in the e2e lab, as the Deployment's pod would run it.

use std::path::Path;
use std::time::Duration;

use tno_testenv::{E2eEnv, OperatorProcess};

/// How long the operator may take from start to answering `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the operator with `args` (see [`tno_testenv::OperatorArgs`]) and waits until it is
/// ready. With `kubeconfig`, it uses that instead of the lab's admin kubeconfig.
pub async fn start_operator(
    env: &E2eEnv,
    args: &[String],
    kubeconfig: Option<&Path>,
) -> Result<OperatorProcess, String> {
    let binary = Path::new(env!("CARGO_BIN_EXE_tailnet-operator"));
    let started = match kubeconfig {
        Some(kubeconfig) => {
            env.start_operator_with_kubeconfig(binary, args, kubeconfig)
                .await
        }
        None => env.start_operator(binary, args).await,
    };
    let mut operator = started.map_err(|e| format!("start: {e}"))?;
    operator
        .wait_ready(READY_TIMEOUT)
        .await
        .map_err(|e| format!("not ready: {e}"))?;
    Ok(operator)
}

/// The operator's reconcile count of one controller (`ingress`, `egress`, `tailnet` …) from
/// its `/metrics`. A failed scrape or a missing series fails the test: a witness built from
/// two such reads must not pass on a pair of zeros.
pub async fn reconciles(operator: &OperatorProcess, controller: &str) -> f64 {
    let series = format!("tailnet_operator_reconciles_total{{controller=\"{controller}\"}}");
    let text = operator
        .metrics()
        .await
        .unwrap_or_else(|e| panic!("scraping the operator's metrics: {e}"));
    text.lines()
        .find(|line| line.starts_with(&series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no sample {series} in the operator's metrics:\n{text}"))
}
