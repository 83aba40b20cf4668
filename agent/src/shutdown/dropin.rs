//! The `logind.conf.d` drop-in that raises `InhibitDelayMaxSec` to the shutdown budget, and
//! the drop-ins that override it (logind reads every `*.conf` of its drop-in directories in
//! file-name order, whichever directory holds them; the last one setting a key wins).
//!
//! Ours is named to sort after the usual ones (the kubelet's `99-kubelet.conf`, a
//! distribution's `50-*.conf`, Ubuntu's `unattended-upgrades-*.conf`), so that a shorter delay
//! set there never silently takes the drain's time away; and it keeps any longer delay they ask
//! for (the kubelet's graceful shutdown period, for one), so it never takes theirs.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// Our drop-in's file name: sorts after the usual ones (see the module documentation).
pub const FILE_NAME: &str = "zz-nodeward.conf";

/// The name earlier versions wrote (it lost to `99-kubelet.conf`); removed when found.
pub const OLD_FILE_NAME: &str = "60-nodeward.conf";

/// What our drop-ins start with; a file without it is somebody else's and never removed.
const HEADER: &str = "# Written by nodeward-agent";

/// logind's drop-in directories, most to least specific.
pub const DIRECTORIES: [&str; 4] = [
    "/etc/systemd/logind.conf.d",
    "/run/systemd/logind.conf.d",
    "/usr/local/lib/systemd/logind.conf.d",
    "/usr/lib/systemd/logind.conf.d",
];

pub fn render(delay: Duration) -> String {
    format!(
        "{HEADER}: logind waits this long for the agent to drain the node\n\
         # before shutting down (its budget, or a longer delay another drop-in asks for).\n\
         # Remove it together with nodeward.\n\
         [Login]\nInhibitDelayMaxSec={}\n",
        delay.as_secs().max(1)
    )
}

/// `InhibitDelayMaxSec` as logind reads it: seconds, or a systemd time span (`30s`, `2min`,
/// `1h 30min`); `None` when it is not one.
pub fn parse_delay(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let mut total = Duration::ZERO;
    for part in value.split_whitespace() {
        let digits = part.find(|c: char| !c.is_ascii_digit())?;
        let (number, unit) = part.split_at(digits);
        let number: u64 = number.parse().ok()?;
        let seconds = match unit {
            "s" | "sec" | "second" | "seconds" => 1,
            "m" | "min" | "minute" | "minutes" => 60,
            "h" | "hr" | "hour" | "hours" => 3600,
            "ms" | "msec" => {
                total += Duration::from_millis(number);
                continue;
            }
            _ => return None,
        };
        total += Duration::from_secs(number * seconds);
    }
    (!value.is_empty()).then_some(total)
}

/// The delay our drop-in sets: the budget, or the longest delay another drop-in of `files`
/// (file name, content) sets, whichever is longer.
pub fn wanted_delay(budget: Duration, files: &[(String, String)]) -> Duration {
    files
        .iter()
        .filter(|(name, _)| name != FILE_NAME && name != OLD_FILE_NAME && name.ends_with(".conf"))
        .filter_map(|(_, content)| inhibit_delay(content).as_deref().and_then(parse_delay))
        .fold(budget, Duration::max)
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

/// Writes our drop-in into `dir` unless it already says the same, and removes the one an
/// earlier version wrote; whether anything changed.
pub fn ensure(dir: &Path, delay: Duration) -> std::io::Result<bool> {
    let old = dir.join(OLD_FILE_NAME);
    let removed_old = std::fs::read_to_string(&old).is_ok_and(|c| c.starts_with(HEADER))
        && std::fs::remove_file(&old).is_ok();
    let path = dir.join(FILE_NAME);
    let content = render(delay);
    if std::fs::read_to_string(&path).is_ok_and(|c| c == content) {
        return Ok(removed_old);
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
    fn ours_sorts_after_the_kubelets_and_the_distributions() {
        for theirs in [
            "99-kubelet.conf",
            "50-distro.conf",
            "unattended-upgrades-logind-maxdelay.conf",
        ] {
            assert!(FILE_NAME > theirs, "{theirs} would override ours");
        }
    }

    #[test]
    fn the_delay_keeps_a_longer_one_another_drop_in_asks_for() {
        let files = vec![
            (
                "99-kubelet.conf".to_owned(),
                "[Login]\nInhibitDelayMaxSec=300\n".to_owned(),
            ),
            (
                "unattended-upgrades-logind-maxdelay.conf".to_owned(),
                "[Login]\nInhibitDelayMaxSec=30s\n".to_owned(),
            ),
            (
                FILE_NAME.to_owned(),
                "[Login]\nInhibitDelayMaxSec=900\n".to_owned(),
            ),
        ];
        let budget = Duration::from_secs(120);
        assert_eq!(wanted_delay(budget, &files), Duration::from_secs(300));
        assert_eq!(
            wanted_delay(budget, &files[1..]),
            budget,
            "ours is not counted"
        );
        assert_eq!(parse_delay("2min 30s"), Some(Duration::from_secs(150)));
        assert_eq!(parse_delay("1h"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_delay("soon"), None);
    }

    #[test]
    fn the_old_drop_in_is_removed_and_nobody_elses() {
        let dir = std::env::temp_dir().join(format!("nodeward-dropin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        std::fs::write(dir.join(OLD_FILE_NAME), render(Duration::from_secs(60))).expect("old");
        assert!(ensure(&dir, Duration::from_secs(120)).expect("written"));
        assert!(!dir.join(OLD_FILE_NAME).exists());
        assert_eq!(
            inhibit_delay(&std::fs::read_to_string(dir.join(FILE_NAME)).expect("ours")).as_deref(),
            Some("120")
        );
        assert!(!ensure(&dir, Duration::from_secs(120)).expect("unchanged"));
        // Somebody else's file of that name stays.
        std::fs::write(dir.join(OLD_FILE_NAME), "[Login]\nInhibitDelayMaxSec=10\n")
            .expect("theirs");
        ensure(&dir, Duration::from_secs(120)).expect("written");
        assert!(dir.join(OLD_FILE_NAME).exists());
        std::fs::remove_dir_all(&dir).expect("cleaned up");
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
        assert!(
            overriding(&files).is_empty(),
            "every one of them sorts before ours"
        );
        let later = vec![(
            "zzz-admin.conf".to_owned(),
            "[Login]\nInhibitDelayMaxSec=10s\n".to_owned(),
        )];
        assert_eq!(
            overriding(&later),
            ["zzz-admin.conf (InhibitDelayMaxSec=10s)"]
        );
    }
}
