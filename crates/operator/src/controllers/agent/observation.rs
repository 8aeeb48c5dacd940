//! What the generic gather step observed about an agent-backed resource, as plain data (no
//! I/O here: `decide` reads these, `gather.rs` fills them).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use tailnet_api::Tailnet;
use tailnet_api::agent_status::StatusReport;
use tailnet_headscale::Node;

use jiff::Timestamp;

use super::super::status::Problem;

/// Headscale's node list as the gather step saw it (shared with other reconciles).
pub type NodeList = Result<Arc<Vec<Node>>, Problem>;

/// The Tailnet a resource references, and whether its Headscale server can be used (the
/// client itself stays with the gather and act steps).
#[derive(Clone, Debug)]
pub struct TailnetView {
    pub tailnet: Tailnet,
    pub headscale: Result<(), Problem>,
    /// The PEM bundle of `spec.serverCA` (given to the agents' tailscale containers).
    pub server_ca: Option<String>,
    /// A contributor without a Headscale key: the tags the owner wrote a pre-auth key for,
    /// and until when it is valid (`None`: this installation mints its own keys).
    pub owner_keys: Option<BTreeMap<String, Timestamp>>,
}

/// What the gather step knows of the agent's auth Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthSecret {
    /// Not read: this process removed it once the node existed, recently (see applied.rs).
    RemovedByUs,
    Absent,
    Present {
        key_id: Option<u64>,
        expires: Option<Timestamp>,
    },
}

/// The agent as observed: what every kind shares.
#[derive(Clone, Debug)]
pub struct AgentObserved {
    /// Headscale's node list (the agent's node, and e.g. the routes of approver nodes).
    pub nodes: NodeList,
    pub auth_secret: AuthSecret,
    pub deployment: Option<Deployment>,
    /// The agent's `/status` (probe results); `None` when it could not be read.
    pub report: Option<StatusReport>,
}

impl AgentObserved {
    /// Nothing observed (the Tailnet is not usable).
    pub fn unobserved() -> Self {
        AgentObserved {
            nodes: Err(nodes_unobservable()),
            auth_secret: AuthSecret::Absent,
            deployment: None,
            report: None,
        }
    }

    /// The node list, or none when it could not be read.
    pub fn listed_nodes(&self) -> &[Node] {
        self.nodes.as_deref().map_or(&[], |n| n)
    }
}

/// The problem to report when Headscale cannot be asked for nodes.
pub fn nodes_unobservable() -> Problem {
    Problem::new(
        tailnet_api::conditions::reasons::HEADSCALE_UNREACHABLE,
        "cannot observe the node (see TailnetReady)",
    )
}

/// What one reconcile of a resource of kind `O` (the kind's own observation) observed.
#[derive(Clone, Debug)]
pub struct Observation<O> {
    /// The Tailnet, or why `TailnetReady` is False. When this is an error, nothing below was
    /// read.
    pub access: Result<TailnetView, Problem>,
    pub agent: AgentObserved,
    /// What the kind's own gather step read.
    pub kind: O,
}

impl<O: Default> Observation<O> {
    /// Only the Tailnet (or its problem); nothing else read.
    pub fn only_access(access: Result<TailnetView, Problem>) -> Self {
        Observation {
            access,
            agent: AgentObserved::unobserved(),
            kind: O::default(),
        }
    }
}
