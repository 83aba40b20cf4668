//! Followed logs: node-problem-detector's monitors, the kernel log (from /dev/kmsg or the
//! journal's files) and programs' journal messages, each Event once across a restart.

use super::*;

/// node-problem-detector's custom plugin monitor with one plugin (its shipped DNS check, which
/// fails here: no cluster DNS) behind a temporary and a permanent rule.
fn dns_monitor(dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/src/npd/testdata/plugin/dns_problem.sh");
    let monitor = serde_json::json!({
        "plugin": "custom",
        "pluginConfig": {"invoke_interval": "1s", "timeout": "1s", "max_output_length": 80, "concurrency": 1},
        "source": "dns-custom-plugin-monitor",
        "conditions": [{"type": "DNSProblem", "reason": "DNSIsUp", "message": "DNS is up"}],
        "rules": [
            {"type": "temporary", "reason": "DNSUnreachable", "path": script},
            {"type": "permanent", "condition": "DNSProblem", "reason": "DNSUnreachable", "path": script},
        ],
    });
    let file = dir.join("dns-monitor.json");
    std::fs::create_dir_all(dir)?;
    std::fs::write(&file, serde_json::to_vec_pretty(&monitor)?)?;
    Ok(file)
}

#[tokio::test]
async fn a_node_problem_detector_monitor_sets_its_permanent_condition_and_its_temporary_rule_only_raises_events()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("agent-npd", "zone-a").await?;
    let monitor = dns_monitor(&std::env::temp_dir().join(format!("nodeward-npd-{}", env.id)))?;
    let _agent = Agent::start_with(
        &node,
        &env,
        Options {
            env: vec![("NODEWARD_NPD_CONFIG", monitor.display().to_string())],
            ..Options::default()
        },
    )?;

    // The permanent rule: a Node condition with the rule's reason.
    let nodes: Api<Node> = env.nodes();
    let flagged = wait_condition(&nodes, &node, "DNSProblem", "True").await?;
    assert_eq!(
        reason_of(&flagged, "DNSProblem").as_deref(),
        Some("DNSUnreachable")
    );
    // The temporary rule: in the NodeReport, and a Warning Event, never a Node condition.
    let what = "the temporary rule's finding in the NodeReport";
    reported(&env, &node, what, |s| {
        s.findings.iter().any(|f| {
            f.type_ == "DNSUnreachable"
                && f.status == "True"
                && f.message == "DNS lookup to kubernetes.default is not working"
        })
    })
    .await?;
    wait::eventually("the temporary rule's Warning Event", TIMEOUT, || async {
        let events = env.events_about(&node, "regarding.kind=NodeReport").await?;
        Ok(events
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("DNSUnreachable")
                    && e.type_.as_deref() == Some("Warning")
            })
            .then_some(()))
    })
    .await?;
    let node_object = nodes.get(&node).await?;
    let conditions = nodeward_api::node::conditions(&node_object);
    assert!(
        !conditions.iter().any(|c| c.type_ == "DNSUnreachable"),
        "a temporary rule sets no Node condition: {conditions:?}"
    );
    env.cleanup().await
}

/// How many times the Events about `node` tell of `text` (an Event's series counts its repeats).
async fn told(env: &TestEnv, node: &str, text: &str) -> anyhow::Result<i32> {
    Ok(env
        .events_about(node, "")
        .await?
        .iter()
        .filter(|e| e.note.as_deref().is_some_and(|n| n.contains(text)))
        .map(|e| e.series.as_ref().map_or(1, |s| s.count))
        .sum())
}

#[tokio::test]
async fn kernel_messages_raise_events_once_and_a_clearing_condition_across_a_restart()
-> anyhow::Result<()> {
    let env = TestEnv::new("agent-kmsg").await?;
    kernel_log_across_a_restart(&env, "zone-d", "source: kmsg", KernelLogSource::Kmsg).await?;
    env.cleanup().await
}

