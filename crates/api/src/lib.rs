//! CRD types (in progress).
