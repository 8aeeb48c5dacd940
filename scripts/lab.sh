#!/usr/bin/env bash
# The local lab: installs and builds what is missing (Debian packages, the Go-built
# kube-apiserver/etcd/headscale/tailscaled/..., the Rust binaries), then starts a real control
# plane, test kubelet, kube-proxy, CoreDNS, Headscale and a remote site behind a subnet router
# in network namespaces, runs the operator, applies examples/ (Tailnet in Apply mode,
# TailnetEgress, TailnetIngress with its backends), and shows one egress connection (a pod's
# bytes → remote-db → tailnet → 192.0.2.10:5432) and one HTTPS ingress request (the laptop node
# → https://portal.team-a.lab.example.net via MagicDNS), then `kubectl get` of the resources,
# and the lockdown guard: a base without rules (allow-all) is refused in Apply while the live
# policy stays (`kubectl describe tailnet demo`), then the demo's base comes back.
# Needs root. Ctrl-C stops it and cleans up. `--once` stops after the demo (exit code = result);
# `--bare` starts only the environment; `--second-cluster` also starts a second cluster on the
# same Headscale and, with the demo, runs examples/second-cluster/ there (a contributor).
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup installs cargo here; a non-login shell may not have it on PATH.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"
bash scripts/install-system-packages.sh
bash deps/build.sh all
echo "[lab] building the Rust binaries (first run: several minutes)…" >&2
cargo build --workspace --bins --locked
exec target/debug/tno-lab "$@"
