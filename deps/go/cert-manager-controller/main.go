// Command cert-manager-controller runs cert-manager's own certificate and CA
// issuer control loops against a Kubernetes API server.
//
// The upstream controller command (github.com/cert-manager/cert-manager/cmd/controller)
// is a separate Go module that the Go module proxy does not serve, so this thin
// main of tailnet-operator's (deps/build.sh builds it) starts the controllers
// that the main module's public packages register with pkg/controller: the
// Certificate pipeline (trigger, key manager, request manager, issuing,
// readiness, revision manager), the CertificateRequest approver, the CA and
// self-signed CertificateRequest issuers, and the (Cluster)Issuer readiness
// controllers, and with -enable-gateway-api the gateway-shim (Certificates for
// the certificateRefs of Gateways annotated cert-manager.io/issuer or
// cert-manager.io/cluster-issuer; the Gateway API CRDs must be installed).
// ACME, Vault, Venafi and the ingress shim are not built in. There is no
// leader election: run exactly one per cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"

	// Controllers register themselves with pkg/controller in init().
	gatewayshim "github.com/cert-manager/cert-manager/pkg/controller/certificate-shim/gateways"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"

	// Issuer types the (Cluster)Issuer controllers can set up and mark Ready.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

type options struct {
	kubeconfig               string
	namespace                string
	clusterResourceNamespace string
	workers                  int
	enableGatewayAPI         bool
	showVersion              bool
}

func main() {
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	klog.InitFlags(fs) // -v, -logtostderr, ...
	var o options
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the API server (default: in-cluster config)")
	fs.StringVar(&o.namespace, "namespace", "", "watch only this namespace (default: all; a namespaced run has no ClusterIssuers)")
	fs.StringVar(&o.clusterResourceNamespace, "cluster-resource-namespace", "cert-manager",
		"namespace of the Secrets that ClusterIssuers refer to (e.g. a CA issuer's key pair)")
	fs.IntVar(&o.workers, "workers", 5, "workers per controller")
	fs.BoolVar(&o.enableGatewayAPI, "enable-gateway-api", false,
		"run the gateway-shim: Certificates for annotated Gateways' listeners (needs the Gateway API CRDs)")
	fs.BoolVar(&o.showVersion, "version", false, "print the cert-manager version and exit")
	_ = fs.Parse(os.Args[1:])

	if o.showVersion {
		v := util.VersionInfo()
		fmt.Printf("cert-manager-controller (tailnet-operator wrapper) cert-manager %s commit %s %s %s\n",
			v.GitVersion, v.GitCommit, v.GoVersion, v.Platform)
		return
	}
	logf.InitLogs()
	defer logf.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	if err := run(ctx, o); err != nil {
		logf.FromContext(ctx).Error(err, "controller failed")
		logf.FlushLogs()
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	log := logf.FromContext(ctx)
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig: o.kubeconfig,
		Namespace:  o.namespace,
		IssuerOptions: controller.IssuerOptions{
			ClusterResourceNamespace: o.clusterResourceNamespace,
		},
		ConfigOptions: controller.ConfigOptions{EnableGatewayAPI: o.enableGatewayAPI},
		CertificateOptions: controller.CertificateOptions{
			// upstream's defaults for a failed CertificateRequest's retry
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("building the controller context: %w", err)
	}
	base, err := factory.Build()
	if err != nil {
		return fmt.Errorf("building the base context: %w", err)
	}

	names := make([]string, 0, len(controller.Known()))
	for name := range controller.Known() {
		if o.namespace != "" && name == clusterissuers.ControllerName {
			continue // ClusterIssuers are cluster-scoped: not watched in a namespaced run
		}
		if name == gatewayshim.ControllerName && !o.enableGatewayAPI {
			continue // its informers exist only with the Gateway API enabled
		}
		names = append(names, name)
	}
	sort.Strings(names)

	errs := make(chan error, len(names))
	var wg sync.WaitGroup
	for _, name := range names {
		ctrl, err := controller.Known()[name](factory)
		if err != nil {
			return fmt.Errorf("constructing controller %s: %w", name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := ctrl.Run(o.workers, ctx); err != nil {
				errs <- fmt.Errorf("controller %s: %w", name, err)
			}
		}()
	}
	log.Info("starting controllers", "controllers", strings.Join(names, ","),
		"clusterResourceNamespace", o.clusterResourceNamespace, "version", util.VersionInfo().GitVersion)
	// Informers are registered by the constructors above; start them after.
	base.SharedInformerFactory.Start(ctx.Done())
	base.KubeSharedInformerFactory.Start(ctx.Done())
	if o.enableGatewayAPI {
		base.GWShared.Start(ctx.Done())
	}

	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	if ctx.Err() != nil && len(all) == 0 {
		log.Info("control loops exited")
	}
	return errors.Join(all...)
}
