//! Records what `--version` prints besides the crate version: the git revision the binary was
//! built from and the target it was built for.
//!
//! The release and image builds set `NODEWARD_REVISION` (the last commit that changed the
//! sources, so that a change elsewhere does not make a new binary); otherwise git is asked, and
//! a build outside a checkout says `unknown`.

use std::{path::PathBuf, process::Command};

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    if !output.status.success() {
        return None;
    }
    let text = String::from_utf8(output.stdout).ok()?;
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_owned())
}

fn main() {
    println!("cargo:rerun-if-env-changed=NODEWARD_REVISION");
    let revision = match std::env::var("NODEWARD_REVISION") {
        Ok(r) if !r.trim().is_empty() => r.trim().to_owned(),
        _ => {
            // Rebuild when HEAD moves (a commit or a checkout), not on every build.
            if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                let dir = PathBuf::from(dir);
                println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
                if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
                    println!("cargo:rerun-if-changed={}", dir.join(reference).display());
                }
            }
            git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
        }
    };
    println!("cargo:rustc-env=NODEWARD_REVISION={revision}");
    let target = std::env::var("TARGET").unwrap_or_else(|_| "unknown".to_owned());
    println!("cargo:rustc-env=NODEWARD_TARGET={target}");
}
