#!/usr/bin/env bash
# The local lab: installs and builds what is missing (Debian packages, the Go-built
# kube-apiserver/etcd/headscale/tailscaled/..., the Rust binaries), then starts a real control
# plane, test kubelet, kube-proxy, CoreDNS, Headscale and a remote site behind a subnet router
# in network namespaces, runs the operator, applies the example Tailnet and TailnetEgress and
# shows a pod's bytes crossing the tailnet. Needs root. Ctrl-C stops it and cleans up.
# `scripts/lab.sh --bare` starts only the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup installs cargo here; a non-login shell may not have it on PATH.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/install-system-packages.sh
bash deps/build.sh all
cargo build --workspace --bins --locked
exec target/debug/tno-lab "$@"
