//! Child processes that cannot outlive the test process.
//!
//! `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not the process. Test
//! harnesses run each test on its own thread, so a server shared between tests would be killed
//! when the test that started it finishes. All supervised children are therefore forked by one
//! process-wide spawner thread that never exits.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;

use crate::error::{NetlabError, Result};

/// Runs a command to completion; non-zero exit becomes [`NetlabError::CommandFailed`] with stderr.
pub fn run_checked(command: &mut Command) -> Result<String> {
    let description = describe(command);
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| NetlabError::Spawn {
            command: description.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(NetlabError::CommandFailed {
            command: description,
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Program and arguments, for error messages.
pub fn describe(command: &Command) -> String {
    let mut text = command.get_program().to_string_lossy().into_owned();
    for arg in command.get_args() {
        let _ = write!(text, " {}", arg.to_string_lossy());
    }
    text
}

/// A long-running child process: stdout and stderr go to a log file, it gets SIGKILL when the
/// test process dies (`PR_SET_PDEATHSIG`), and it is killed and reaped on drop.
#[derive(Debug)]
pub struct ChildProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

impl ChildProcess {
    /// Starts `command` (which may already be set up to enter a netns) with its output appended
    /// to `log_path`. `name` is used in messages only.
    pub fn spawn(name: impl Into<String>, mut command: Command, log_path: &Path) -> Result<Self> {
        let name = name.into();
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_path)
            .map_err(|e| NetlabError::io(format!("opening log {}", log_path.display()), e))?;
        let log_for_stderr = log
            .try_clone()
            .map_err(|e| NetlabError::io("duplicating a log file handle", e))?;
        command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_for_stderr));
        // SAFETY: getpid/getppid/prctl/_exit are async-signal-safe and touch no shared memory.
        let spawner_pid = unsafe { libc::getpid() };
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The test process may have died between fork and prctl.
                if libc::getppid() != spawner_pid {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
        let description = describe(&command);
        let (reply_tx, reply_rx) = mpsc::channel();
        let spawn_failed = |source| NetlabError::Spawn {
            command: description.clone(),
            source,
        };
        spawner()
            .send((command, reply_tx))
            .map_err(|_| spawn_failed(io::Error::other("spawner thread is gone")))?;
        let child = reply_rx
            .recv()
            .map_err(|_| spawn_failed(io::Error::other("spawner thread is gone")))?
            .map_err(spawn_failed)?;
        Ok(ChildProcess {
            name,
            child,
            log_path: log_path.to_owned(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// `Some(status)` once the process has exited.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .map_err(|e| NetlabError::io(format!("waiting for {}", self.name), e))
    }

    /// The last `lines` lines of the log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path, lines)
    }

    /// SIGKILL and reap. Idempotent.
    pub fn kill(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a text file (empty if it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let Ok(file) = File::open(path) else {
        return String::new();
    };
    let mut tail = VecDeque::with_capacity(lines);
    for line in BufReader::new(file).lines().map_while(|line| line.ok()) {
        if tail.len() == lines {
            tail.pop_front();
        }
        tail.push_back(line);
    }
    tail.into_iter().collect::<Vec<_>>().join("\n")
}

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot be started, every spawn reports "spawner thread is gone".
        let _ = std::thread::Builder::new()
            .name("netlab-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            });
        tx
    })
}
