//! The installation's role for its Tailnet (pure), decided once from `spec.policy`: the
//! owner writes Headscale's policy, a contributor only publishes its fragment. Every step
//! that differs between the two branches on this, once.

use tailnet_api::conditions::types;
use tailnet_api::tailnet::{Contributor, PolicyMode, TailnetPolicy};

/// Conditions that must hold for `Ready`, in the order of their dependencies.
pub const REQUIRED: [&str; 4] = [
    types::HEADSCALE_REACHABLE,
    types::BASE_VALID,
    types::POLICY_APPLIED,
    types::DNS_RENDERED,
];
/// The same for `mode: Contribute`: the fragment live in the owner's policy instead.
pub const REQUIRED_CONTRIBUTING: [&str; 4] = [
    types::HEADSCALE_REACHABLE,
    types::BASE_VALID,
    types::FRAGMENT_LIVE,
    types::DNS_RENDERED,
];

/// What this installation is for its Tailnet.
#[derive(Clone, Debug, PartialEq)]
pub enum Role {
    /// `mode: DryRun | Apply`: its base policy, with its own entries and its contributors'
    /// accepted fragments, is the policy Headscale enforces.
    Owner {
        /// Whether the rendered policy is written (and routes approved) or only compared.
        mode: OwnerMode,
        /// `policy.contributors`, in the order their entries are checked.
        contributors: Vec<Contributor>,
    },
    /// `mode: Contribute`: another installation owns the policy. This one renders its own
    /// entries on an empty base (the owner's base is the owner's business) and publishes
    /// them as a fragment; nothing goes to Headscale (no policy, no route approvals).
    Contributor,
}

/// How the owner treats Headscale's policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OwnerMode {
    /// Render and compare, never write.
    DryRun,
    /// Write the rendered policy and approve routes.
    Apply,
}

impl Role {
    pub fn of(policy: &TailnetPolicy) -> Self {
        let mode = match policy.mode {
            PolicyMode::Contribute => return Role::Contributor,
            PolicyMode::DryRun => OwnerMode::DryRun,
            PolicyMode::Apply => OwnerMode::Apply,
        };
        Role::Owner {
            mode,
            contributors: policy.contributors.clone(),
        }
    }

    /// The contributors whose fragments are read and merged (none for a contributor).
    pub fn contributors(&self) -> &[Contributor] {
        match self {
            Role::Owner { contributors, .. } => contributors,
            Role::Contributor => &[],
        }
    }

    /// The conditions `Ready` follows.
    pub fn required(&self) -> &'static [&'static str] {
        match self {
            Role::Owner { .. } => &REQUIRED,
            Role::Contributor => &REQUIRED_CONTRIBUTING,
        }
    }
}
