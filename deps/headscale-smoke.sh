#!/usr/bin/env bash
# deps/headscale-smoke.sh — prove the built headscale really runs: start it on
# loopback with the minimal config documented in deps/README.md (sqlite,
# policy mode database, embedded DERP), create a user and an API key with the
# CLI, call the REST API with that key, then stop it.
#   deps/headscale-smoke.sh [path/to/headscale]   (default: from deps/build.sh --print-env)
set -euo pipefail

DEPS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HS=${1:-$("$DEPS_ROOT/build.sh" --print-env | sed -n 's/^TNO_BIN_HEADSCALE=//p')}
[[ -x $HS ]] || { echo "headscale not found at $HS (run deps/build.sh headscale)" >&2; exit 1; }

free_port() {  # a currently free TCP port on 127.0.0.1
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

WORK=$(mktemp -d)
PID=
cleanup() {
  if [[ -n $PID ]] && kill -0 "$PID" 2>/dev/null; then
    kill "$PID"
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

PORT=$(free_port) METRICS_PORT=$(free_port) GRPC_PORT=$(free_port) STUN_PORT=$(free_port)

cat >"$WORK/config.yaml" <<EOF
server_url: http://127.0.0.1:$PORT
listen_addr: 127.0.0.1:$PORT
metrics_listen_addr: 127.0.0.1:$METRICS_PORT
grpc_listen_addr: 127.0.0.1:$GRPC_PORT
unix_socket: $WORK/headscale.sock
unix_socket_permission: "0770"
disable_check_updates: true
noise:
  private_key_path: $WORK/noise_private.key
prefixes:
  v4: 100.64.0.0/10
  v6: fd7a:115c:a1e0::/48
database:
  type: sqlite
  sqlite:
    path: $WORK/db.sqlite
policy:
  mode: database
derp:
  server:
    enabled: true
    region_id: 999
    region_code: headscale
    region_name: Headscale Embedded DERP
    stun_listen_addr: 127.0.0.1:$STUN_PORT
    private_key_path: $WORK/derp_server_private.key
    automatically_add_embedded_derp_region: true
    ipv4: 127.0.0.1
  urls: []
  auto_update_enabled: false
dns:
  magic_dns: true
  base_domain: tailnet.test
  override_local_dns: false
log:
  level: info
EOF

"$HS" -c "$WORK/config.yaml" serve >"$WORK/headscale.log" 2>&1 &
PID=$!

hs() { "$HS" -c "$WORK/config.yaml" "$@"; }

ok=
for _ in $(seq 100); do
  if curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then ok=1; break; fi
  kill -0 "$PID" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $ok ]]; then
  echo "headscale did not become healthy; log:" >&2
  cat "$WORK/headscale.log" >&2
  exit 1
fi
echo "headscale $(curl -fsS "http://127.0.0.1:$PORT/version") healthy on 127.0.0.1:$PORT"

hs users create smoke
KEY=$(hs apikeys create --expiration 1h | tail -n1)
[[ -n $KEY ]] || { echo "no API key printed" >&2; exit 1; }

echo "GET /api/v1/user:"
curl -fsS -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/api/v1/user"; echo
echo "GET /api/v1/policy:"
curl -sS -w ' (HTTP %{http_code})' -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/api/v1/policy"; echo
echo "PUT /api/v1/policy:"
curl -fsS -X PUT -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
  --data '{"policy":"{\"acls\":[{\"action\":\"accept\",\"src\":[\"*\"],\"dst\":[\"*:*\"]}]}"}' \
  "http://127.0.0.1:$PORT/api/v1/policy"; echo
echo "GET /api/v1/policy:"
curl -fsS -H "Authorization: Bearer $KEY" "http://127.0.0.1:$PORT/api/v1/policy"; echo
echo "GET /api/v1/policy without a key:"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/api/v1/policy")
echo "HTTP $code"
[[ $code == 401 ]] || { echo "expected 401 without a key" >&2; exit 1; }
echo "GET /derp/probe (embedded DERP):"
curl -fsS -o /dev/null -w 'HTTP %{http_code}\n' "http://127.0.0.1:$PORT/derp/probe"
echo "headscale smoke test passed"
