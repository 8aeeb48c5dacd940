//! Starting one container: a process in the pod's netns with its own mount and UTS namespaces.
//!
//! The container's root is an overlay of the host's root filesystem with a per-container tmpfs
//! as the writable layer, so `mountPath`s can be created anywhere (even under `/etc`) without
//! touching the host, and everything disappears with the container's last process. Volumes are
//! bind-mounted from the pod's directory; they are opened before `chroot` and mounted through
//! `/proc/self/fd`, so a path is never resolved against the host's root after the switch.

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use tno_netlab::Netns;

use crate::error::{Error, IoContext, NetlabContext, Result};
use crate::process::ManagedProcess;

/// A directory or file of the pod made visible inside the container.
#[derive(Debug, Clone)]
pub struct BindMount {
    pub source: PathBuf,
    /// Absolute path inside the container.
    pub target: String,
    pub read_only: bool,
}

/// Everything needed to start one container process.
#[derive(Debug, Clone)]
pub struct ContainerLaunch {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
    pub hostname: String,
    /// `(uid, gid)` from the security context; root when `None`.
    pub run_as: Option<(u32, u32)>,
    pub read_only_root: bool,
    /// An empty host directory that holds the container's writable layer while it runs.
    pub scratch_dir: PathBuf,
    pub mounts: Vec<BindMount>,
    pub log_path: PathBuf,
}

/// Starts the container's process.
pub fn spawn_container(netns: &Netns, launch: &ContainerLaunch) -> Result<ManagedProcess> {
    std::fs::create_dir_all(&launch.scratch_dir)
        .io_context(|| format!("creating {:?}", launch.scratch_dir))?;
    let plan = MountPlan::new(launch)?;
    let mut command = Command::new(&launch.program);
    command
        .args(&launch.args)
        .env_clear()
        .envs(launch.env.iter().cloned());
    netns
        .enter_on_exec(&mut command)
        .netlab_context(|| format!("entering the netns of container {}", launch.name))?;
    // SAFETY: `MountPlan::enter` performs only system calls on memory prepared before fork.
    unsafe {
        command.pre_exec(move || plan.enter());
    }
    ManagedProcess::spawn(&launch.name, command, &launch.log_path)
}

struct PlannedBind {
    /// Kept open until exec (O_CLOEXEC), so the mount source is the real host object.
    _source: File,
    source_via_fd: CString,
    parents: Vec<CString>,
    target: CString,
    is_file: bool,
    read_only: bool,
}

struct MountPlan {
    scratch: CString,
    upper: CString,
    work: CString,
    merged: CString,
    overlay_options: CString,
    merged_dev: CString,
    merged_proc: CString,
    merged_sys: CString,
    binds: Vec<PlannedBind>,
    working_dir_parents: Vec<CString>,
    working_dir: CString,
    hostname: CString,
    read_only_root: bool,
    run_as: Option<(u32, u32)>,
}

fn c_string(value: impl Into<Vec<u8>>, what: &str) -> Result<CString> {
    CString::new(value).map_err(|_| Error::Pod {
        pod: what.to_string(),
        reason: "path or name contains a NUL byte".into(),
    })
}

fn c_path(path: &Path) -> Result<CString> {
    c_string(path.as_os_str().as_bytes(), &path.display().to_string())
}

/// `/a/b/c` → [`/a`, `/a/b`] (the parents to create, outermost first). Rejects `..`.
fn container_parents(target: &str) -> Result<Vec<CString>> {
    let path = Path::new(target);
    if !path.is_absolute() || path.components().any(|part| part == Component::ParentDir) {
        return Err(Error::Pod {
            pod: target.to_string(),
            reason: "mount and working paths must be absolute and free of '..'".into(),
        });
    }
    path.ancestors()
        .skip(1)
        .filter(|ancestor| *ancestor != Path::new("/"))
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .map(c_path)
        .collect()
}

