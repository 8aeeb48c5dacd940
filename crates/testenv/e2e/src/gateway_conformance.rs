//! The upstream Gateway API conformance suite (`deps/build.sh gateway-api-conformance`: the
//! `sigs.k8s.io/gateway-api/conformance` test compiled into a program) run against the lab:
//! its command line ([`SuiteRun::args`]), the runner's settings from the environment
//! ([`RunnerConfig::from_vars`]), the GatewayClass it tests ([`gateway_class_object`]), the
//! suite process inside a netns ([`run_suite`]) and what its report and log say
//! ([`ConformanceReport`], [`subtest_outcomes`], [`summary`]).
//!
//! The suite dials the Gateways' `status.addresses` (tailnet IPs) from its own process, so it
//! runs in the netns of a kernel-mode tailnet node (`tailscale0`, see
//! `tno_testenv_tailnet::TunMode::Kernel`), with a kubeconfig for the apiserver's lab address.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use tno_netlab::{ChildProcess, Netns};

/// The GatewayClass the suite tests.
pub const GATEWAY_CLASS: &str = "tailnet";
/// The product's controller name (SPEC §3).
pub const CONTROLLER_NAME: &str = "tailnet-operator.dev/gateway";
/// The profiles that apply to the product (issue 30).
pub const PROFILES: [&str; 3] = ["GATEWAY-HTTP", "GATEWAY-TLS", "GATEWAY-TCP"];
/// The core features of [`PROFILES`]. Declared explicitly: without `-supported-features`
/// the suite reads them from the GatewayClass' `status.supportedFeatures` and refuses to
/// start when that is empty.
pub const CORE_FEATURES: [&str; 5] = [
    "Gateway",
    "HTTPRoute",
    "ReferenceGrant",
    "TLSRoute",
    "TCPRoute",
];
/// The suite's timeout names that `-timeout-config-overrides` accepts (`Name:seconds`;
/// `RequiredConsecutiveSuccesses` is a count). The suite silently ignores any other name, so
/// the runner refuses them.
pub const TIMEOUT_NAMES: [&str; 25] = [
    "CreateTimeout",
    "DeleteTimeout",
    "GetTimeout",
    "GatewayMustHaveAddress",
    "GatewayMustHaveCondition",
    "GatewayStatusMustHaveListeners",
    "GatewayListenersMustHaveConditions",
    "ListenerSetMustHaveCondition",
    "ListenerSetListenersMustHaveConditions",
    "GWCMustBeAccepted",
    "HTTPRouteMustNotHaveParents",
    "HTTPRouteMustHaveCondition",
    "TLSRouteMustHaveCondition",
    "TCPRouteMustHaveCondition",
    "UDPRouteMustHaveCondition",
    "RouteMustHaveParents",
    "ManifestFetchTimeout",
    "MaxTimeToConsistency",
    "NamespacesMustBeReady",
    "RequestTimeout",
    "LatestObservedGenerationSet",
    "DefaultTestTimeout",
    "DefaultPollInterval",
    "RequiredConsecutiveSuccesses",
    "TestIsolation",
];
/// Longest accepted value of a list setting (features, profiles, extra arguments).
const MAX_LIST_ITEMS: usize = 64;
/// Longest accepted single value (a path, a URL, an argument).
const MAX_VALUE_LEN: usize = 512;
/// The runner's default bound on one whole suite run.
const DEFAULT_DEADLINE: Duration = Duration::from_secs(3 * 3600);

/// What went wrong while preparing or reading a conformance run.
#[derive(Debug, thiserror::Error)]
pub enum ConformanceError {
    #[error("{variable}: {reason}")]
    Setting {
        variable: &'static str,
        reason: String,
    },
    #[error("the conformance report {path} cannot be parsed")]
    Report {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
}

/// The implementation named in the report (`-organization`, `-project`, `-url`, `-version`,
/// `-contact`; the suite refuses to write a report when one is empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Implementation {
    pub organization: String,
    pub project: String,
    pub url: String,
    pub version: String,
    pub contact: Vec<String>,
}

