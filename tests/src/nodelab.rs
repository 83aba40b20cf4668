//! The node lab: real Debian VMs (systemd as PID 1, containerd, a real kubelet) joined to the
//! shared control plane (`tests/nodelab/start.sh`).
//!
//! `./tests/run` starts it once and exports `NODEWARD_TEST_NODELAB` (its state directory);
//! without it, the first test that asks starts one with the shared control plane, which stops
//! when this process exits. Commands run in a VM through the QEMU guest agent (no network
//! needed); each VM has a serial console logged in as root (`STATE/NODE/console.sock`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex as StdMutex, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    net::UnixStream,
    sync::Mutex,
};

use crate::{controlplane, wait};

/// Environment variable naming the state directory of an already running node lab.
pub const STATE_ENV: &str = "NODEWARD_TEST_NODELAB";

/// How close [`Vm::sync_clock`] brings a guest's clock to this machine's, in seconds: well
/// under what any test compares (a drain's 10 s grace, a bench's 100 ms steps).
const CLOCK_TOLERANCE: f64 = 0.05;

/// How long a command in a guest may take unless a test says otherwise. Most end in a second
/// or two, but on a loaded machine an emulated guest's systemd takes its time: a daemon-reload
/// and a kubelet restart once took over 60 s (a CI run, beside the other tests' builds).
const GUEST_COMMAND: Duration = Duration::from_secs(300);

/// The running lab: its VMs by name.
#[derive(Debug)]
pub struct NodeLab {
    pub state_dir: PathBuf,
    pub nodes: Vec<String>,
}

/// The lab shared by every test of this process (started if none runs).
pub fn shared() -> &'static NodeLab {
    static SHARED: OnceLock<Result<NodeLab, String>> = OnceLock::new();
    crate::once_per_process(&SHARED, "the node lab", attach_or_start)
}

