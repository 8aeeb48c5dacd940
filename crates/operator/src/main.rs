//! `tailnet-operator`: `run` runs the controllers, `crd` prints the CRDs, `render` previews
//! offline what the operator would write (policy, DNS, Kubernetes objects).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod cli;
mod controllers;
mod metrics;
#[cfg(test)]
mod pipeline_equivalence;
mod runtime;

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
    Run(cli::run::RunArgs),
    /// Offline preview: render the policy, DNS entries and Kubernetes objects from manifests.
    Render(cli::render::RenderArgs),
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = match args.command {
        Command::Crd(a) => cli::crd::run(&a),
        Command::Render(a) => cli::render::run(&a),
        Command::Run(a) => cli::run::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
