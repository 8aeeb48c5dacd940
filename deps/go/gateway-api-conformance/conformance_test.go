package conformancewrapper

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

// A test binary only knows -test.run and -test.v; these short forms behave as
// under `go test`, so the program takes the flags people already use with the
// suite (e.g. -run 'TestConformance/HTTPRouteSimpleSameNamespace' -v).
var (
	runPattern = flag.String("run", "", "same as -test.run: run only tests (and subtests, TestConformance/<ShortName>) matching this regular expression")
	verbose    = flag.Bool("v", false, "same as -test.v: log every test and subtest as it runs")
)

func TestMain(m *testing.M) {
	flag.Parse()
	if *runPattern != "" {
		mustSet("test.run", *runPattern)
	}
	if *verbose {
		mustSet("test.v", "true")
	}
	os.Exit(m.Run())
}

func mustSet(name, value string) {
	if err := flag.Set(name, value); err != nil {
		fmt.Fprintf(os.Stderr, "gateway-api-conformance: setting -%s: %v\n", name, err)
		os.Exit(2)
	}
}

// TestConformance is the upstream suite as upstream's own conformance_test.go
// runs it: options from the command line, the suite's embedded manifests.
func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