impl Implementation {
    /// tailnet-operator at `version`.
    pub fn tailnet_operator(version: &str) -> Self {
        Implementation {
            organization: "tailnet-operator".into(),
            project: "tailnet-operator".into(),
            url: "https://github.com/tailnet-operator/tailnet-operator".into(),
            version: version.into(),
            contact: vec!["https://github.com/tailnet-operator/tailnet-operator/issues".into()],
        }
    }
}

/// One run of the suite: what its command line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuiteRun {
    pub gateway_class: String,
    pub profiles: Vec<String>,
    pub supported_features: Vec<String>,
    pub implementation: Implementation,
    pub report: PathBuf,
    /// `(name, seconds)` for `-timeout-config-overrides`.
    pub timeouts: Vec<(String, u32)>,
    /// Appended as they are (e.g. `-run-test=HTTPRouteSimpleSameNamespace`).
    pub extra_args: Vec<String>,
}

impl SuiteRun {
    /// The suite's flags, `-v` (every subtest's outcome in the log) first.
    pub fn args(&self) -> Vec<String> {
        let implementation = &self.implementation;
        let mut args = vec![
            "-v".to_owned(),
            format!("-gateway-class={}", self.gateway_class),
            format!("-conformance-profiles={}", self.profiles.join(",")),
            format!("-supported-features={}", self.supported_features.join(",")),
            format!("-organization={}", implementation.organization),
            format!("-project={}", implementation.project),
            format!("-url={}", implementation.url),
            format!("-version={}", implementation.version),
            format!("-contact={}", implementation.contact.join(",")),
            format!("-report-output={}", self.report.display()),
        ];
        if !self.timeouts.is_empty() {
            let overrides: Vec<String> = self
                .timeouts
                .iter()
                .map(|(name, seconds)| format!("{name}:{seconds}"))
                .collect();
            args.push(format!("-timeout-config-overrides={}", overrides.join(";")));
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// Who marks the GatewayClass `Accepted`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassAcceptance {
    /// The implementation's controller (the real run).
    Controller,
    /// The runner itself, before the suite starts: a check of the harness (base manifests,
    /// backend pods, the suite's client on the tailnet) while no controller exists. Its
    /// results say nothing about the product.
    StandIn,
}

/// The runner's settings (`TNO_GATEWAY_CONFORMANCE_*`, see docs/gateway-api-conformance.md).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunnerConfig {
    pub run: SuiteRun,
    /// The suite's combined output (next to the report).
    pub log: PathBuf,
    pub acceptance: ClassAcceptance,
    /// Whether the workspace's operator runs (with a Tailnet) during the suite.
    pub operator: bool,
    pub deadline: Duration,
}

impl RunnerConfig {
    /// Reads the settings through `var` (the process environment in the runner); relative
    /// paths and defaults are under `default_dir` (e.g. `target/gateway-conformance`).
    pub fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        default_dir: &Path,
        default_version: &str,
    ) -> Result<RunnerConfig, ConformanceError> {
        let var = |name: &str| var(name).filter(|value| !value.trim().is_empty());
        let report = match var("TNO_GATEWAY_CONFORMANCE_REPORT") {
            Some(path) => {
                bounded("TNO_GATEWAY_CONFORMANCE_REPORT", &path)?;
                default_dir.join(path)
            }
            None => default_dir.join("report.yaml"),
        };
        let log = report.with_extension("log");
        let list = |name: &'static str, default: &[&str]| match var(name) {
            Some(text) => parse_names(name, &text),
            None => Ok(default.iter().map(|item| item.to_string()).collect()),
        };
        let profiles = list("TNO_GATEWAY_CONFORMANCE_PROFILES", &PROFILES)?;
        let supported_features = list("TNO_GATEWAY_CONFORMANCE_FEATURES", &CORE_FEATURES)?;
        let timeouts = match var("TNO_GATEWAY_CONFORMANCE_TIMEOUTS") {
            Some(text) => parse_timeouts(&text)?,
            None => Vec::new(),
        };
        let extra_args = match var("TNO_GATEWAY_CONFORMANCE_ARGS") {
            Some(text) => parse_extra_args(&text)?,
            None => Vec::new(),
        };
        let acceptance = match var("TNO_GATEWAY_CONFORMANCE_CLASS_STATUS").as_deref() {
            None | Some("controller") => ClassAcceptance::Controller,
            Some("stand-in") => ClassAcceptance::StandIn,
            Some(other) => {
                return Err(ConformanceError::Setting {
                    variable: "TNO_GATEWAY_CONFORMANCE_CLASS_STATUS",
                    reason: format!("{other:?}: expected `controller` or `stand-in`"),
                });
            }
        };
        let operator = match var("TNO_GATEWAY_CONFORMANCE_OPERATOR").as_deref() {
            None | Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return Err(ConformanceError::Setting {
                    variable: "TNO_GATEWAY_CONFORMANCE_OPERATOR",
                    reason: format!("{other:?}: expected `on` or `off`"),
                });
            }
        };
        let deadline = match var("TNO_GATEWAY_CONFORMANCE_DEADLINE") {
            Some(text) => {
                Duration::from_secs(parse_seconds("TNO_GATEWAY_CONFORMANCE_DEADLINE", &text)?)
            }
            None => DEFAULT_DEADLINE,
        };
        let version = match var("TNO_GATEWAY_CONFORMANCE_VERSION") {
            Some(version) => bounded("TNO_GATEWAY_CONFORMANCE_VERSION", &version)?.to_owned(),
            None => default_version.to_owned(),
        };
        Ok(RunnerConfig {
            run: SuiteRun {
                gateway_class: GATEWAY_CLASS.into(),
                profiles,
                supported_features,
                implementation: Implementation::tailnet_operator(&version),
                report,
                timeouts,
                extra_args,
            },
            log,
            acceptance,
            operator,
            deadline,
        })
    }
}

