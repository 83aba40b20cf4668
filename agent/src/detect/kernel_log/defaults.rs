//! The kernel-log patterns a node gets unless configured otherwise: node-problem-detector's
//! kernel monitor, rule for rule and with its reasons (so that alerts on them carry over), and
//! the lines newer kernels print for the same problems; each is tested against real kernel
//! messages (`kernel_log.rs`).

use std::{path::PathBuf, time::Duration};

use super::{KernelLogConfig, KernelPatternConfig, SourceSetting, default_journal_directories};

impl Default for KernelLogConfig {
    fn default() -> Self {
        let pattern = KernelPatternConfig::new;
        Self {
            enabled: true,
            source: SourceSetting::Auto,
            device: PathBuf::from("/dev/kmsg"),
            journal_directories: default_journal_directories(),
            lookback: Duration::from_secs(300),
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            hold: Duration::ZERO,
            // node-problem-detector's kernel monitor, rule for rule (its reasons, so that
            // alerts on them carry over), and the lines newer kernels print for the same
            // problems; each is tested against real kernel messages below.
            patterns: vec![
                pattern(
                    "OOMKilling",
                    r"(Out of memory|Memory cgroup out of memory): Kill(ed)? process \d+|Killed process \d+ \(.+\) total-vm:\d+kB",
                    None,
                ),
                pattern(
                    "TaskHung",
                    r"task [\S ]+:\d+ blocked for more than \d+ seconds\.",
                    None,
                ),
                pattern(
                    "UnregisterNetDevice",
                    r"unregister_netdevice: waiting for \S+ to become free\. Usage count = -?\d+",
                    None,
                ),
                pattern(
                    "KernelOops",
                    r"BUG: unable to handle |BUG: kernel NULL pointer dereference|divide error: 0000 \[#\d+\]|Oops: [0-9a-f]{4} \[#\d+\]|general protection fault",
                    None,
                ),
                pattern("Ext4Error", r"EXT4-fs error ", None),
                pattern("Ext4Warning", r"EXT4-fs warning ", None),
                pattern(
                    "IOError",
                    r"Buffer I/O error on |I/O error, dev \S+, sector \d+",
                    None,
                ),
                pattern("MemoryReadError", r"CE memory read error ", None),
                pattern(
                    "CperHardwareErrorCorrected",
                    r"\[Hardware Error\]: event severity: corrected$",
                    None,
                ),
                pattern(
                    "CperHardwareErrorRecoverable",
                    r"\[Hardware Error\]: event severity: recoverable$",
                    None,
                ),
                pattern(
                    "CperHardwareErrorFatal",
                    r"\[Hardware Error\]: event severity: fatal$",
                    Some(nodeward_api::conditions::node::CPER_HARDWARE_ERROR_FATAL),
                )
                .ok(
                    "CperHardwareHasNoFatalError",
                    "UEFI CPER has no fatal error",
                ),
                pattern(
                    "XfsHasShutdown",
                    r"XFS \([^)]+\): .*(Shutting down filesystem|Filesystem has been shut down)",
                    Some(nodeward_api::conditions::node::XFS_SHUTDOWN),
                )
                .ok("XfsHasNotShutDown", "XFS has not shutdown"),
                pattern(
                    "DockerHung",
                    r"task (docker|dockerd):\d+ blocked for more than \d+ seconds\.",
                    Some(nodeward_api::conditions::node::KERNEL_DEADLOCK),
                )
                .ok("KernelHasNoDeadlock", "kernel has no deadlock"),
                pattern(
                    "ContainerdHung",
                    r"task (containerd|containerd-shim\S*):\d+ blocked for more than \d+ seconds\.",
                    Some(nodeward_api::conditions::node::KERNEL_DEADLOCK),
                )
                .ok("KernelHasNoDeadlock", "kernel has no deadlock"),
                pattern(
                    "FilesystemIsReadOnly",
                    r"Remounting filesystem read-only",
                    Some(nodeward_api::conditions::node::READONLY_FILESYSTEM),
                )
                .ok("FilesystemIsNotReadOnly", "Filesystem is not read-only"),
            ],
        }
    }
}