/// An agent on a new node of `env` reading /dev/kmsg with the section's fields after `source`
/// that `kernel_log` writes for the test's tag (patterns unique to the test, so that no other
/// agent on this machine reacts to its lines): the node's name, the tag and the agent.
async fn kmsg_agent(
    env: &TestEnv,
    kernel_log: impl FnOnce(&str) -> String,
) -> anyhow::Result<(String, String, Agent)> {
    let node = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker("zone-d")]).await?;
    let tag = env.id.replace('-', "");
    let kernel_log = format!("{{source: kmsg, {}}}", kernel_log(&tag));
    let agent = Agent::start_with(
        &node,
        env,
        Options {
            interval: "1s",
            heartbeat: "30s",
            kernel_log: &kernel_log,
            ..Options::default()
        },
    )?;
    Ok((node, tag, agent))
}

/// A kernel line that sets a condition is judged when it is read, not at the detector's next
/// interval (a minute here, after a first run at the start): the condition is on the Node
/// within the 30 s this waits, half the time to that next run.
#[tokio::test]
async fn a_kernel_line_sets_its_condition_when_it_is_read_not_at_the_next_interval()
-> anyhow::Result<()> {
    let env = TestEnv::new("agent-kmsg-now").await?;
    let (node, tag, agent) = kmsg_agent(&env, |tag| {
        format!(
            "interval: 60s, timeout: 5s, patterns: [{{reason: FilesystemIsReadOnly, regex: 't{tag}\\): Remounting filesystem read-only', condition: ReadonlyFilesystem}}]"
        )
    })
    .await?;
    let nodes: Api<Node> = env.nodes();
    wait_condition(&nodes, &node, "ReadonlyFilesystem", "False").await?;
    let written = std::time::Instant::now();
    std::fs::write(
        "/dev/kmsg",
        format!("<3>EXT4-fs (t{tag}): Remounting filesystem read-only\n"),
    )?;
    wait::until(
        &nodes,
        &node,
        "ReadonlyFilesystem=True before the detector's next interval",
        Duration::from_secs(30),
        has("ReadonlyFilesystem", "True"),
    )
    .await?
    .context("the node")?;
    println!(
        "ReadonlyFilesystem on the Node {:.2} s after its kernel line",
        written.elapsed().as_secs_f64()
    );
    env.cleanup_after(agent).await
}

/// A flood of 200 OOM kills of eight processes through the real kernel log: the first few are
/// Events at once, the rest summarised in the next one the rate limit allows, naming every
/// process; a hung task right after the flood is published at once all the same.
#[tokio::test]
async fn a_flood_reaches_the_api_server_with_every_process_and_leaves_room_for_another_problem()
-> anyhow::Result<()> {
    let env = TestEnv::new("agent-kmsg-flood").await?;
    let (node, tag, agent) = kmsg_agent(&env, |tag| {
        format!(
            "interval: 1s, timeout: 500ms, patterns: [{{reason: OOMKilling, regex: 'Killed process \\d+ \\(t{tag}-\\w+\\)'}}, {{reason: TaskHung, regex: 'task t{tag}:\\d+ blocked for more than \\d+ seconds'}}]"
        )
    })
    .await?;
    agent.wait_ready().await?;
    let processes: Vec<String> = (0..8).map(|i| format!("t{tag}-p{i}")).collect();
    // Each record written through a descriptor of its own: the kernel allows one descriptor
    // only a burst of ten before it drops what userspace writes.
    for i in 0..200 {
        let process = &processes[i % processes.len()];
        std::fs::write(
            "/dev/kmsg",
            format!(
                "<3>Out of memory: Killed process {} ({process}) total-vm:1kB\n",
                5000 + i
            ),
        )?;
    }
    std::fs::write(
        "/dev/kmsg",
        format!("<3>INFO: task t{tag}:77 blocked for more than 120 seconds.\n"),
    )?;
    let hung = format!("task t{tag}:77 blocked");
    wait::eventually(
        "the hung task's Event, not held behind the flood",
        TIMEOUT,
        || async { Ok((told(&env, &node, &hung).await? == 1).then_some(())) },
    )
    .await?;
    // The rest of the flood comes in the next summary (its reason's allowance refills every
    // 30 s): every process is named in an OOMKilling Event by then.
    let named = wait::eventually(
        "every process named in an Event",
        Duration::from_secs(75),
        || async {
            let events = env.events_about(&node, "").await?;
            let notes: Vec<&str> = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("OOMKilling"))
                .filter_map(|e| e.note.as_deref())
                .collect();
            let all = processes
                .iter()
                .all(|p| notes.iter().any(|n| n.contains(&format!("({p})"))));
            Ok(all.then_some(notes.len()))
        },
    )
    .await?;
    assert!(
        named <= 8,
        "a few Events and a summary, not one per kill: {named}"
    );
    env.cleanup_after(agent).await
}