fn bounded<'a>(variable: &'static str, value: &'a str) -> Result<&'a str, ConformanceError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(ConformanceError::Setting {
            variable,
            reason: format!("longer than {MAX_VALUE_LEN} characters"),
        });
    }
    Ok(value)
}

/// A comma-separated list of names the suite knows by their spelling (features, profiles):
/// letters, digits and `-`, starting with a letter.
fn parse_names(variable: &'static str, text: &str) -> Result<Vec<String>, ConformanceError> {
    let names: Vec<String> = text
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect();
    if names.is_empty() || names.len() > MAX_LIST_ITEMS {
        return Err(ConformanceError::Setting {
            variable,
            reason: format!("expected 1 to {MAX_LIST_ITEMS} comma-separated names"),
        });
    }
    for name in &names {
        let well_formed = name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
        if !well_formed {
            return Err(ConformanceError::Setting {
                variable,
                reason: format!("{name:?} is not a feature or profile name"),
            });
        }
    }
    Ok(names)
}

fn parse_seconds(variable: &'static str, text: &str) -> Result<u64, ConformanceError> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|seconds| (1..=86_400).contains(seconds))
        .ok_or_else(|| ConformanceError::Setting {
            variable,
            reason: format!("{text:?} is not a number of seconds between 1 and 86400"),
        })
}

/// `Name:seconds;Name:seconds` with names from [`TIMEOUT_NAMES`].
pub fn parse_timeouts(text: &str) -> Result<Vec<(String, u32)>, ConformanceError> {
    const VARIABLE: &str = "TNO_GATEWAY_CONFORMANCE_TIMEOUTS";
    let mut timeouts = Vec::new();
    for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let invalid = |reason: String| ConformanceError::Setting {
            variable: VARIABLE,
            reason,
        };
        let (name, seconds) = entry
            .split_once(':')
            .ok_or_else(|| invalid(format!("{entry:?} is not Name:seconds")))?;
        let name = name.trim();
        if !TIMEOUT_NAMES.contains(&name) {
            return Err(invalid(format!(
                "{name:?} is not one of the suite's timeouts ({})",
                TIMEOUT_NAMES.join(", ")
            )));
        }
        let seconds = parse_seconds(VARIABLE, seconds)?;
        let seconds = u32::try_from(seconds).map_err(|_| invalid(format!("{seconds} too big")))?;
        timeouts.push((name.to_owned(), seconds));
    }
    if timeouts.is_empty() || timeouts.len() > MAX_LIST_ITEMS {
        return Err(ConformanceError::Setting {
            variable: VARIABLE,
            reason: "expected Name:seconds entries separated by `;`".into(),
        });
    }
    Ok(timeouts)
}

