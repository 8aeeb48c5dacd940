//! The types read what the apiserver returns (defaults filled in, fields we do not model,
//! values from newer releases) and write the status fields the schema requires.

use kube::Resource;
use pretty_assertions::assert_eq;
use serde_json::json;
use tailnet_gateway_api::gateway::{GatewayStatusAddress, ListenerStatus};
use tailnet_gateway_api::{
    Gateway, GatewayClass, GatewayStatus, HTTPRoute, ReferenceGrant, RouteStatus, TCPRoute,
    TLSRoute,
};

fn from_yaml<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
    serde_yaml::from_str(yaml).expect("test YAML deserializes")
}

#[test]
fn resources_are_served_at_v1_with_their_plurals() {
    let cases = [
        (
            GatewayClass::api_version(&()),
            GatewayClass::kind(&()),
            GatewayClass::plural(&()),
        ),
        (
            Gateway::api_version(&()),
            Gateway::kind(&()),
            Gateway::plural(&()),
        ),
        (
            HTTPRoute::api_version(&()),
            HTTPRoute::kind(&()),
            HTTPRoute::plural(&()),
        ),
        (
            TLSRoute::api_version(&()),
            TLSRoute::kind(&()),
            TLSRoute::plural(&()),
        ),
        (
            TCPRoute::api_version(&()),
            TCPRoute::kind(&()),
            TCPRoute::plural(&()),
        ),
        (
            ReferenceGrant::api_version(&()),
            ReferenceGrant::kind(&()),
            ReferenceGrant::plural(&()),
        ),
    ];
    let got: Vec<(String, String, String)> = cases
        .into_iter()
        .map(|(v, k, p)| (v.into_owned(), k.into_owned(), p.into_owned()))
        .collect();
    let want: Vec<(String, String, String)> = [
        ("GatewayClass", "gatewayclasses"),
        ("Gateway", "gateways"),
        ("HTTPRoute", "httproutes"),
        ("TLSRoute", "tlsroutes"),
        ("TCPRoute", "tcproutes"),
        ("ReferenceGrant", "referencegrants"),
    ]
    .into_iter()
    .map(|(k, p)| {
        (
            "gateway.networking.k8s.io/v1".to_string(),
            k.to_string(),
            p.to_string(),
        )
    })
    .collect();
    assert_eq!(got, want);
}

#[test]
fn gateway_class_is_cluster_scoped_and_the_others_namespaced() {
    fn scope<T: Resource>() -> &'static str {
        let full = std::any::type_name::<T::Scope>();
        full.rsplit("::").next().unwrap_or(full)
    }
    let got = [
        scope::<GatewayClass>(),
        scope::<Gateway>(),
        scope::<HTTPRoute>(),
        scope::<TLSRoute>(),
        scope::<TCPRoute>(),
        scope::<ReferenceGrant>(),
    ];
    let mut want = ["NamespaceResourceScope"; 6];
    want[0] = "ClusterResourceScope";
    assert_eq!(got, want);
}

