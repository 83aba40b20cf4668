//! The `logind.conf.d` drop-in that raises `InhibitDelayMaxSec` to the shutdown budget, and
//! the drop-ins that override it (logind reads every `*.conf` of its drop-in directories in
//! file-name order; the last one setting a key wins).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// Our drop-in's file name: sorts after the usual distribution ones (`50-...`).
pub const FILE_NAME: &str = "60-nodeward.conf";

/// logind's drop-in directories, most to least specific.
pub const DIRECTORIES: [&str; 4] = [
    "/etc/systemd/logind.conf.d",
    "/run/systemd/logind.conf.d",
    "/usr/local/lib/systemd/logind.conf.d",
    "/usr/lib/systemd/logind.conf.d",
];

pub fn render(delay: Duration) -> String {
    format!(
        "# Written by nodeward-agent: logind waits this long for the agent to drain the node\n\
         # before shutting down. Remove it together with nodeward.\n\
         [Login]\nInhibitDelayMaxSec={}\n",
        delay.as_secs().max(1)
    )
}

/// The `InhibitDelayMaxSec` a fragment sets in its `[Login]` section, if any.
pub fn inhibit_delay(content: &str) -> Option<String> {
    let mut in_login = false;
    let mut value = None;
    for line in content.lines().map(str::trim) {
        if line.starts_with('[') {
            in_login = line == "[Login]";
        } else if in_login
            && let Some((key, v)) = line.split_once('=')
            && key.trim() == "InhibitDelayMaxSec"
        {
            value = Some(v.trim().to_owned());
        }
    }
    value
}

/// Of `files` (file name, content), those sorting after ours that set `InhibitDelayMaxSec`,
/// as "name (InhibitDelayMaxSec=value)".
pub fn overriding(files: &[(String, String)]) -> Vec<String> {
    let mut later: Vec<String> = files
        .iter()
        .filter(|(name, _)| name.as_str() > FILE_NAME && name.ends_with(".conf"))
        .filter_map(|(name, content)| {
            inhibit_delay(content).map(|v| format!("{name} (InhibitDelayMaxSec={v})"))
        })
        .collect();
    later.sort();
    later.dedup();
    later
}

/// Reads every `*.conf` in `directories` (missing ones are skipped).
pub fn read_all(directories: &[PathBuf]) -> Vec<(String, String)> {
    let mut files = Vec::new();
    for dir in directories {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Ok(content) = std::fs::read_to_string(entry.path()) {
                files.push((name, content));
            }
        }
    }
    files
}

/// Writes our drop-in into `dir` unless it already says the same; whether it changed.
pub fn ensure(dir: &Path, delay: Duration) -> std::io::Result<bool> {
    let path = dir.join(FILE_NAME);
    let content = render(delay);
    if std::fs::read_to_string(&path).is_ok_and(|c| c == content) {
        return Ok(false);
    }
    std::fs::create_dir_all(dir)?;
    let temporary = dir.join(format!(".{FILE_NAME}.tmp"));
    std::fs::write(&temporary, content)?;
    std::fs::rename(&temporary, &path)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_a_login_section_that_parses_back() {
        let text = render(Duration::from_secs(120));
        assert_eq!(inhibit_delay(&text).as_deref(), Some("120"));
    }

    #[test]
    fn only_later_files_setting_the_delay_override_ours() {
        let files = vec![
            (
                "50-distro.conf".to_owned(),
                "[Login]\nInhibitDelayMaxSec=5\n".to_owned(),
            ),
            (
                "90-admin.conf".to_owned(),
                "[Login]\nInhibitDelayMaxSec=10s\n".to_owned(),
            ),
            (
                "95-other.conf".to_owned(),
                "[Login]\nHandleLidSwitch=ignore\n".to_owned(),
            ),
            (
                "99-wrong-section.conf".to_owned(),
                "[Other]\nInhibitDelayMaxSec=1\n".to_owned(),
            ),
            (
                "99-not-conf.txt".to_owned(),
                "[Login]\nInhibitDelayMaxSec=1\n".to_owned(),
            ),
        ];
        assert_eq!(
            overriding(&files),
            ["90-admin.conf (InhibitDelayMaxSec=10s)"]
        );
    }
}
