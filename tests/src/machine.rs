//! A simulated machine behind a kwok node: the real agent process with its own real
//! systemd-logind (private bus, private mount namespace) and a boot id. The agent reboots
//! through logind; when logind asks the systemd stand-in for `reboot.target`, the harness
//! carries the reboot out ([`Machine::reboot`]): everything on the machine stops and starts
//! again with a new boot id and without the reboot-required sentinel.

use std::{path::PathBuf, time::Instant};

use crate::{TestEnv, controlplane, daemon::Daemon, logind::Logind};

/// The agent configuration every machine starts from: only the reboot-required detector (its
/// sentinel in the machine's directory), the shutdown guard on.
fn base_config(sentinel: &std::path::Path) -> String {
    crate::scratch::agent_config(
        &[&format!(
            "rebootRequired: {{interval: 500ms, timeout: 500ms, sentinelFile: {}}}",
            sentinel.display()
        )],
        "shutdownGuard: {enabled: true, budget: 8s, safetyMargin: 1s}\n",
    )
}

pub struct Machine {
    pub name: String,
    pub index: usize,
    pub dir: PathBuf,
    pub logind: Logind,
    /// The test's namespace: the agent's Lease and what the coordinator publishes are there.
    namespace: String,
    agent_binary: String,
    agent: Option<Daemon>,
    /// Boots so far (the first start is boot 1).
    pub boots: usize,
    /// When the harness carried out each reboot.
    pub rebooted_at: Vec<Instant>,
    /// When the current boot began.
    booted_at: jiff::Timestamp,
    /// How long [`reboot_until_succeeded`] keeps the machine down (none by default).
    pub reboot_takes: std::time::Duration,
    /// Down for its reboot until then.
    down_until: Option<Instant>,
}

impl Machine {
    /// A machine for node `index` of `env` running `agent_binary`, with `extra_config` (YAML
    /// lines) after the base configuration; `reboot_required` creates its reboot sentinel.
    pub async fn start(
        env: &TestEnv,
        agent_binary: &str,
        index: usize,
        extra_config: &str,
        reboot_required: bool,
    ) -> anyhow::Result<Self> {
        let name = env.node_name(index);
        let dir = crate::scratch::dir(&format!("nodeward-machine-{}-{index}", env.id))?;
        let sentinel = dir.join("reboot-required");
        if reboot_required {
            crate::scratch::write(&dir, "reboot-required", "")?;
        }
        crate::scratch::write(
            &dir,
            "agent.yaml",
            format!("{}{extra_config}", base_config(&sentinel)),
        )?;
        let logind = Logind::start(&format!("{}-{index}", env.id), 10).await?;
        let mut machine = Self {
            name,
            index,
            dir,
            logind,
            namespace: env.namespace.clone(),
            agent_binary: agent_binary.to_owned(),
            agent: None,
            boots: 0,
            rebooted_at: Vec::new(),
            booted_at: jiff::Timestamp::now(),
            reboot_takes: std::time::Duration::ZERO,
            down_until: None,
        };
        machine.boot()?;
        Ok(machine)
    }

    /// Writes a new boot id and starts the agent.
    fn boot(&mut self) -> anyhow::Result<()> {
        self.boots += 1;
        let boot_id = format!(
            "{:04x}{:04x}-0000-4000-8000-{:012x}",
            self.index,
            self.boots,
            std::process::id()
        );
        std::fs::write(self.dir.join("boot_id"), format!("{boot_id}\n"))?;
        self.booted_at = jiff::Timestamp::now();
        self.start_agent()
    }

    /// Starts the agent in the current boot (again, after [`Machine::kill_agent`]).
    pub fn start_agent(&mut self) -> anyhow::Result<()> {
        let mut args = crate::daemon::agent_args(
            &self.name,
            &self.namespace,
            &controlplane::shared().kubeconfig,
            &self.dir.join("agent.yaml"),
        );
        args.extend([
            "--boot-id-file".into(),
            self.dir.join("boot_id").display().to_string(),
        ]);
        self.agent = Some(Daemon::start_with_env(
            &self.agent_binary,
            &format!("{}-boot{}", self.name, self.boots),
            &args,
            &[("DBUS_SYSTEM_BUS_ADDRESS", &self.logind.bus.address)],
        )?);
        Ok(())
    }

