//! Running a configured program for a check. The child is killed when the check is dropped
//! (its timeout expired), so a hung program never outlives its check.

use std::process::Stdio;

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
    let output = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let first = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_owned)
    };
    Ok(Outcome {
        code: output.status.code(),
        first_line: first(&output.stdout)
            .or_else(|| first(&output.stderr))
            .unwrap_or_default(),
    })
}

/// `text` cut to at most `max` characters, marked with an ellipsis when cut.
pub fn cap(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut capped: String = text.chars().take(max.saturating_sub(1)).collect();
    capped.push('…');
    capped
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

    #[test]
    fn cap_cuts_on_characters() {
        assert_eq!(cap("abc", 3), "abc");
        assert_eq!(cap("abcdef", 4), "abc…");
        assert_eq!(cap("ééééé", 3), "éé…");
    }
}
