//! Named network namespaces (`/run/netns/<name>`, managed with iproute2's `ip`).

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::error::{NetlabError, Result};
use crate::process::run_checked;

const NETNS_DIR: &str = "/run/netns";

/// A named network namespace. One created with [`Netns::create`] is deleted (its processes
/// killed first) when dropped or when [`Netns::delete`] is called.
#[derive(Debug)]
pub struct Netns {
    name: String,
    delete_on_drop: bool,
    deleted: AtomicBool,
}

impl Netns {
    /// Creates a netns with loopback up. Fails if the name already exists.
    pub fn create(name: impl Into<String>) -> Result<Netns> {
        let name = name.into();
        run_checked(Command::new("ip").args(["netns", "add", &name]))?;
        let netns = Netns {
            name,
            delete_on_drop: true,
            deleted: AtomicBool::new(false),
        };
        netns.ip(&["link", "set", "lo", "up"])?;
        Ok(netns)
    }

    /// A handle on an existing netns that is not deleted on drop.
    pub fn adopt(name: impl Into<String>) -> Netns {
        Netns {
            name: name.into(),
            delete_on_drop: false,
            deleted: AtomicBool::new(false),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind mount that keeps the netns alive, e.g. `/run/netns/tno-…-lab`.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(NETNS_DIR).join(&self.name)
    }

    /// Runs `ip -n <netns> <args>` and returns its stdout.
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        run_checked(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Writes a sysctl of this netns (e.g. `net.ipv4.ip_forward`), never the root netns's.
    pub fn set_sysctl(&self, key: &str, value: &str) -> Result<()> {
        let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
        let value = value.to_owned();
        self.in_netns(move || std::fs::write(&path, value).map_err(|e| (path, e)))?
            .map_err(|(path, e)| NetlabError::io(format!("writing {}", path.display()), e))
    }

    /// A `Command` whose process starts inside this netns (setns between fork and exec; no
    /// mount namespace or `/etc/netns` games, unlike `ip netns exec`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Result<Command> {
        let mut command = Command::new(program);
        self.enter_on_exec(&mut command)?;
        Ok(command)
    }

    /// Makes an existing `Command` start inside this netns.
    pub fn enter_on_exec(&self, command: &mut Command) -> Result<()> {
        let netns_file = self.open()?;
        // SAFETY: the closure only calls setns(2), which is async-signal-safe, on an fd that the
        // closure owns (it is O_CLOEXEC, so the exec'd program does not inherit it).
        unsafe {
            command.pre_exec(move || {
                if libc::setns(netns_file.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        Ok(())
    }

    /// Runs `f` on a fresh thread that has entered this netns, and returns its result. Sockets
    /// created there stay in this netns for their whole life, whichever thread uses them later.
    pub fn in_netns<R, F>(&self, f: F) -> Result<R>
    where
        R: Send + 'static,
        F: FnOnce() -> R + Send + 'static,
    {
        let netns_file = self.open()?;
        let name = self.name.clone();
        let handle = std::thread::Builder::new()
            .name(format!("netns-{name}"))
            .spawn(move || enter(&netns_file).map(|()| f()))
            .map_err(|e| NetlabError::io("spawning a netns helper thread", e))?;
        handle
            .join()
            .map_err(|_| NetlabError::HelperThreadPanicked {
                netns: self.name.clone(),
            })?
            .map_err(|source| NetlabError::EnterNetns {
                netns: name,
                source,
            })
    }

    /// Moves the calling thread into this netns for good. Only for threads dedicated to it:
    /// every socket the thread creates afterwards lives in this netns.
    pub fn enter_current_thread(&self) -> Result<()> {
        enter(&self.open()?).map_err(|source| NetlabError::EnterNetns {
            netns: self.name.clone(),
            source,
        })
    }

    /// A TCP listener bound inside this netns.
    pub fn bind_tcp(&self, addr: SocketAddr) -> Result<TcpListener> {
        self.in_netns(move || TcpListener::bind(addr))?
            .map_err(|e| NetlabError::io(format!("binding {addr} in netns {}", self.name), e))
    }

    /// A TCP connection made from inside this netns. Connect errors (refused, unreachable,
    /// timeout) are returned as `io::Error` so callers can assert on their kind.
    pub fn connect_tcp(
        &self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<io::Result<TcpStream>> {
        self.in_netns(move || TcpStream::connect_timeout(&addr, timeout))
    }

    /// Pids of the processes that live in this netns.
    pub fn pids(&self) -> Result<Vec<u32>> {
        let out = run_checked(Command::new("ip").args(["netns", "pids", &self.name]))?;
        Ok(out
            .split_whitespace()
            .filter_map(|pid| pid.parse().ok())
            .collect())
    }

    /// Kills every process in this netns (SIGKILL) and deletes it. Idempotent.
    pub fn delete(&self) -> Result<()> {
        if self.deleted.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if !self.path().exists() {
            return Ok(());
        }
        for pid in self.pids()? {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        run_checked(Command::new("ip").args(["netns", "delete", &self.name]))?;
        Ok(())
    }

    pub(crate) fn open(&self) -> Result<File> {
        let path = self.path();
        File::open(&path).map_err(|source| NetlabError::EnterNetns {
            netns: self.name.clone(),
            source,
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.delete_on_drop
            && let Err(error) = self.delete()
        {
            eprintln!("netlab: could not delete netns {}: {error}", self.name);
        }
    }
}

/// setns(2) for the calling thread.
pub(crate) fn enter(netns_file: &File) -> io::Result<()> {
    // SAFETY: setns only reads the fd; it affects the calling thread's network namespace only.
    if unsafe { libc::setns(netns_file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Names of all named netns on the machine.
pub fn list_netns() -> Result<Vec<String>> {
    let entries = match std::fs::read_dir(NETNS_DIR) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(NetlabError::io(format!("listing {NETNS_DIR}"), e)),
    };
    Ok(entries
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect())
}
