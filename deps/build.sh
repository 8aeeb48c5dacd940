#!/usr/bin/env bash
# deps/build.sh — build the pinned third-party programs that the real-system
# tests need (SPEC §9) from the Go module proxy, into a version-keyed cache
# outside the work tree. See deps/README.md.
#
#   deps/build.sh [all | component...]   build what is missing (default: all, see below)
#   deps/build.sh --print-env             TNO_BIN_<NAME>=<abs path> lines (+ TNO_*_CRDS)
#   deps/build.sh --check [component...]  run every binary's version flag
#   deps/build.sh --download [component...]  only `go mod download` what the builds need
#   deps/build.sh --pin [component...]    regenerate deps/go/<c>/go.mod+go.sum
#                                         from deps/versions.env (maintainers)
#
# Components: kubernetes etcd headscale tailscale coredns cert-manager
#             cert-manager-controller (our thin main over cert-manager's controller
#                           packages, deps/go/cert-manager-controller; cert-manager's version)
#             helm prometheus caddy   (chart and monitoring-rule checks, benchmarks)
#             crane actionlint        (the lab's OCI registry and image pushes; workflow lint)
#             kube-router   (NetworkPolicy enforcer of the lab, network_policy_e2e)
#             gateway-api   (the Standard-channel Gateway API CRDs, files only)
#             tailscale-minimal (tailscaled with only the features an agent pod uses, from
#                           the tailscale wrapper module: the tailnet-tailscaled image's program,
#                           what the e2e agents run; TNO_BIN_TAILSCALED_MINIMAL)
#   Not in `all` (built only when named):
#             gateway-api-conformance (the upstream conformance suite as a program, our
#                           wrapper deps/go/gateway-api-conformance, + its echo-basic backend;
#                           gateway-api's version)
# Layout:     ${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps}/<component>-<version>/bin/<binary>
#             .../cert-manager-<version>/crds/cert-manager.crds.yaml
#             .../gateway-api-<version>/crds/*.yaml
# Env:        TNO_DEPS_DIR   cache root
#             TNO_DEPS_GO_P  go build -p (default 2)
#             TNO_DEPS_GOGC  GOGC of the builds (default 200)
#             TNO_DEPS_JOBS  components built at the same time (default 2)
#             TNO_DEPS_FORCE=1  rebuild even if cached
#             GO             go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail

DEPS_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE_ROOT=${TNO_DEPS_DIR:-$HOME/.cache/tailnet-operator/deps}
COMPONENTS=(kubernetes etcd headscale tailscale tailscale-minimal coredns cert-manager cert-manager-controller helm prometheus caddy crane actionlint kube-router gateway-api)
# Built only when named (long cold builds that only some runs need); --print-env lists them too.
OPTIONAL_COMPONENTS=(gateway-api-conformance)

log() { printf '[deps] %s\n' "$*" >&2; }
die() { printf '[deps] ERROR: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- versions
declare -A VERSIONS=()
while IFS='=' read -r key value; do
  VERSIONS[$key]=$value
done < <(grep -E '^[A-Z][A-Z0-9_]*=[^[:space:]]+$' "$DEPS_ROOT/versions.env")

# version_key C: the versions.env key of C (a wrapper of ours shares its module's key).
version_key() {
  case $1 in
    cert-manager-controller) echo CERT_MANAGER_VERSION ;;
    gateway-api-conformance) echo GATEWAY_API_VERSION ;;
    tailscale-minimal) echo TAILSCALE_VERSION ;;
    *) echo "$(tr 'a-z-' 'A-Z_' <<<"$1")_VERSION" ;;
  esac
}

# version_of C: the pinned version, or TNO_<C>_VERSION from the environment (a
# version matrix run, e.g. TNO_HEADSCALE_VERSION=v0.29.2). A version other than
# the pinned one is built from its own wrapper module deps/go/<c>-<version>/.
version_of() {
  local key override
  key=$(version_key "$1")
  override="TNO_$key"
  if [[ -n ${!override:-} ]]; then
    printf '%s\n' "${!override}"
    return
  fi
  [[ -n ${VERSIONS[$key]:-} ]] || die "$key missing from deps/versions.env"
  printf '%s\n' "${VERSIONS[$key]}"
}

# wrapper_dir C: the wrapper module that pins C's modules at version_of C.
wrapper_dir() {
  local key ver module=$1
  key=$(version_key "$1")
  ver=$(version_of "$1")
  [[ $module != tailscale-minimal ]] || module=tailscale  # the same modules, other build tags
  if [[ $ver == "${VERSIONS[$key]:-}" ]]; then
    printf '%s\n' "$DEPS_ROOT/go/$module"
  else
    printf '%s\n' "$DEPS_ROOT/go/$module-$ver"
  fi
}


# ------------------------------------------------------- component tables
# binaries_of C: the programs component C provides (the --print-env names).
binaries_of() {
  case $1 in
    kubernetes) echo kube-apiserver kube-controller-manager kube-proxy kubectl ;;
    etcd) echo etcd etcdctl ;;
    headscale) echo headscale ;;
    tailscale) echo tailscaled tailscale containerboot ;;
    coredns) echo coredns ;;
    cert-manager) echo ;;
    cert-manager-controller) echo cert-manager-controller ;;
    helm) echo helm ;;
    prometheus) echo promtool prometheus ;;
    caddy) echo caddy ;;
    crane) echo crane ;;
    actionlint) echo actionlint ;;
    kube-router) echo kube-router ;;
    gateway-api) echo ;;
    gateway-api-conformance) echo gateway-api-conformance echo-basic ;;
    tailscale-minimal) echo tailscaled ;;
    *) die "unknown component '$1' (known: ${COMPONENTS[*]} ${OPTIONAL_COMPONENTS[*]})" ;;
  esac
}

# main_module_of C: the module (in the Go module proxy) that carries C.
main_module_of() {
  case $1 in
    kubernetes) echo k8s.io/kubernetes ;;
    etcd) echo go.etcd.io/etcd/server/v3 ;;
    headscale) echo github.com/juanfont/headscale ;;
    tailscale | tailscale-minimal) echo tailscale.com ;;
    coredns) echo github.com/coredns/coredns ;;
    cert-manager | cert-manager-controller) echo github.com/cert-manager/cert-manager ;;
    helm) echo helm.sh/helm/v4 ;;
    prometheus) echo github.com/prometheus/prometheus ;;
    caddy) echo github.com/caddyserver/caddy/v2 ;;
    crane) echo github.com/google/go-containerregistry ;;
    actionlint) echo github.com/rhysd/actionlint ;;
    kube-router) echo github.com/cloudnativelabs/kube-router/v2 ;;
    gateway-api) echo sigs.k8s.io/gateway-api ;;
    # the suite is a module of its own in the same repository, released with the same tags
    gateway-api-conformance) echo sigs.k8s.io/gateway-api/conformance ;;
  esac
}

