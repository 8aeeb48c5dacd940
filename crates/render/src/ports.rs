//! Stable allocation of the agent's egress listener ports.

use std::collections::{BTreeMap, BTreeSet};

use tailnet_api::agent_config::{ADMIN_PORT, FIRST_EGRESS_PORT};

/// Gives each target name a listener port. Ports already allocated (from the resource's
/// status) are kept, so adding or removing a target never moves the others; new targets get
/// the lowest free port from [`FIRST_EGRESS_PORT`] in name order.
pub fn allocate(names: &[&str], previous: &BTreeMap<String, u16>) -> BTreeMap<String, u16> {
    let mut sorted: Vec<&str> = names.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut taken = BTreeSet::from([ADMIN_PORT]);
    let mut allocated = BTreeMap::new();
    for name in &sorted {
        if let Some(&port) = previous.get(*name)
            && port >= FIRST_EGRESS_PORT
            && taken.insert(port)
        {
            allocated.insert(name.to_string(), port);
        }
    }
    let mut next = FIRST_EGRESS_PORT;
    for name in sorted {
        if allocated.contains_key(name) {
            continue;
        }
        while taken.contains(&next) {
            next = next.saturating_add(1);
        }
        taken.insert(next);
        allocated.insert(name.to_string(), next);
    }
    allocated
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_targets_get_lowest_free_ports_in_name_order() {
        let ports = allocate(&["remote-db", "remote-api"], &BTreeMap::new());
        assert_eq!(ports["remote-api"], 10000);
        assert_eq!(ports["remote-db"], 10001);
    }

    #[test]
    fn existing_allocations_are_kept() {
        let previous = BTreeMap::from([("remote-db".to_string(), 10001u16)]);
        let ports = allocate(&["aaa", "remote-db"], &previous);
        assert_eq!(ports["remote-db"], 10001);
        assert_eq!(ports["aaa"], 10000);
        // Removing a target frees its port without moving others.
        let ports = allocate(&["remote-db"], &ports);
        assert_eq!(ports.len(), 1);
        assert_eq!(ports["remote-db"], 10001);
    }

    #[test]
    fn duplicate_previous_ports_are_reallocated() {
        let previous = BTreeMap::from([("a".to_string(), 10000u16), ("b".to_string(), 10000u16)]);
        let ports = allocate(&["a", "b"], &previous);
        assert_ne!(ports["a"], ports["b"]);
    }
}
