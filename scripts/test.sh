#!/usr/bin/env bash
# Runs every check and test of the project, as CI does (.ci/run calls this script).
# On a fresh machine it installs what it needs: Debian packages, the Go-built third-party
# binaries (kube-apiserver, etcd, headscale, tailscaled, ... cached outside the work tree,
# see deps/README.md), then checks formatting, lints, generated files and runs all tests —
# unit tests and the tests against the real apiserver, Headscale and tailscale nodes
# (those need root for network namespaces).
set -euo pipefail
cd "$(dirname "$0")/.."
# rustup installs cargo here; a non-login shell may not have it on PATH.
command -v cargo >/dev/null || export PATH="$HOME/.cargo/bin:$PATH"

step() { printf '\n==> %s (%s)\n' "$*" "$(date -u +%H:%M:%S)"; }
started=$(date +%s)

step "system packages"
bash scripts/install-system-packages.sh

step "third-party binaries (deps/build.sh; cached in ${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps})"
bash deps/build.sh all

step "static checks: rustfmt, clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "dependencies: cargo deny (licenses, bans, sources; advisories need GitHub, see deny.toml)"
command -v cargo-deny >/dev/null || cargo install cargo-deny --locked
cargo deny check licenses bans sources

step "fuzzing: 20 s per cargo-fuzz target (scripts/fuzz.sh --long for long runs)"
bash scripts/fuzz.sh

step "Helm chart and monitoring rules (helm lint, promtool check/test rules)"
DEPS_ENV=$(bash deps/build.sh --print-env)
HELM=$(sed -n 's/^TNO_BIN_HELM=//p' <<<"$DEPS_ENV")
PROMTOOL=$(sed -n 's/^TNO_BIN_PROMTOOL=//p' <<<"$DEPS_ENV")
"$HELM" lint --strict charts/tailnet-operator
"$PROMTOOL" check rules charts/tailnet-operator/files/prometheus-rules.yaml
"$PROMTOOL" test rules charts/tailnet-operator/tests/prometheus-rules.test.yaml
# helm template + server-side dry-run + RBAC table: crates/testenv/e2e/tests/helm_chart.rs

step "build binaries (the test kubelet runs the freshly built tailnet-agent)"
cargo build --workspace --bins --locked

step "tests: unit, CLI, generated files, real apiserver/Headscale/tailscale"
# The real-environment tests must not skip themselves when binaries are missing.
TNO_REQUIRE_REAL_ENV=1 cargo test --workspace --locked

step "done in $(( $(date +%s) - started ))s"
