#!/usr/bin/env bash
# Instructions per request of the agent's HTTPS ingress under callgrind (valgrind): a count
# that repeats to within 0.1 % for the same binary whatever else the machine does, so two
# builds can be compared without the VM's speed in the result (docs/benchmarks.md, "Known
# misses"). The agent serves one `http` listener (TLS, one route) in a network namespace of its
# own against `tno-bench serve-http`; after a 5 s warm-up, callgrind counts the agent's user-space
# instructions while wrk (keep-alive GET /1k) runs, and the count is divided by wrk's requests.
# Kernel time is not counted (see scripts/bench-per-request.sh for that). Needs root,
# valgrind, wrk and openssl.
#
#   scripts/bench-instructions.sh AGENT|floor [CONNECTIONS [SECONDS [OUTDIR]]]
#
# AGENT: any build of tailnet-agent (release for the figure users get; `--profile profiling`
# for `callgrind_annotate OUTDIR/callgrind.out.1` by function). `floor` measures the
# hand-written floor `tno-bench serve-proxy --raw-backend` instead. The backend (and the floor)
# is $TNO_BENCH (default target/release/tno-bench). Defaults: 1 connection, 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
server=$1; connections=${2:-1}; seconds=${3:-10}
out=$(realpath -m "${4:-target/bench/instructions}")
bench=$(realpath "${TNO_BENCH:-target/release/tno-bench}")
[ "$server" = floor ] || server=$(realpath "$server")
. scripts/bench-common.sh
bench_require valgrind callgrind_control:valgrind wrk openssl
rm -rf "$out"; mkdir -p "$out"; cd "$out"
bench_listener_files "$out" agent:8443:9180
ns=tno-instructions-$$
bench_namespace "$ns"
export server connections seconds bench
ip netns exec "$ns" unshare --mount --propagation private bash -c '
set -euo pipefail
mount --bind hosts /etc/hosts
"$bench" serve-http --port 18080 --localapi-socket "$PWD/localapi.sock" >backend.log 2>&1 &
backend=$!
# Counting starts switched off: the start and the warm-up are not in the figure.
count=(valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$PWD/callgrind.out")
if [ "$server" = floor ]; then
  "${count[@]}" "$bench" serve-proxy --port 8443 --backend-port 18080 --cert cert.pem \
    --key key.pem --raw-backend >server.log 2>&1 &
else
  RUST_LOG=warn "${count[@]}" "$server" --config agent.json --pod-ip 10.250.0.2 >server.log 2>&1 &
fi
counted=$!
trap "kill $backend $counted 2>/dev/null || true" EXIT
for _ in $(seq 600); do (exec 3<>/dev/tcp/127.0.0.1/8443) 2>/dev/null && break; sleep 0.1; done
sleep 2
wrk -t 1 -c "$connections" -d 5s https://bench.test:8443/1k >/dev/null
callgrind_control --instr=on "$counted" >/dev/null 2>&1
wrk -t 1 -c "$connections" -d "${seconds}s" https://bench.test:8443/1k >wrk.txt
callgrind_control --instr=off "$counted" >/dev/null 2>&1
callgrind_control --dump "$counted" >/dev/null 2>&1
kill -TERM "$counted"; wait "$counted" || true
'
instructions=$(grep -h "^totals:" callgrind.out* | awk '{ sum += $2 } END { print sum }')
requests=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' wrk.txt)
echo "instructions: $instructions; requests: $requests; per request: $(awk -v i="$instructions" -v r="$requests" 'BEGIN { printf "%.0f", i / r }')"
echo "(callgrind data: $out/callgrind.out*; callgrind_annotate for the functions)"
