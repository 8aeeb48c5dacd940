//! Condition types and reasons of the Gateway API, spelled as `apis/v1` defines them. One
//! module per object whose status carries them; a reason shared by several objects appears in
//! each module it belongs to.

/// `GatewayClass.status.conditions`.
pub mod gateway_class {
    pub const ACCEPTED: &str = "Accepted";
    pub const SUPPORTED_VERSION: &str = "SupportedVersion";

    pub mod reasons {
        /// `Accepted=True`.
        pub const ACCEPTED: &str = "Accepted";
        /// `Accepted=False`: the parametersRef is missing, of an unsupported kind or malformed.
        pub const INVALID_PARAMETERS: &str = "InvalidParameters";
        /// `Accepted=Unknown`: no decision yet (the CRD's default).
        pub const PENDING: &str = "Pending";
        /// `Accepted=False`: the implementation does not support a user-defined GatewayClass.
        pub const UNSUPPORTED: &str = "Unsupported";
        /// `SupportedVersion=True`.
        pub const SUPPORTED_VERSION: &str = "SupportedVersion";
        /// `SupportedVersion=False` or `Accepted=False`: the installed CRDs' bundle version is
        /// not supported.
        pub const UNSUPPORTED_VERSION: &str = "UnsupportedVersion";
    }
}

/// `Gateway.status.conditions`.
pub mod gateway {
    pub const ACCEPTED: &str = "Accepted";
    pub const PROGRAMMED: &str = "Programmed";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";

    pub mod reasons {
        /// `Accepted=True`.
        pub const ACCEPTED: &str = "Accepted";
        /// `Accepted=True` (some listeners are valid) or `False` (none is).
        pub const LISTENERS_NOT_VALID: &str = "ListenersNotValid";
        /// `Accepted`/`Programmed` `Unknown`: not reconciled yet.
        pub const PENDING: &str = "Pending";
        /// `Accepted=False`: a `spec.addresses` type is not supported.
        pub const UNSUPPORTED_ADDRESS: &str = "UnsupportedAddress";
        /// `Accepted=False`: the Gateway's own parametersRef is invalid.
        pub const INVALID_PARAMETERS: &str = "InvalidParameters";
        /// `Accepted=False` or `Programmed=False`: syntactically or semantically invalid.
        pub const INVALID: &str = "Invalid";
        /// `Programmed=True`.
        pub const PROGRAMMED: &str = "Programmed";
        /// `Programmed=False`: not enough infrastructure to schedule the Gateway.
        pub const NO_RESOURCES: &str = "NoResources";
        /// `Programmed=False`: no address assigned yet.
        pub const ADDRESS_NOT_ASSIGNED: &str = "AddressNotAssigned";
        /// `Programmed=False`: a `spec.addresses` value cannot be used.
        pub const ADDRESS_NOT_USABLE: &str = "AddressNotUsable";
        /// `ResolvedRefs=True`.
        pub const RESOLVED_REFS: &str = "ResolvedRefs";
        /// `ResolvedRefs=False`: a listener's `ResolvedRefs` is False.
        pub const LISTENERS_NOT_RESOLVED: &str = "ListenersNotResolved";
        /// `ResolvedRefs=False`: a cross-namespace reference lacks a ReferenceGrant.
        pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    }
}

/// `Gateway.status.listeners[].conditions`.
pub mod listener {
    pub const ACCEPTED: &str = "Accepted";
    pub const PROGRAMMED: &str = "Programmed";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    pub const CONFLICTED: &str = "Conflicted";
    /// Negative polarity: only ever set to True, removed otherwise.
    pub const OVERLAPPING_TLS_CONFIG: &str = "OverlappingTLSConfig";

