//! Running a configured program for a check (see [`crate::host::reaper`]: its whole process group
//! is killed when it ends or when its check times out, so a hung program, or one it started,
//! never outlives its check).

use std::time::Duration;

/// What a check's output is read into: a finding uses its first line.
const KEEP: usize = 64 * 1024;

/// How a program ended and the first line it printed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// The first non-empty line of standard output (standard error when stdout is empty).
    pub first_line: String,
}

/// Runs `argv` to completion.
pub async fn run(argv: &[String]) -> Result<Outcome, String> {
    let (program, args) = argv.split_first().ok_or("no program configured")?;
    let output = crate::host::reaper::run(program, args, KEEP).await?;
    Ok(Outcome {
        code: output.status.code(),
        first_line: first_line(&output.stdout, &output.stderr),
    })
}

/// Runs `argv` here, or on the host as a transient systemd service (`on_host`; see
/// [`crate::host::commands`]) within `timeout`.
pub async fn run_where(
    argv: &[String],
    on_host: bool,
    timeout: Duration,
) -> Result<Outcome, String> {
    if on_host {
        let ran = crate::host::commands::run(argv, timeout).await?;
        Ok(Outcome {
            code: ran.code,
            first_line: first_line(&ran.output, &[]),
        })
    } else {
        run(argv).await
    }
}

/// The first non-empty line of `stdout`, or of `stderr` when stdout has none (what the
/// node-problem-detector plugin protocol reads as the message), whatever bytes they hold.
pub fn first_line(stdout: &[u8], stderr: &[u8]) -> String {
    let first = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_owned)
    };
    first(stdout).or_else(|| first(stderr)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| (*a).to_owned()).collect()
    }

    #[tokio::test]
    async fn reports_exit_code_and_first_line() {
        let out = run(&argv(&[
            "/bin/sh",
            "-c",
            "echo; echo '  first  '; echo second; exit 3",
        ]))
        .await;
        assert_eq!(
            out,
            Ok(Outcome {
                code: Some(3),
                first_line: "first".into()
            })
        );
    }

    #[tokio::test]
    async fn falls_back_to_stderr_and_reports_signals() {
        let out = run(&argv(&["/bin/sh", "-c", "echo oops >&2; kill -9 $$"]))
            .await
            .expect("ran");
        assert_eq!(out.code, None);
        assert_eq!(out.first_line, "oops");
    }

    #[tokio::test]
    async fn a_missing_program_is_an_error_naming_it() {
        let err = run(&argv(&["/nonexistent/check"]))
            .await
            .expect_err("missing");
        assert!(err.starts_with("cannot run /nonexistent/check"), "{err}");
    }

    #[tokio::test]
    async fn a_flood_of_output_is_read_but_not_kept() {
        // 64 MiB on stdout: read to the end (the program is not blocked), 64 KiB kept.
        let script = argv(&["-c", "echo first; head -c 67108864 /dev/zero; exit 4"]);
        let ran = crate::host::reaper::run("/bin/sh", &script, KEEP)
            .await
            .expect("ran");
        assert_eq!(ran.status.code(), Some(4));
        assert_eq!(ran.stdout.len(), KEEP, "what was kept of 64 MiB");
        assert!(ran.stdout.starts_with(b"first\n"));
    }

    /// Waits until `pid` has exited (gone, or a zombie awaiting its parent).
    async fn exited(pid: i32) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                Err(_) => return true,
                Ok(stat)
                    if stat
                        .rsplit(')')
                        .next()
                        .is_some_and(|s| s.trim_start().starts_with('Z')) =>
                {
                    return true;
                }
                Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
            }
        }
        false
    }

    #[tokio::test]
    async fn what_a_check_leaves_running_dies_with_it() {
        let out = run(&argv(&[
            "/bin/sh",
            "-c",
            "sleep 60 >/dev/null 2>&1 & echo $!",
        ]))
        .await
        .expect("ran");
        let pid: i32 = out.first_line.parse().expect("the background job's pid");
        assert!(
            exited(pid).await,
            "the check's background job {pid} outlived it"
        );
    }

    #[tokio::test]
    async fn a_timed_out_check_takes_its_children_along() {
        let file = std::env::temp_dir().join(format!("nodeward-child-{}", std::process::id()));
        let _ = std::fs::remove_file(&file);
        let script = format!("sleep 60 & echo $! > {}; wait", file.display());
        let script = argv(&["/bin/sh", "-c", &script]);
        let mut running = Box::pin(run(&script));
        // Once the check has started its child, it is abandoned, as its timeout does.
        let started = async {
            loop {
                if let Some(pid) = std::fs::read_to_string(&file)
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok())
                {
                    return pid;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        let pid = tokio::select! {
            ended = &mut running => panic!("the check ended: {ended:?}"),
            pid = tokio::time::timeout(std::time::Duration::from_secs(10), started) => pid.expect("the child started"),
        };
        drop(running);
        let _ = std::fs::remove_file(&file);
        assert!(exited(pid).await, "a timed-out check's child {pid} went on");
    }
}