# packages_of C: "binary=package" pairs built with `go build`.
packages_of() {
  case $1 in
    kubernetes)
      echo kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
        kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
        kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
        kubectl=k8s.io/kubernetes/cmd/kubectl ;;
    etcd)
      echo etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3 ;;
    headscale)
      echo headscale=github.com/juanfont/headscale/cmd/headscale ;;
    tailscale)
      echo tailscaled=tailscale.com/cmd/tailscaled tailscale=tailscale.com/cmd/tailscale \
        containerboot=tailscale.com/cmd/containerboot ;;
    tailscale-minimal)
      echo tailscaled=tailscale.com/cmd/tailscaled ;;
    coredns)
      echo coredns=github.com/coredns/coredns ;;
    cert-manager-controller)  # the wrapper module's own main package
      echo cert-manager-controller=tailnet-operator.dev/deps/cert-manager-controller ;;
    helm)
      echo helm=helm.sh/helm/v4/cmd/helm ;;
    prometheus)
      echo promtool=github.com/prometheus/prometheus/cmd/promtool \
        prometheus=github.com/prometheus/prometheus/cmd/prometheus ;;
    caddy)
      echo caddy=github.com/caddyserver/caddy/v2/cmd/caddy ;;
    crane)
      echo crane=github.com/google/go-containerregistry/cmd/crane ;;
    actionlint)
      echo actionlint=github.com/rhysd/actionlint/cmd/actionlint ;;
    kube-router)
      echo kube-router=github.com/cloudnativelabs/kube-router/v2/cmd/kube-router ;;
    gateway-api-conformance)  # the suite: our wrapper package's test (go test -c)
      echo gateway-api-conformance=tailnet-operator.dev/deps/gateway-api-conformance \
        echo-basic=sigs.k8s.io/gateway-api/conformance/echo-basic ;;
  esac
}

comp_dir() { printf '%s/%s-%s\n' "$CACHE_ROOT" "$1" "$(version_of "$1")"; }
crds_path() { printf '%s/crds/cert-manager.crds.yaml\n' "$(comp_dir cert-manager)"; }
gateway_api_crds_dir() { printf '%s/crds\n' "$(comp_dir gateway-api)"; }

# ---------------------------------------------------------------- go setup
setup_go() {
  if [[ -z ${GO:-} ]]; then
    GO=$(command -v go || true)
    [[ -n $GO ]] || GO=/usr/local/go/bin/go
  fi
  [[ -x $GO ]] || die "no go command (set GO=/path/to/go)"
  export CGO_ENABLED=0
  export GOWORK=off
  export GOFLAGS=-buildvcs=false  # our own checkout's VCS state is not the component's
  # The approved toolchain is the machine's Go (1.26.x); no component needs newer
  # (tailscale 1.104.x would: see deps/versions.env).
  export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  GO_P=${TNO_DEPS_GO_P:-2}
  # The compiler's collector runs half as often: measured on cold builds side by side against
  # GOGC=100, kubernetes (2 runs each) 0.91x the wall time and 0.90x the CPU at the same peak
  # (1.88 GiB), crane (4 runs each) 0.86x and 0.87x. The programs built are the same bytes.
  export GOGC=${TNO_DEPS_GOGC:-200}
}

# module_meta WRAPPERDIR MODULE FIELD: Dir (source in the module cache), or
# Time / Hash (release time, VCS commit) from the proxy's .info for the module
# (empty if the proxy gave none: it records the commit only for some modules).
module_meta() {
  local dir=$1 mod=$2 field=$3 json info
  json=$(cd "$dir" && "$GO" mod download -json "$mod")
  case $field in
    Dir) sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p' <<<"$json" ;;
    Time | Hash)
      info=$(sed -n 's/^[[:space:]]*"Info": "\(.*\)",\{0,1\}$/\1/p' <<<"$json")
      [[ -f $info ]] || return 0
      grep -o "\"$field\":\"[^\"]*\"" "$info" | head -n1 | cut -d'"' -f4 ;;
  esac
}

# -------------------------------------------------------------- ldflags
# ldflags_of C WRAPPERDIR: version stamping, as the upstream release builds do.
ldflags_of() {
  local c=$1 dir=$2 ver hash time
  ver=$(version_of "$c")
  hash=$(module_meta "$dir" "$(main_module_of "$c")" Hash)
  time=$(module_meta "$dir" "$(main_module_of "$c")" Time)
  local f=(-s -w)
  case $c in
    kubernetes)
      local minor=${ver#v1.}; minor=${minor%%.*}
      local pkg
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        f+=("-X" "$pkg.gitVersion=$ver" "-X" "$pkg.gitMajor=1" "-X" "$pkg.gitMinor=$minor"
          "-X" "$pkg.gitTreeState=clean" "-X" "$pkg.buildDate=${time:-1970-01-01T00:00:00Z}")
        [[ -z $hash ]] || f+=("-X" "$pkg.gitCommit=$hash")
      done ;;
    etcd)
      f+=("-X" "go.etcd.io/etcd/api/v3/version.GitSHA=${hash:-$ver}") ;;
    tailscale | tailscale-minimal)
      local short=${ver#v}
      f+=("-X" "tailscale.com/version.shortStamp=$short"
        "-X" "tailscale.com/version.longStamp=$short${hash:+-t${hash:0:9}}")
      [[ -z $hash ]] || f+=("-X" "tailscale.com/version.gitCommitStamp=$hash") ;;
    coredns)
      f+=("-X" "github.com/coredns/coredns/coremain.GitCommit=${hash:-$ver}") ;;
    helm)  # as helm's Makefile for a tagged release (metadata empty)
      f+=("-X" "helm.sh/helm/v4/internal/version.version=$ver" "-X" "helm.sh/helm/v4/internal/version.metadata="
        "-X" "helm.sh/helm/v4/internal/version.gitTreeState=clean")
      [[ -z $hash ]] || f+=("-X" "helm.sh/helm/v4/internal/version.gitCommit=$hash") ;;
    prometheus)  # as .promu.yml; module v0.3XY.Z is release 3.XY.Z
      local rel=${ver#v0.}
      rel="${rel:0:1}.$((10#${rel:1:2})).${rel#*.}"
      f+=("-X" "github.com/prometheus/common/version.Version=$rel"
        "-X" "github.com/prometheus/common/version.Revision=${hash:-$ver}"
        "-X" "github.com/prometheus/common/version.Branch=HEAD"
        "-X" "github.com/prometheus/common/version.BuildUser=tailnet-operator-deps"
        "-X" "github.com/prometheus/common/version.BuildDate=${time:-19700101-00:00:00}")
      ;;
    caddy)  # caddy.Version() looks for caddy among the build's *dependencies*;
      # built by package path it is the main module, so set its documented override
      f+=("-X" "github.com/caddyserver/caddy/v2.CustomVersion=$ver") ;;
    cert-manager-controller)  # as cert-manager's make/ldflags (pkg/util version variables)
      f+=("-X" "github.com/cert-manager/cert-manager/pkg/util.AppVersion=$ver")
      [[ -z $hash ]] || f+=("-X" "github.com/cert-manager/cert-manager/pkg/util.AppGitCommit=$hash") ;;
    kube-router)  # as its Makefile (Version = the git tag there)
      f+=("-X" "github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$ver"
        "-X" "github.com/cloudnativelabs/kube-router/v2/pkg/version.BuildDate=${time:-1970-01-01T00:00:00Z}") ;;
  esac
  printf '%s\n' "${f[*]}"
}