    pub mod reasons {
        /// `Accepted=True`.
        pub const ACCEPTED: &str = "Accepted";
        /// `Accepted=False`: the port cannot be used.
        pub const PORT_UNAVAILABLE: &str = "PortUnavailable";
        /// `Accepted=False`: the protocol is not supported.
        pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
        /// `Accepted=False`: no CA certificate for client validation could be resolved.
        pub const NO_VALID_CA_CERTIFICATE: &str = "NoValidCACertificate";
        /// `Accepted=False`: a field value is not supported by the implementation.
        pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
        /// `Accepted`/`Programmed` `Unknown` or `False`: not reconciled or not ready yet.
        pub const PENDING: &str = "Pending";
        /// `Programmed=True`.
        pub const PROGRAMMED: &str = "Programmed";
        /// `Programmed=False`: the listener is invalid.
        pub const INVALID: &str = "Invalid";
        /// `ResolvedRefs=True`.
        pub const RESOLVED_REFS: &str = "ResolvedRefs";
        /// `ResolvedRefs=False`: a certificateRef is missing, of an unsupported kind or
        /// malformed (and the reference itself is permitted).
        pub const INVALID_CERTIFICATE_REF: &str = "InvalidCertificateRef";
        /// `ResolvedRefs=False`: `allowedRoutes.kinds` names a kind this listener cannot serve.
        pub const INVALID_ROUTE_KINDS: &str = "InvalidRouteKinds";
        /// `ResolvedRefs=False`: a cross-namespace certificateRef lacks a ReferenceGrant.
        pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
        /// `ResolvedRefs=False`: a CA certificate reference is invalid.
        pub const INVALID_CA_CERTIFICATE_REF: &str = "InvalidCACertificateRef";
        /// `ResolvedRefs=False`: a CA certificate reference is of an unsupported kind.
        pub const INVALID_CA_CERTIFICATE_KIND: &str = "InvalidCACertificateKind";
        /// `Conflicted=True`: another listener on the port has the same hostname.
        pub const HOSTNAME_CONFLICT: &str = "HostnameConflict";
        /// `Conflicted=True`: another listener on the port has an incompatible protocol.
        pub const PROTOCOL_CONFLICT: &str = "ProtocolConflict";
        /// `Conflicted=False`.
        pub const NO_CONFLICTS: &str = "NoConflicts";
        /// `OverlappingTLSConfig=True`: hostnames overlap with another listener's on the port.
        pub const OVERLAPPING_HOSTNAMES: &str = "OverlappingHostnames";
        /// `OverlappingTLSConfig=True`: certificates overlap with another listener's.
        pub const OVERLAPPING_CERTIFICATES: &str = "OverlappingCertificates";
    }
}

/// `*Route.status.parents[].conditions`.
pub mod route {
    pub const ACCEPTED: &str = "Accepted";
    pub const RESOLVED_REFS: &str = "ResolvedRefs";
    /// Only ever set to True (some rules valid, some dropped).
    pub const PARTIALLY_INVALID: &str = "PartiallyInvalid";

    pub mod reasons {
        /// `Accepted=True`.
        pub const ACCEPTED: &str = "Accepted";
        /// `Accepted=False`: no listener's allowedRoutes admits the route.
        pub const NOT_ALLOWED_BY_LISTENERS: &str = "NotAllowedByListeners";
        /// `Accepted=False`: no admitting listener's hostname intersects the route's.
        pub const NO_MATCHING_LISTENER_HOSTNAME: &str = "NoMatchingListenerHostname";
        /// `Accepted=False`: sectionName and/or port match no listener.
        pub const NO_MATCHING_PARENT: &str = "NoMatchingParent";
        /// `Accepted=False` (or `PartiallyInvalid=True`): an enum value is not supported.
        pub const UNSUPPORTED_VALUE: &str = "UnsupportedValue";
        /// `Accepted=Unknown`: not reconciled yet.
        pub const PENDING: &str = "Pending";
        /// `Accepted=False`: incompatible filters in a rule (URLRewrite with RequestRedirect).
        pub const INCOMPATIBLE_FILTERS: &str = "IncompatibleFilters";
        /// `ResolvedRefs=True`.
        pub const RESOLVED_REFS: &str = "ResolvedRefs";
        /// `ResolvedRefs=False`: a cross-namespace backendRef lacks a ReferenceGrant.
        pub const REF_NOT_PERMITTED: &str = "RefNotPermitted";
        /// `ResolvedRefs=False`: a backendRef names an unsupported group/kind.
        pub const INVALID_KIND: &str = "InvalidKind";
        /// `ResolvedRefs=False`: a backendRef names an object that does not exist.
        pub const BACKEND_NOT_FOUND: &str = "BackendNotFound";
        /// `ResolvedRefs=False`: the backend's app protocol is not supported.
        pub const UNSUPPORTED_PROTOCOL: &str = "UnsupportedProtocol";
    }
}
