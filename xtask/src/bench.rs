//! `cargo xtask bench [--smoke] [ARGS…]`: builds the agent, the operator and `tno-bench`
//! (release, or debug for the smoke), makes sure Caddy is built (deps/build.sh), and runs
//! `tno-bench run` with ARGS (e.g. `--only egress,ingress`, `--repeat 5`). The tables go to
//! stdout and to target/bench/results.md; docs/benchmarks.md explains them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

pub fn bench(args: &[String], root: &Path) -> Result<(), String> {
    let smoke = args.iter().any(|a| a == "--smoke");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(&cargo);
    build.current_dir(root).args([
        "build",
        "--locked",
        "-p",
        "tailnet-agent",
        "-p",
        "tno-bench",
        "-p",
        "tailnet-operator",
        // tno-test-servers: the echo backends of the tailnet and startup benchmarks.
        "-p",
        "tno-testenv-kube",
    ]);
    if !smoke {
        build.arg("--release");
    }
    run(&mut build)?;

    run(Command::new("bash")
        .arg(root.join("deps/build.sh"))
        .arg("caddy"))?;
    let env = Command::new("bash")
        .arg(root.join("deps/build.sh"))
        .arg("--print-env")
        .output()
        .map_err(|e| format!("deps/build.sh --print-env: {e}"))?;
    let caddy = String::from_utf8_lossy(&env.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("TNO_BIN_CADDY=").map(PathBuf::from));

    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join(if smoke { "debug" } else { "release" });
    let mut command = Command::new(bin.join("tno-bench"));
    command
        .arg("run")
        .arg("--agent")
        .arg(bin.join("tailnet-agent"))
        .arg("--operator")
        .arg(bin.join("tailnet-operator"));
    if let Some(caddy) = &caddy {
        command.arg("--caddy").arg(caddy);
    }
    command.args(args).stdout(Stdio::piped());
    let output = command
        .spawn()
        .and_then(|child| child.wait_with_output())
        .map_err(|e| format!("tno-bench: {e}"))?;
    let tables = String::from_utf8_lossy(&output.stdout);
    print!("{tables}");
    let results = target.join("bench/results.md");
    if let Some(dir) = results.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    std::fs::write(&results, tables.as_bytes())
        .map_err(|e| format!("{}: {e}", results.display()))?;
    if output.status.success() {
        eprintln!("tables also in {}", results.display());
        Ok(())
    } else {
        Err(format!("tno-bench failed: {}", output.status))
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let status = command.status().map_err(|e| format!("{command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed: {status}"))
    }
}
