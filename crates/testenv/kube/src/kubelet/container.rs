//! Starting one container: a process in the pod's netns with its own mount and UTS namespaces.
//!
//! The container's root is an overlay of the host's root filesystem with a per-container tmpfs
//! as the writable layer, so `mountPath`s can be created anywhere (even under `/etc`) without
//! touching the host, and everything disappears with the container's last process. Volumes are
//! bind-mounted from the pod's directory: it is first bound at `/.tno-pod` inside the new root,
//! and after `chroot` each volume is bound from there to its `mountPath` (so paths with
//! symlinks such as `/var/run` resolve inside the container, never on the host); then the
//! staging mount is detached.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

use tno_netlab::Netns;

use crate::error::{Error, IoContext, NetlabContext, Result};
use crate::kubelet::images::image_dir_in_container;
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
    /// The pod's directory: every [`BindMount::source`] must be inside it.
    pub pod_dir: PathBuf,
    /// The image's host directories, mounted read-only at `image_dir_in_container(index)`.
    pub image_dirs: Vec<PathBuf>,
    /// A pulled image's unpacked root file system: the overlay's lower layer instead of the
    /// host's `/`.
    pub root_dir: Option<PathBuf>,
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

/// Where the pod directory is staged inside the container's root during setup.
const STAGING: &str = "/.tno-pod";