#[test]
fn gateway_as_the_apiserver_returns_it() {
    let gateway: Gateway = from_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata:
  name: web
  namespace: team-a
  generation: 3
  managedFields: [{manager: kubectl}]
spec:
  gatewayClassName: tailnet
  someFutureField: {x: 1}
  listeners:
  - name: https
    hostname: "*.example.com"
    port: 443
    protocol: HTTPS
    tls:
      mode: Terminate
      certificateRefs:
      - {group: "", kind: Secret, name: cert, namespace: certs}
    allowedRoutes:
      namespaces:
        from: Selector
        selector: {matchLabels: {team: a}}
      kinds: [{group: gateway.networking.k8s.io, kind: HTTPRoute}]
  - name: raw
    port: 5432
    protocol: TCP
    allowedRoutes: {namespaces: {from: Same}}
status:
  conditions:
  - {type: Accepted, status: Unknown, reason: Pending, message: Waiting for controller, lastTransitionTime: "1970-01-01T00:00:00Z"}
"#,
    );
    assert_eq!(gateway.metadata.generation, Some(3));
    assert_eq!(gateway.spec.gateway_class_name, "tailnet");
    let https = &gateway.spec.listeners[0];
    assert_eq!(https.hostname.as_deref(), Some("*.example.com"));
    let tls = https.tls.as_ref().expect("tls");
    assert_eq!(tls.mode.as_deref(), Some("Terminate"));
    assert_eq!(tls.certificate_refs[0].namespace.as_deref(), Some("certs"));
    let allowed = https.allowed_routes.as_ref().expect("allowedRoutes");
    let namespaces = allowed.namespaces.as_ref().expect("namespaces");
    assert_eq!(namespaces.from.as_deref(), Some("Selector"));
    assert!(namespaces.selector.is_some());
    assert_eq!(allowed.kinds[0].kind, "HTTPRoute");
    assert_eq!(gateway.spec.listeners[1].protocol, "TCP");
    let status = gateway.status.expect("status");
    assert_eq!(status.conditions[0].reason, "Pending");
}

#[test]
fn http_route_with_every_field_we_read() {
    let route: HTTPRoute = from_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: app, namespace: team-a, creationTimestamp: "2026-01-02T03:04:05Z"}
spec:
  parentRefs:
  - {group: gateway.networking.k8s.io, kind: Gateway, name: web, namespace: infra, sectionName: https, port: 443}
  hostnames: [app.example.com]
  rules:
  - name: api
    matches:
    - path: {type: PathPrefix, value: /api}
      headers: [{type: Exact, name: version, value: "2"}]
      queryParams: [{type: Exact, name: debug, value: "1"}]
      method: GET
    filters:
    - type: RequestHeaderModifier
      requestHeaderModifier: {set: [{name: x-a, value: "1"}], add: [{name: x-b, value: "2"}], remove: [x-c]}
    - type: ResponseHeaderModifier
      responseHeaderModifier: {set: [{name: x-d, value: "3"}]}
    - type: URLRewrite
      urlRewrite: {hostname: internal, path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    - type: RequestMirror
      requestMirror: {backendRef: {name: shadow, port: 80}}
    backendRefs:
    - {group: "", kind: Service, name: api, namespace: backends, port: 8080, weight: 3}
    - name: api-canary
      port: 8080
      weight: 1
      filters: [{type: RequestHeaderModifier, requestHeaderModifier: {set: [{name: canary, value: "1"}]}}]
    timeouts: {request: 10s, backendRequest: 2s}
  - filters:
    - type: RequestRedirect
      requestRedirect: {scheme: https, hostname: other.example.com, port: 8443, statusCode: 301, path: {type: ReplaceFullPath, replaceFullPath: /}}
"#,
    );
    let parent = &route.spec.parent_refs[0];
    assert_eq!(parent.section_name.as_deref(), Some("https"));
    assert_eq!(parent.port, Some(443));
    let rule = &route.spec.rules[0];
    let m = &rule.matches[0];
    assert_eq!(
        m.path.as_ref().and_then(|p| p.value.as_deref()),
        Some("/api")
    );
    assert_eq!(m.headers[0].name, "version");
    assert_eq!(m.query_params[0].value, "1");
    assert_eq!(m.method.as_deref(), Some("GET"));
    let set = &rule.filters[0]
        .request_header_modifier
        .as_ref()
        .expect("rhm")
        .set;
    assert_eq!(set[0].name, "x-a");
    let rewrite = rule.filters[2].url_rewrite.as_ref().expect("rewrite");
    let rewrite_path = rewrite.path.as_ref().expect("path");
    assert_eq!(rewrite_path.replace_prefix_match.as_deref(), Some("/v2"));
    // A filter type we do not model the body of still deserializes, by its type.
    assert_eq!(rule.filters[3].type_, "RequestMirror");
    let first = &rule.backend_refs[0].backend_ref;
    assert_eq!(
        (first.namespace.as_deref(), first.port, first.weight),
        (Some("backends"), Some(8080), Some(3))
    );
    assert_eq!(rule.backend_refs[1].filters.len(), 1);
    let timeouts = rule.timeouts.as_ref().expect("timeouts");
    assert_eq!(timeouts.backend_request.as_deref(), Some("2s"));
    let redirect = route.spec.rules[1].filters[0]
        .request_redirect
        .as_ref()
        .expect("redirect");
    assert_eq!(
        (
            redirect.scheme.as_deref(),
            redirect.port,
            redirect.status_code
        ),
        (Some("https"), Some(8443), Some(301))
    );
}

