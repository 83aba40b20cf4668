//! Read-only filesystems: every configured path that exists must sit on a filesystem that is
//! read-write (a disk error makes ext4 and xfs remount read-only).
//!
//! Only the filesystem's own (super block) options count, not a mount's: a read-only view of a
//! writable filesystem is not a problem of the node. systemd's `ProtectSystem=strict` (host
//! mode's unit) remounts every path read-only for the agent alone, a container's read-only
//! bind mounts do the same; the filesystem under them is still writable.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use nodeward_api::conditions::node::READONLY_FILESYSTEM;

use super::{AgentContext, Detector, Finding, Section};

super::section! {
    pub struct FilesystemConfig {
        /// Paths that must be on writable filesystems; paths that do not exist are skipped.
        pub paths: Vec<PathBuf>,
    }
}

impl Default for FilesystemConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
            hold: Duration::ZERO,
            paths: ["/var/lib/kubelet", "/var/lib/containerd", "/var/log"]
                .map(PathBuf::from)
                .to_vec(),
        }
    }
}

impl Section for FilesystemConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)
    }

    fn detectors(&self, _: Option<&AgentContext>) -> Vec<Detector> {
        self.detector(DETECTOR, READONLY_FILESYSTEM, |c| async move {
            observe(&c).await
        })
    }
}

pub const DETECTOR: &str = "filesystem";
const MOUNTINFO: &str = "/proc/self/mountinfo";

/// One mount as `/proc/self/mountinfo` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    /// The filesystem is read-only (its super options say `ro`), whatever this mount says.
    pub read_only: bool,
    pub source: String,
}

/// Parses the text of `/proc/self/mountinfo`.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            // id parent major:minor root mount-point options [optional...] - fstype source super-options
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let after: Vec<&str> = after.split(' ').collect();
            let super_options = after.get(2).copied().unwrap_or("");
            Some(Mount {
                mount_point: PathBuf::from(unescape(fields.get(4)?)),
                read_only: super_options.split(',').any(|o| o == "ro"),
                source: after.get(1).map(|s| unescape(s)).unwrap_or_default(),
            })
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(digits)) => {
                out.push(
                    digits
                        .iter()
                        .fold(0u8, |acc, d| acc.wrapping_mul(8).wrapping_add(d - b'0')),
                );
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The mount a path lives on: the last-mounted one with the longest matching mount point
/// (later entries shadow earlier ones at the same point).
pub fn mount_of<'a>(mounts: &'a [Mount], path: &Path) -> Option<&'a Mount> {
    mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| path.starts_with(&m.mount_point))
        .max_by_key(|(index, m)| (m.mount_point.components().count(), *index))
        .map(|(_, m)| m)
}

/// Decides for the paths that exist (already resolved to their real locations).
pub fn evaluate(mounts: &[Mount], paths: &[PathBuf]) -> Finding {
    if paths.is_empty() {
        return Finding::ok(
            DETECTOR,
            READONLY_FILESYSTEM,
            "NoPathsToCheck",
            "none of the configured paths exists".into(),
        );
    }
    let mut read_only = Vec::new();
    for path in paths {
        match mount_of(mounts, path) {
            Some(m) if m.read_only => read_only.push(format!(
                "{} ({} on {})",
                path.display(),
                m.source,
                m.mount_point.display()
            )),
            Some(_) => {}
            None => {
                return Finding::unknown(
                    DETECTOR,
                    READONLY_FILESYSTEM,
                    "MountUnknown",
                    format!("no mount in {MOUNTINFO} holds {}", path.display()),
                );
            }
        }
    }
    if !read_only.is_empty() {
        let mounts = read_only.join("; ");
        let message = format!("mounted read-only: {mounts}");
        return Finding::problem(
            DETECTOR,
            READONLY_FILESYSTEM,
            "FilesystemIsReadOnly",
            message,
        );
    }
    let list: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    let message = format!("writable: {}", list.join(", "));
    Finding::ok(DETECTOR, READONLY_FILESYSTEM, "FilesystemWritable", message)
}

