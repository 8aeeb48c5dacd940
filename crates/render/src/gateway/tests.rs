//! Table tests of the Gateway decision, one per spec rule.
