//! The lab's "no surprise lockdown" step: the demo Tailnet (Apply) gets a base with neither
//! `acls` nor `grants` — Headscale's allow-all — and the operator must refuse to apply the
//! rendered document (`PolicyApplied=False/WouldLockDown`) while the live policy stays byte for
//! byte. The demo's base comes back afterwards and is applied again.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use tno_testenv::E2eEnv;

use crate::install::DemoOperator;
use crate::{OPERATOR_NAMESPACE, print_kubectl, tailnet_resource};

/// The demo's base without its rules (and without `tests`, which assert rule-based access):
/// groups and tag owners only.
fn ruleless(base: &str) -> Result<String, String> {
    let mut policy: serde_json::Value =
        serde_json::from_str(base).map_err(|e| format!("the demo base policy: {e}"))?;
    let object = policy
        .as_object_mut()
        .ok_or("the demo base policy is not an object")?;
    for key in ["acls", "grants", "tests"] {
        object.remove(key);
    }
    serde_json::to_string_pretty(&policy).map_err(|e| e.to_string())
}

async fn set_base(client: &kube::Client, text: &str) -> Result<(), String> {
    let config_map = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": tno_testenv::BASE_POLICY_CONFIG_MAP, "namespace": OPERATOR_NAMESPACE},
        "data": {tno_testenv::BASE_POLICY_KEY: text},
    });
    Api::<ConfigMap>::namespaced(client.clone(), OPERATOR_NAMESPACE)
        .patch(
            tno_testenv::BASE_POLICY_CONFIG_MAP,
            &PatchParams::apply("tno-lab").force(),
            &Patch::Apply(&config_map),
        )
        .await
        .map(|_| ())
        .map_err(|e| format!("base policy ConfigMap: {e}"))
}

/// Waits until the demo Tailnet's `PolicyApplied` has `reason`; returns its message.
async fn policy_applied(client: &kube::Client, reason: &str) -> Result<String, String> {
    let tailnets: Api<DynamicObject> =
        Api::all_with(client.clone(), &tailnet_resource("Tailnet", "tailnets"));
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let tailnet = tailnets.get("demo").await.map_err(|e| e.to_string())?;
        let conditions = tailnet.data["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let applied = conditions.iter().find(|c| c["type"] == "PolicyApplied");
        if let Some(c) = applied.filter(|c| c["reason"] == reason) {
            return Ok(c["message"].as_str().unwrap_or_default().to_string());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "Tailnet demo: PolicyApplied never became {reason}; last: {applied:?}"
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The operator's refused syncs of the demo Tailnet (`…policy_syncs_total{result="would_lock_down"}`).
async fn refused_syncs(operator: &DemoOperator) -> f64 {
    operator
        .metric(r#"tailnet_operator_policy_syncs_total{tailnet="demo",result="would_lock_down"}"#)
        .await
        .unwrap_or(0.0)
}

/// The step itself (see the module comment).
pub async fn demo(
    env: &E2eEnv,
    client: &kube::Client,
    operator: &DemoOperator,
) -> Result<(), String> {
    let headscale = env.headscale_api();
    let live_before = headscale.get_policy().await.map_err(|e| e.to_string())?;
    let base = env.base_policy().map_err(|e| e.to_string())?;
    println!(
        "\ndemo: the base policy loses its rules (Headscale's allow-all) while the Tailnet is in Apply …"
    );
    set_base(client, &ruleless(&base)?).await?;
    let message = policy_applied(client, "WouldLockDown").await?;
    println!("demo:   PolicyApplied=False WouldLockDown: {message}");
    // Positive witness that the operator went on judging the rule-less base: two more refused
    // syncs counted after the condition; only then the live policy is compared.
    let first = refused_syncs(operator).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    while refused_syncs(operator).await < first + 2.0 {
        if Instant::now() > deadline {
            return Err("the operator stopped re-judging the rule-less base".into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let live_during = headscale.get_policy().await.map_err(|e| e.to_string())?;
    if live_during != live_before {
        return Err("the live policy changed although the operator refused the lockdown".into());
    }
    println!(
        "demo: OK — lockdown refused: the live policy is unchanged ({} bytes, {} refused syncs)",
        live_during.len(),
        refused_syncs(operator).await
    );
    print_kubectl(env, &["describe", "tailnet", "demo"]);
    set_base(client, &base).await?;
    policy_applied(client, "Applied").await?;
    println!("demo: the demo's base with its rules is back (PolicyApplied=True Applied)");
    Ok(())
}
