// Package conformancewrapper is tailnet-operator's wrapper around the Gateway API
// conformance suite (sigs.k8s.io/gateway-api/conformance, the version pinned in
// deps/versions.env). deps/build.sh compiles its test (`go test -c`) into the
// program gateway-api-conformance, which runs the upstream suite against the
// cluster of --kubeconfig / $KUBECONFIG with the suite's own flags
// (--gateway-class, --supported-features, --conformance-profiles,
// --report-output, --organization, --project, --url, --version, --contact,
// --cleanup-base-resources, --debug, --run-test, --skip-tests, ...). It also
// builds the suite's echo backend (sigs.k8s.io/gateway-api/conformance/echo-basic)
// from the same module version. No upstream code is copied here.
package conformancewrapper
