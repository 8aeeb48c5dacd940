//! The Kubernetes side of the real test environment (SPEC §9): etcd, kube-apiserver,
//! kube-controller-manager, a test kubelet, kube-proxy (nftables) and CoreDNS, wired into the
//! network lab of [`tno_netlab`]. See `crates/testenv/README.md` ("Kubernetes side").

pub mod binaries;
pub mod control_plane;
pub mod crds;
pub mod env;
mod error;
pub mod http_backend;
pub mod kubelet;
pub mod network;
pub mod oci_registry;
pub mod pki;
pub mod process;
pub mod registry_auth;

pub use env::{KubeEnv, KubeEnvOptions, TestNamespace, shared, shared_with};
pub use error::{Error, Result, error_chain};
