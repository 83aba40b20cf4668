//! In its container the agent is PID 1: what a check leaves behind is re-parented to it and
//! must be collected, without taking the exit status of the checks it waits for. This test
//! binary makes itself a subreaper, which receives orphans as PID 1 does.

use std::time::{Duration, Instant};

use nodeward_agent::{detect::command, host::reaper};

/// `pid`'s state letter and parent, while it exists.
fn state(pid: i32) -> Option<(char, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut after = stat.rsplit(')').next()?.split_whitespace();
    let state = after.next()?.chars().next()?;
    let parent = after.next()?.parse().ok()?;
    Some((state, parent))
}

fn argv(script: &str) -> Vec<String> {
    ["/bin/sh", "-c", script].map(str::to_owned).to_vec()
}

#[tokio::test]
async fn orphans_left_by_checks_are_collected_and_the_checks_keep_their_exit_codes()
-> anyhow::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)?;
    assert!(reaper::receives_orphans());

    // A check that leaves a process behind: its group is killed, the leftover is ours now.
    let out = command::run(&argv("sleep 60 >/dev/null 2>&1 & echo $!"))
        .await
        .map_err(anyhow::Error::msg)?;
    let orphan: i32 = out.first_line.parse()?;
    let me = i32::try_from(std::process::id())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(orphan) != Some(('Z', me)) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the leftover {orphan} did not become our zombie: {:?}",
            state(orphan)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let reaping = tokio::spawn(reaper::reap(Duration::from_secs(1)));
    // While the reaper runs, checks still get their own exit codes (none is taken from them).
    let checks: Vec<_> = (0..20)
        .map(|i| tokio::spawn(async move { command::run(&argv(&format!("exit {i}"))).await }))
        .collect();
    for (i, check) in checks.into_iter().enumerate() {
        let out = check.await?.map_err(anyhow::Error::msg)?;
        assert_eq!(out.code, Some(i32::try_from(i)?), "check {i}'s exit code");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while state(orphan).is_some() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the orphan {orphan} was not collected: {:?}",
            state(orphan)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    reaping.abort();
    Ok(())
}
