//! `tailnet-operator`: `run` runs the controllers, `crd` prints the CRDs, `render` previews
//! offline what the operator would write (policy, DNS, Kubernetes objects).

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

mod cli;
mod controllers;
mod metrics;
#[cfg(test)]
mod pipeline_equivalence;
mod runtime;
mod scope;

#[derive(Parser)]
#[command(
    name = "tailnet-operator",
    version,
    about = "Declared connections between Kubernetes and a Headscale tailnet"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions as YAML (or write them into a directory).
    Crd(cli::crd::CrdArgs),
    /// Run the operator (controllers, leader election, admin server).
    #[command(after_help = cli::run::AFTER_HELP)]
    Run(Box<cli::run::RunArgs>),
    /// Offline preview: render the policy, DNS entries and Kubernetes objects from manifests.
    #[command(after_help = cli::render::AFTER_HELP)]
    Render(cli::render::RenderArgs),
}

fn main() -> ExitCode {
    // Usage errors exit 2 (clap), `--help`/`--version` 0.
    let (command, env_warnings) =
        cli::run::with_deprecated_env(Args::command(), |name| std::env::var_os(name));
    let args = match Args::from_arg_matches(&command.get_matches()) {
        Ok(args) => args,
        Err(e) => e.exit(),
    };
    let result: Result<(), (u8, String)> = match args.command {
        Command::Crd(a) => cli::crd::run(&a).map_err(|e| (1, e.to_string())),
        Command::Render(mut a) => {
            if a.fragment {
                a.only = Some(cli::render::Only::Fragment);
            }
            cli::render::run(&a).map_err(|e| (e.exit_code(), e.to_string()))
        }
        Command::Run(a) => {
            for warning in &env_warnings {
                eprintln!("warning: {warning}");
            }
            cli::run::run(*a).map_err(|e| (1, e.to_string()))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err((code, message)) => {
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag and argument of every subcommand says what it does (`--help`).
    #[test]
    fn every_flag_has_help_text() {
        let command = Args::command();
        for sub in command.get_subcommands() {
            for arg in sub.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                assert!(
                    arg.get_help()
                        .is_some_and(|h| !h.to_string().trim().is_empty()),
                    "{} --{id} has no help text",
                    sub.get_name()
                );
            }
        }
        command.debug_assert();
    }

    /// `--cluster-cidrs` takes network addresses (IPv4 and IPv6, comma-separated) and refuses a
    /// host address naming the network it meant; `--cluster-dns-pods` has kube-dns's default.
    #[test]
    fn cluster_ranges_are_parsed_and_a_host_address_is_refused() {
        let parse = |extra: &[&str]| {
            let argv = ["tailnet-operator", "run"].iter().chain(extra);
            Args::try_parse_from(argv).map(|a| match a.command {
                Command::Run(args) => *args,
                _ => unreachable!(),
            })
        };
        let args = parse(&["--cluster-cidrs", "10.244.0.0/16,fd00:10:244::/56"]).expect("parse");
        let cidrs: Vec<String> = args.cluster_cidrs.iter().map(ToString::to_string).collect();
        assert_eq!(cidrs, ["10.244.0.0/16", "fd00:10:244::/56"]);
        assert_eq!(
            args.cluster_dns_pods.to_string(),
            "kube-system/k8s-app=kube-dns"
        );
        assert!(parse(&[]).expect("parse").cluster_cidrs.is_empty());
        let dns = parse(&["--cluster-dns-pods", "dns/app=coredns,tier=node"]).expect("parse");
        assert_eq!(
            dns.cluster_dns_pods.to_string(),
            "dns/app=coredns,tier=node"
        );
        let refused = parse(&["--cluster-cidrs", "10.96.0.0/12,10.244.0.1/16"])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(refused.contains("did you mean 10.244.0.0/16?"), "{refused}");
        assert!(parse(&["--cluster-dns-pods", "kube-dns"]).is_err());
        assert!(parse(&[]).expect("parse").restrict_agent_egress);
        let off = parse(&["--restrict-agent-egress", "false"]).expect("parse");
        assert!(!off.restrict_agent_egress);
    }

    fn run_args(env: &[(&str, &str)]) -> (cli::run::RunArgs, Vec<String>) {
        let lookup = |name: &str| {
            env.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| std::ffi::OsString::from(v))
        };
        let (command, warnings) = cli::run::with_deprecated_env(Args::command(), lookup);
        let matches = command
            .try_get_matches_from(["tailnet-operator", "run"])
            .expect("parse");
        match Args::from_arg_matches(&matches).expect("args").command {
            Command::Run(args) => (*args, warnings),
            _ => unreachable!(),
        }
    }

    /// The old unprefixed names are read (with a warning) only when the new one is unset.
    /// (Only the mapping is decided here; clap itself reads the process environment, so the
    /// values are checked through the real binary's environment in the e2e setup.)
    #[test]
    fn old_environment_names_are_deprecated_not_dropped() {
        let (_, warnings) = run_args(&[]);
        assert!(warnings.is_empty());
        let (_, warnings) = run_args(&[("OPERATOR_NAMESPACE", "ops")]);
        assert_eq!(
            warnings,
            [
                "environment variable OPERATOR_NAMESPACE is deprecated and will be ignored in the next release; set TAILNET_OPERATOR_OPERATOR_NAMESPACE instead"
            ]
        );
        let (_, warnings) = run_args(&[
            ("OPERATOR_NAMESPACE", "ops"),
            ("TAILNET_OPERATOR_OPERATOR_NAMESPACE", "new"),
        ]);
        assert!(warnings.is_empty(), "the new name wins: {warnings:?}");
        for (id, old, new) in cli::run::DEPRECATED_ENV {
            assert_eq!(*new, format!("TAILNET_OPERATOR_{old}"));
            let run = Args::command();
            let run = run.find_subcommand("run").expect("run").clone();
            let arg = run
                .get_arguments()
                .find(|a| a.get_id().as_str() == *id)
                .unwrap_or_else(|| panic!("{id} is a flag of run"));
            assert_eq!(
                arg.get_env().map(|e| e.to_string_lossy().into_owned()),
                Some(new.to_string()),
                "{id}"
            );
        }
        // Every env-settable flag of run is in the table.
        let run = Args::command();
        let run = run.find_subcommand("run").expect("run").clone();
        let with_env = run
            .get_arguments()
            .filter(|a| a.get_env().is_some())
            .filter(|a| !cli::run::ENV_WITHOUT_OLD_NAME.contains(&a.get_id().as_str()))
            .count();
        assert_eq!(with_env, cli::run::DEPRECATED_ENV.len());
    }

    /// Preview and operator write the same ownership marker for the same installation id.
    #[test]
    fn render_and_the_operator_write_the_same_marker() {
        let config = controllers::test_fixtures::config();
        assert_eq!(
            tailnet_api::tailnet::marker_installation_id(&config.installation_id, "demo"),
            controllers::tailnet::decide::installation_id(&config, "demo")
        );
    }
}
