use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Args, Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector;
use nodeward_agent::{
    Error, check,
    config::{Config, Overrides},
    detect::{
        AgentContext,
        cluster::ClusterContext,
        peers::{self, Directory, PeerContext},
    },
    liveness::Liveness,
    logs,
    maintenance::reboot_method::RebootMethod,
    metrics::Metrics,
    policies::Follow,
    report::{Identity, Reporter},
    runner,
    server::{self, Readiness},
    shutdown::{self, guard::Guard},
};
use nodeward_api::report::{AgentMode, PauseAcknowledgement};
use nodeward_runtime::{
    args::{ClientArgs, LogArgs},
    events::Events,
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinSet,
};

/// nodeward's node agent.
#[derive(Parser)]
#[command(name = "nodeward-agent", version = nodeward_runtime::VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run every local detector once on this machine (no cluster needed), print the findings
    /// and exit 1 if a problem was found, 2 if the configuration is invalid.
    Check {
        #[command(flatten)]
        settings: Settings,
        /// Output format.
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Run the detectors continuously and report to the cluster: Node conditions and the
    /// node's NodeReport. Stops cleanly on SIGTERM or SIGINT.
    Run {
        #[command(flatten)]
        settings: Settings,
        /// The name of this node's Node object.
        #[arg(long, env = "NODE_NAME")]
        node_name: String,
        #[command(flatten)]
        client: ClientArgs,
        #[command(flatten)]
        log: LogArgs,
        /// Address for /healthz, /readyz and /metrics.
        #[arg(long, env = "NODEWARD_LISTEN", default_value = "0.0.0.0:9470")]
        listen: SocketAddr,
        /// nodeward's namespace: the agent's Lease, and where the coordinator publishes the
        /// peer directory and the policies for the agents.
        #[arg(long, env = "POD_NAMESPACE", default_value = "nodeward-system")]
        namespace: String,
        /// Ask for a Reboot maintenance when the node needs a reboot, whatever the policies
        /// say (a policy's autoReboot turns it on for the nodes it selects).
        #[arg(long, env = "NODEWARD_AUTO_REBOOT")]
        auto_reboot: bool,
        /// The kernel's boot id (a new one means the node rebooted); the DaemonSet mounts the
        /// host's file.
        #[arg(
            long,
            env = "NODEWARD_BOOT_ID_FILE",
            default_value = "/proc/sys/kernel/random/boot_id"
        )]
        boot_id_file: PathBuf,
    },
}