/// The same through the journal: a real journald reads /dev/kmsg into its files, and the agent
/// reads those files (as an unprivileged DaemonSet pod does from the host's, mounted read-only).
#[tokio::test]
async fn kernel_messages_read_from_the_journal_files_raise_events_once_across_a_restart()
-> anyhow::Result<()> {
    use nodeward_e2e::journald::Journald;
    let env = TestEnv::new("agent-journal").await?;
    let journald = Journald::start(&env.id).await?;
    let source = format!(
        "source: journal, journalDirectories: ['{}']",
        journald.dir.display()
    );
    kernel_log_across_a_restart(&env, "zone-d", &source, KernelLogSource::Journal).await?;
    env.cleanup().await
}

/// node-problem-detector's shipped systemd monitor (a journald monitor), loaded as it is:
/// systemd's "Started …kubelet" in the journal of a real journald becomes a KubeletStart Event,
/// once, also across an agent restart.
#[tokio::test]
async fn a_programs_journal_messages_raise_the_journald_monitors_events_once_across_a_restart()
-> anyhow::Result<()> {
    use nodeward_e2e::journald::Journald;
    let (env, node) = TestEnv::with_worker("agent-journald", "zone-d").await?;
    let journald = Journald::start(&env.id).await?;
    let monitor = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/src/npd/testdata/systemd-monitor.json");
    let journal = format!(
        "{{interval: 500ms, timeout: 500ms, directories: ['{}']}}",
        journald.dir.display()
    );
    let options = || Options {
        journal: &journal,
        env: vec![("NODEWARD_NPD_CONFIG", monitor.display().to_string())],
        ..Options::default()
    };
    let tag = env.id.replace('-', "");
    let first = format!("{tag}-1 Started kubelet.service - kubelet: The Kubernetes Node Agent.");
    journald.send("systemd", &first)?;
    // Another program's line, the same words: not systemd's, so no Event. (The tag goes first:
    // node-problem-detector's patterns must match up to the end of the message.)
    let other = format!("{tag}-other Started Kubernetes kubelet.");
    journald.send("not-systemd", &other)?;
    let agent = Agent::start_with(&node, &env, options())?;
    wait::eventually("the KubeletStart Event", TIMEOUT, || async {
        Ok((told(&env, &node, &first).await? == 1).then_some(()))
    })
    .await
    .with_context(|| agent.output())?;
    reported(&env, &node, "the systemd monitor's position", |s| {
        s.journal_log.iter().any(|p| p.identifier == "systemd")
    })
    .await?;

    drop(agent);
    let agent = Agent::start_with(&node, &env, options())?;
    agent.wait_ready().await?;
    let second = format!("{tag}-2 Started kubelet.service - kubelet: The Kubernetes Node Agent.");
    journald.send("systemd", &second)?;
    wait::eventually("the second KubeletStart Event", TIMEOUT, || async {
        Ok((told(&env, &node, &second).await? == 1).then_some(()))
    })
    .await?;
    assert_eq!(
        told(&env, &node, &first).await?,
        1,
        "published once, not again after the restart"
    );
    assert_eq!(
        told(&env, &node, &other).await?,
        0,
        "another program's message"
    );
    let events = env.events_about(&node, "").await?;
    let event = events
        .iter()
        .find(|e| e.note.as_deref().is_some_and(|n| n.contains(&second)))
        .context("the second Event")?;
    assert_eq!(event.reason.as_deref(), Some("KubeletStart"));
    env.cleanup_after(agent).await
}

