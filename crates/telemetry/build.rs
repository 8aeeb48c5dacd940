//! Build facts for `<prefix>_build_info`: the rustc version, the target triple and the git
//! commit. The commit comes from `TNO_GIT_COMMIT` when set (`cargo xtask images` sets it, with
//! `-dirty` for uncommitted changes), else from `git rev-parse HEAD` of the source tree (no
//! network); `unknown` without either (e.g. a source tarball).

use std::path::PathBuf;
use std::process::Command;

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status.success().then_some(())?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// `git` in the package directory.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let mut all = vec!["-C", dir.as_str()];
    all.extend_from_slice(args);
    output("git", &all)
}

/// The commit HEAD names; rebuilds when HEAD or the branch it points to moves (HEAD's reflog
/// grows with every commit and checkout, also when the branch ref is packed).
fn git_commit() -> Option<String> {
    let commit = git(&["rev-parse", "HEAD"])?;
    let mut watched = vec!["HEAD".to_string(), "logs/HEAD".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(branch);
    }
    for name in watched {
        // Worktrees keep HEAD in their own git dir and branches in the common one:
        // --git-path resolves both.
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", &name])
            && PathBuf::from(&path).exists()
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=TNO_GIT_COMMIT");
    let commit = std::env::var("TNO_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_commit)
        .unwrap_or_else(|| "unknown".to_string());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    // "rustc 1.95.0 (59807616e 2026-04-14)" → "1.95.0".
    let rustc_version = output(&rustc, &["--version"])
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_string))
        .unwrap_or_else(|| "unknown".to_string());
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_string());
    println!("cargo:rustc-env=TNO_BUILD_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=TNO_BUILD_RUSTC_VERSION={rustc_version}");
    println!("cargo:rustc-env=TNO_BUILD_TARGET={target}");
}