#[test]
fn tls_tcp_routes_and_reference_grants() {
    let tls: TLSRoute = from_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TLSRoute
metadata: {name: db, namespace: team-a}
spec:
  parentRefs: [{name: web, sectionName: tls}]
  hostnames: ["*.db.example.com"]
  rules: [{backendRefs: [{name: db, port: 5432, weight: 2}]}]
"#,
    );
    assert_eq!(tls.spec.hostnames, ["*.db.example.com"]);
    assert_eq!(tls.spec.rules[0].backend_refs[0].weight, Some(2));
    let tcp: TCPRoute = from_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: TCPRoute
metadata: {name: raw, namespace: team-a}
spec:
  parentRefs: [{name: web, port: 5432}]
  rules: [{name: only, backendRefs: [{name: raw, namespace: other, port: 5432}]}]
"#,
    );
    assert_eq!(tcp.spec.parent_refs[0].port, Some(5432));
    assert_eq!(tcp.spec.rules[0].name.as_deref(), Some("only"));
    let grant: ReferenceGrant = from_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: ReferenceGrant
metadata: {name: allow, namespace: other}
spec:
  from: [{group: gateway.networking.k8s.io, kind: TCPRoute, namespace: team-a}]
  to: [{group: "", kind: Service, name: raw}, {group: "", kind: Secret}]
"#,
    );
    assert_eq!(grant.spec.from[0].namespace, "team-a");
    assert_eq!(grant.spec.to[0].name.as_deref(), Some("raw"));
    assert_eq!(grant.spec.to[1].name, None);
}

#[test]
fn gateway_class_with_parameters_and_status() {
    let class: GatewayClass = from_yaml(
        r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: tailnet, generation: 2}
spec:
  controllerName: tailnet-operator.dev/gateway
  parametersRef: {group: tailnet-operator.dev, kind: TailnetGatewayParameters, name: default, namespace: ops}
  description: Gateways on the tailnet
status:
  conditions: []
  supportedFeatures: [{name: Gateway}, {name: HTTPRoute}]
"#,
    );
    assert_eq!(class.spec.controller_name, "tailnet-operator.dev/gateway");
    let params = class.spec.parameters_ref.as_ref().expect("parametersRef");
    assert_eq!(params.namespace.as_deref(), Some("ops"));
    let status = class.status.expect("status");
    assert_eq!(status.supported_features[1].name, "HTTPRoute");
}

#[test]
fn status_fields_the_schema_requires_are_always_written() {
    let route_status = serde_json::to_value(RouteStatus::default()).expect("serializes");
    assert_eq!(route_status, json!({"parents": []}));
    let gateway_status = serde_json::to_value(GatewayStatus {
        addresses: vec![GatewayStatusAddress {
            type_: Some("IPAddress".into()),
            value: "100.64.0.7".into(),
        }],
        conditions: vec![],
        listeners: vec![ListenerStatus {
            name: "udp".into(),
            ..ListenerStatus::default()
        }],
    })
    .expect("serializes");
    assert_eq!(
        gateway_status,
        json!({
            "addresses": [{"type": "IPAddress", "value": "100.64.0.7"}],
            "listeners": [{"name": "udp", "supportedKinds": [], "attachedRoutes": 0, "conditions": []}]
        })
    );
}