fn attach_or_start() -> anyhow::Result<NodeLab> {
    let cp = controlplane::shared();
    let (state_dir, mut child) = match std::env::var(STATE_ENV) {
        Ok(dir) => (PathBuf::from(dir), None),
        Err(_) => {
            let controlplane = cp.state_dir.as_os_str();
            let args = [std::ffi::OsStr::new("--controlplane"), controlplane];
            let (dir, child) = crate::start_script("tests/nodelab/start.sh", "nodelab", &args)?;
            (dir, Some(child))
        }
    };
    // Building the node image and booting under software emulation take minutes.
    let deadline = Instant::now() + Duration::from_secs(25 * 60);
    while !state_dir.join("ready").exists() {
        if let Some(child) = child.as_mut()
            && let Some(status) = child.try_wait()?
        {
            bail!(
                "tests/nodelab/start.sh exited with {status}; its log:\n{}",
                std::fs::read_to_string(state_dir.join("start.log")).unwrap_or_default()
            );
        }
        // A lab started by ./tests/run: start.sh marks that it stopped.
        if state_dir.join("stopping").exists() {
            bail!(
                "the node lab in {} stopped before it was ready; its log:\n{}",
                state_dir.display(),
                std::fs::read_to_string(state_dir.join("start.log")).unwrap_or_default()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the node lab in {} was not ready in time",
                state_dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let env = std::fs::read_to_string(state_dir.join("env"))?;
    let nodes = env
        .lines()
        .find_map(|l| l.strip_prefix("NODEWARD_NODELAB_NODES="))
        .map(|v| {
            v.trim_matches('"')
                .split_whitespace()
                .map(String::from)
                .collect()
        })
        .context("NODEWARD_NODELAB_NODES in the lab's env")?;
    // Keep the lab this process started until it exits (start.sh watches our pid).
    std::mem::forget(child);
    Ok(NodeLab { state_dir, nodes })
}

impl NodeLab {
    pub fn vm(&self, name: &str) -> Vm {
        Vm {
            name: name.to_owned(),
            dir: self.state_dir.join(name),
        }
    }

    pub fn vms(&self) -> Vec<Vm> {
        self.nodes.iter().map(|n| self.vm(n)).collect()
    }
}

/// What a command in a VM did.
#[derive(Clone, Debug)]
pub struct Output {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// One of the lab's VMs.
#[derive(Clone, Debug)]
pub struct Vm {
    pub name: String,
    pub dir: PathBuf,
}

/// The guest agent's socket takes one client at a time: one call per VM at a time in this
/// process. Each call connects anew: a connection belongs to the Tokio runtime it was made
/// in, and every test has its own.
type AgentTurn = Arc<Mutex<()>>;

fn agent_lock(dir: &Path) -> AgentTurn {
    static LOCKS: OnceLock<StdMutex<HashMap<PathBuf, AgentTurn>>> = OnceLock::new();
    let locks = LOCKS.get_or_init(Default::default);
    let mut locks = locks.lock().unwrap_or_else(|p| p.into_inner());
    locks.entry(dir.to_owned()).or_default().clone()
}

/// A connection to the QEMU guest agent (JSON lines over the VM's virtio-serial port).
struct GuestAgent {
    lines: tokio::io::Lines<BufReader<tokio::net::unix::OwnedReadHalf>>,
    writer: tokio::net::unix::OwnedWriteHalf,
}

impl GuestAgent {
    /// Connects and synchronises: the agent may be starting, or answering a request a
    /// timed-out caller abandoned.
    async fn connect(socket: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let stream = UnixStream::connect(socket)
            .await
            .with_context(|| format!("connecting to {}", socket.display()))?;
        let (read, writer) = stream.into_split();
        let mut agent = Self {
            lines: BufReader::new(read).lines(),
            writer,
        };
        let id: u32 = rand_id();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            agent
                .send(&json!({"execute": "guest-sync", "arguments": {"id": id}}))
                .await?;
            let attempt = tokio::time::Instant::now() + Duration::from_secs(3);
            while let Ok(Ok(Some(line))) =
                tokio::time::timeout_at(attempt, agent.lines.next_line()).await
            {
                if serde_json::from_str::<Value>(&line).is_ok_and(|v| v["return"] == json!(id)) {
                    return Ok(agent);
                }
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the guest agent at {} does not answer", socket.display());
            }
        }
    }

    /// How far the guest's clock is from this machine's, in seconds: its time against the
    /// middle of the call's round trip, from the shortest of three calls (as NTP does: a long
    /// trip on a loaded emulated guest leaves its middle uncertain by half of it).
    async fn clock_offset(&mut self) -> anyhow::Result<f64> {
        let mut best: Option<(i64, i64)> = None;
        for _ in 0..3 {
            let sent = unix_nanos()?;
            let guest = self
                .call(
                    json!({"execute": "guest-get-time"}),
                    Duration::from_secs(10),
                )
                .await?
                .as_i64()
                .context("guest-get-time's answer")?;
            let back = unix_nanos()?;
            let sample = (back - sent, guest - sent / 2 - back / 2);
            if best.is_none_or(|(trip, _)| sample.0 < trip) {
                best = Some(sample);
            }
        }
        let (_, offset) = best.context("no clock sample")?;
        Ok(offset as f64 / 1e9)
    }

    async fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.writer.write_all(&line).await?;
        Ok(())
    }

    async fn call(&mut self, message: Value, timeout: Duration) -> anyhow::Result<Value> {
        self.send(&message).await?;
        let line = tokio::time::timeout(timeout, self.lines.next_line())
            .await
            .map_err(|_| anyhow!("the guest agent did not answer {}", message["execute"]))??
            .context("the guest agent closed the connection")?;
        let reply: Value = serde_json::from_str(&line)?;
        if let Some(error) = reply.get("error") {
            bail!("guest agent {}: {error}", message["execute"]);
        }
        Ok(reply["return"].clone())
    }
}

/// Nanoseconds since the Unix epoch on this machine's clock.
fn unix_nanos() -> anyhow::Result<i64> {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(i64::try_from(since.as_nanos())?)
}

fn rand_id() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(7);
    nanos ^ std::process::id()
}

impl Vm {
    fn socket(&self) -> PathBuf {
        self.dir.join("qga.sock")
    }

    /// Runs `script` with `/bin/sh -c` as root in the VM; waits up to `timeout` for it to end
    /// (and up to `timeout` for the guest agent to answer, e.g. while the VM boots).
    pub async fn exec_with(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        let lock = agent_lock(&self.dir);
        let _turn = lock.lock().await;
        let result = async {
            // A busy guest's agent now and then answers guest-exec without a pid (seen under
            // software emulation with one vCPU): a fresh connection and a second try do.
            let mut attempt = 0;
            let (mut agent, pid) = loop {
                attempt += 1;
                let mut agent = GuestAgent::connect(&self.socket(), timeout).await?;
                let started = agent
                    .call(
                        json!({"execute": "guest-exec", "arguments": {
                            "path": "/bin/sh", "arg": ["-c", script], "capture-output": true}}),
                        Duration::from_secs(30),
                    )
                    .await?;
                match started["pid"].as_i64() {
                    Some(pid) => break (agent, pid),
                    None if attempt < 3 => tokio::time::sleep(Duration::from_secs(1)).await,
                    None => anyhow::bail!("guest-exec returned no pid: {started}"),
                }
            };
            let deadline = tokio::time::Instant::now() + timeout;
            // Each poll is work for the guest agent: from 0.2 s apart to 1 s for a long run.
            let mut pause = Duration::from_millis(200);
            loop {
                let status_call = json!({"execute": "guest-exec-status", "arguments": {"pid": pid}});
                let poll = tokio::time::timeout(
                    Duration::from_secs(30),
                    agent.call(status_call, Duration::MAX),
                )
                .await;
                // A guest agent that misses one poll (seen on a loaded host) has not lost the
                // command: a fresh, synchronised connection drops the late reply, and the
                // polls go on until the command's own bound. An answer that is an error, or a
                // closed connection, still ends the wait at once.
                let status = match poll {
                    Ok(answer) => answer?,
                    Err(_) if tokio::time::Instant::now() < deadline => {
                        eprintln!(
                            "{}: the guest agent did not answer guest-exec-status within 30 s; polling pid {pid} again",
                            self.name
                        );
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        agent = GuestAgent::connect(&self.socket(), left).await?;
                        continue;
                    }
                    Err(_) => bail!("the guest agent did not answer guest-exec-status for pid {pid}"),
                };
                if status["exited"] == true {
                    let text = |field: &str| {
                        status[field]
                            .as_str()
                            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                            .unwrap_or_default()
                    };
                    return Ok(Output {
                        code: status["exitcode"].as_i64().unwrap_or(-1),
                        stdout: text("out-data"),
                        stderr: text("err-data"),
                    });
                }
                if tokio::time::Instant::now() > deadline {
                    bail!("{script:?} did not end within {timeout:?}");
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 3 / 2).min(Duration::from_secs(1));
            }
        }
        .await;
        result.with_context(|| format!("running {script:?} in {}", self.name))
    }

    /// Sets the VM's clock to this machine's (to within a millisecond or so); returns how
    /// far off it was, in seconds (negative: behind). A VM's clock starts from the emulated
    /// RTC, which keeps whole seconds, and no time server is in reach, so a guest runs up to
    /// a second off the API server's clock: everything that compares the node's clock with
    /// the API server's (a drain lets a pod go 10 s past its deletionTimestamp) or times a
    /// guest from this machine would inherit it. Real nodes keep time with NTP.
    pub async fn sync_clock(&self) -> anyhow::Result<f64> {
        self.set_clock_off(0.0).await
    }

    /// Sets the VM's clock `offset` seconds off this machine's (negative: behind), as a node
    /// whose time nobody keeps may be; returns how far off it was. The next test's turn syncs
    /// it again ([`Self::sync_clock`]).
    pub async fn set_clock_off(&self, offset: f64) -> anyhow::Result<f64> {
        let lock = agent_lock(&self.dir);
        let _turn = lock.lock().await;
        let result = async {
            let mut agent = GuestAgent::connect(&self.socket(), Duration::from_secs(30)).await?;
            let before = agent.clock_offset().await?;
            // The guest sets what it was sent when it gets to it, so it ends up behind by the
            // time the message took (tens of ms on a loaded emulated guest): each try adds what
            // the one before fell short by.
            let mut lead = offset;
            let mut last = (before, Ok(Value::Null));
            for _ in 0..4 {
                let time = unix_nanos()? + (lead * 1e9) as i64;
                let set = json!({"execute": "guest-set-time", "arguments": {"time": time}});
                // The guest agent sets the clock, then runs hwclock, which the image lacks
                // (the RTC's whole seconds would not keep the rest): the call's error is
                // expected, and the clock read back decides.
                let answer = agent.call(set, Duration::from_secs(10)).await;
                let after = agent.clock_offset().await?;
                if (after - offset).abs() < CLOCK_TOLERANCE {
                    return Ok(before);
                }
                lead -= after - offset;
                last = (after, answer);
            }
            let (after, answer) = last;
            anyhow::bail!(
                "the clock is still {after:.3} s off after setting it 4 times (the guest agent: {answer:?})"
            );
        }
        .await;
        result.with_context(|| format!("setting the clock of {}", self.name))
    }

    /// Runs `script` ([`GUEST_COMMAND`] at most).
    pub async fn exec(&self, script: &str) -> anyhow::Result<Output> {
        self.exec_with(script, GUEST_COMMAND).await
    }

    /// Runs `script`, which must succeed ([`GUEST_COMMAND`] at most); its standard output.
    pub async fn run(&self, script: &str) -> anyhow::Result<String> {
        self.run_within(script, GUEST_COMMAND).await
    }

    /// As [`Self::run`], within `timeout`: for what systemd does at its own pace on a loaded
    /// emulated guest (a daemon-reload, a unit started).
    pub async fn run_within(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        let output = self.exec_with(script, timeout).await?;
        anyhow::ensure!(
            output.code == 0,
            "{script:?} in {} exited {}: {}{}",
            self.name,
            output.code,
            output.stdout,
            output.stderr
        );
        Ok(output.stdout)
    }

    /// The kernel's boot id.
    pub async fn boot_id(&self) -> anyhow::Result<String> {
        Ok(self
            .run("cat /proc/sys/kernel/random/boot_id")
            .await?
            .trim()
            .to_owned())
    }

    /// Runs `script` once the VM answers (it may be booting): retried until `timeout`. Each
    /// try may take the rest of that time: a try cut short would leave the script running in
    /// the guest while the next starts it again (a loaded guest's kubelet restart took over
    /// a minute), each adding to the load that made it slow.
    pub async fn run_when_up(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match self
                .exec_with(script, left.max(Duration::from_secs(30)))
                .await
            {
                Ok(output) if output.code == 0 => return Ok(output.stdout),
                Ok(output) => bail!(
                    "{script:?} in {} exited {}: {}{}",
                    self.name,
                    output.code,
                    output.stdout,
                    output.stderr
                ),
                Err(e) if tokio::time::Instant::now() > deadline => {
                    return Err(e.context(format!(
                        "{} did not answer within {timeout:?}; its console:\n{}",
                        self.name,
                        self.console_tail(40)
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
            }
        }
    }

    /// Waits until the VM runs with a boot id other than `previous`; the new one.
    pub async fn wait_rebooted(&self, previous: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Ok(id) = self
                .exec_with(
                    "cat /proc/sys/kernel/random/boot_id",
                    Duration::from_secs(10),
                )
                .await
                .map(|o| o.stdout.trim().to_owned())
                && !id.is_empty()
                && id != previous
            {
                return Ok(id);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "{} did not come back with a new boot id within {timeout:?}; its console:\n{}",
                    self.name,
                    self.console_tail(40)
                );
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    /// Powers a VM that powered itself off on again.
    pub fn power_on(&self) -> anyhow::Result<()> {
        std::fs::write(self.dir.join("power-on"), b"")?;
        Ok(())
    }

    /// The times (seconds since the epoch) the VM was started and powered off, in order.
    pub fn power_log(&self) -> Vec<(u64, String)> {
        std::fs::read_to_string(self.dir.join("power.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (time, what) = l.split_once(' ')?;
                Some((time.parse().ok()?, what.to_owned()))
            })
            .collect()
    }

    /// Waits until the VM's Node is Ready.
    pub async fn wait_node_ready(
        &self,
        client: &kube::Client,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        wait::until(&nodes, &self.name, "the node to be Ready", timeout, |n| {
            wait::node_condition(n, "Ready").is_some_and(|(status, _)| status == "True")
        })
        .await
        .with_context(|| format!("{}'s console:\n{}", self.name, self.console_tail(30)))?;
        Ok(())
    }

    /// The last `lines` lines of the serial console.
    pub fn console_tail(&self, lines: usize) -> String {
        let text = std::fs::read(self.dir.join("console.log")).unwrap_or_default();
        let text = String::from_utf8_lossy(&text);
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The journal of `units` since this boot, for failure messages.
    pub async fn journal(&self, units: &[&str], lines: usize) -> String {
        let selectors: String = units.iter().map(|u| format!(" -u {u}")).collect();
        match self
            .exec(&format!(
                "journalctl -b --no-pager -o short-precise{selectors} | tail -n {lines}"
            ))
            .await
        {
            Ok(output) => output.stdout,
            Err(e) => format!("(no journal: {e:#})"),
        }
    }

    /// Writes `contents` to `path` in the VM, through the guest agent's file calls.
    pub async fn write_file(&self, path: &str, contents: &[u8]) -> anyhow::Result<()> {
        let lock = agent_lock(&self.dir);
        let _turn = lock.lock().await;
        let result = async {
            let mut agent = GuestAgent::connect(&self.socket(), Duration::from_secs(60)).await?;
            let call = Duration::from_secs(30);
            let handle = agent
                .call(
                    json!({"execute": "guest-file-open", "arguments": {"path": path, "mode": "w"}}),
                    call,
                )
                .await?;
            for chunk in contents.chunks(48 * 1024) {
                let encoded = base64::engine::general_purpose::STANDARD.encode(chunk);
                agent
                    .call(
                        json!({"execute": "guest-file-write", "arguments": {"handle": handle, "buf-b64": encoded}}),
                        call,
                    )
                    .await?;
            }
            agent
                .call(
                    json!({"execute": "guest-file-close", "arguments": {"handle": handle}}),
                    call,
                )
                .await?;
            anyhow::Ok(())
        }
        .await;
        result.with_context(|| format!("writing {path} in {}", self.name))
    }

    /// The VM's address on the lab network.
    pub fn lab_ip(&self) -> anyhow::Result<String> {
        let env = std::fs::read_to_string(self.dir.join("config/node.env"))?;
        env.lines()
            .find_map(|l| l.strip_prefix("LAB_IP="))
            .map(String::from)
            .context("LAB_IP in node.env")
    }
}