/// The configuration file and the settings that override it (flags, or their environment
/// variables).
#[derive(Args)]
struct Settings {
    /// Configuration file (default: /etc/nodeward/agent.yaml when it exists).
    #[arg(long, env = "NODEWARD_CONFIG")]
    config: Option<PathBuf>,
    /// A reboot is required while this file exists (detectors.rebootRequired.sentinelFile).
    #[arg(long, env = "NODEWARD_REBOOT_SENTINEL")]
    reboot_sentinel: Option<PathBuf>,
    /// A reboot is required while this command exits 0; words split on spaces
    /// (detectors.rebootRequired.sentinelCommand).
    #[arg(long, env = "NODEWARD_REBOOT_SENTINEL_COMMAND")]
    reboot_sentinel_command: Option<String>,
    /// How often the NodeReport heartbeat is written, e.g. 60s (reporting.heartbeatInterval).
    #[arg(long, env = "NODEWARD_HEARTBEAT_INTERVAL")]
    heartbeat_interval: Option<String>,
    /// Instance metadata service base URL (detectors.securityGroups.metadataURL).
    #[arg(long, env = "NODEWARD_METADATA_URL")]
    metadata_url: Option<String>,
    /// Security groups the node must be in, comma-separated (detectors.securityGroups.expected).
    #[arg(long, env = "NODEWARD_EXPECTED_SECURITY_GROUPS", value_delimiter = ',')]
    expected_security_groups: Option<Vec<String>>,
    /// Port for peer probes over TCP and UDP (detectors.peers.port).
    #[arg(long, env = "NODEWARD_PEER_PORT")]
    peer_port: Option<u16>,
    /// How long a Node may be missing before KubeletUnregistered (detectors.kubelet.registrationTimeout).
    #[arg(long, env = "NODEWARD_REGISTRATION_TIMEOUT")]
    registration_timeout: Option<String>,
    /// The kubelet's health endpoint (detectors.kubelet.healthzURL).
    #[arg(long, env = "NODEWARD_KUBELET_HEALTHZ_URL")]
    kubelet_healthz_url: Option<String>,
    /// Hold a logind delay lock and drain before shutdown (shutdownGuard.enabled).
    #[arg(long, env = "NODEWARD_SHUTDOWN_GUARD", action = clap::ArgAction::Set)]
    shutdown_guard: Option<bool>,
    /// How long the drain before a shutdown may take, e.g. 120s (shutdownGuard.budget).
    #[arg(long, env = "NODEWARD_SHUTDOWN_BUDGET")]
    shutdown_budget: Option<String>,
    /// Write the logind.conf.d drop-in raising InhibitDelayMaxSec into this directory
    /// (shutdownGuard.writeDropIn and dropInDir).
    #[arg(long, env = "NODEWARD_LOGIND_DROP_IN_DIR")]
    logind_drop_in_dir: Option<PathBuf>,
    /// POST a JSON notification here on drain start, reboot and completion
    /// (notifications.url).
    #[arg(long, env = "NODEWARD_NOTIFY_URL")]
    notify_url: Option<String>,
    /// How a drained node reboots: logind, command or signal (reboot.method).
    #[arg(long, env = "NODEWARD_REBOOT_METHOD", value_enum)]
    reboot_method: Option<RebootMethod>,
    /// The host command of --reboot-method command, words split on spaces (reboot.command).
    #[arg(long, env = "NODEWARD_REBOOT_COMMAND")]
    reboot_command: Option<String>,
    /// The signal sent to the host's PID 1 by --reboot-method signal (reboot.signal).
    #[arg(long, env = "NODEWARD_REBOOT_SIGNAL")]
    reboot_signal: Option<i32>,
    /// node-problem-detector monitor files (kmsg, journald and custom plugin monitors) to load as they
    /// are; repeat the flag or separate with commas (npd.configs).
    #[arg(
        long = "npd-config",
        env = "NODEWARD_NPD_CONFIG",
        value_delimiter = ','
    )]
    npd_configs: Option<Vec<PathBuf>>,
}

