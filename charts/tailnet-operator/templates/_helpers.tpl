{{- define "tailnet-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tailnet-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tailnet-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tailnet-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "tailnet-operator.labels" -}}
{{ include "tailnet-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "tailnet-operator.serviceAccountName" -}}
{{- default (include "tailnet-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* image reference: [registry/]repository:tag[@digest]; ctx = dict "image" <values> "default"
<tag> "global" <.Values.global>. The registry (image.registry, else global.imageRegistry) is a
prefix of the repository, e.g. a pull-through mirror: mirror.example.net/ghcr.io/… */}}
{{- define "tailnet-operator.image" -}}
{{- $tag := default .default .image.tag -}}
{{- $registry := default (dig "imageRegistry" "" (default dict .global)) .image.registry -}}
{{- $repository := .image.repository -}}
{{- if $registry -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" $registry) $repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s:%s@%s" $repository $tag .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The operator pod's imagePullSecrets: global.imagePullSecrets, then imagePullSecrets. */}}
{{- define "tailnet-operator.imagePullSecrets" -}}
{{- $secrets := concat (default list .Values.global.imagePullSecrets) (default list .Values.imagePullSecrets) | uniq -}}
{{- with $secrets }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/* Whether the cluster serves a monitoring.coreos.com/v1 kind (ctx: dict "root" $ "kind" <Kind>);
"true" or empty. `helm template` without --api-versions assumes it does not. */}}
{{- define "tailnet-operator.hasMonitoringKind" -}}
{{- if .root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" .kind) -}}true{{- end -}}
{{- end -}}

{{- /*
RBAC rules, split by where they are granted. Every rule is what crates/operator/src really
calls; each is listed with its reason in crates/testenv/e2e/tests/helm_chart.rs (which fails on
anything not listed).
*/ -}}

{{- /* Cluster-wide in every mode: Tailnets are cluster-scoped; kube-system's uid is the default installation id. */ -}}
{{- define "tailnet-operator.clusterRules" -}}
- apiGroups: [tailnet-operator.dev]
  resources: [tailnets]
  verbs: [get, list, watch]
- apiGroups: [tailnet-operator.dev]
  resources: [tailnets/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [namespaces]
  resourceNames: [kube-system]
  verbs: [get]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  resourceNames: [kubernetes]
  verbs: [get]
# Gateway API (docs/gateway-api.md): read the classes, Gateways, routes and grants; write the
# status of ours (classes of controllerName tailnet-operator.dev/gateway and what they serve).
- apiGroups: [gateway.networking.k8s.io]
  resources: [gatewayclasses, gateways, httproutes, tlsroutes, tcproutes, referencegrants]
  verbs: [get, list, watch]
# The finalizer of a served Gateway (its tailnet node is removed before it goes).
- apiGroups: [gateway.networking.k8s.io]
  resources: [gateways]
  verbs: [patch]
- apiGroups: [gateway.networking.k8s.io]
  resources: [gatewayclasses/status, gateways/status, httproutes/status, tlsroutes/status, tcproutes/status]
  verbs: [patch]
- apiGroups: [tailnet-operator.dev]
  resources: [tailnetgatewayparameters]
  verbs: [get, list, watch]
# Labels of route namespaces, for listeners that admit routes by namespace selector.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [get]
{{- end -}}

{{- /* Where TailnetIngresses, Services of the tailnet loadBalancerClass and their agents live: the ClusterRole (whole cluster) or a Role in each watched namespace. */ -}}
{{- define "tailnet-operator.workloadRules" -}}
- apiGroups: [tailnet-operator.dev]
  resources: [tailnetegresses, tailnetingresses]
  verbs: [get, list, watch, patch]
- apiGroups: [tailnet-operator.dev]
  resources: [tailnetegresses/status, tailnetingresses/status]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get, create, patch, update, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [cert-manager.io]
  resources: [certificates]
  verbs: [create, patch]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create, patch]
{{- end -}}

{{- /* The watched namespaces (release namespace included, sorted), or empty for the whole cluster. */ -}}
{{- define "tailnet-operator.watchNamespaces" -}}
{{- if .Values.watchNamespaces -}}
{{- append .Values.watchNamespaces .Release.Namespace | uniq | sortAlpha | join "," -}}
{{- end -}}
{{- end -}}
