//! Run identity: every netns and scratch directory of a run carries the run id, and the run id
//! carries the pid and start time of the process that owns it, so leftovers of dead runs can be
//! told apart from those of live parallel runs.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{NetlabError, Result};
use crate::netns::{self, Netns};

/// Prefix of every run id, netns name and scratch directory this crate creates.
pub const RUN_PREFIX: &str = "tno-";

/// Identity of one test-environment run: `tno-<pid>-<starttime>-<seq>`.
///
/// Short enough to prefix netns names; `seq` keeps several runs of one process apart.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RunId(String);

impl RunId {
    /// A fresh id owned by the current process.
    pub fn generate() -> Result<RunId> {
        static NEXT_SEQ: AtomicU32 = AtomicU32::new(0);
        let pid = std::process::id();
        let start_time = process_start_time(pid).ok_or_else(|| {
            NetlabError::io(
                "reading /proc/self/stat",
                std::io::Error::other("no start time for own pid"),
            )
        })?;
        let seq = NEXT_SEQ.fetch_add(1, Ordering::Relaxed);
        Ok(RunId(format!("{RUN_PREFIX}{pid}-{start_time}-{seq}")))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Name of a netns that belongs to this run, e.g. `tno-1-2-0-lab`.
    pub fn netns_name(&self, role: &str) -> String {
        format!("{}-{role}", self.0)
    }

    /// Scratch directory of this run under the system temp dir (created by the caller).
    pub fn scratch_dir(&self) -> PathBuf {
        std::env::temp_dir().join(&self.0)
    }

    /// Whether a name (netns or directory) belongs to a run whose process is gone.
    fn owner_is_dead(name: &str) -> bool {
        let Some(rest) = name.strip_prefix(RUN_PREFIX) else {
            return false;
        };
        let mut parts = rest.split('-');
        let (Some(pid), Some(start_time)) = (parts.next(), parts.next()) else {
            return false;
        };
        let (Ok(pid), Ok(start_time)) = (pid.parse::<u32>(), start_time.parse::<u64>()) else {
            return false;
        };
        // A recycled pid has a different start time.
        process_start_time(pid) != Some(start_time)
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Start time (clock ticks since boot) of a process, `None` if it does not exist.
fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 22 overall is the 20th after the name (state is field 3).
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// What [`cleanup_stale_runs`] removed.
#[derive(Debug, Default)]
pub struct StaleCleanup {
    pub netns: Vec<String>,
    pub scratch_dirs: Vec<PathBuf>,
}

/// Deletes the netns (killing their processes) and scratch directories of runs whose owning
/// process is dead. Leftovers of live runs are never touched.
pub fn cleanup_stale_runs() -> Result<StaleCleanup> {
    let mut cleaned = StaleCleanup::default();
    for name in netns::list_netns()? {
        if RunId::owner_is_dead(&name) {
            Netns::adopt(name.clone()).delete()?;
            cleaned.netns.push(name);
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if RunId::owner_is_dead(&name) {
                let path = entry.path();
                match std::fs::remove_dir_all(&path) {
                    Ok(()) => cleaned.scratch_dirs.push(path),
                    // Another cleaner (a parallel test process, or the owner's own drop just
                    // before it exited) got there first.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(NetlabError::io(format!("removing {}", path.display()), e));
                    }
                }
            }
        }
    }
    Ok(cleaned)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_run_is_alive_and_unknown_pid_is_dead() {
        let run = RunId::generate().expect("run id");
        assert!(!RunId::owner_is_dead(run.as_str()));
        assert!(RunId::owner_is_dead("tno-4294967295-1-0-lab"));
        assert!(!RunId::owner_is_dead("other-1-2-lab"));
        assert!(!RunId::owner_is_dead("tno-notapid-2-lab"));
    }
}
