# Sourced by scripts/bench-*.sh: the agent's test listener for the per-request measurements
# (one `http` listener with TLS and one route, as tno-bench's ingress lab) and its network
# namespace.

# bench_require TOOL[:PACKAGE]...: exits with the package to install when a tool is missing.
bench_require() {
  local tool
  for tool in "$@"; do
    command -v "${tool%%:*}" >/dev/null || {
      echo "${tool%%:*} is missing (apt-get install ${tool##*:})" >&2
      exit 1
    }
  done
}

# bench_listener_files DIR NAME:PORT:ADMIN_PORT...: in DIR a self-signed certificate for
# bench.test, a hosts file naming it, and for each NAME an agent configuration NAME.json
# serving https://bench.test:PORT from the backend 127.0.0.1:18080.
bench_listener_files() {
  local dir=$1 variant name port admin
  shift
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$dir/key.pem" -out "$dir/cert.pem" -days 2 -subj /CN=bench.test \
    -addext subjectAltName=DNS:bench.test 2>/dev/null
  for variant in "$@"; do
    IFS=: read -r name port admin <<<"$variant"
    cat >"$dir/$name.json" <<CFG
{"localapiSocket":"$dir/localapi.sock","adminPort":$admin,"ingress":[{"mode":"http","port":$port,"routes":[{"name":"bench","hostnames":["bench.test"],"backend":{"host":"127.0.0.1","port":18080}}]}],"tls":{"certFile":"$dir/cert.pem","keyFile":"$dir/key.pem"}}
CFG
  done
  echo "127.0.0.1 localhost bench.test" >"$dir/hosts"
}

# bench_namespace NAME: a network namespace with the pod IP of tno-bench's lab on its
# loopback, deleted when the script exits.
bench_namespace() {
  ip netns add "$1"
  # shellcheck disable=SC2064 # the name is fixed now
  trap "ip netns del '$1'" EXIT
  ip -n "$1" link set lo up
  ip -n "$1" addr add 10.250.0.2/32 dev lo
}
