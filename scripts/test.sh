#!/usr/bin/env bash
# Runs every check and test of the project, as CI does (.ci/run calls this script).
# Installs what it needs on a fresh machine: Debian packages, the Go-built third-party
# binaries (cached outside the work tree, see deps/README.md), then runs formatting,
# lints, the generated-files check and all tests.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "system packages"
bash scripts/install-system-packages.sh

step "static checks: rustfmt, clippy"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings

step "tests (unit, CLI, generated-files drift)"
cargo test --workspace --locked --exclude tno-testenv-kube --exclude tno-testenv-tailnet --exclude tno-netlab

step "done"