tags_of() {
  case $1 in
    kubernetes) echo selinux,notest,grpcnotrace ;;  # as hack/lib/golang.sh (non-debug)
    # promtool checks rules; the lab's prometheus server finds its targets through
    # Kubernetes SD only: leave out every other service-discovery plugin (upstream's
    # tags, plugins/plugin_kubernetes.go: !remove_all_sd || enable_kubernetes_sd;
    # no cloud SDKs). Web UI assets are not embedded (no builtinassets tag).
    prometheus) echo remove_all_sd,enable_kubernetes_sd ;;
    # Every feature an agent pod does not use left out: the output of
    # `go run tailscale.com/cmd/featuretags --min --add=netstack,kube,dns,useroutes,health,useproxy,portmapper,bakedroots,cloud,unixsocketidentity,hujsonconf,routecheck,gro,outboundproxy`
    # (v1.102.5). Kept: userspace networking, the Secret state store, MagicDNS queries,
    # subnet routes, the config file, NAT traversal helpers, GRO, and outboundproxy (it
    # carries the LocalAPI's `dial`, the agent's way out). A feature added by a newer
    # tailscale is simply compiled in.
    tailscale-minimal) echo ts_omit_ace,ts_omit_acme,ts_omit_advertiseexitnode,ts_omit_advertiseroutes,ts_omit_appconnectors,ts_omit_aws,ts_omit_bird,ts_omit_c2n,ts_omit_cachenetmap,ts_omit_captiveportal,ts_omit_capture,ts_omit_cliconndiag,ts_omit_clientmetrics,ts_omit_clientupdate,ts_omit_colorable,ts_omit_completion,ts_omit_completion_scripts,ts_omit_conn25,ts_omit_dbus,ts_omit_debug,ts_omit_debugeventbus,ts_omit_debugportmapper,ts_omit_desktop_sessions,ts_omit_doctor,ts_omit_drive,ts_omit_flashappliance,ts_omit_identityfederation,ts_omit_ipnbus,ts_omit_iptables,ts_omit_linkspeed,ts_omit_linuxdnsfight,ts_omit_listenrawdisco,ts_omit_logtail,ts_omit_netlog,ts_omit_networkmanager,ts_omit_oauthkey,ts_omit_osrouter,ts_omit_peerapiclient,ts_omit_peerapiserver,ts_omit_portlist,ts_omit_posture,ts_omit_qrcodes,ts_omit_relayserver,ts_omit_remoteconfig,ts_omit_resolved,ts_omit_runtimemetrics,ts_omit_sdnotify,ts_omit_serve,ts_omit_serviceclientprefs,ts_omit_ssh,ts_omit_synology,ts_omit_syslog,ts_omit_syspolicy,ts_omit_systray,ts_omit_taildrop,ts_omit_tailnetlock,ts_omit_tap,ts_omit_tpm,ts_omit_tundevstats,ts_omit_useexitnode,ts_omit_usermetrics,ts_omit_wakeonlan,ts_omit_webbrowser,ts_omit_webclient ;;
    *) echo ;;
  esac
}

