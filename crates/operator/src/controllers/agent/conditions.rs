//! The conditions every agent-backed kind shares, decided from observed data (pure):
//! `TailnetReady`, `NodeOnline`, `AgentReady`, `PolicyEffective` and reachability.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use kube::ResourceExt;
use tailnet_api::Tailnet;
use tailnet_api::agent_status::{ProbeState, ProbeView};
use tailnet_api::conditions::{self, reasons, types};
use tailnet_api::tailnet::PolicyMode;
use tailnet_headscale::Node;

use super::super::status::{ConditionSet, Problem};
use super::identity::{Identity, KeyState, tag_shared};
use super::observation::{NodeList, TailnetView};

/// The conditions of a spec that does not validate: `SpecValid=False` naming every field,
/// and `Ready` from it alone (nothing else is decided; the last good configuration stays).
pub fn invalid_spec(
    previous: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    generation: Option<i64>,
    errors: &[tailnet_api::validate::FieldError],
    now: jiff::Timestamp,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let mut c = ConditionSet::new(previous, generation, now);
    c.fail(
        types::SPEC_VALID,
        Problem::new(
            reasons::INVALID_SPEC,
            format!(
                "{}; the last valid configuration stays applied",
                tailnet_api::validate::summarize(errors)
            ),
        ),
    );
    c.finish(&[types::SPEC_VALID], &[])
}

/// `TailnetReady` from the Tailnet and its Headscale client.
pub fn tailnet_ready(c: &mut ConditionSet, access: &TailnetView) {
    let name = access.tailnet.name_any();
    match &access.headscale {
        Ok(_) => c.ok(
            types::TAILNET_READY,
            reasons::READY,
            format!("Tailnet {name} at {}", access.tailnet.spec.server),
        ),
        Err(problem) => c.fail(
            types::TAILNET_READY,
            Problem::new(
                problem.reason,
                format!("Tailnet {name}: {}", problem.message),
            ),
        ),
    }
}

/// `NodeOnline` from the agent's node (if any) and where its login stands.
pub fn node_online(c: &mut ConditionSet, nodes: &NodeList, node: Option<&Node>, key: &KeyState) {
    if let Err(problem) = nodes {
        c.unknown(types::NODE_ONLINE, problem.clone());
        return;
    }
    match (node, key) {
        (Some(n), _) if n.online => c.ok(
            types::NODE_ONLINE,
            reasons::ONLINE,
            format!(
                "node {} (id {}) is online at {}",
                n.given_name,
                n.id,
                n.ip_addresses.join(", ")
            ),
        ),
        (Some(n), _) => c.fail(
            types::NODE_ONLINE,
            Problem::new(
                reasons::NODE_OFFLINE,
                format!(
                    "node {} (id {}) is registered but offline; check the agent pod's tailscale container",
                    n.given_name, n.id
                ),
            ),
        ),
        (None, KeyState::NotDeployable) => c.fail(
            types::NODE_ONLINE,
            Problem::new(
                reasons::NODE_NOT_REGISTERED,
                "no agent is deployed while the problems in the other conditions remain; no pre-auth key is minted until then",
            ),
        ),
        (None, KeyState::Waiting { expires }) => c.fail(
            types::NODE_ONLINE,
            Problem::new(
                reasons::NODE_NOT_REGISTERED,
                format!("waiting for the agent to log in with its pre-auth key (valid until {expires})"),
            ),
        ),
        (None, KeyState::AwaitingOwner) => c.fail(
            types::NODE_ONLINE,
            Problem::new(
                reasons::AWAITING_OWNER_KEY,
                "this installation holds no Headscale key: the owner writes a single-use pre-auth key for this agent's tag into Secret <tailnet>-owner-keys once the tag is live in its policy (see the Tailnet's FragmentLive); the agent logs in then",
            ),
        ),
        // Not reached: a key state of NodeExists comes with a node.
        (None, KeyState::NodeExists) => {}
    }
}

/// The conditions of the identity: `NodeOnline`, `AgentReady` (the Deployment's pods) and a
/// tag shared with nodes that are not the agent's.
pub fn identity(
    c: &mut ConditionSet,
    identity: &Identity,
    nodes: &NodeList,
    deployment: Option<&Deployment>,
) {
    node_online(c, nodes, identity.node(), &identity.key_state);
    agent_ready(c, deployment);
    let foreign: Vec<&Node> = identity.foreign.iter().collect();
    tag_shared(c, &identity.tag, &foreign, identity.node().is_some());
}

/// `AgentReady`: whether the agent Deployment has an available pod, else what is missing.
pub fn agent_ready(c: &mut ConditionSet, deployment: Option<&Deployment>) {
    let Some(d) = deployment else {
        c.fail(
            types::AGENT_READY,
            Problem::new(
                reasons::AGENT_NOT_READY,
                "the agent Deployment does not exist yet",
            ),
        );
        return;
    };
    let status = d.status.clone().unwrap_or_default();
    if status.available_replicas.unwrap_or(0) >= 1 {
        c.ok(types::AGENT_READY, reasons::READY, "the agent pod is ready");
        return;
    }
    let why = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .filter(|c| c.status != "True")
        .filter_map(|c| c.message)
        .next()
        .unwrap_or_else(|| {
            "waiting for the agent pod to become ready (see its tailscale and tailnet-agent containers)"
                .to_string()
        });
    c.fail(
        types::AGENT_READY,
        Problem::new(reasons::AGENT_NOT_READY, why),
    );
}