/// Whitespace-separated arguments for the suite, each a `-flag` or `-flag=value`.
fn parse_extra_args(text: &str) -> Result<Vec<String>, ConformanceError> {
    const VARIABLE: &str = "TNO_GATEWAY_CONFORMANCE_ARGS";
    let args: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
    if args.len() > MAX_LIST_ITEMS {
        return Err(ConformanceError::Setting {
            variable: VARIABLE,
            reason: format!("more than {MAX_LIST_ITEMS} arguments"),
        });
    }
    for arg in &args {
        bounded(VARIABLE, arg)?;
        if !arg.starts_with('-') {
            return Err(ConformanceError::Setting {
                variable: VARIABLE,
                reason: format!("{arg:?} is not a -flag or -flag=value"),
            });
        }
    }
    Ok(args)
}

/// Where the class's TailnetGatewayParameters live and what they say.
#[derive(Clone, Copy, Debug)]
pub struct ClassParameters<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The Tailnet the class's Gateways join.
    pub tailnet: &'a str,
    /// Granted access to every listener port (the suite's client must be among them).
    pub allow_from: &'a [&'a str],
}

/// The TailnetGatewayParameters of the class (server-side apply body).
pub fn gateway_parameters_object(parameters: &ClassParameters<'_>) -> Value {
    json!({
        "apiVersion": "tailnet-operator.dev/v1alpha1",
        "kind": "TailnetGatewayParameters",
        "metadata": {"name": parameters.name, "namespace": parameters.namespace},
        "spec": {
            "tailnetRef": {"name": parameters.tailnet},
            "allowFrom": parameters.allow_from,
        },
    })
}

/// The GatewayClass the suite tests (server-side apply body), naming its parameters.
pub fn gateway_class_object(name: &str, parameters: &ClassParameters<'_>) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "GatewayClass",
        "metadata": {"name": name},
        "spec": {
            "controllerName": CONTROLLER_NAME,
            // The CRD allows 64 bytes.
            "description": "tailnet-operator: Gateways as tailnet nodes",
            "parametersRef": {
                "group": "tailnet-operator.dev",
                "kind": "TailnetGatewayParameters",
                "name": parameters.name,
                "namespace": parameters.namespace,
            },
        },
    })
}

/// The status a stand-in writes ([`ClassAcceptance::StandIn`]): `Accepted=True` for
/// `generation`, with a message that says who wrote it.
pub fn stand_in_class_status(generation: i64, now_rfc3339: &str) -> Value {
    json!({
        "status": {
            "conditions": [{
                "type": "Accepted",
                "status": "True",
                "reason": "Accepted",
                "message": "set by the conformance runner's stand-in (harness check, no controller)",
                "observedGeneration": generation,
                "lastTransitionTime": now_rfc3339,
            }],
        },
    })
}

/// How a `go test -v` subtest ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Pass,
    Fail,
    Skip,
}

/// The outcome of every `TestConformance/<ShortName>` subtest in a `go test -v` log (the
/// suite's tests; their own sub-subtests are left out), in log order.
pub fn subtest_outcomes(log: &str) -> Vec<(String, Outcome)> {
    const PREFIX: &str = "TestConformance/";
    log.lines()
        .filter_map(|line| {
            let line = line.trim_start();
            let (outcome, rest) = [
                ("--- PASS: ", Outcome::Pass),
                ("--- FAIL: ", Outcome::Fail),
                ("--- SKIP: ", Outcome::Skip),
            ]
            .into_iter()
            .find_map(|(marker, outcome)| line.strip_prefix(marker).map(|rest| (outcome, rest)))?;
            let name = rest.split_whitespace().next()?.strip_prefix(PREFIX)?;
            (!name.is_empty() && !name.contains('/')).then(|| (name.to_owned(), outcome))
        })
        .collect()
}