    /// The agent dies (SIGKILL); the machine stays up.
    pub fn kill_agent(&mut self) {
        self.agent = None; // dropping a Daemon kills it
    }

    pub fn agent_running(&self) -> bool {
        self.agent.is_some()
    }

    /// Whether logind asked for `reboot.target` in this boot.
    pub fn reboot_requested(&self) -> bool {
        self.logind.started("reboot.target")
    }

    /// The machine goes down for its reboot: agent, logind and bus stop.
    pub async fn go_down(&mut self) -> anyhow::Result<()> {
        self.rebooted_at.push(Instant::now());
        self.agent = None;
        self.logind
            .systemd
            .started
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self.logind.restart_bus().await?;
        Ok(())
    }

    /// Everything on the machine stops; it comes back with a new boot id and without the
    /// reboot-required sentinel (it lived in /run).
    pub async fn reboot(&mut self) -> anyhow::Result<()> {
        self.go_down().await?;
        self.come_up()
    }

    /// Back from a reboot: the sentinel gone, a new boot id, the agent started.
    pub fn come_up(&mut self) -> anyhow::Result<()> {
        match std::fs::remove_file(self.dir.join("reboot-required")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
            _ => {}
        }
        self.boot()
    }

    /// A reboot is needed again (a new package was installed).
    pub fn require_reboot(&self) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("reboot-required"), "")?;
        Ok(())
    }

    /// Whether the machine needs a reboot (its sentinel is there).
    pub fn reboot_pending(&self) -> bool {
        self.dir.join("reboot-required").exists()
    }

    /// When the current boot began, to the second (as the API server's timestamps are).
    pub fn booted_at(&self) -> jiff::Timestamp {
        jiff::Timestamp::from_second(self.booted_at.as_second()).unwrap_or(self.booted_at)
    }

    /// What the agent printed in this boot.
    pub fn output(&self) -> String {
        self.agent.as_ref().map(Daemon::output).unwrap_or_default()
    }
}

/// Carries out every reboot logind asks `machines` for (each down for its `reboot_takes`)
/// until each NodeMaintenance in `names` has Succeeded; fails with the machines' output after
/// `limit`.
pub async fn reboot_until_succeeded(
    machines: &mut [Machine],
    client: &kube::Client,
    names: &[String],
    limit: std::time::Duration,
) -> anyhow::Result<()> {
    let maintenances: kube::Api<nodeward_api::NodeMaintenance> = kube::Api::all(client.clone());
    let deadline = Instant::now() + limit;
    loop {
        for m in machines.iter_mut() {
            if m.reboot_requested() {
                m.go_down().await?;
                m.down_until = Some(Instant::now() + m.reboot_takes);
            }
            if m.down_until.is_some_and(|until| Instant::now() >= until) {
                m.down_until = None;
                m.come_up()?;
            }
        }
        let mut done = 0;
        for name in names {
            if maintenances.get(name).await?.phase() == nodeward_api::MaintenancePhase::Succeeded {
                done += 1;
            }
        }
        if done == names.len() {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the maintenances did not all succeed within {limit:?}:\n{}",
            machines
                .iter()
                .map(Machine::output)
                .collect::<Vec<_>>()
                .join("\n")
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Asks for a Manual Reboot of each of the first `count` nodes of `env` (`<node>-reboot`), all
/// at once; their names.
pub async fn reboot_each(env: &TestEnv, count: usize) -> anyhow::Result<Vec<String>> {
    let mut names = Vec::new();
    for index in 0..count {
        let node = env.node_name(index);
        let name = format!("{node}-reboot");
        env.create_maintenance(&name, &node, "Manual", "Reboot")
            .await?;
        names.push(name);
    }
    Ok(names)
}
