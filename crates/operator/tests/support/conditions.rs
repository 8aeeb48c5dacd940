//! The status conditions of the operator's objects: reading them, describing them for a
//! failure message, waiting for one.

use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use serde::de::DeserializeOwned;
use tailnet_api::{Tailnet, TailnetEgress, TailnetIngress};
use tno_testenv::OperatorProcess;

use super::wait::{WAIT, eventually};

pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// One `Type=Status/Reason: message` line per condition.
pub fn describe(conditions: &[Condition]) -> String {
    conditions
        .iter()
        .map(|c| format!("{}={}/{}: {}", c.type_, c.status, c.reason, c.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A Tailnet, TailnetEgress or TailnetIngress, through its status conditions.
pub trait WithConditions {
    fn conditions(&self) -> &[Condition];

    /// The status fields besides the conditions that explain a failure (none by default).
    fn status_summary(&self) -> String {
        String::new()
    }

    fn condition(&self, type_: &str) -> Option<&Condition> {
        find(self.conditions(), type_)
    }

    /// The message of condition `type_` (empty when it is not set).
    fn condition_message(&self, type_: &str) -> String {
        self.condition(type_)
            .map(|c| c.message.clone())
            .unwrap_or_default()
    }

    /// The conditions and the status summary, for a failure message.
    fn describe(&self) -> String {
        let summary = self.status_summary();
        let conditions = describe(self.conditions());
        if summary.is_empty() {
            conditions
        } else {
            format!("{conditions}\n{summary}")
        }
    }
}

impl WithConditions for Tailnet {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
}

impl WithConditions for TailnetEgress {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }

    fn status_summary(&self) -> String {
        let targets = self.status.as_ref().map(|s| &s.targets);
        format!("targets: {targets:?}")
    }
}

impl WithConditions for TailnetIngress {
    fn conditions(&self) -> &[Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }

    fn status_summary(&self) -> String {
        let status = self.status.clone().unwrap_or_default();
        format!(
            "hostnames {:?} ips {:?}",
            status.hostnames, status.tailnet_ips
        )
    }
}

/// A condition a test waits for: `type_` with `status`, and `reason` when one is given.
#[derive(Clone, Copy, Debug)]
pub struct ConditionIs<'a> {
    type_: &'a str,
    status: &'a str,
    reason: Option<&'a str>,
}

impl<'a> ConditionIs<'a> {
    /// `type_` has `status`, whatever the reason.
    pub fn new(type_: &'a str, status: &'a str) -> ConditionIs<'a> {
        ConditionIs {
            type_,
            status,
            reason: None,
        }
    }

    /// ... and this reason too.
    pub fn reason(self, reason: &'a str) -> ConditionIs<'a> {
        ConditionIs {
            reason: Some(reason),
            ..self
        }
    }

    pub fn holds_for(&self, object: &impl WithConditions) -> bool {
        object.condition(self.type_).is_some_and(|c| {
            c.status == self.status && self.reason.is_none_or(|reason| c.reason == reason)
        })
    }
}

impl fmt::Display for ConditionIs<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.type_, self.status)?;
        if let Some(reason) = self.reason {
            write!(f, "/{reason}")?;
        }
        Ok(())
    }
}

/// Polls object `name` until `expected` holds; the timeout error shows its conditions and,
/// when `operator` is given, the tail of that operator's log.
pub async fn condition_becomes<K>(
    api: &Api<K>,
    name: &str,
    expected: ConditionIs<'_>,
    timeout: Duration,
    operator: Option<&OperatorProcess>,
) -> Result<K, String>
where
    K: WithConditions + kube::Resource + Clone + DeserializeOwned + fmt::Debug,
{
    eventually(&format!("{name} {expected}"), timeout, || async {
        let object = api.get(name).await.map_err(|e| e.to_string())?;
        if expected.holds_for(&object) {
            return Ok(object);
        }
        Err(match operator {
            Some(operator) => format!(
                "{}\n--- operator ---\n{}",
                object.describe(),
                operator.log_tail(15)
            ),
            None => object.describe(),
        })
    })
    .await
}

/// [`condition_becomes`] within [`WAIT`], failing the test when it times out.
pub async fn wait_for_condition<K>(
    api: &Api<K>,
    name: &str,
    expected: ConditionIs<'_>,
    operator: Option<&OperatorProcess>,
) -> K
where
    K: WithConditions + kube::Resource + Clone + DeserializeOwned + fmt::Debug,
{
    condition_becomes(api, name, expected, WAIT, operator)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