/// Why the suite (or its setup) failed: each of testify's failure blocks in a `go test` log
/// (tab-indented `Error Trace:`/`Error:`/`Test:`/`Messages:` fields and their continuation
/// lines) as `<Error> (<Messages>)`.
pub fn failure_messages(log: &str) -> Vec<String> {
    const FIELDS: [&str; 4] = ["Error Trace", "Error", "Test", "Messages"];
    fn flush(fields: &mut Vec<(&'static str, String)>, failures: &mut Vec<String>) {
        let field = |name: &str| {
            fields
                .iter()
                .find(|(field, _)| *field == name)
                .map(|(_, text)| text.clone())
        };
        if let Some(error) = field("Error") {
            failures.push(match field("Messages").filter(|m| !m.is_empty()) {
                Some(messages) => format!("{error} ({messages})"),
                None => error,
            });
        }
        fields.clear();
    }
    let mut failures = Vec::new();
    let mut fields: Vec<(&'static str, String)> = Vec::new();
    for line in log.lines() {
        // testify indents with tabs; go test's own lines (t.Log, --- FAIL) with spaces.
        if !line.trim_start_matches(' ').starts_with('\t') {
            flush(&mut fields, &mut failures);
            continue;
        }
        let text = line.trim();
        let field = FIELDS.iter().find_map(|name| {
            let rest = text.strip_prefix(name)?.strip_prefix(':')?;
            Some((*name, rest.trim()))
        });
        match field {
            Some((name, rest)) => {
                if name == "Error Trace" {
                    flush(&mut fields, &mut failures);
                }
                fields.push((name, rest.to_owned()));
            }
            None => {
                if let Some((_, current)) = fields.last_mut() {
                    if !current.is_empty() {
                        current.push(' ');
                    }
                    current.push_str(text);
                }
            }
        }
    }
    flush(&mut fields, &mut failures);
    failures
}

/// The suite's report (`-report-output`, `gateway.networking.k8s.io/v1 ConformanceReport`).
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ConformanceReport {
    #[serde(default)]
    pub date: String,
    #[serde(default, rename = "gatewayAPIVersion")]
    pub gateway_api_version: String,
    #[serde(default, rename = "gatewayAPIChannel")]
    pub gateway_api_channel: String,
    #[serde(default)]
    pub mode: String,
    /// `null` when no test ran (the suite's setup failed).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub profiles: Vec<ProfileReport>,
}

fn null_as_empty<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Ok(Option::<Vec<T>>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct ProfileReport {
    pub name: String,
    #[serde(default)]
    pub summary: String,
    pub core: Status,
    #[serde(default)]
    pub extended: Option<Status>,
}

/// A profile's core or extended result. (The extended one also lists features.)
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    #[serde(default)]
    pub result: String,
    #[serde(default)]
    pub statistics: Statistics,
    #[serde(default)]
    pub failed_tests: Vec<String>,
    #[serde(default)]
    pub skipped_tests: Vec<String>,
    #[serde(default)]
    pub supported_features: Vec<String>,
    #[serde(default)]
    pub unsupported_features: Vec<String>,
}

/// The suite marshals these fields without JSON tags: capitalised keys.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Statistics {
    #[serde(rename = "Passed", default)]
    pub passed: u32,
    #[serde(rename = "Failed", default)]
    pub failed: u32,
    #[serde(rename = "Skipped", default)]
    pub skipped: u32,
}

impl ConformanceReport {
    pub fn parse(text: &str, path: &Path) -> Result<ConformanceReport, ConformanceError> {
        serde_yaml::from_str(text).map_err(|source| ConformanceError::Report {
            path: path.to_owned(),
            source,
        })
    }
}

/// The runner's summary: per profile (from the report, when there is one) core and extended
/// results with counts and the failed tests; then every subtest's outcome from the log, and
/// the failure messages when the suite stopped before any subtest ran.
pub fn summary(report: Option<&ConformanceReport>, log: &str) -> String {
    let mut out = String::new();
    match report {
        Some(report) if !report.profiles.is_empty() => {
            out.push_str(&format!(
                "report: Gateway API {} ({}), mode {}, {}\n",
                report.gateway_api_version, report.gateway_api_channel, report.mode, report.date
            ));
            for profile in &report.profiles {
                out.push_str(&profile_lines(profile));
            }
        }
        Some(_) => out.push_str("report: no profile results (no test ran)\n"),
        None => out.push_str("report: none written\n"),
    }
    let outcomes = subtest_outcomes(log);
    let mut by_outcome: BTreeMap<Outcome, Vec<&str>> = BTreeMap::new();
    for (name, outcome) in &outcomes {
        by_outcome.entry(*outcome).or_default().push(name);
    }
    let count = |outcome| by_outcome.get(&outcome).map_or(0, Vec::len);
    out.push_str(&format!(
        "suite subtests: {} passed, {} failed, {} skipped\n",
        count(Outcome::Pass),
        count(Outcome::Fail),
        count(Outcome::Skip)
    ));
    for (outcome, names) in &by_outcome {
        out.push_str(&format!("  {outcome:?}: {}\n", names.join(", ")));
    }
    if outcomes.is_empty() {
        for message in failure_messages(log) {
            out.push_str(&format!("  setup failed: {message}\n"));
        }
    }
    out
}

fn profile_lines(profile: &ProfileReport) -> String {
    let status_line = |label: &str, status: &Status| {
        let s = status.statistics;
        let mut line = format!(
            "  {label}: {} (passed {}, failed {}, skipped {})\n",
            if status.result.is_empty() {
                "-"
            } else {
                &status.result
            },
            s.passed,
            s.failed,
            s.skipped
        );
        if !status.failed_tests.is_empty() {
            line.push_str(&format!("    failed: {}\n", status.failed_tests.join(", ")));
        }
        if !status.skipped_tests.is_empty() {
            line.push_str(&format!(
                "    skipped: {}\n",
                status.skipped_tests.join(", ")
            ));
        }
        line
    };
    let mut out = format!("{}: {}\n", profile.name, profile.summary);
    out.push_str(&status_line("core", &profile.core));
    if let Some(extended) = &profile.extended {
        out.push_str(&status_line("extended", extended));
        if !extended.unsupported_features.is_empty() {
            out.push_str(&format!(
                "    not declared: {}\n",
                extended.unsupported_features.join(", ")
            ));
        }
    }
    out
}

/// How a suite process ended.
#[derive(Debug)]
pub enum SuiteExit {
    Exited(ExitStatus),
    /// Killed at the runner's deadline.
    TimedOut,
}

/// Runs the suite `binary` with `run`'s arguments inside `netns` (KUBECONFIG = `kubeconfig`),
/// its output appended to `log`; kills it at `deadline`. Returns how it ended and how long
/// it took.
pub async fn run_suite(
    netns: &Netns,
    binary: &Path,
    kubeconfig: &Path,
    run: &SuiteRun,
    log: &Path,
    deadline: Duration,
) -> crate::Result<(SuiteExit, Duration)> {
    let mut command = netns.command(binary)?;
    command.args(run.args()).env("KUBECONFIG", kubeconfig);
    let started = Instant::now();
    let mut process = ChildProcess::spawn("gateway-api-conformance", command, log)?;
    loop {
        if let Some(status) = process.exit_status()? {
            return Ok((SuiteExit::Exited(status), started.elapsed()));
        }
        if started.elapsed() > deadline {
            process.kill();
            return Ok((SuiteExit::TimedOut, started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[cfg(test)]
mod tests;
