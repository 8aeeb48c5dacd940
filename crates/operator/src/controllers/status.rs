//! The one status toolkit of the three controllers (pure): a condition set with stable
//! `lastTransitionTime`, `Ready` derived from the required conditions, and problems as typed
//! values (a reason constant from `tailnet_api::conditions::reasons` plus a message).
//! Writing the status and the transition Events is `publish.rs`.

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::Serialize;
use tailnet_api::conditions::{self, Status};

/// A status with conditions (every kind's status type; what `publish.rs` writes).
pub trait WithConditions: Clone + PartialEq + Serialize {
    fn conditions(&self) -> &[Condition];
    fn conditions_mut(&mut self) -> &mut Vec<Condition>;
    /// Clears fields that record when something was read (they change on every read, so a
    /// status compare that included them would write, and be triggered by its own write, on
    /// every reconcile). None by default.
    fn clear_read_times(&mut self) {}
}

impl WithConditions for tailnet_api::egress::TailnetEgressStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

impl WithConditions for tailnet_api::ingress::TailnetIngressStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
}

/// A Service's status (kind `service`: a Service of the tailnet `loadBalancerClass`).
impl WithConditions for k8s_openapi::api::core::v1::ServiceStatus {
    fn conditions(&self) -> &[Condition] {
        self.conditions.as_deref().unwrap_or_default()
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        self.conditions.get_or_insert_with(Vec::new)
    }
}

impl WithConditions for tailnet_api::tailnet::TailnetStatus {
    fn conditions(&self) -> &[Condition] {
        &self.conditions
    }
    fn conditions_mut(&mut self) -> &mut Vec<Condition> {
        &mut self.conditions
    }
    /// `status.contributors[].lastRead`: set to now on every read of a contributor.
    fn clear_read_times(&mut self) {
        for contributor in &mut self.contributors {
            contributor.last_read = None;
        }
    }
}

/// Why a condition is not `True`: a CamelCase reason constant and a message that says what
/// to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub reason: &'static str,
    pub message: String,
}

impl Problem {
    pub fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Problem {
            reason,
            message: message.into(),
        }
    }

    /// A Headscale client error as a problem (its reason is one of
    /// `reasons::headscale::ALL`).
    pub fn headscale(error: &tailnet_headscale::Error, message: impl Into<String>) -> Self {
        Problem::new(error.reason(), message)
    }
}

/// The conditions of one object being decided: starts from the previous list so that
/// transition times stay stable while a condition's status does not change.
#[derive(Clone, Debug)]
pub struct ConditionSet {
    list: Vec<Condition>,
    generation: Option<i64>,
    now: Time,
}

impl ConditionSet {
    pub fn new(previous: &[Condition], generation: Option<i64>, now: Timestamp) -> Self {
        ConditionSet {
            list: previous.to_vec(),
            generation,
            now: Time(now),
        }
    }

    pub fn set(&mut self, type_: &str, status: Status, reason: &str, message: impl Into<String>) {
        let condition = conditions::condition(type_, status, reason, message, self.generation);
        conditions::upsert(&mut self.list, condition, &self.now);
    }

    /// `type_` holds.
    pub fn ok(&mut self, type_: &str, reason: &str, message: impl Into<String>) {
        self.set(type_, Status::True, reason, message);
    }

    /// `type_` does not hold, because of `problem`.
    pub fn fail(&mut self, type_: &str, problem: Problem) {
        self.set(type_, Status::False, problem.reason, problem.message);
    }

    /// `type_` cannot be observed, because of `problem`.
    pub fn unknown(&mut self, type_: &str, problem: Problem) {
        self.set(type_, Status::Unknown, problem.reason, problem.message);
    }

    pub fn remove(&mut self, type_: &str) {
        self.list.retain(|c| c.type_ != type_);
    }

    pub fn get(&self, type_: &str) -> Option<&Condition> {
        conditions::find(&self.list, type_)
    }

    /// The list as it is, without deriving `Ready` (for objects the controller does not
    /// honour, whose `Ready` was set directly).
    pub fn into_list(self) -> Vec<Condition> {
        self.list
    }

    /// Adds `Ready` and returns the list. `Ready` follows `required` in order (the first one
    /// that is not `True` names the missing precondition), plus each of `observed_if_known`
    /// once it has been observed (not `Unknown`): an unobserved reachability does not block
    /// `Ready`, an observed failure does.
    pub fn finish(mut self, required: &[&str], observed_if_known: &[&str]) -> Vec<Condition> {
        let mut all = required.to_vec();
        for type_ in observed_if_known {
            if self.get(type_).is_some_and(|c| c.status != "Unknown") {
                all.push(type_);
            }
        }
        let ready = conditions::ready_from(&self.list, &all, self.generation);
        conditions::upsert(&mut self.list, ready, &self.now);
        self.list
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tailnet_api::conditions::{reasons, types};

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).expect("timestamp")
    }

    #[test]
    fn transition_time_stays_while_the_status_stays() {
        let mut first = ConditionSet::new(&[], Some(1), at(10));
        first.ok(types::AGENT_READY, reasons::READY, "ready");
        let list = first.finish(&[types::AGENT_READY], &[]);
        let mut second = ConditionSet::new(&list, Some(2), at(20));
        second.ok(types::AGENT_READY, reasons::READY, "still ready");
        second.fail(
            types::NODE_ONLINE,
            Problem::new(reasons::NODE_OFFLINE, "off"),
        );
        let list = second.finish(&[types::AGENT_READY, types::NODE_ONLINE], &[]);
        let agent = conditions::find(&list, types::AGENT_READY).expect("agent");
        assert_eq!(agent.last_transition_time.0, at(10));
        assert_eq!(agent.observed_generation, Some(2));
        let ready = conditions::find(&list, types::READY).expect("ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reasons::NODE_OFFLINE)
        );
        assert_eq!(ready.last_transition_time.0, at(20));
    }

    #[test]
    fn unobserved_optional_conditions_do_not_block_ready() {
        let mut set = ConditionSet::new(&[], None, at(1));
        set.ok(types::AGENT_READY, reasons::READY, "ready");
        set.unknown(
            types::TARGETS_REACHABLE,
            Problem::new(reasons::NOT_OBSERVED, "no report"),
        );
        let list = set.finish(&[types::AGENT_READY], &[types::TARGETS_REACHABLE]);
        let ready = conditions::find(&list, types::READY).expect("ready");
        assert_eq!(ready.status, "True");
        let mut set = ConditionSet::new(&list, None, at(2));
        set.fail(
            types::TARGETS_REACHABLE,
            Problem::new(reasons::TIMEOUT, "db: timeout"),
        );
        let list = set.finish(&[types::AGENT_READY], &[types::TARGETS_REACHABLE]);
        let ready = conditions::find(&list, types::READY).expect("ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Timeout")
        );
    }

    #[test]
    fn removed_conditions_are_gone() {
        let mut set = ConditionSet::new(&[], None, at(1));
        set.fail(
            types::SPEC_VALID,
            Problem::new(reasons::INVALID_SPEC, "bad"),
        );
        set.remove(types::SPEC_VALID);
        assert!(set.get(types::SPEC_VALID).is_none());
    }
}