impl Settings {
    /// The configuration file with the flags and environment applied; the error names the
    /// file or the flag and says how to fix it.
    fn load(&self) -> Result<Config, String> {
        let config = Config::load(self.config.as_deref()).map_err(|e| e.to_string())?;
        let overrides = Overrides {
            reboot_sentinel: self.reboot_sentinel.clone(),
            reboot_sentinel_command: self
                .reboot_sentinel_command
                .as_ref()
                .map(|c| c.split_whitespace().map(String::from).collect()),
            heartbeat_interval: self.heartbeat_interval.clone(),
            metadata_url: self.metadata_url.clone(),
            expected_security_groups: self.expected_security_groups.clone(),
            peer_port: self.peer_port,
            registration_timeout: self.registration_timeout.clone(),
            kubelet_healthz_url: self.kubelet_healthz_url.clone(),
            shutdown_guard: self.shutdown_guard,
            shutdown_budget: self.shutdown_budget.clone(),
            logind_drop_in_dir: self.logind_drop_in_dir.clone(),
            notify_url: self.notify_url.clone(),
            reboot_method: self.reboot_method,
            reboot_command: self
                .reboot_command
                .as_ref()
                .map(|c| c.split_whitespace().map(String::from).collect()),
            reboot_signal: self.reboot_signal,
            npd_configs: self.npd_configs.clone(),
        };
        config.with_overrides(&overrides)?.with_npd()
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = &cli.command;
    let (Command::Check { settings, .. } | Command::Run { settings, .. }) = command;
    let config = match settings.load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nodeward-agent: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread: the agent mostly waits; each extra worker costs its stack and a malloc arena.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nodeward-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match command {
        Command::Check { output, .. } => {
            let findings = runtime.block_on(check::run(&config));
            match output {
                Output::Table => print!("{}", check::render_table(&findings)),
                Output::Json => println!("{}", check::render_json(&findings)),
            }
            ExitCode::from(check::exit_code(&findings))
        }
        Command::Run {
            node_name,
            client,
            log,
            listen,
            namespace,
            auto_reboot,
            boot_id_file,
            ..
        } => {
            log.init();
            let boot_id = match std::fs::read_to_string(boot_id_file) {
                Ok(id) => Some(id.trim().to_owned()),
                Err(e) => {
                    tracing::warn!(file = %boot_id_file.display(), error = %e, "cannot read the boot id; reboots are not recognised (set --boot-id-file)");
                    None
                }
            };
            let agent = Running {
                node_name: node_name.clone(),
                namespace: namespace.clone(),
                listen: *listen,
                auto_reboot: *auto_reboot,
                boot_id,
            };
            match runtime.block_on(run(config, client, agent)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "nodeward-agent stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Who and where the running agent is.
struct Running {
    node_name: String,
    namespace: String,
    listen: SocketAddr,
    auto_reboot: bool,
    boot_id: Option<String>,
}

async fn run(config: Config, client_args: &ClientArgs, running: Running) -> Result<(), Error> {
    let node_name = running.node_name.clone();
    let mode = if client_args.kubeconfig.is_some() {
        AgentMode::Host
    } else {
        AgentMode::DaemonSet
    };
    let metrics = Arc::new(Metrics::new());
    let client = connect(client_args, &metrics).await?;
    let identity = Identity {
        node_name: node_name.clone(),
        mode,
        boot_id: running.boot_id.clone(),
    };
    let readiness = Arc::new(Readiness::new(&[nodeward_agent::report::FIRST_REPORT]));
    let mut tasks = JoinSet::new();
    server::spawn(
        running.listen,
        metrics.encoder(),
        readiness.clone(),
        &mut tasks,
    )
    .await?;
    if nodeward_agent::reaper::receives_orphans() {
        // PID 1 of its container: what checks leave behind is re-parented to the agent.
        tasks.spawn(nodeward_agent::reaper::reap(
            std::time::Duration::from_secs(10),
        ));
    }
    if config.host_stats.enabled {
        tasks.spawn(nodeward_agent::host_stats::run(
            config.host_stats.clone(),
            metrics.clone(),
        ));
    }
    let (own_node, own_node_writer) = reflector::store();
    let cluster = ClusterContext {
        client: client.clone(),
        node_name: node_name.clone(),
        started: std::time::Instant::now(),
        own_node,
    };
    tasks.spawn(
        Liveness {
            client: client.clone(),
            namespace: running.namespace.clone(),
            node: node_name.clone(),
            every: config.reporting.heartbeat_interval,
            metrics: metrics.clone(),
        }
        .run(),
    );
    let peers = peer_context(&config, &client, &running, &metrics, &mut tasks).await?;
    let (log_events_tx, log_events) = mpsc::channel(64);
    let this_node = logs::Node {
        name: &node_name,
        boot_id: running.boot_id.as_deref(),
    };
    let logs = logs::start(&config, &client, &this_node, &log_events_tx).await;
    let agent = AgentContext {
        cluster,
        peers,
        kernel_log: logs.kernel,
        journal_logs: logs.journal,
    };
    let detectors = config.detectors.enabled(Some(&agent));
    let snapshots = runner::start(detectors, metrics.clone(), &mut tasks);
    let sightings = agent.peers.as_ref().map(|p| p.sightings.clone());
    let reporter = Reporter::new(client.clone(), identity, metrics, readiness)
        .with_recheck(config.reporting.heartbeat_interval)
        .with_sightings(sightings)
        .with_published(logs.source, logs.published)
        .with_events_only(
            config
                .detectors
                .custom
                .iter()
                .filter(|c| c.events_only)
                .map(|c| c.condition.clone())
                .collect(),
        );
    let pauses = maintain(
        &config,
        &client,
        &running,
        &snapshots,
        own_node_writer,
        &mut tasks,
    );
    tasks.spawn(reporter.run(snapshots, log_events, pauses));
    tracing::info!(node = %node_name, ?mode, "nodeward-agent running");
    let signal = nodeward_runtime::stop_signal().await?;
    tracing::info!("{signal}: stopping");
    tasks.abort_all();
    Ok(())
}

/// A client whose every request is counted in the agent's metrics.
async fn connect(client_args: &ClientArgs, metrics: &Arc<Metrics>) -> Result<kube::Client, Error> {
    let user_agent = concat!("nodeward-agent/", env!("CARGO_PKG_VERSION"));
    nodeward_runtime::client::connect_counting(
        client_args.kubeconfig.as_deref(),
        user_agent,
        Some(metrics.api_cost()),
    )
    .await
    .map_err(Into::into)
}

/// The peer detector's context: the directory of the others followed and the probe responder
/// started (in `tasks`).
async fn peer_context(
    config: &Config,
    client: &kube::Client,
    running: &Running,
    metrics: &Arc<Metrics>,
    tasks: &mut JoinSet<()>,
) -> Result<Option<PeerContext>, Error> {
    if !config.detectors.peers.enabled {
        return Ok(None);
    }
    let directory = Directory::default();
    tasks.spawn(
        directory
            .clone()
            .follow(client.clone(), running.namespace.clone()),
    );
    let p = &config.detectors.peers;
    tasks.spawn(peers::respond(p.listen_address, p.port).await?);
    Ok(Some(PeerContext {
        directory,
        node_name: running.node_name.clone(),
        metrics: metrics.clone(),
        sightings: peers::Sightings::default(),
    }))
}

/// Starts what carries out this node's maintenances and guards its shutdowns: the shutdown
/// guard (when enabled), the maintenance executor, the policy follower and the reboot
/// requester (in `tasks`). Returns the pauses this node obeys, for its reports.
fn maintain(
    config: &Config,
    client: &kube::Client,
    running: &Running,
    snapshots: &watch::Receiver<runner::Snapshot>,
    own_node: reflector::store::Writer<Node>,
    tasks: &mut JoinSet<()>,
) -> watch::Receiver<Vec<PauseAcknowledgement>> {
    let node_name = running.node_name.as_str();
    let boot_id = running.boot_id.as_deref().unwrap_or_default();
    let auto_reboot_flag = running.auto_reboot;
    let (maintenances, watching) =
        nodeward_agent::maintenance::watch::start(client.clone(), node_name);
    tasks.spawn(watching);
    // The agent's own pod (in a DaemonSet), which its drains leave for last.
    let own_pod = std::env::var("POD_NAMESPACE")
        .ok()
        .zip(std::env::var("POD_NAME").ok());
    let events = Events::new(
        client.clone(),
        nodeward_api::labels::AGENT_FIELD_MANAGER,
        node_name.to_owned(),
    );
    if config.shutdown_guard.enabled {
        let shutdown_guard = Guard {
            client: client.clone(),
            node: node_name.to_owned(),
            boot_id: boot_id.to_owned(),
            settings: shutdown::Settings::new(&config.shutdown_guard, own_pod.clone()),
            events: events.clone(),
            maintenances: maintenances.clone(),
            own_node: own_node.as_reader(),
        };
        tasks.spawn(shutdown_guard.run());
    }
    let (policies, policy_writer) = reflector::store();
    let (notifier, delivery) = nodeward_agent::notify::Notifier::new(&config.notifications);
    if let Some(delivery) = delivery {
        tasks.spawn(delivery);
    }
    tasks.spawn(
        nodeward_agent::maintenance::executor::Executor {
            client: client.clone(),
            node: node_name.to_owned(),
            boot_id: boot_id.to_owned(),
            own_pod,
            notifier,
            events,
            policies,
            reboot: config.reboot.clone(),
            written: Default::default(),
        }
        .run(maintenances),
    );
    let (pauses_tx, pauses) = watch::channel(Vec::new());
    let (auto_reboot_tx, auto_reboot) = watch::channel(auto_reboot_flag);
    tasks.spawn(nodeward_agent::policies::follow(Follow {
        client: client.clone(),
        namespace: running.namespace.clone(),
        node_name: node_name.to_owned(),
        policies: policy_writer,
        node: own_node,
        pauses: pauses_tx,
        auto_reboots: auto_reboot_tx,
        forced_auto_reboot: auto_reboot_flag,
    }));
    tasks.spawn(nodeward_agent::maintenance::reboot_request::run(
        client.clone(),
        node_name.to_owned(),
        boot_id.to_owned(),
        snapshots.clone(),
        auto_reboot,
    ));
    pauses
}
