use std::{net::SocketAddr, path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use clap::{Parser, Subcommand};
use nodeward_coordinator::{
    Error,
    controller::{self, Changes, Controller, Stores},
    election,
    metrics::Metrics,
    publish::Publisher,
    webhook,
};
use nodeward_decide::round::marks::Mark;
use nodeward_runtime::{
    args::{ClientArgs, LogArgs},
    listener::Limits,
    server::{self, Readiness},
};
use tokio::sync::watch;

const USER_AGENT: &str = concat!("nodeward-coordinator/", env!("CARGO_PKG_VERSION"));

/// How long the controller and the election have to finish when the coordinator stops.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// nodeward's coordinator: admits node disruptions under cluster-wide limits.
#[derive(Parser)]
#[command(name = "nodeward-coordinator", version = nodeward_runtime::VERSION, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the coordinator: elect a leader, admit maintenances, track cluster health. Stops
    /// cleanly (releasing the leader Lease) on SIGTERM or SIGINT.
    Run(Box<Run>),
}

#[derive(clap::Args)]
struct Run {
    #[command(flatten)]
    client: ClientArgs,
    /// Address for /healthz, /readyz and /metrics.
    #[arg(long, env = "NODEWARD_LISTEN", default_value = "0.0.0.0:9471")]
    listen: SocketAddr,
    #[command(flatten)]
    log: LogArgs,
    /// Elect a leader among the replicas; `--leader-elect=false` makes this one act at once
    /// (budgets still hold: every budget write is conditional).
    #[arg(long, env = "NODEWARD_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader election Lease.
    #[arg(long, default_value = "nodeward-coordinator")]
    lease_name: String,
    /// The coordinator's namespace: its leader election Lease and webhook Secret are there, the
    /// agents' Leases, and what it publishes for the agents (the peer directory's
    /// EndpointSlices, the policies' ConfigMap).
    #[arg(long, env = "POD_NAMESPACE", default_value = "nodeward-system")]
    lease_namespace: String,
    /// Identity recorded as the Lease holder and in admissions (default: host name and a
    /// random suffix).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How long a Lease holder is trusted without renewing, e.g. 15s.
    #[arg(long, default_value = "15s", value_parser = humantime::parse_duration)]
    lease_duration: Duration,
    /// The leader steps down when it could not renew for this long; less than --lease-duration.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    renew_deadline: Duration,
    /// How often the Lease is renewed or retried; less than --renew-deadline.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    retry_period: Duration,
    /// Decide again at least this often (windows open and close, conditions age).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    resync: Duration,
    /// Delete finished maintenances (Succeeded, Failed, Cancelled) this long after they
    /// finished, keeping each node's latest and the failures a failure budget still counts;
    /// 0 keeps them all. At least 1h, e.g. 168h.
    #[arg(long, env = "NODEWARD_FINISHED_MAINTENANCE_TTL", default_value = "168h", value_parser = humantime::parse_duration)]
    finished_maintenance_ttl: Duration,
    /// The marks other actors honour that a node carries while its maintenance is under way
    /// (admitted until it ends), so that none of them disrupts it on top: medik8s
    /// (`remediation.medik8s.io/exclude-from-remediation`), cluster-autoscaler
    /// (`cluster-autoscaler.kubernetes.io/scale-down-disabled`), karpenter
    /// (`karpenter.sh/do-not-disrupt`); comma-separated, `none` for none.
    #[arg(long, env = "NODEWARD_MARK_FOR_OTHER_ACTORS", default_value = "medik8s,cluster-autoscaler,karpenter", value_parser = parse_marks)]
    mark_for_other_actors: Marks,
    /// Serve the admission webhook (HTTPS: each agent's evictions to its own node's pods, its
    /// reboot requests to a few at once) on this address, e.g. 0.0.0.0:9443.
    #[arg(long, env = "NODEWARD_WEBHOOK_LISTEN")]
    webhook_listen: Option<SocketAddr>,
    /// Keep the webhook's certificate in this Secret (in the coordinator's namespace): issued,
    /// renewed and its CA bundle written into --webhook-configuration by the coordinator.
    #[arg(
        long,
        env = "NODEWARD_WEBHOOK_SECRET",
        conflicts_with = "webhook_cert_dir"
    )]
    webhook_secret: Option<String>,
    /// Or serve the tls.crt and tls.key in this directory (e.g. from cert-manager), reloaded
    /// when they change.
    #[arg(long, env = "NODEWARD_WEBHOOK_CERT_DIR")]
    webhook_cert_dir: Option<PathBuf>,
    /// The Service the API server calls the webhook through (its DNS names go into the
    /// certificate).
    #[arg(long, default_value = "nodeward-coordinator-webhook")]
    webhook_service: String,
    /// More DNS names for the certificate, comma-separated.
    #[arg(long, value_delimiter = ',')]
    webhook_extra_dns: Vec<String>,
    /// The ValidatingWebhookConfiguration whose webhooks' caBundle the coordinator keeps.
    #[arg(long, default_value = "nodeward-agent-evictions")]
    webhook_configuration: String,
    /// A webhook that must be in it.
    #[arg(long, default_value = "evictions.agent.nodeward.io")]
    webhook_name: String,
    /// How long the webhook's CA is valid; a successor is trusted from a third of its life
    /// left, and takes over at a sixth.
    #[arg(long, default_value = "10y", value_parser = humantime::parse_duration)]
    webhook_ca_validity: Duration,
    /// How long a serving certificate is valid; renewed with a third of its life left.
    #[arg(long, default_value = "90d", value_parser = humantime::parse_duration)]
    webhook_cert_validity: Duration,
    /// The agents' service-account user (system:serviceaccount:NAMESPACE:NAME): the webhook
    /// grants it, where the API server asks (`--authorization-config`), the list and watch of
    /// its own node's pods (/authorize/pod-reads).
    #[arg(long, env = "NODEWARD_AGENT_USER")]
    agent_user: Option<String>,
    /// The group of host-mode agents' certificates (users nodeward:agent:NODE), granted the
    /// same.
    #[arg(long, env = "NODEWARD_AGENT_GROUP")]
    agent_group: Option<String>,
    /// The agents' ValidatingAdmissionPolicy (and binding) of the release: once its binding is
    /// in force, the copy the chart installs before everything else on a first install
    /// (`<name>-bootstrap`) is removed.
    #[arg(long, env = "NODEWARD_AGENT_ADMISSION_POLICY")]
    agent_admission_policy: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Run(run) = &cli.command
        && let Err(e) = validate(run)
    {
        eprintln!("nodeward-coordinator: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("nodeward-coordinator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Run(run) => {
            run.log.init();
            match runtime.block_on(run_coordinator(*run)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "nodeward-coordinator stopped");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn validate(run: &Run) -> Result<(), String> {
    if run.renew_deadline >= run.lease_duration {
        return Err(format!(
            "--renew-deadline ({}) must be shorter than --lease-duration ({}), so that a leader steps down before its Lease can be taken over",
            humantime::format_duration(run.renew_deadline),
            humantime::format_duration(run.lease_duration)
        ));
    }
    if run.retry_period >= run.renew_deadline {
        return Err(format!(
            "--retry-period ({}) must be shorter than --renew-deadline ({})",
            humantime::format_duration(run.retry_period),
            humantime::format_duration(run.renew_deadline)
        ));
    }
    if run.resync.is_zero() {
        return Err("--resync must be more than 0s, e.g. 5s".to_owned());
    }
    if !run.finished_maintenance_ttl.is_zero()
        && run.finished_maintenance_ttl < Duration::from_secs(3600)
    {
        return Err(format!(
            "--finished-maintenance-ttl ({}) must be 0 (keep every finished maintenance) or at least 1h, e.g. 168h: a remediation's escalation and the agent's retries read recent ones",
            humantime::format_duration(run.finished_maintenance_ttl)
        ));
    }
    if run.webhook_listen.is_some()
        && run.webhook_secret.is_none()
        && run.webhook_cert_dir.is_none()
    {
        return Err(
            "--webhook-listen needs a certificate: --webhook-secret NAME (the coordinator keeps one) or --webhook-cert-dir DIR".to_owned(),
        );
    }
    if let Some(user) = &run.agent_user
        && user
            .strip_prefix("system:serviceaccount:")
            .and_then(|account| account.split_once(':'))
            .is_none_or(|(namespace, name)| namespace.is_empty() || name.is_empty())
    {
        return Err(format!(
            "--agent-user ({user}) must be a service account's user, e.g. system:serviceaccount:nodeward-system:nodeward-agent"
        ));
    }
    if run.webhook_cert_validity < Duration::from_secs(10) {
        return Err("--webhook-cert-validity must be at least 10s, e.g. 90d".to_owned());
    }
    if run.webhook_ca_validity < run.webhook_cert_validity * 3 {
        return Err(format!(
            "--webhook-ca-validity ({}) must be at least three times --webhook-cert-validity ({}), so that a serving certificate never outlives the CA's handover",
            humantime::format_duration(run.webhook_ca_validity),
            humantime::format_duration(run.webhook_cert_validity)
        ));
    }
    Ok(())
}

/// `--mark-for-other-actors`: the marks, in the order given.
#[derive(Clone, Debug)]
struct Marks(Vec<Mark>);

fn parse_marks(list: &str) -> Result<Marks, String> {
    if list.trim() == "none" {
        return Ok(Marks(Vec::new()));
    }
    let mut marks = Vec::new();
    for name in list.split(',').map(str::trim) {
        let mark = Mark::from_name(name).ok_or_else(|| {
            let known: Vec<&str> = Mark::ALL.iter().map(|m| m.name()).collect();
            format!(
                "unknown actor {name:?}: name some of {} (comma-separated), or none",
                known.join(", ")
            )
        })?;
        if !marks.contains(&mark) {
            marks.push(mark);
        }
    }
    Ok(Marks(marks))
}

fn default_identity() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "coordinator".to_owned());
    format!("{host}-{:06x}", rand::random::<u32>() & 0xff_ffff)
}

async fn run_coordinator(run: Run) -> Result<(), Error> {
    let client = run.client.connect(USER_AGENT).await?;
    let identity = run.identity.clone().unwrap_or_else(default_identity);
    let metrics = Arc::new(Metrics::new());
    let readiness = Arc::new(Readiness::new(&[nodeward_coordinator::controller::SYNCED]));
    let mut tasks = tokio::task::JoinSet::new();
    server::spawn(run.listen, metrics.encoder(), readiness.clone(), &mut tasks).await?;
    start_webhook(&run, &client, &readiness, &mut tasks).await?;

    if let Some(policy) = &run.agent_admission_policy {
        tasks.spawn(nodeward_coordinator::policy_bootstrap::retire(
            client.clone(),
            policy.clone(),
        ));
    }
    let changed = Arc::new(Changes::default());
    let stores = Stores::watch(&client, &run.lease_namespace, &changed, &mut tasks);

    let (stop_all, stop) = nodeward_runtime::stop::channel();
    // The controller and the election finish what they are writing when the coordinator stops.
    let mut writers = tokio::task::JoinSet::new();
    let (leader_tx, leader) = watch::channel(false);
    if run.leader_elect {
        let settings = election::Settings {
            name: run.lease_name.clone(),
            namespace: run.lease_namespace.clone(),
            identity: identity.clone(),
            lease_duration: run.lease_duration,
            renew_deadline: run.renew_deadline,
            retry_period: run.retry_period,
        };
        writers.spawn(election::run(
            client.clone(),
            settings,
            leader_tx,
            metrics.clone(),
            stop.clone(),
        ));
    } else {
        tracing::warn!("leader election is off: this coordinator acts as leader");
        metrics.leader.set(1);
        let _ = leader_tx.send(true);
        // Keep the sender alive so that the controller's `leader.changed()` never ends.
        tasks.spawn(async move {
            leader_tx.closed().await;
        });
    }
    // What the agents read instead of watching every Node and policy: published by the leader.
    tasks.spawn(
        Publisher {
            client: client.clone(),
            namespace: run.lease_namespace.clone(),
            stores: stores.clone(),
            readiness: readiness.clone(),
        }
        .run(leader.clone(), run.resync, stop.clone()),
    );
    let finished_ttl =
        (!run.finished_maintenance_ttl.is_zero()).then_some(run.finished_maintenance_ttl);
    let settings = controller::Settings {
        finished_ttl,
        marks: run.mark_for_other_actors.0.clone(),
    };
    let controller = Controller::new(client, identity.clone(), metrics, changed, settings);
    writers.spawn(controller.run(stores, leader, run.resync, readiness, stop));
    tracing::info!(%identity, "nodeward-coordinator running");

    let signal = nodeward_runtime::stop_signal().await?;
    tracing::info!("{signal}: stopping");
    // The controller finishes the writes of its round, and the election releases the Lease so
    // that the next leader takes over at once; the rest end then.
    let aborted = stop_all.drain(writers, tasks, STOP_GRACE).await;
    tracing::info!(aborted, "stopped");
    Ok(())
}

/// Serves the eviction webhook when `--webhook-listen` asks for it, with the certificate the
/// coordinator keeps (or the one in `--webhook-cert-dir`); ready only once one is loaded.
async fn start_webhook(
    run: &Run,
    client: &kube::Client,
    readiness: &Arc<Readiness>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> Result<(), Error> {
    let Some(address) = run.webhook_listen else {
        return Ok(());
    };
    let serving = Arc::new(webhook::ServingCert::default());
    readiness.close(webhook::CERTIFICATE_LOADED);
    if let Some(secret) = &run.webhook_secret {
        let mut dns_names =
            webhook::certificate::Wanted::service_names(&run.webhook_service, &run.lease_namespace);
        dns_names.extend(run.webhook_extra_dns.iter().cloned());
        tasks.spawn(
            webhook::Keeper {
                client: client.clone(),
                namespace: run.lease_namespace.clone(),
                secret: secret.clone(),
                configuration: run.webhook_configuration.clone(),
                webhook: run.webhook_name.clone(),
                wanted: webhook::certificate::Wanted {
                    dns_names,
                    ca_lifetime: run.webhook_ca_validity,
                    serving_lifetime: run.webhook_cert_validity,
                },
                serving: serving.clone(),
                readiness: readiness.clone(),
            }
            .run(),
        );
    } else if let Some(dir) = &run.webhook_cert_dir {
        tasks.spawn(webhook::keeper::follow_files(
            dir.clone(),
            serving.clone(),
            readiness.clone(),
            Duration::from_secs(10),
        ));
    }
    let acceptor = webhook::acceptor(serving).map_err(Error::Webhook)?;
    let agents = webhook::pod_reads::Agents {
        user: run.agent_user.clone(),
        group: run.agent_group.clone(),
    };
    let (bound, serving) =
        webhook::serve(address, acceptor, client.clone(), agents, Limits::default())
            .await
            .map_err(Error::Webhook)?;
    tracing::info!(address = %bound, evictions = webhook::EVICTION_PATH, requests = webhook::requests::REQUEST_PATH, pod_reads = webhook::pod_reads::POD_READS_PATH, "serving the admission and authorization webhooks");
    tasks.spawn(serving);
    Ok(())
}
