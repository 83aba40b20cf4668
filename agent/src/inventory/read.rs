//! One reading of the host's software, as pure code: the shell script the agent runs on the
//! host (read-only queries of `/etc/os-release` and the package manager, the package names as
//! its arguments, never in its text) and the parsing of what it prints.

use nodeward_api::{
    bounds::excerpt,
    inventory::{Inventory, PackageVersion},
};

/// Runs on the host as `sh -c SCRIPT sh PENDING PACKAGE...`: prints tab-separated records,
/// `os NAME`, `manager dpkg|rpm`, `package NAME VERSION` (empty when not installed),
/// `pending COUNT`, and `error WHAT` for what it could not read. Only queries: the package
/// manager's metadata is never refreshed, nothing is locked or installed. Its text has no `${`:
/// systemd replaces `${NAME}` in a transient unit's command line with its environment's
/// (empty) value before the shell sees it, so a `$` the shell must pass on comes from `$d`.
pub const SCRIPT: &str = r#"pending=$1; shift
if [ -r /etc/os-release ]; then
  PRETTY_NAME=; . /etc/os-release; printf 'os\t%s\n' "$PRETTY_NAME"
else
  printf 'error\tno /etc/os-release on the host\n'
fi
[ "$#" -gt 0 ] || [ "$pending" = yes ] || exit 0
if command -v dpkg-query >/dev/null 2>&1; then
  printf 'manager\tdpkg\n'
  d='$'
  for p in "$@"; do
    s=$(dpkg-query -W -f="$d{db:Status-Abbrev}\t$d{Version}" "$p" 2>/dev/null)
    case "$s" in
      ii*) printf 'package\t%s\t%s\n' "$p" "$(printf '%s' "$s" | cut -f2)" ;;
      *) printf 'package\t%s\t\n' "$p" ;;
    esac
  done
  if [ "$pending" = yes ]; then
    if out=$(apt-get -s -o Debug::NoLocking=true dist-upgrade 2>&1); then
      printf 'pending\t%s\n' "$(printf '%s\n' "$out" | grep -c '^Inst ')"
    else
      printf 'error\tapt-get -s dist-upgrade failed: %s\n' "$(printf '%s' "$out" | tail -n 1)"
    fi
  fi
elif command -v rpm >/dev/null 2>&1; then
  printf 'manager\trpm\n'
  for p in "$@"; do
    if v=$(rpm -q --qf '%{EPOCHNUM}:%{VERSION}-%{RELEASE}' "$p" 2>/dev/null); then
      printf 'package\t%s\t%s\n' "$p" "$v"
    else
      printf 'package\t%s\t\n' "$p"
    fi
  done
  if [ "$pending" = yes ]; then
    if command -v dnf >/dev/null 2>&1 || command -v yum >/dev/null 2>&1; then
      dnf=$(command -v dnf || command -v yum)
      out=$("$dnf" -C -q check-update 2>&1); code=$?
      case $code in
        0) printf 'pending\t0\n' ;;
        100) printf 'pending\t%s\n' "$(printf '%s\n' "$out" | grep -c '^[^ ]*\.[^ ]* \+[^ ]\+ \+[^ ]\+')" ;;
        *) printf 'error\t%s -C check-update failed: %s\n' "$dnf" "$(printf '%s' "$out" | tail -n 1)" ;;
      esac
    elif command -v zypper >/dev/null 2>&1; then
      if out=$(zypper -n --no-refresh -q list-updates 2>&1); then
        printf 'pending\t%s\n' "$(printf '%s\n' "$out" | grep -c '^v ')"
      else
        printf 'error\tzypper list-updates failed: %s\n' "$(printf '%s' "$out" | tail -n 1)"
      fi
    else
      printf 'error\tno dnf, yum or zypper to count the pending updates\n'
    fi
  fi
else
  printf 'error\tno dpkg-query or rpm on the host\n'
fi
"#;

/// The command that reads the host: `SCRIPT` with the package names as arguments.
pub fn argv(packages: &[String], pending: bool) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_owned(),
        "-c".to_owned(),
        SCRIPT.to_owned(),
        "sh".to_owned(),
        if pending { "yes" } else { "no" }.to_owned(),
    ];
    argv.extend(packages.iter().cloned());
    argv
}

