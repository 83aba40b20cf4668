use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc};

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand, ValueEnum};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::reflector;
use nodeward_agent::{
    Error, background, check,
    config::Config,
    detect,
    fencing::Fencer,
    flags::{Given, Placed},
    liveness::{ApiContact, Liveness},
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
    stop::Stopping,
};

/// How long the tasks that write have to finish what they are writing when the agent stops.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);
use tokio::{sync::watch, task::JoinSet};

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

/// The configuration file. The settings that override it (a flag for each field a section
/// declares one for, and `--set PATH=VALUE` for any) are added to the command from the
/// sections' declarations ([`Config::flags`]).
#[derive(Args)]
struct Settings {
    /// Configuration file (default: /etc/nodeward/agent.yaml when it exists).
    #[arg(long, env = "NODEWARD_CONFIG")]
    config: Option<PathBuf>,
}

/// The command line: the derived arguments, with every section's flags and `--set` added to
/// `check` and `run`.
fn command_line() -> (Cli, Vec<Placed>, Vec<Given>) {
    let flags = Config::flags();
    let with_flags = |command: clap::Command| {
        flags
            .iter()
            .fold(command.arg(nodeward_agent::flags::set_arg()), |c, f| {
                c.arg(f.arg())
            })
    };
    let matches = Cli::command()
        .mut_subcommand("check", with_flags)
        .mut_subcommand("run", with_flags)
        .get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let given = match matches.subcommand() {
        Some((_, sub)) => nodeward_agent::flags::given(sub, &flags),
        None => Ok(Vec::new()),
    };
    let given = given.unwrap_or_else(|e| {
        eprintln!("nodeward-agent: {e}");
        std::process::exit(2)
    });
    (cli, flags, given)
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let (cli, _, given) = command_line();
    let command = &cli.command;
    let (Command::Check { settings, .. } | Command::Run { settings, .. }) = command;
    let loaded = Config::load_with(settings.config.as_deref(), &given).and_then(Config::with_npd);
    let config = match loaded {
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
    // The tasks that write finish a write under way when the agent stops.
    let mut writers = JoinSet::new();
    let (stop, stopping) = nodeward_runtime::stop::channel();
    server::spawn(
        running.listen,
        metrics.encoder(),
        readiness.clone(),
        &mut tasks,
    )
    .await?;
    watch_the_host(&config, &metrics, &mut tasks);
    let (own_node, own_node_writer) = reflector::store();
    let contact = ApiContact::default();
    writers.spawn(
        Liveness {
            client: client.clone(),
            namespace: running.namespace.clone(),
            node: node_name.clone(),
            every: config.reporting.heartbeat_interval,
            metrics: metrics.clone(),
            contact: contact.clone(),
        }
        .run(stopping.clone()),
    );
    let (log_events_tx, log_events) = tokio::sync::mpsc::channel(detect::LOG_EVENTS_WAITING);
    let on = detect::On::new(
        &client,
        &node_name,
        &running.namespace,
        running.boot_id.as_deref(),
        &metrics,
        log_events_tx,
    );
    let started = background::start(&config, on, own_node, &mut tasks).await?;
    let detectors = config.detectors.enabled(Some(&started.agent));
    let writing = detectors.iter().map(|d| d.condition.to_string()).collect();
    let snapshots = runner::start(detectors, metrics.clone(), &mut tasks);
    let inventories = nodeward_agent::inventory::Reader {
        config: config.inventory.clone(),
        client: client.clone(),
        node_name: node_name.clone(),
        boot_id: running.boot_id.clone(),
        metrics: metrics.clone(),
    }
    .start(stopping.clone(), &mut tasks);
    let fencer = Fencer::of(
        &config.fencing,
        &config.detectors.peers,
        &started.agent,
        &client,
        &metrics,
        contact.clone(),
    );
    let mut reporter = Reporter::new(client.clone(), identity, metrics, readiness)
        .with_recheck(config.reporting.heartbeat_interval)
        .writing(writing)
        .telling(contact)
        .publishing(started.for_reports);
    if let Some(fencer) = fencer {
        reporter = reporter.announcing(fencer.claim.clone());
        writers.spawn(fencer.run(stopping.clone()));
    }
    let pauses = maintain(
        &config,
        &client,
        &running,
        (&snapshots, &inventories),
        own_node_writer,
        &stopping,
        (&mut tasks, &mut writers),
    );
    writers.spawn(reporter.run(snapshots, log_events, pauses, stopping));
    tracing::info!(node = %node_name, ?mode, "nodeward-agent running");
    let signal = nodeward_runtime::stop_signal().await?;
    tracing::info!("{signal}: stopping");
    // The reporter, the executor and the liveness finish a write under way; the rest (watches,
    // probes, the shutdown guard, whose inhibitor lock goes with it) end then.
    let aborted = stop.drain(writers, tasks, STOP_GRACE).await;
    tracing::info!(aborted, "stopped");
    Ok(())
}

/// Starts what looks after the host beside the detectors: the reaper of what checks leave
/// behind (when the agent is its container's PID 1) and the host's statistics.
fn watch_the_host(config: &Config, metrics: &Arc<Metrics>, tasks: &mut JoinSet<()>) {
    if nodeward_agent::host::reaper::receives_orphans() {
        tasks.spawn(nodeward_agent::host::reaper::reap(
            std::time::Duration::from_secs(10),
        ));
    }
    if config.host_stats.enabled {
        tasks.spawn(nodeward_agent::host_stats::run(
            config.host_stats.clone(),
            metrics.clone(),
        ));
    }
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

/// Starts what carries out this node's maintenances and guards its shutdowns: the shutdown
/// guard (when enabled), the maintenance executor, the policy follower and the reboot
/// requester (in `tasks`), from the detectors' snapshots and the inventory. Returns the
/// pauses this node obeys, for its reports.
fn maintain(
    config: &Config,
    client: &kube::Client,
    running: &Running,
    (snapshots, inventories): (
        &watch::Receiver<runner::Snapshot>,
        &nodeward_agent::inventory::Inventories,
    ),
    own_node: reflector::store::Writer<Node>,
    stopping: &Stopping,
    (tasks, writers): (&mut JoinSet<()>, &mut JoinSet<()>),
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
    let events = nodeward_agent::events(client.clone(), node_name);
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
    let node_changed = std::sync::Arc::new(tokio::sync::Notify::new());
    let (notifier, delivery) = nodeward_agent::notify::Notifier::new(&config.notifications);
    if let Some(delivery) = delivery {
        tasks.spawn(delivery);
    }
    writers.spawn(
        nodeward_agent::maintenance::executor::Executor {
            client: client.clone(),
            node: node_name.to_owned(),
            boot_id: boot_id.to_owned(),
            own_pod,
            notifier,
            events: events.clone(),
            policies,
            reboot: config.reboot.clone(),
            inventories: inventories.clone(),
            written: Default::default(),
            node_changed: node_changed.clone(),
        }
        .run(maintenances.clone(), stopping.clone()),
    );
    let (pauses_tx, pauses) = watch::channel(Vec::new());
    let (auto_reboot_tx, auto_reboot) = watch::channel(auto_reboot_flag);
    tasks.spawn(nodeward_agent::policies::follow(Follow {
        client: client.clone(),
        namespace: running.namespace.clone(),
        node_name: node_name.to_owned(),
        policies: policy_writer,
        node: own_node,
        node_changed,
        pauses: pauses_tx,
        auto_reboots: auto_reboot_tx,
        forced_auto_reboot: auto_reboot_flag,
    }));
    let cloud = &config.detectors.cloud_notices;
    if cloud.enabled && cloud.maintenance {
        tasks.spawn(nodeward_agent::maintenance::cloud_request::run(
            client.clone(),
            events.clone(),
            node_name.to_owned(),
            boot_id.to_owned(),
            cloud.clone(),
        ));
    }
    tasks.spawn(nodeward_agent::maintenance::reboot_request::run(
        (client.clone(), events),
        (node_name.to_owned(), boot_id.to_owned()),
        nodeward_agent::maintenance::reboot_request::Retry {
            retries: config.reboot.request_retries,
            after: config.reboot.request_retry_after,
        },
        maintenances,
        snapshots.clone(),
        auto_reboot,
    ));
    pauses
}