impl MountPlan {
    fn new(launch: &ContainerLaunch) -> Result<Self> {
        let scratch = &launch.scratch_dir;
        let merged = scratch.join("merged");
        let binds = launch
            .mounts
            .iter()
            .map(|mount| {
                let source = File::open(&mount.source)
                    .io_context(|| format!("opening volume source {:?}", mount.source))?;
                let is_file = source
                    .metadata()
                    .io_context(|| format!("inspecting {:?}", mount.source))?
                    .is_file();
                Ok(PlannedBind {
                    source_via_fd: c_string(
                        format!("/proc/self/fd/{}", source.as_raw_fd()),
                        "fd path",
                    )?,
                    _source: source,
                    parents: container_parents(&mount.target)?,
                    target: c_string(mount.target.as_bytes(), &mount.target)?,
                    is_file,
                    read_only: mount.read_only,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let working_dir = launch.working_dir.clone().unwrap_or_else(|| "/".into());
        Ok(Self {
            scratch: c_path(scratch)?,
            upper: c_path(&scratch.join("upper"))?,
            work: c_path(&scratch.join("work"))?,
            overlay_options: c_string(
                format!(
                    "lowerdir=/,upperdir={},workdir={}",
                    scratch.join("upper").display(),
                    scratch.join("work").display()
                ),
                "overlay options",
            )?,
            merged_dev: c_path(&merged.join("dev"))?,
            merged_proc: c_path(&merged.join("proc"))?,
            merged_sys: c_path(&merged.join("sys"))?,
            merged: c_path(&merged)?,
            binds,
            working_dir_parents: container_parents(&working_dir)?,
            working_dir: c_string(working_dir.as_bytes(), &working_dir)?,
            hostname: c_string(launch.hostname.as_bytes(), &launch.hostname)?,
            read_only_root: launch.read_only_root,
            run_as: launch.run_as,
        })
    }

    /// Runs in the forked child, after it entered the pod's netns and before exec.
    fn enter(&self) -> std::io::Result<()> {
        use libc::{
            CLONE_NEWNS, CLONE_NEWUTS, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE,
            MS_RDONLY, MS_REC, MS_REMOUNT,
        };
        check(unsafe { libc::unshare(CLONE_NEWNS | CLONE_NEWUTS) })?;
        // Nothing mounted from here on may propagate back to the host.
        mount(None, c"/", None, MS_REC | MS_PRIVATE, None)?;
        mount(
            Some(c"tmpfs"),
            &self.scratch,
            Some(c"tmpfs"),
            MS_NOSUID | MS_NODEV,
            Some(c"mode=0755"),
        )?;
        for dir in [&self.upper, &self.work, &self.merged] {
            mkdir(dir)?;
        }
        mount(
            Some(c"overlay"),
            &self.merged,
            Some(c"overlay"),
            0,
            Some(&self.overlay_options),
        )?;
        mount(
            Some(c"/dev"),
            &self.merged_dev,
            None,
            MS_BIND | MS_REC,
            None,
        )?;
        mount(
            Some(c"/proc"),
            &self.merged_proc,
            None,
            MS_BIND | MS_REC,
            None,
        )?;
        // A fresh sysfs shows the pod's network devices, not the host's.
        mount(
            Some(c"sysfs"),
            &self.merged_sys,
            Some(c"sysfs"),
            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            None,
        )?;
        check(unsafe { libc::chroot(self.merged.as_ptr()) })?;
        check(unsafe { libc::chdir(c"/".as_ptr()) })?;
        for bind in &self.binds {
            for parent in &bind.parents {
                mkdir(parent)?;
            }
            if bind.is_file {
                // A symlink or stale file at the target would redirect the mount.
                unsafe { libc::unlink(bind.target.as_ptr()) };
                let fd = unsafe {
                    libc::open(
                        bind.target.as_ptr(),
                        libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC,
                        0o644,
                    )
                };
                check(fd)?;
                unsafe { libc::close(fd) };
            } else {
                mkdir(&bind.target)?;
            }
            mount(
                Some(&bind.source_via_fd),
                &bind.target,
                None,
                MS_BIND | MS_REC,
                None,
            )?;
            if bind.read_only {
                mount(
                    None,
                    &bind.target,
                    None,
                    MS_REMOUNT | MS_BIND | MS_RDONLY,
                    None,
                )?;
            }
        }
        for parent in &self.working_dir_parents {
            mkdir(parent)?;
        }
        mkdir(&self.working_dir)?;
        if self.read_only_root {
            mount(None, c"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)?;
        }
        check(unsafe { libc::chdir(self.working_dir.as_ptr()) })?;
        check(unsafe {
            libc::sethostname(self.hostname.as_ptr(), self.hostname.as_bytes().len())
        })?;
        if let Some((uid, gid)) = self.run_as {
            check(unsafe { libc::setgroups(1, &gid) })?;
            check(unsafe { libc::setgid(gid) })?;
            check(unsafe { libc::setuid(uid) })?;
        }
        Ok(())
    }
}

fn check(result: libc::c_int) -> std::io::Result<()> {
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn mkdir(path: &CString) -> std::io::Result<()> {
    if unsafe { libc::mkdir(path.as_ptr(), 0o755) } == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    if error.raw_os_error() == Some(libc::EEXIST) {
        Ok(())
    } else {
        Err(error)
    }
}

fn mount(
    source: Option<&std::ffi::CStr>,
    target: &std::ffi::CStr,
    fstype: Option<&std::ffi::CStr>,
    flags: libc::c_ulong,
    data: Option<&std::ffi::CStr>,
) -> std::io::Result<()> {
    let result = unsafe {
        libc::mount(
            source.map_or(std::ptr::null(), |value| value.as_ptr()),
            target.as_ptr(),
            fstype.map_or(std::ptr::null(), |value| value.as_ptr()),
            flags,
            data.map_or(std::ptr::null(), |value| value.as_ptr().cast()),
        )
    };
    check(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parents_are_listed_outermost_first_and_dotdot_is_refused() {
        let parents = container_parents("/var/run/secrets/x").expect("valid path");
        let parents: Vec<&str> = parents.iter().map(|p| p.to_str().unwrap_or("")).collect();
        assert_eq!(parents, ["/var", "/var/run", "/var/run/secrets"]);
        assert!(container_parents("relative/path").is_err());
        assert!(container_parents("/a/../etc").is_err());
    }
}