/// What the script printed (and how it ended), as an inventory; the kernel and boot are the
/// caller's. Every asked package appears, in the order asked; unknown records are ignored,
/// every text is cut to its field's bound.
pub fn parse(output: &str, ended: Result<(), String>, packages: &[String]) -> Inventory {
    let mut inventory = Inventory::default();
    let mut errors: Vec<String> = ended.err().into_iter().collect();
    let mut versions = std::collections::BTreeMap::new();
    for line in output.lines() {
        let mut fields = line.splitn(3, '\t');
        match (fields.next(), fields.next(), fields.next()) {
            (Some("os"), Some(name), None) if !name.trim().is_empty() => {
                inventory.os_image = Some(excerpt(name.as_bytes(), 256));
            }
            (Some("manager"), Some(manager), None) => {
                inventory.package_manager = Some(excerpt(manager.as_bytes(), 16));
            }
            (Some("package"), Some(name), Some(version)) => {
                let version = version.trim();
                versions.insert(
                    name.to_owned(),
                    (!version.is_empty()).then(|| excerpt(version.as_bytes(), 256)),
                );
            }
            (Some("pending"), Some(count), None) => match count.trim().parse::<u32>() {
                Ok(n) => inventory.updates_pending = Some(i32::try_from(n).unwrap_or(i32::MAX)),
                Err(_) => errors.push(format!(
                    "a pending-update count that is no number: {count:?}"
                )),
            },
            (Some("error"), Some(what), _) => errors.push(what.trim().to_owned()),
            _ => {}
        }
    }
    inventory.packages = packages
        .iter()
        .map(|name| PackageVersion {
            name: name.clone(),
            version: versions.get(name).cloned().flatten(),
        })
        .collect();
    if !errors.is_empty() {
        inventory.error = Some(excerpt(errors.join("; ").as_bytes(), 1024));
    }
    inventory
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_debian_host_gives_its_os_its_packages_and_its_pending_updates() {
        let printed = "os\tDebian GNU/Linux 13 (trixie)\nmanager\tdpkg\npackage\tnodelab-demo\t2.0\npackage\tmissing\t\npending\t3\n";
        let got = parse(printed, Ok(()), &names(&["nodelab-demo", "missing"]));
        assert_eq!(
            got.os_image.as_deref(),
            Some("Debian GNU/Linux 13 (trixie)")
        );
        assert_eq!(got.package_manager.as_deref(), Some("dpkg"));
        assert_eq!(got.version_of("nodelab-demo"), Some("2.0"));
        assert_eq!(got.version_of("missing"), None);
        assert_eq!(
            got.packages.len(),
            2,
            "an uninstalled package is listed too"
        );
        assert_eq!(got.updates_pending, Some(3));
        assert_eq!(got.error, None);
    }

    #[test]
    fn what_could_not_be_read_is_the_error_and_what_could_is_kept() {
        let printed = "os\tFedora Linux 43\nmanager\trpm\npackage\tkernel\t0:6.17.1-300.fc43\nerror\t/usr/bin/dnf -C check-update failed: Cache-only enabled but no cache\n";
        let got = parse(printed, Err("exit code 2".into()), &names(&["kernel"]));
        assert_eq!(got.version_of("kernel"), Some("0:6.17.1-300.fc43"));
        assert_eq!(got.updates_pending, None);
        let error = got.error.expect("an error");
        assert!(
            error.contains("exit code 2") && error.contains("no cache"),
            "{error}"
        );
    }

    #[test]
    fn nonsense_is_ignored_bounded_or_named() {
        let long = "x".repeat(5000);
        let printed = format!(
            "garbage\nos\t{long}\npending\tmany\npackage\tunasked\t1.0\npackage\tasked\t1\x1b[2J\n"
        );
        let got = parse(&printed, Ok(()), &names(&["asked"]));
        assert_eq!(got.os_image.as_ref().map(|o| o.chars().count()), Some(256));
        assert_eq!(got.packages.len(), 1, "only asked packages are listed");
        assert_eq!(
            got.version_of("asked"),
            Some("1 [2J"),
            "no control characters"
        );
        assert!(got.error.unwrap_or_default().contains("\"many\""));
    }

    #[test]
    fn the_package_names_are_arguments_never_script_text() {
        let argv = argv(&names(&["a;reboot", "b"]), true);
        assert_eq!(argv[..2], ["/bin/sh", "-c"]);
        assert_eq!(argv[2], SCRIPT);
        assert_eq!(argv[3..], ["sh", "yes", "a;reboot", "b"]);
    }

    #[test]
    fn the_script_has_nothing_systemd_would_expand() {
        assert!(
            !SCRIPT.contains("${"),
            "systemd would replace ${{...}} in the command line"
        );
    }

    /// The script itself, run by this machine's shell against stand-ins on its PATH for the
    /// package manager: what it prints parses into the packages asked.
    #[test]
    fn the_script_prints_what_parse_reads() {
        let dir = std::env::temp_dir().join(format!("nodeward-inventory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory");
        let stub = |name: &str, body: &str| {
            use std::os::unix::fs::PermissionsExt;
            let path = dir.join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("a stub");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .expect("executable");
        };
        stub(
            "dpkg-query",
            r#"[ "$2" = '-f=${db:Status-Abbrev}\t${Version}' ] || { echo "format $2" >&2; exit 3; }
case "$3" in demo) printf 'ii \t2.0-1' ;; gone) printf 'rc \t1.0' ;; *) exit 1 ;; esac"#,
        );
        stub(
            "apt-get",
            "printf 'Inst a [1] (2 x)\\nConf a\\nInst b [1] (2 x)\\n'",
        );
        let path = format!("{}:/usr/bin:/bin", dir.display());
        let packages = names(&["demo", "gone", "absent"]);
        let out = std::process::Command::new("/bin/sh")
            .args(&argv(&packages, true)[1..])
            .env("PATH", path)
            .output()
            .expect("sh runs");
        let _ = std::fs::remove_dir_all(&dir);
        let printed = String::from_utf8_lossy(&out.stdout);
        let got = parse(&printed, Ok(()), &packages);
        assert_eq!(got.package_manager.as_deref(), Some("dpkg"), "{printed}");
        assert_eq!(got.version_of("demo"), Some("2.0-1"), "{printed}");
        assert_eq!(
            got.version_of("gone"),
            None,
            "removed, its config left: not installed"
        );
        assert_eq!(got.version_of("absent"), None);
        assert_eq!(got.updates_pending, Some(2), "{printed}");
    }
}