# recipe_of C: what determines the build output besides the Go version and
# module data that follows from the version (the ldflags values). Cheap and
# offline, so a warm run needs neither the network nor the module cache.
# A cached component whose recipe differs is rebuilt. Bump RECIPE_REV when
# the way components are built changes.
RECIPE_REV=2
recipe_of() {
  local c=$1 dir
  dir=$(wrapper_dir "$c")
  {
    echo "component=$c version=$(version_of "$c") recipe=$RECIPE_REV"
    echo "packages=$(packages_of "$c")"
    echo "tags=$(tags_of "$c") cgo=0 trimpath=1"
    [[ $c != headscale ]] || echo "method=go-install"
    [[ $c != caddy ]] || echo "ldflags=CustomVersion"
    [[ $c != kube-router ]] || echo "ldflags=version.Version"
    [[ $c != gateway-api ]] || echo "files=config/crd/standard/*.yaml"
    [[ $c != gateway-api-conformance ]] || echo "method=go-test-c+go-build"
    [[ ! -f $dir/go.mod ]] || cat "$dir/go.mod" "$dir/go.sum"
    local f
    for f in "$dir"/*.go; do  # a wrapper main / test of ours
      [[ ! -f $f ]] || cat "$f"
    done
  } | sha256sum | cut -d' ' -f1
}

is_cached() {
  local c=$1 d b
  d=$(comp_dir "$c")
  [[ -f $d/.recipe && "$(cat "$d/.recipe")" == "$(recipe_of "$c")" ]] || return 1
  if [[ $c == cert-manager ]]; then
    [[ -s $(crds_path) ]] || return 1
  fi
  if [[ $c == gateway-api ]]; then
    compgen -G "$(gateway_api_crds_dir)/*.yaml" >/dev/null || return 1
  fi
  for b in $(binaries_of "$c"); do
    [[ -x $d/bin/$b ]] || return 1
  done
}

# publish TMPDIR C: atomically move a finished build into place.
publish() {
  local tmp=$1 c=$2 d old
  d=$(comp_dir "$c")
  recipe_of "$c" >"$tmp/.recipe"
  if [[ -e $d ]]; then
    old="$d.old.$$"
    mv "$d" "$old"
    mv "$tmp" "$d"
    rm -rf "$old"
  else
    mv "$tmp" "$d"
  fi
}

# check_wrapper C: the committed wrapper go.mod pins the versions.env version.
check_wrapper() {
  local c=$1 dir want got mod
  dir=$(wrapper_dir "$c")
  want=$(version_of "$c")
  mod=$(main_module_of "$c")
  [[ -f $dir/go.mod ]] || die "$dir/go.mod missing; run deps/build.sh --pin $c"
  got=$(cd "$dir" && "$GO" list -m -f '{{.Version}}' "$mod")
  [[ $got == "$want" ]] ||
    die "$dir/go.mod pins $mod $got but versions.env says $want; run deps/build.sh --pin $c"
  if [[ $c == gateway-api-conformance ]]; then
    # the suite's go.mod requires sigs.k8s.io/gateway-api at a placeholder (upstream replaces
    # it with ../): the wrapper must pin the API module at the suite's own version
    got=$(cd "$dir" && "$GO" list -m -f '{{.Version}}{{with .Replace}} => {{.Version}}{{end}}' sigs.k8s.io/gateway-api)
    [[ $got == "$want" ]] ||
      die "$dir/go.mod resolves sigs.k8s.io/gateway-api to $got, not $want; run deps/build.sh --pin $c"
  fi
  if [[ $c == kubernetes ]]; then
    local staging="v0.${want#v1.}" bad
    bad=$(cd "$dir" && "$GO" list -m -f '{{if .Replace}}{{.Path}} {{.Replace.Version}}{{end}}' all |
      awk -v s="$staging" 'NF==2 && $2!=s')
    [[ -z $bad ]] || die "kubernetes staging replaces not at $staging: $bad; run deps/build.sh --pin kubernetes"
  fi
}

# -------------------------------------------------------------- building
build_go_component() {
  local c=$1 ver dir tmp t0 t1 t2 ldflags tags pair name pkg out
  ver=$(version_of "$c")
  dir=$(wrapper_dir "$c")
  mkdir -p "$CACHE_ROOT"
  tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$c-$ver.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/bin" "$tmp/out"

  t0=$(date +%s)
  check_wrapper "$c"
  log "$c $ver: downloading modules"
  (cd "$dir" && "$GO" mod download)
  t1=$(date +%s)
  ldflags=$(ldflags_of "$c" "$dir")
  tags=$(tags_of "$c")
  local pkgs=()
  for pair in $(packages_of "$c"); do pkgs+=("${pair#*=}"); done
  log "$c $ver: compiling ${pkgs[*]}"
  (cd "$dir" && "$GO" build -p "$GO_P" -trimpath ${tags:+-tags="$tags"} -ldflags="$ldflags" \
    -o "$tmp/out/" "${pkgs[@]}")
  t2=$(date +%s)
  for pair in $(packages_of "$c"); do
    name=${pair%%=*} pkg=${pair#*=}
    # go build names a binary after the last path element, skipping a /vN suffix
    out=$(sed -E 's#/v[0-9]+$##; s#.*/##' <<<"$pkg")
    mv "$tmp/out/$out" "$tmp/bin/$name"
  done
  rmdir "$tmp/out"
  {
    echo "component: $c $ver"
    echo "go: $("$GO" version)"
    echo "packages: ${pkgs[*]}"
    echo "tags: $tags"
    echo "ldflags: $ldflags"
    echo "download_seconds: $((t1 - t0))"
    echo "compile_seconds: $((t2 - t1))"
  } >"$tmp/BUILD-INFO"
  publish "$tmp" "$c"
  trap - EXIT
  log "$c $ver: done (download $((t1 - t0))s, compile $((t2 - t1))s) -> $(comp_dir "$c")/bin"
}

# cert-manager: render the CRDs of the Helm chart in the module's source with
# the values upstream uses for its static cert-manager.crds.yaml
# (crds.enabled=true, crds.keep=true, creator=static, release name cert-manager).
build_cert_manager() {
  local c=cert-manager ver dir tmp src t0 f n
  ver=$(version_of "$c")
  dir=$(wrapper_dir "$c")
  t0=$(date +%s)
  check_wrapper "$c"
  src=$(module_meta "$dir" "$(main_module_of "$c")" Dir)
  [[ -d $src/deploy/charts/cert-manager/templates ]] || die "cert-manager chart not found in module source $src"
  mkdir -p "$CACHE_ROOT"
  tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$c-$ver.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/crds"
  {
    echo "# cert-manager $ver CustomResourceDefinitions, rendered by tailnet-operator deps/build.sh"
    echo "# from deploy/charts/cert-manager/templates/crd-*.yaml of the Go module"
    echo "# github.com/cert-manager/cert-manager@$ver (values: crds.enabled=true, crds.keep=true,"
    echo "# creator=static, release name cert-manager) with all Helm templating removed."
    n=0
    for f in "$src"/deploy/charts/cert-manager/templates/crd-*.yaml; do
      n=$((n + 1))
      echo "---"
      echo "# Source: cert-manager/templates/${f##*/}"
      awk -v ver="$ver" -v file="${f##*/}" '
        /^[[:space:]]*\{\{- if or \.Values\.crds\.enabled \.Values\.installCRDs \}\}[[:space:]]*$/ { next }
        /^[[:space:]]*\{\{- if \.Values\.crds\.keep \}\}[[:space:]]*$/ { next }
        /^[[:space:]]*\{\{- end \}\}[[:space:]]*$/ { next }
        /^[[:space:]]*\{\{- include "cert-manager\.crd-labels" \. \| nindent 4 \}\}[[:space:]]*$/ {
          print "    app: \"cert-manager\""
          print "    app.kubernetes.io/name: \"cert-manager\""
          print "    app.kubernetes.io/instance: \"cert-manager\""
          print "    app.kubernetes.io/component: \"crds\""
          print "    app.kubernetes.io/version: \"" ver "\""
          next
        }
        /\{\{/ { printf "unhandled Helm template in %s: %s\n", file, $0 > "/dev/stderr"; exit 3 }
        { print }
      ' "$f"
    done
  } >"$tmp/crds/cert-manager.crds.yaml"
  [[ $n -gt 0 ]] || die "no crd-*.yaml templates in $src"
  [[ $(grep -c '^kind: CustomResourceDefinition$' "$tmp/crds/cert-manager.crds.yaml") -eq $n ]] ||
    die "rendered CRD file does not hold $n CRDs"
  echo "component: $c $ver (CRDs only; $n CRDs)" >"$tmp/BUILD-INFO"
  publish "$tmp" "$c"
  trap - EXIT
  log "$c $ver: done ($(($(date +%s) - t0))s) -> $(crds_path)"
}

# gateway-api: the Standard-channel files of the module's config/crd/standard/ as they
# are (upstream's standard-install.yaml is their concatenation): one CRD per file, plus
# gateway.networking.k8s.io_vap_safeupgrades.yaml (a ValidatingAdmissionPolicy and its
# binding that refuse Experimental-channel CRDs over Standard ones and downgrades below
# v1.5). Every file must carry this version's bundle-version and the standard channel.
build_gateway_api() {
  local c=gateway-api ver dir tmp src t0 f n=0 crds
  ver=$(version_of "$c")
  dir=$(wrapper_dir "$c")
  t0=$(date +%s)
  check_wrapper "$c"
  src=$(module_meta "$dir" "$(main_module_of "$c")" Dir)/config/crd/standard
  compgen -G "$src/*.yaml" >/dev/null || die "no config/crd/standard/*.yaml in the module source of $c $ver"
  mkdir -p "$CACHE_ROOT"
  tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$c-$ver.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/crds"
  for f in "$src"/*.yaml; do
    grep -q "^    gateway.networking.k8s.io/bundle-version: $ver\$" "$f" ||
      die "${f##*/} is not annotated bundle-version $ver"
    grep -q '^    gateway.networking.k8s.io/channel: standard$' "$f" ||
      die "${f##*/} is not annotated channel standard"
    install -m 0644 "$f" "$tmp/crds/"
    n=$((n + 1))
  done
  crds=$(cat "$tmp"/crds/*.yaml | grep -c '^kind: CustomResourceDefinition$' || true)
  [[ $crds -ge 1 ]] || die "no CustomResourceDefinition in $src"
  {
    echo "component: $c $ver (Standard-channel files only: $n files, $crds CRDs)"
    echo "source: sigs.k8s.io/gateway-api@$ver config/crd/standard/*.yaml (unchanged)"
  } >"$tmp/BUILD-INFO"
  publish "$tmp" "$c"
  trap - EXIT
  log "$c $ver: done ($(($(date +%s) - t0))s, $crds CRDs in $n files) -> $(gateway_api_crds_dir)"
}

# gateway-api-conformance: the suite is a Go test (upstream runs `go test ./conformance`
# with flags), so the program is the test binary of our wrapper package
# (deps/go/gateway-api-conformance/conformance_test.go, which calls
# conformance.RunConformance), compiled with `go test -c`; its echo backend
# (conformance/echo-basic, a main package inside the same module) with `go build`.
build_gateway_api_conformance() {
  local c=gateway-api-conformance ver dir tmp t0 t1 t2 t3 pair suite_pkg echo_pkg
  ver=$(version_of "$c")
  dir=$(wrapper_dir "$c")
  for pair in $(packages_of "$c"); do
    case ${pair%%=*} in
      gateway-api-conformance) suite_pkg=${pair#*=} ;;
      echo-basic) echo_pkg=${pair#*=} ;;
    esac
  done
  mkdir -p "$CACHE_ROOT"
  tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$c-$ver.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/bin"
  t0=$(date +%s)
  check_wrapper "$c"
  log "$c $ver: downloading modules"
  (cd "$dir" && "$GO" mod download)
  t1=$(date +%s)
  log "$c $ver: compiling $echo_pkg"
  (cd "$dir" && "$GO" build -p "$GO_P" -trimpath -ldflags="-s -w" -o "$tmp/bin/echo-basic" "$echo_pkg")
  t2=$(date +%s)
  log "$c $ver: compiling the suite (go test -c $suite_pkg)"
  (cd "$dir" && "$GO" test -c -p "$GO_P" -trimpath -ldflags="-s -w" -o "$tmp/bin/gateway-api-conformance" "$suite_pkg")
  t3=$(date +%s)
  {
    echo "component: $c $ver"
    echo "go: $("$GO" version)"
    echo "packages: $echo_pkg (go build), $suite_pkg (go test -c: sigs.k8s.io/gateway-api/conformance.RunConformance)"
    echo "ldflags: -s -w"
    echo "download_seconds: $((t1 - t0))"
    echo "compile_seconds: echo-basic $((t2 - t1)), suite $((t3 - t2))"
  } >"$tmp/BUILD-INFO"
  publish "$tmp" "$c"
  trap - EXIT
  log "$c $ver: done (download $((t1 - t0))s, compile $((t3 - t1))s) -> $(comp_dir "$c")/bin"
}

# headscale reports its version only from the main module's version in the
# binary's build info (hscontrol/types.GetVersionInfo; there are no -X
# variables), and that is "(devel)" -> "dev" for any wrapper module. So the
# wrapper module (deps/go/headscale) only downloads and hash-pins every module,
# and the binary is built with `go install <pkg>@<version>`, where headscale's
# own go.mod/go.sum are the main module (it has no replace directives) and the
# build info carries the real version. `go install pkg@version` also asks the
# proxy for the module's version list (deprecation check), which the proxy
# refuses for github.com/juanfont/headscale (403), so the go command is pointed
# first at its own module download cache (a file:// GOPROXY), which lists the
# versions it holds, then at the usual proxy.
build_headscale() {
  local c=headscale ver dir tmp t0 t1 t2 pkg pair modcache
  ver=$(version_of "$c")
  dir=$(wrapper_dir "$c")
  pair=$(packages_of "$c"); pkg=${pair#*=}
  mkdir -p "$CACHE_ROOT"
  tmp=$(mktemp -d "$CACHE_ROOT/.tmp-$c-$ver.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$tmp'" EXIT
  mkdir -p "$tmp/bin"
  t0=$(date +%s)
  check_wrapper "$c"
  log "$c $ver: downloading modules"
  (cd "$dir" && "$GO" mod download)
  t1=$(date +%s)
  log "$c $ver: compiling $pkg@$ver"
  modcache=$("$GO" env GOMODCACHE)
  (cd "$tmp" && GOBIN="$tmp/bin" GOPROXY="file://$modcache/cache/download,$("$GO" env GOPROXY)" \
    "$GO" install -p "$GO_P" -trimpath -ldflags="-s -w" "$pkg@$ver")
  t2=$(date +%s)
  {
    echo "component: $c $ver"
    echo "go: $("$GO" version)"
    echo "packages: $pkg@$ver (go install)"
    echo "ldflags: -s -w"
    echo "download_seconds: $((t1 - t0))"
    echo "compile_seconds: $((t2 - t1))"
  } >"$tmp/BUILD-INFO"
  publish "$tmp" "$c"
  trap - EXIT
  log "$c $ver: done (download $((t1 - t0))s, compile $((t2 - t1))s) -> $(comp_dir "$c")/bin"
}

build_component() {
  local c=$1 lock
  binaries_of "$c" >/dev/null
  mkdir -p "$CACHE_ROOT"
  lock="$CACHE_ROOT/.lock-$c"
  exec {lockfd}>"$lock"
  flock "$lockfd"
  # leftovers of a build that was killed (we hold the lock: none is running)
  rm -rf "$CACHE_ROOT/.tmp-$c-"* "$CACHE_ROOT/$c-"*.old.*
  if [[ ${TNO_DEPS_FORCE:-0} != 1 ]] && is_cached "$c"; then
    log "$c $(version_of "$c"): cached in $(comp_dir "$c")"
  else
    case $c in
      cert-manager) build_cert_manager ;;
      gateway-api) build_gateway_api ;;
      gateway-api-conformance) build_gateway_api_conformance ;;
      headscale) build_headscale ;;
      *) build_go_component "$c" ;;
    esac
  fi
  exec {lockfd}>&-
}

# in_parallel LIMIT WHAT FUNCTION C...: runs `FUNCTION C` for each component, LIMIT at a time
# in the order given; dies naming the components whose run failed.
in_parallel() {
  local limit=$1 what=$2 function=$3 c pid running=0 failed=()
  shift 3
  declare -A component_of=()
  for c; do
    if ((running >= limit)); then
      wait -n -p pid || failed+=("${component_of[$pid]}")
      running=$((running - 1))
    fi
    "$function" "$c" &
    component_of[$!]=$c
    running=$((running + 1))
  done
  while ((running > 0)); do
    wait -n -p pid || failed+=("${component_of[$pid]}")
    running=$((running - 1))
  done
  ((${#failed[@]} == 0)) || die "$what failed: ${failed[*]} (see above)"
}

# build_all C...: builds the components TNO_DEPS_JOBS at a time (default 2), the longest
# (kubernetes) first. Measured cold on 2 cores, the lab's components took 940 s two at a time,
# about what one at a time takes (~950 s, the sum of the single builds of another run).
build_all() {
  local jobs=${TNO_DEPS_JOBS:-2}
  [[ $jobs =~ ^[1-9][0-9]*$ ]] || die "TNO_DEPS_JOBS=$jobs: expected a positive number"
  in_parallel "$jobs" "building" build_component "$@"
}

# download_component C: `go mod download` of C's wrapper module, unless C is cached.
download_component() {
  local c=$1 dir
  dir=$(wrapper_dir "$c")
  [[ -f $dir/go.mod ]] || return 0
  if [[ ${TNO_DEPS_FORCE:-0} != 1 ]] && is_cached "$c"; then return 0; fi
  (cd "$dir" && "$GO" mod download)
}

# download_all C...: the modules of every component at once (network-bound: scripts/lab.sh runs
# it while cargo has the cores, so the builds that follow only compile).
download_all() {
  (($# == 0)) || in_parallel "$#" "downloading modules" download_component "$@"
}

# -------------------------------------------------------------- --pin
write_tool_gomod() {  # write_tool_gomod C  (go.mod with tool directives, then tidy)
  local c=$1 dir ver mod pair
  dir=$(wrapper_dir "$c")
  ver=$(version_of "$c")
  mod=$(main_module_of "$c")
  mkdir -p "$dir"
  rm -f "$dir/go.sum"
  {
    echo "// Generated by deps/build.sh --pin $c from deps/versions.env. Do not edit."
    echo "module tailnet-operator.dev/deps/$c"
    echo
    echo "go 1.26.0"
    echo
    echo "require ("
    echo "	$mod $ver"
    if [[ $c == etcd ]]; then echo "	go.etcd.io/etcd/etcdctl/v3 $ver"; fi
    echo ")"
    echo
    echo "tool ("
    for pair in $(packages_of "$c"); do echo "	${pair#*=}"; done
    echo ")"
    if [[ $c == kubernetes ]]; then
      # Upstream replaces every staging module with ./staging/src/k8s.io/<m>,
      # which is ignored for a dependency: pin each to the published v0.X.Y.
      local gomod staging="v0.${ver#v1.}" m
      gomod=$(cd /tmp && "$GO" mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
      [[ -f $gomod ]] || die "could not download $mod@$ver go.mod"
      echo
      echo "replace ("
      for m in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\/src\// { print $1 }' "$gomod"); do
        echo "	$m => $m $staging"
      done
      echo ")"
    fi
  } >"$dir/go.mod"
  (cd "$dir" && "$GO" mod tidy)
}

pin_component() {
  local c=$1 dir ver mod
  dir=$(wrapper_dir "$c")
  ver=$(version_of "$c")
  mod=$(main_module_of "$c")
  log "pinning $c $ver in $dir"
  case $c in
    tailscale-minimal)
      log "tailscale-minimal builds from tailscale's wrapper: pin tailscale" ;;
    cert-manager)
      # only the module source is needed (for its CRDs); go.sum pins its hash
      mkdir -p "$dir"
      rm -f "$dir/go.sum"
      printf '%s\n' "// Generated by deps/build.sh --pin $c from deps/versions.env. Do not edit." \
        "// Only the module's source is used (deploy/charts/cert-manager/templates/crd-*.yaml)." \
        "module tailnet-operator.dev/deps/$c" "" "go 1.26.0" "" "require $mod $ver" >"$dir/go.mod"
      (cd "$dir" && "$GO" mod download "$mod")
      grep -q "^$mod $ver " "$dir/go.sum" || die "go.sum for $mod not written" ;;
    gateway-api)
      # only the module's source is needed (its Standard-channel CRDs); go.sum pins its hash
      mkdir -p "$dir"
      rm -f "$dir/go.sum"
      printf '%s\n' "// Generated by deps/build.sh --pin $c from deps/versions.env. Do not edit." \
        "// Only the module's source is used (config/crd/standard/*.yaml)." \
        "module tailnet-operator.dev/deps/$c" "" "go 1.26.0" "" "require $mod $ver" >"$dir/go.mod"
      (cd "$dir" && "$GO" mod download "$mod")
      grep -q "^$mod $ver " "$dir/go.sum" || die "go.sum for $mod not written" ;;
    gateway-api-conformance)
      # conformance_test.go and doc.go are ours (committed). The suite's go.mod requires
      # sigs.k8s.io/gateway-api at v0.0.0-00010101000000-000000000000 and replaces it with
      # ../ (ignored for a dependency): pin the API module at the same version.
      compgen -G "$dir/*_test.go" >/dev/null || die "$dir/*_test.go missing"
      rm -f "$dir/go.sum"
      printf '%s\n' "// Generated by deps/build.sh --pin $c from deps/versions.env" \
        "// (gateway-api's version). The *.go files are ours: the suite's test entry point." \
        "module tailnet-operator.dev/deps/$c" "" "go 1.26.0" "" "require (" \
        "	$mod $ver" "	sigs.k8s.io/gateway-api $ver" ")" "" \
        "replace sigs.k8s.io/gateway-api v0.0.0-00010101000000-000000000000 => sigs.k8s.io/gateway-api $ver" \
        >"$dir/go.mod"
      (cd "$dir" && "$GO" mod tidy) ;;
    cert-manager-controller)
      # main.go is ours (committed); go.mod requires the main module, tidy pins the rest
      [[ -f $dir/main.go ]] || die "$dir/main.go missing"
      rm -f "$dir/go.sum"
      printf '%s\n' "// Generated by deps/build.sh --pin $c from deps/versions.env" \
        "// (cert-manager's version). main.go is ours: a thin main over the module's controllers." \
        "module tailnet-operator.dev/deps/$c" "" "go 1.26.0" "" "require $mod $ver" >"$dir/go.mod"
      (cd "$dir" && "$GO" mod tidy) ;;
    *) write_tool_gomod "$c" ;;
  esac
}

# -------------------------------------------------------------- --check
check_component() {
  local c=$1 ver d out short
  ver=$(version_of "$c")
  d=$(comp_dir "$c")/bin
  short=${ver#v}
  local b
  for b in $(binaries_of "$c"); do
    [[ -x $d/$b ]] || { log "FAIL $c: $d/$b missing (run deps/build.sh $c)"; return 1; }
  done
  # expect NAME CMD... : run CMD, require output to contain the expected text
  expect() {
    local want=$1; shift
    if ! out=$(timeout 30 "$@" 2>&1); then
      log "FAIL $c: '$*' exited non-zero: $out"; return 1
    fi
    if [[ $out != *"$want"* ]]; then
      log "FAIL $c: '$*' printed '$out', expected '$want'"; return 1
    fi
    log "ok   $c: $* -> $(head -n1 <<<"$out")"
  }
  case $c in
    kubernetes)
      expect "Kubernetes $ver" "$d/kube-apiserver" --version || return 1
      expect "Kubernetes $ver" "$d/kube-controller-manager" --version || return 1
      expect "Kubernetes $ver" "$d/kube-proxy" --version || return 1
      expect "nftables" "$d/kube-proxy" --help || return 1 ;;
    etcd)
      expect "etcd Version: $short" "$d/etcd" --version || return 1
      expect "etcdctl version: $short" "$d/etcdctl" version || return 1 ;;
    headscale)
      # no config needed for `version`; never let the CLI look for updates
      expect "$ver" env HEADSCALE_DISABLE_CHECK_UPDATES=true "$d/headscale" version || return 1 ;;
    tailscale-minimal)
      expect "$short" "$d/tailscaled" --version || return 1
      # the build tags took (the binary's build info lists them)
      expect "-tags=ts_omit_ace" "$GO" version -m "$d/tailscaled" || return 1 ;;
    tailscale)
      expect "$short" "$d/tailscaled" --version || return 1
      expect "$short" "$d/tailscale" version || return 1
      # containerboot has no version flag (it is configured by TS_* env and
      # would start tailscaled): check its embedded module version instead.
      expect "tailscale.com	$ver" "$GO" version -m "$d/containerboot" || return 1 ;;
    coredns)
      expect "CoreDNS-$short" "$d/coredns" -version || return 1
      local p plugins
      plugins=$("$d/coredns" -plugins)
      for p in kubernetes hosts forward errors health ready cache reload loop; do
        grep -Eqx "[[:space:]]*(dns\.)?$p" <<<"$plugins" || { log "FAIL coredns: plugin $p not compiled in"; return 1; }
      done
      log "ok   coredns: plugins kubernetes hosts forward errors health ready cache reload loop present" ;;
    helm)
      expect "$ver" "$d/helm" version --short || return 1 ;;
    prometheus)
      local rel=${ver#v0.}
      rel="${rel:0:1}.$((10#${rel:1:2})).${rel#*.}"
      expect "promtool, version $rel" "$d/promtool" --version || return 1
      expect "prometheus, version $rel" "$d/prometheus" --version || return 1 ;;
    caddy)
      expect "$ver" "$d/caddy" version || return 1 ;;
    crane)
      expect "$ver" "$d/crane" version || return 1 ;;
    actionlint)
      expect "$ver" "$d/actionlint" -version || return 1 ;;
    kube-router)
      expect "version $ver" "$d/kube-router" --version || return 1 ;;
    cert-manager-controller)
      expect "cert-manager $ver" "$d/cert-manager-controller" -version || return 1 ;;
    gateway-api-conformance)
      # neither program has a version flag of its own (--version is the *implementation's*
      # version for the report). echo-basic's build info names its module and version; a
      # test binary's build info lists no dependencies, so the suite is checked by the
      # module@version source paths -trimpath leaves in it (both modules, only $ver).
      # Then: it lists its test and takes the suite's flags and our -run/-v.
      expect "sigs.k8s.io/gateway-api/conformance	$ver" "$GO" version -m "$d/echo-basic" || return 1
      local sources
      sources=$(grep -ao 'sigs\.k8s\.io/gateway-api\(/conformance\)\{0,1\}@v[^/]*/' "$d/gateway-api-conformance" | sort -u | tr '\n' ' ')
      if [[ $sources != "sigs.k8s.io/gateway-api/conformance@$ver/ sigs.k8s.io/gateway-api@$ver/ " ]]; then
        log "FAIL $c: the suite's sources are '$sources', expected sigs.k8s.io/gateway-api{,/conformance}@$ver"; return 1
      fi
      log "ok   $c: the suite is built from $sources"
      expect "TestConformance" "$d/gateway-api-conformance" -test.list . || return 1
      local usage flag
      usage=$("$d/gateway-api-conformance" -h 2>&1 || true)
      for flag in gateway-class supported-features conformance-profiles report-output organization \
        project url version contact cleanup-base-resources debug run-test skip-tests kubeconfig run v; do
        grep -q "^  -$flag\([[:space:]]\|$\)" <<<"$usage" || { log "FAIL $c: flag -$flag missing from -h"; return 1; }
      done
      log "ok   $c: the suite's flags and -run/-v present" ;;
    gateway-api)
      local dir f n=0 crds
      dir=$(gateway_api_crds_dir)
      compgen -G "$dir/*.yaml" >/dev/null || { log "FAIL gateway-api: no $dir/*.yaml (run deps/build.sh gateway-api)"; return 1; }
      for f in "$dir"/*.yaml; do
        n=$((n + 1))
        grep -q "^    gateway.networking.k8s.io/bundle-version: $ver\$" "$f" ||
          { log "FAIL gateway-api: ${f##*/} is not bundle-version $ver"; return 1; }
      done
      crds=$(cat "$dir"/*.yaml | grep -c '^kind: CustomResourceDefinition$' || true)
      if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
        python3 - "$dir" <<'PY' || { log "FAIL gateway-api: $dir does not hold valid Standard-channel CRDs"; return 1; }
import glob, sys, yaml
docs = [d for f in sorted(glob.glob(sys.argv[1] + "/*.yaml")) for d in yaml.safe_load_all(open(f)) if d]
crds = [d for d in docs if d.get("kind") == "CustomResourceDefinition"]
names = sorted(d["metadata"]["name"] for d in crds)
assert all(d["metadata"]["annotations"]["gateway.networking.k8s.io/channel"] == "standard" for d in crds), names
for must in ("gatewayclasses", "gateways", "httproutes", "referencegrants", "tlsroutes", "tcproutes"):
    assert must + ".gateway.networking.k8s.io" in names, (must, names)
others = sorted(d["kind"] + "/" + d["metadata"]["name"] for d in docs if d.get("kind") != "CustomResourceDefinition")
print("[deps] ok   gateway-api: %d CRDs: %s; also %s" % (len(names), " ".join(names), " ".join(others)), file=sys.stderr)
PY
      else
        log "ok   gateway-api: $crds CRDs in $n files (YAML not parsed: no python3-yaml)"
      fi ;;
    cert-manager)
      local f
      f=$(crds_path)
      [[ -s $f ]] || { log "FAIL cert-manager: $f missing (run deps/build.sh cert-manager)"; return 1; }
      if grep -q '{{' "$f"; then log "FAIL cert-manager: Helm templating left in $f"; return 1; fi
      if command -v python3 >/dev/null && python3 -c 'import yaml' 2>/dev/null; then
        python3 - "$f" <<'PY' || { log "FAIL cert-manager: $f is not valid CRD YAML"; return 1; }
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
names = sorted(d["metadata"]["name"] for d in docs if d.get("kind") == "CustomResourceDefinition")
assert len(names) == len(docs) >= 6, names
print("[deps] ok   cert-manager: %d CRDs: %s" % (len(names), " ".join(names)), file=sys.stderr)
PY
      else
        log "ok   cert-manager: $(grep -c '^kind: CustomResourceDefinition$' "$f") CRDs (YAML not parsed: no python3-yaml)"
      fi ;;
  esac
}

print_env() {
  local c b
  echo "TNO_DEPS_DIR=$CACHE_ROOT"
  for c in "${COMPONENTS[@]}" "${OPTIONAL_COMPONENTS[@]}"; do
    for b in $(binaries_of "$c"); do
      # the minimal build's binary is named tailscaled too (its pods' command)
      [[ $c != tailscale-minimal ]] || { echo "TNO_BIN_TAILSCALED_MINIMAL=$(comp_dir "$c")/bin/$b"; continue; }
      echo "TNO_BIN_$(tr 'a-z-' 'A-Z_' <<<"$b")=$(comp_dir "$c")/bin/$b"
    done
  done
  echo "TNO_CERT_MANAGER_CRDS=$(crds_path)"
  echo "TNO_GATEWAY_API_CRDS=$(gateway_api_crds_dir)"
}

# -------------------------------------------------------------- main
# components_from_args ARG...: `all` (or nothing) is COMPONENTS; an optional component is
# built only when named (`all gateway-api-conformance` builds both).
components_from_args() {
  local c
  if [[ $# -eq 0 || " $* " == *" all "* ]]; then
    printf '%s\n' "${COMPONENTS[@]}"
    for c; do
      [[ " ${OPTIONAL_COMPONENTS[*]} " != *" $c "* ]] || echo "$c"
    done
  else
    for c; do binaries_of "$c" >/dev/null; echo "$c"; done
  fi
}

main() {
  local mode=build
  case ${1:-} in
    --print-env) print_env; return ;;
    --check) mode=check; shift ;;
    --pin) mode=pin; shift ;;
    --download) mode=download; shift ;;
    -h | --help) sed -n '2,35p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; return ;;
    -*) die "unknown option $1" ;;
  esac
  local comps c failed=0 t0
  for c; do [[ $c == all ]] || binaries_of "$c" >/dev/null; done  # unknown name: exit 1
  mapfile -t comps < <(components_from_args "$@")
  case $mode in
    check)
      setup_go
      for c in "${comps[@]}"; do check_component "$c" || failed=1; done
      [[ $failed == 0 ]] || die "self-check failed"
      log "self-check passed: ${comps[*]}" ;;
    pin)
      setup_go
      for c in "${comps[@]}"; do pin_component "$c"; done ;;
    download)
      setup_go
      t0=$(date +%s)
      download_all "${comps[@]}"
      log "modules downloaded in $(($(date +%s) - t0))s: ${comps[*]}" ;;
    build)
      setup_go
      t0=$(date +%s)
      build_all "${comps[@]}"
      log "all done in $(($(date +%s) - t0))s: ${comps[*]}" ;;
  esac
}

main "$@"; exit $?  # same line: editing this file during a run is then harmless