/// Reasons of the Tailnet's `PolicyApplied` that are passed on to `PolicyEffective`.
fn passed_on_reason(reason: &str) -> Option<&'static str> {
    [
        reasons::DRY_RUN,
        reasons::REJECTED,
        reasons::OWNED_ELSEWHERE,
        reasons::BASE_INVALID,
        reasons::HEADSCALE_UNREACHABLE,
    ]
    .into_iter()
    .chain(reasons::headscale::ALL.iter().copied())
    .find(|known| *known == reason)
}

/// `PolicyEffective` from the Tailnet's view of which grants are live. `blocked` is a
/// problem of the resource's own that prevents any grant (e.g. `SourceNotAllowed`).
pub fn policy_effective(
    c: &mut ConditionSet,
    tailnet: &Tailnet,
    resource_key: &str,
    live_message: &str,
    blocked: Option<Problem>,
) {
    let status = tailnet.status.clone().unwrap_or_default();
    if status
        .policy
        .as_ref()
        .is_some_and(|p| p.effective_for.iter().any(|k| k == resource_key))
    {
        c.ok(types::POLICY_EFFECTIVE, reasons::READY, live_message);
        return;
    }
    let name = tailnet.name_any();
    let applied = conditions::find(&status.conditions, types::POLICY_APPLIED);
    let problem = match (blocked, tailnet.spec.policy.mode, applied) {
        (Some(problem), _, _) => problem,
        (None, PolicyMode::DryRun, _) => Problem::new(
            reasons::DRY_RUN,
            format!("Tailnet {name} is in DryRun: grants are rendered but not written"),
        ),
        (None, PolicyMode::Contribute, _) => Problem::new(
            reasons::CONTRIBUTING,
            format!(
                "Tailnet {name} contributes its grants (ConfigMap {name}-policy-fragment) to the installation that owns the policy: they are not live there yet (see the Tailnet's FragmentLive)"
            ),
        ),
        (None, _, Some(a)) if a.status != "True" => Problem::new(
            passed_on_reason(&a.reason).unwrap_or(reasons::NOT_EFFECTIVE),
            format!("Tailnet {name}: {}", a.message),
        ),
        _ => Problem::new(
            reasons::NOT_EFFECTIVE,
            "the grants are not live in Headscale yet",
        ),
    };
    c.fail(types::POLICY_EFFECTIVE, problem);
}

/// Sets a reachability condition (`TargetsReachable`/`BackendsReachable`) from the agent's
/// probe views (`None`: the agent's report could not be read). Returns the probe per name.
pub fn reachability(
    c: &mut ConditionSet,
    type_: &str,
    report: Option<&[ProbeView]>,
) -> BTreeMap<String, ProbeView> {
    let Some(probes) = report else {
        c.unknown(
            type_,
            Problem::new(
                reasons::NOT_OBSERVED,
                "the agent's /status could not be read (pod not running, or not reachable from the operator)",
            ),
        );
        return BTreeMap::new();
    };
    let failing: Vec<_> = probes
        .iter()
        .filter(|p| !matches!(p.state, ProbeState::Reachable | ProbeState::Unknown))
        .collect();
    match failing.first() {
        Some(first) => {
            let list: Vec<String> = failing
                .iter()
                .map(|p| {
                    format!(
                        "{} ({}): {} {}",
                        p.name,
                        p.address,
                        p.state.label(),
                        p.message
                    )
                    .trim()
                    .to_string()
                })
                .collect();
            c.fail(type_, Problem::new(first.state.label(), list.join("; ")));
        }
        None if probes.iter().all(|p| p.state == ProbeState::Unknown) => c.unknown(
            type_,
            Problem::new(
                reasons::NOT_PROBED_YET,
                "no probe result yet (or probing is switched off)",
            ),
        ),
        None => c.ok(type_, reasons::REACHABLE, "every probed address answers"),
    }
    probes.iter().map(|p| (p.name.clone(), p.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    fn probe(name: &str, state: ProbeState) -> ProbeView {
        ProbeView {
            name: name.into(),
            address: "192.0.2.10:5432".into(),
            state,
            message: String::new(),
            last_probe: None,
        }
    }

    fn set() -> ConditionSet {
        ConditionSet::new(&[], Some(1), Timestamp::UNIX_EPOCH)
    }

    #[test]
    fn reachability_names_the_first_failing_cause() {
        let mut c = set();
        reachability(
            &mut c,
            types::TARGETS_REACHABLE,
            Some(&[
                probe("db", ProbeState::Reachable),
                probe("api", ProbeState::NoRoute),
            ]),
        );
        let cond = c.get(types::TARGETS_REACHABLE).expect("condition");
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "NoRoute")
        );
        assert!(cond.message.starts_with("api (192.0.2.10:5432): NoRoute"));
        let mut c = set();
        reachability(&mut c, types::TARGETS_REACHABLE, None);
        assert_eq!(
            c.get(types::TARGETS_REACHABLE).map(|x| x.status.as_str()),
            Some("Unknown")
        );
    }

    #[test]
    fn deployment_without_status_is_not_ready() {
        let mut c = set();
        agent_ready(&mut c, None);
        assert_eq!(
            c.get(types::AGENT_READY).map(|x| x.status.as_str()),
            Some("False")
        );
        agent_ready(&mut c, Some(&Deployment::default()));
        assert_eq!(
            c.get(types::AGENT_READY).map(|x| x.reason.as_str()),
            Some(reasons::AGENT_NOT_READY)
        );
    }

    #[test]
    fn unknown_tailnet_reasons_are_not_passed_on() {
        assert_eq!(passed_on_reason("Rejected"), Some(reasons::REJECTED));
        assert_eq!(
            passed_on_reason("Timeout"),
            Some(reasons::headscale::TIMEOUT)
        );
        assert_eq!(passed_on_reason("SomethingNew"), None);
    }
}
