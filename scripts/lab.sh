#!/usr/bin/env bash
# The local lab: installs and builds what is missing (Debian packages, the Go-built programs the
# lab runs — kube-apiserver/etcd/headscale/tailscaled/CoreDNS/helm/crane/kube-router —, the
# Rust binaries and the product's images), then starts a real control plane, test kubelet,
# kube-proxy, CoreDNS, Headscale and a remote site behind a subnet router in network
# namespaces, and installs the product the way users do: the images (`cargo xtask images
# --profile lab`, daemon-less) and the chart pushed to the lab's OCI registry, `helm install`
# from there — the operator runs as a pod from its image, its agents from theirs. Then the demo:
# CoreDNS wired as docs/dns.md says, NetworkPolicies enforced (kube-router), examples/ applied
# (Tailnet in Apply mode, TailnetEgress, TailnetIngress with its backends), one egress
# connection (a pod's bytes → remote-db → tailnet → 192.0.2.10:5432), one HTTPS ingress request
# (the laptop node → https://portal.team-a.lab.example.net via MagicDNS), the same name from
# inside the cluster (a listed namespace answered, an unlisted one refused), the egress alias
# with its SNI, `kubectl get` of the resources, and the lockdown guard: a base without rules
# (allow-all) is refused in Apply while the live policy stays, then the demo's base comes back.
# Each phase prints its time ("[lab] <phase>: N s").
#
# Needs root. Ctrl-C stops it and cleans up. `--once` stops after the demo (exit code = result);
# `--bare` starts only the environment; `--dev` runs the operator as a local process from the
# workspace build instead of the chart (no image build); `--second-cluster` also starts a
# second cluster on the same Headscale and, with the demo, runs examples/second-cluster/ there
# (a contributor, its operator a process).
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup installs cargo here; a non-login shell may not have it on PATH.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"

# Cargo's output directory (CARGO_TARGET_DIR is honoured, relative to the repository root).
target_dir=${CARGO_TARGET_DIR:-target}
phase_started=$(date +%s)
phase() {
  local now
  now=$(date +%s)
  echo "[lab] $1: $((now - phase_started)) s" >&2
  phase_started=$now
}
dev=false
bare=false
for arg in "$@"; do
  case $arg in
    --dev) dev=true ;;
    --bare) bare=true ;;
  esac
done

bash scripts/install-system-packages.sh
phase "system packages"
# Only what the lab runs; scripts/test.sh builds the test-only tools (caddy, prometheus,
# actionlint).
bash deps/build.sh kubernetes etcd headscale tailscale coredns cert-manager cert-manager-controller helm crane kube-router
phase "third-party programs (deps/build.sh; cached in ${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps})"
echo "[lab] building the Rust binaries (first run: several minutes)…" >&2
cargo build --workspace --bins --locked
phase "Rust binaries (cargo build)"
if ! $dev && ! $bare; then
  musl_target="$(uname -m)-unknown-linux-musl"
  rustup target list --installed | grep -qx "$musl_target" || rustup target add "$musl_target"
  # Static binaries on an empty base, as releases (which use --profile release: LTO, slower).
  cargo xtask images --profile lab --out "$target_dir/lab-images"
  phase "images (cargo xtask images --profile lab)"
fi
exec "$target_dir/debug/tno-lab" --images "$target_dir/lab-images" "$@"