/// Kernel messages from the real kernel log (written to /dev/kmsg), read from `source`: an OOM
/// kill is published once, also across an agent restart, and a read-only remount sets a
/// condition that a restarted agent reads back and that clears after `clearAfter`.
async fn kernel_log_across_a_restart(
    env: &TestEnv,
    zone: &str,
    source: &str,
    recorded: KernelLogSource,
) -> anyhow::Result<()> {
    let node = env.node_name(0);
    env.create_nodes(&[NodeSpec::worker(zone)]).await?;
    // Patterns unique to this test, so that no other agent on this machine reacts to them.
    let tag = env.id.replace('-', "");
    let kernel_log = format!(
        "{{{source}, interval: 500ms, timeout: 500ms, patterns: [{{reason: OOMKilling, regex: 'Killed process \\d+ \\(t{tag}\\)'}}, {{reason: FilesystemIsReadOnly, regex: 't{tag}\\): Remounting filesystem read-only', condition: ReadonlyFilesystem, clearAfter: 20s}}]}}"
    );
    let options = || Options {
        interval: "1s",
        heartbeat: "30s",
        kernel_log: &kernel_log,
        ..Options::default()
    };
    let agent = Agent::start_with(&node, env, options())?;
    let nodes: Api<Node> = env.nodes();
    wait_condition(&nodes, &node, "ReadonlyFilesystem", "False").await?;

    // The real kernel log: root may write records to /dev/kmsg.
    std::fs::write(
        "/dev/kmsg",
        format!("<3>EXT4-fs (t{tag}): Remounting filesystem read-only\n"),
    )?;
    std::fs::write(
        "/dev/kmsg",
        format!("<3>Out of memory: Killed process 4242 (t{tag}) total-vm:1kB\n"),
    )?;
    let flagged = wait_condition(&nodes, &node, "ReadonlyFilesystem", "True").await?;
    assert_eq!(
        reason_of(&flagged, "ReadonlyFilesystem").as_deref(),
        Some("FilesystemIsReadOnly")
    );
    let first = format!("Killed process 4242 (t{tag})");
    wait::eventually("the OOMKilling event", TIMEOUT, || async {
        Ok((told(env, &node, &first).await? == 1).then_some(()))
    })
    .await?;
    // Its place in the log reaches the NodeReport before the agent goes.
    let position = reported(env, &node, "the kernel log's position", |s| {
        s.kernel_log.is_some()
    })
    .await?
    .status
    .and_then(|s| s.kernel_log)
    .context("the kernel log's position")?;
    assert_eq!(position.source, recorded, "{position:?}");

    // A restarted agent reads the log from the boot's start: the remount (younger than its
    // clearAfter) still counts, and the OOM kill already published is not published again;
    // a new one is.
    drop(agent);
    let agent = Agent::start_with(&node, env, options())?;
    agent.wait_ready().await?;
    // The restarted agent's own verdict (the Node still carries the first one's): a reader
    // from the current end would never see the remount.
    wait::eventually(
        "the restarted agent to read the remount back",
        TIMEOUT,
        || async {
            let problem = agent
                .metric("nodeward_finding{type=\"ReadonlyFilesystem\"}")
                .await
                .unwrap_or(0.0);
            Ok((problem == 1.0).then_some(()))
        },
    )
    .await?;
    std::fs::write(
        "/dev/kmsg",
        format!("<3>Out of memory: Killed process 4343 (t{tag}) total-vm:1kB\n"),
    )?;
    let second = format!("Killed process 4343 (t{tag})");
    wait::eventually("the new OOMKilling event", TIMEOUT, || async {
        Ok((told(env, &node, &second).await? == 1).then_some(()))
    })
    .await?;
    assert_eq!(
        told(env, &node, &first).await?,
        1,
        "published once, not again after the restart"
    );

    // Nothing new for clearAfter: the condition clears.
    wait_condition(&nodes, &node, "ReadonlyFilesystem", "False").await?;
    drop(agent);
    Ok(())
}