pub async fn observe(config: &FilesystemConfig) -> Finding {
    let mountinfo = match tokio::fs::read_to_string(MOUNTINFO).await {
        Ok(text) => text,
        Err(e) => {
            return Finding::unknown(
                DETECTOR,
                READONLY_FILESYSTEM,
                "MountsUnreadable",
                format!("cannot read {MOUNTINFO}: {e}"),
            );
        }
    };
    let mut existing = Vec::new();
    for path in &config.paths {
        // Symlinks resolve to where the data really is; a missing path is not this check's business.
        if let Ok(real) = tokio::fs::canonicalize(path).await {
            existing.push(real);
        }
    }
    evaluate(&parse_mountinfo(&mountinfo), &existing)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Status;

    const MOUNTINFO_TEXT: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro
30 22 8:2 / /var/lib/kubelet rw,relatime shared:2 - ext4 /dev/sdb1 ro,errors=remount-ro
31 22 8:3 / /mnt/with\\040space ro,relatime - xfs /dev/sdc1 ro
32 22 0:5 / /var/lib/kubelet/pods rw,relatime - tmpfs tmpfs rw
40 22 8:4 / /var/log ro,nosuid,nodev,relatime - ext4 /dev/sdd1 rw,errors=remount-ro
";

    #[test]
    fn parses_mount_points_sources_and_read_only_options() {
        let mounts = parse_mountinfo(MOUNTINFO_TEXT);
        assert_eq!(mounts.len(), 5);
        assert_eq!(mounts[2].mount_point, PathBuf::from("/mnt/with space"));
        assert!(mounts[1].read_only, "read-only in the super options counts");
        assert!(!mounts[0].read_only);
        // ProtectSystem=strict's view: the mount is read-only, the filesystem is not.
        assert!(
            !mounts[4].read_only,
            "a read-only view of a writable filesystem"
        );
        assert_eq!(mounts[1].source, "/dev/sdb1");
    }

    #[test]
    fn the_longest_mount_point_holds_the_path() {
        let mounts = parse_mountinfo(MOUNTINFO_TEXT);
        let of =
            |p: &str| mount_of(&mounts, Path::new(p)).map(|m| m.mount_point.display().to_string());
        assert_eq!(
            of("/var/lib/kubelet/pods/x").as_deref(),
            Some("/var/lib/kubelet/pods")
        );
        assert_eq!(
            of("/var/lib/kubelet/plugins").as_deref(),
            Some("/var/lib/kubelet")
        );
        assert_eq!(
            of("/var/lib/kubeletx").as_deref(),
            Some("/"),
            "component-wise, not string prefix"
        );
    }

    #[test]
    fn a_path_on_a_read_only_mount_is_a_problem() {
        let mounts = parse_mountinfo(MOUNTINFO_TEXT);
        let found = evaluate(
            &mounts,
            &[
                PathBuf::from("/var/log"),
                PathBuf::from("/var/lib/kubelet/plugins"),
            ],
        );
        found.assert_is(Status::Problem, "FilesystemIsReadOnly");
        assert!(
            found
                .message
                .contains("/var/lib/kubelet/plugins (/dev/sdb1 on /var/lib/kubelet)"),
            "{}",
            found.message
        );
        let fine = evaluate(
            &mounts,
            &[
                PathBuf::from("/var/log"),
                PathBuf::from("/var/lib/kubelet/pods"),
            ],
        );
        assert_eq!(fine.status, Status::Ok);
    }

    #[tokio::test]
    async fn this_machines_existing_paths_are_checked_and_missing_ones_skipped() {
        let config = FilesystemConfig {
            paths: vec!["/nonexistent/nodeward".into(), "/proc".into()],
            ..FilesystemConfig::default()
        };
        let found = observe(&config).await;
        assert_eq!(found.status, Status::Ok, "{found:?}");
        assert_eq!(found.message, "writable: /proc");
    }
}