struct PlannedBind {
    /// The source as seen from inside the new root (under [`STAGING`]).
    source_in_root: CString,
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
    /// Mount points to create first in an image's root (it may lack `/dev`, `/proc`, `/sys`).
    own_root: bool,
    pod_dir: CString,
    merged_staging: CString,
    merged_image_root: CString,
    /// (host directory, mount point under the new root before chroot).
    image_mounts: Vec<(CString, CString)>,
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
                let is_file = std::fs::metadata(&mount.source)
                    .io_context(|| format!("inspecting volume source {:?}", mount.source))?
                    .is_file();
                let relative =
                    mount
                        .source
                        .strip_prefix(&launch.pod_dir)
                        .map_err(|_| Error::Pod {
                            pod: launch.name.clone(),
                            reason: format!(
                                "mount source {:?} is outside the pod directory",
                                mount.source
                            ),
                        })?;
                Ok(PlannedBind {
                    source_in_root: c_path(&Path::new(STAGING).join(relative))?,
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
                    "lowerdir={},upperdir={},workdir={}",
                    launch
                        .root_dir
                        .as_deref()
                        .unwrap_or(Path::new("/"))
                        .display(),
                    scratch.join("upper").display(),
                    scratch.join("work").display()
                ),
                "overlay options",
            )?,
            merged_dev: c_path(&merged.join("dev"))?,
            merged_proc: c_path(&merged.join("proc"))?,
            merged_sys: c_path(&merged.join("sys"))?,
            own_root: launch.root_dir.is_some(),
            pod_dir: c_path(&launch.pod_dir)?,
            merged_staging: c_path(&merged.join(STAGING.trim_start_matches('/')))?,
            merged_image_root: c_path(&merged.join(".tno-image"))?,
            image_mounts: launch
                .image_dirs
                .iter()
                .enumerate()
                .map(|(index, dir)| {
                    let inside = image_dir_in_container(index);
                    let relative = inside.strip_prefix("/").unwrap_or(&inside);
                    Ok((c_path(dir)?, c_path(&merged.join(relative))?))
                })
                .collect::<Result<Vec<_>>>()?,
            merged: c_path(&merged)?,
            binds,
            working_dir_parents: container_parents(&working_dir)?,
            working_dir: c_string(working_dir.as_bytes(), &working_dir)?,
            hostname: c_string(launch.hostname.as_bytes(), &launch.hostname)?,
            read_only_root: launch.read_only_root,
            run_as: launch.run_as,
        })
    }

    /// Runs in the forked child, after it entered the pod's netns and before exec. A failing
    /// step is named on stderr (the container log), since the error itself carries only errno.
    fn enter(&self) -> std::io::Result<()> {
        use libc::{CLONE_NEWNS, CLONE_NEWUTS};
        step(
            "unshare",
            check(unsafe { libc::unshare(CLONE_NEWNS | CLONE_NEWUTS) }),
        )?;
        self.build_root()?;
        step(
            "chroot",
            check(unsafe { libc::chroot(self.merged.as_ptr()) }),
        )?;
        step("chdir /", check(unsafe { libc::chdir(c"/".as_ptr()) }))?;
        self.mount_volumes()?;
        self.finish()
    }

    /// The new root: the overlay on a tmpfs, /dev, /proc and a fresh /sys, the image
    /// directories and the pod directory at the staging path.
    fn build_root(&self) -> std::io::Result<()> {
        use libc::{
            MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT,
        };
        // Nothing mounted from here on may propagate back to the host.
        step(
            "make / private",
            mount(None, c"/", None, MS_REC | MS_PRIVATE, None),
        )?;
        step(
            "tmpfs for the writable layer",
            mount(
                Some(c"tmpfs"),
                &self.scratch,
                Some(c"tmpfs"),
                MS_NOSUID | MS_NODEV,
                Some(c"mode=0755"),
            ),
        )?;
        for dir in [&self.upper, &self.work, &self.merged] {
            step("overlay directories", mkdir(dir))?;
        }
        step(
            "overlay root",
            mount(
                Some(c"overlay"),
                &self.merged,
                Some(c"overlay"),
                0,
                Some(&self.overlay_options),
            ),
        )?;
        if self.own_root {
            for dir in [&self.merged_dev, &self.merged_proc, &self.merged_sys] {
                step("image root mount points", mkdir(dir))?;
            }
        }
        step(
            "/dev",
            mount(
                Some(c"/dev"),
                &self.merged_dev,
                None,
                MS_BIND | MS_REC,
                None,
            ),
        )?;
        step(
            "/proc",
            mount(
                Some(c"/proc"),
                &self.merged_proc,
                None,
                MS_BIND | MS_REC,
                None,
            ),
        )?;
        // A fresh sysfs shows the pod's network devices, not the host's.
        step(
            "/sys",
            mount(
                Some(c"sysfs"),
                &self.merged_sys,
                Some(c"sysfs"),
                MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                None,
            ),
        )?;
        if !self.image_mounts.is_empty() {
            step("image directory root", mkdir(&self.merged_image_root))?;
        }
        for (host_dir, mount_point) in &self.image_mounts {
            step("image directory", mkdir(mount_point))?;
            step(
                "image mount",
                mount(Some(host_dir), mount_point, None, MS_BIND | MS_REC, None),
            )?;
            step(
                "read-only image mount",
                mount(
                    None,
                    mount_point,
                    None,
                    MS_REMOUNT | MS_BIND | MS_RDONLY,
                    None,
                ),
            )?;
        }
        step("staging directory", mkdir(&self.merged_staging))?;
        step(
            "staging mount",
            mount(
                Some(&self.pod_dir),
                &self.merged_staging,
                None,
                MS_BIND | MS_REC,
                None,
            ),
        )?;
        Ok(())
    }

    /// Inside the new root: each volume from the staging mount to its `mountPath`, read-only
    /// ones remounted last; then the staging mount goes.
    fn mount_volumes(&self) -> std::io::Result<()> {
        use libc::{MS_BIND, MS_RDONLY, MS_REC, MS_REMOUNT};
        for bind in &self.binds {
            for parent in &bind.parents {
                step("volume mount parents", mkdir(parent))?;
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
                step("file mount target", check(fd))?;
                unsafe { libc::close(fd) };
            } else {
                step("volume mount target", mkdir(&bind.target))?;
            }
            step(
                "volume bind mount",
                mount(
                    Some(&bind.source_in_root),
                    &bind.target,
                    None,
                    MS_BIND | MS_REC,
                    None,
                ),
            )?;
        }
        // Read-only only after every mount is in place: a mount nested in a read-only volume
        // (k3s's CoreDNS mounts coredns-custom at /etc/coredns/custom inside its read-only
        // /etc/coredns ConfigMap volume) needs its target created first, as runc does.
        for bind in self.binds.iter().filter(|b| b.read_only) {
            step(
                "read-only volume",
                mount(
                    None,
                    &bind.target,
                    None,
                    MS_REMOUNT | MS_BIND | MS_RDONLY,
                    None,
                ),
            )?;
        }
        let staging = c"/.tno-pod";
        step(
            "detach staging",
            check(unsafe { libc::umount2(staging.as_ptr(), libc::MNT_DETACH) }),
        )?;
        step(
            "remove staging",
            check(unsafe { libc::rmdir(staging.as_ptr()) }),
        )?;
        Ok(())
    }

    /// The working directory, a read-only root if asked for, the hostname and the user.
    fn finish(&self) -> std::io::Result<()> {
        use libc::{MS_BIND, MS_RDONLY, MS_REMOUNT};
        for parent in &self.working_dir_parents {
            step("working directory parents", mkdir(parent))?;
        }
        step("working directory", mkdir(&self.working_dir))?;
        if self.read_only_root {
            step(
                "read-only root",
                mount(None, c"/", None, MS_REMOUNT | MS_BIND | MS_RDONLY, None),
            )?;
        }
        step(
            "chdir",
            check(unsafe { libc::chdir(self.working_dir.as_ptr()) }),
        )?;
        step(
            "hostname",
            check(unsafe {
                libc::sethostname(self.hostname.as_ptr(), self.hostname.as_bytes().len())
            }),
        )?;
        if let Some((uid, gid)) = self.run_as {
            step("setgroups", check(unsafe { libc::setgroups(1, &gid) }))?;
            step("setgid", check(unsafe { libc::setgid(gid) }))?;
            step("setuid", check(unsafe { libc::setuid(uid) }))?;
        }
        Ok(())
    }
}

/// Names the failed setup step on stderr (async-signal-safe: a static string and write(2)).
fn step(name: &'static str, result: std::io::Result<()>) -> std::io::Result<()> {
    if result.is_err() {
        let prefix = "test kubelet: container setup failed at: ";
        unsafe {
            libc::write(2, prefix.as_ptr().cast(), prefix.len());
            libc::write(2, name.as_ptr().cast(), name.len());
            libc::write(2, "\n".as_ptr().cast(), 1);
        }
    }
    result
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
