//! `kubectl-nodeward`: found on the PATH, kubectl runs it as `kubectl nodeward VERB`; it also
//! runs alone. See [`nodeward_cli`].

use std::{path::PathBuf, process::ExitCode};

use clap::{CommandFactory, Parser, Subcommand};
use nodeward_cli::{Error, cluster, migrate, request::Verb};

/// Operate nodeward: ask for reboots and drains, cancel them, pause policies, and see why a
/// node is waiting. Reads and writes the same objects as everything else (NodeMaintenance,
/// DisruptionPolicy), with your own Kubernetes identity.
#[derive(Parser)]
#[command(name = "kubectl-nodeward", bin_name = "kubectl nodeward", version = nodeward_runtime::VERSION)]
struct Cli {
    /// Kubeconfig file (default: $KUBECONFIG, ~/.kube/config, or the in-cluster account).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context (default: the current one).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    verb: Command,
}

/// What `reboot`, `patch` and `drain` take.
#[derive(clap::Args)]
struct Asked {
    #[arg(required = true, value_name = "NODE")]
    nodes: Vec<String>,
    /// A note for the maintenance and its Events.
    #[arg(long)]
    message: Option<String>,
    /// An emergency (a patch for an exploited flaw): admitted outside the maintenance windows
    /// and past reboot blockers, first among the pending; never past a budget, a
    /// PodDisruptionBudget, quorum, a blackout, a halted rollout or a pause.
    #[arg(long)]
    urgent: bool,
}

impl Asked {
    async fn request(self, client: &kube::Client, verb: Verb) -> Result<(), Error> {
        cluster::request(
            client,
            &self.nodes,
            verb,
            self.message.as_deref(),
            self.urgent,
        )
        .await
    }
}

#[derive(Subcommand)]
enum Command {
    /// Policies with their budget use, maintenances with their phase, unhealthy nodes.
    Status,
    /// Drain and reboot each NODE, one maintenance each, admitted under the policies' budgets
    /// and windows; the node is uncordoned once its health gate passes.
    Reboot(Asked),
    /// As `reboot`, named as a patch: the policy's update runs once the node is drained, and
    /// the node reboots if the update asks for it (or always, as the policy says).
    Patch(Asked),
    /// Drain each NODE and keep it drained until `cancel` (or `uncordon`) ends it.
    Drain(Asked),
    /// End each NODE's maintenance under way (deletes it): the node's agent undoes the taint
    /// and cordon nodeward made; a cordon someone else made stays.
    Cancel {
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
    },
    /// The same as `cancel`: ends the maintenance that holds each NODE cordoned.
    Uncordon {
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
    },
    /// The operator's word that each NODE is off (powered off, or fenced outside nodeward):
    /// Kubernetes' out-of-service taint with nodeward's record, so that its pods are deleted and
    /// StatefulSet pods start elsewhere; the coordinator takes it away once the node is Ready
    /// again. Refused for a Ready node. For a node whose agent does not fence it, which the
    /// coordinator never marks by itself.
    OutOfService {
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
        /// How the node is known to be off, kept in the record (e.g. "powered off in the BMC").
        #[arg(long, short)]
        message: Option<String>,
    },
    /// Admit nothing new under each POLICY (maintenances under way finish).
    Pause {
        #[arg(required = true, value_name = "POLICY")]
        policies: Vec<String>,
    },
    /// Admit under each POLICY again: unpauses it, and lifts a halt (its failureBudget counts
    /// only failures from now on).
    Resume {
        #[arg(required = true, value_name = "POLICY")]
        policies: Vec<String>,
    },
    /// Why NODE is waiting, or what is being done to it: budget, window, pause, blocker,
    /// workload, agent, deadline, pods holding its drain.
    Why {
        #[arg(value_name = "NODE")]
        node: String,
    },
    /// Print the DisruptionPolicy and Helm values that do what a kured or node-problem-detector
    /// DaemonSet is configured to do, naming what cannot be carried over.
    Migrate(Migrate),
    /// Print a completion script for SHELL, e.g. `kubectl nodeward completion bash >
    /// /etc/bash_completion.d/kubectl-nodeward`.
    Completion {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
}

#[derive(clap::Args)]
struct Migrate {
    /// kured's DaemonSet manifest (YAML), e.g. kured-ds.yaml.
    #[arg(long, value_name = "FILE", group = "from")]
    kured: Option<PathBuf>,
    /// kured's DaemonSet in the cluster, as NAMESPACE/NAME (e.g. kube-system/kured).
    #[arg(long, value_name = "NAMESPACE/NAME", group = "from")]
    kured_daemonset: Option<String>,
    /// node-problem-detector's DaemonSet and the ConfigMaps it mounts (YAML; repeat the flag
    /// or give one file with every document).
    #[arg(long, value_name = "FILE", group = "from")]
    npd: Vec<PathBuf>,
    /// node-problem-detector's DaemonSet in the cluster, as NAMESPACE/NAME (e.g.
    /// kube-system/node-problem-detector); the ConfigMaps it mounts are read with it.
    #[arg(long, value_name = "NAMESPACE/NAME", group = "from")]
    npd_daemonset: Option<String>,
    /// The name of the DisruptionPolicy printed (default: kured, or node-health from
    /// node-problem-detector).
    #[arg(long)]
    policy_name: Option<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Command::Completion { shell } = cli.verb {
        clap_complete::generate(
            shell,
            &mut Cli::command(),
            "kubectl-nodeward",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kubectl-nodeward: starting: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Error> {
    if let Command::Migrate(from) = &cli.verb {
        print!("{}", migrate(from, &cli).await?);
        return Ok(());
    }
    let client = cluster::connect(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    match cli.verb {
        Command::Status => print!("{}", cluster::status(&client).await?),
        Command::Reboot(asked) => asked.request(&client, Verb::Reboot).await?,
        Command::Patch(asked) => asked.request(&client, Verb::Patch).await?,
        Command::Drain(asked) => asked.request(&client, Verb::Drain).await?,
        Command::Cancel { nodes } | Command::Uncordon { nodes } => {
            cluster::cancel(&client, &nodes).await?;
        }
        Command::OutOfService { nodes, message } => {
            cluster::out_of_service(&client, &nodes, message.as_deref()).await?;
        }
        Command::Pause { policies } => cluster::set_paused(&client, &policies, true).await?,
        Command::Resume { policies } => cluster::set_paused(&client, &policies, false).await?,
        Command::Why { node } => print!("{}", cluster::why(&client, &node).await?),
        Command::Completion { .. } | Command::Migrate(_) => {}
    }
    Ok(())
}

/// `migrate`: read from files needs no cluster; from a DaemonSet, the client is made then.
async fn migrate(from: &Migrate, cli: &Cli) -> Result<String, Error> {
    let place = |flag: &str, value: &str| {
        value
            .split_once('/')
            .map(|(ns, n)| (ns.to_owned(), n.to_owned()))
            .ok_or_else(|| {
                Error::Migrate(format!(
                    "--{flag} {value}: give NAMESPACE/NAME, e.g. kube-system/{}",
                    flag.trim_end_matches("-daemonset")
                ))
            })
    };
    let client = || cluster::connect(cli.kubeconfig.as_deref(), cli.context.as_deref());
    let name = |default: &str| {
        from.policy_name
            .clone()
            .unwrap_or_else(|| default.to_owned())
    };
    let out = if let Some(file) = &from.kured {
        migrate::from_kured(
            &migrate::read_file(file).map_err(Error::Migrate)?,
            &name("kured"),
        )
    } else if let Some(value) = &from.kured_daemonset {
        let (namespace, ds) = place("kured-daemonset", value)?;
        let daemonset = migrate::read_cluster(client().await?, &namespace, &ds)
            .await
            .map_err(Error::Migrate)?;
        migrate::from_kured(&daemonset, &name("kured"))
    } else if !from.npd.is_empty() {
        let (daemonset, configmaps) = migrate::read_npd_files(&from.npd).map_err(Error::Migrate)?;
        migrate::from_npd(&daemonset, &configmaps, &name("node-health"))
    } else if let Some(value) = &from.npd_daemonset {
        let (namespace, ds) = place("npd-daemonset", value)?;
        let (daemonset, configmaps) = migrate::read_npd_cluster(client().await?, &namespace, &ds)
            .await
            .map_err(Error::Migrate)?;
        migrate::from_npd(&daemonset, &configmaps, &name("node-health"))
    } else {
        Err("give --kured FILE, --kured-daemonset NAMESPACE/NAME, --npd FILE or --npd-daemonset NAMESPACE/NAME".to_owned())
    };
    out.map_err(Error::Migrate)
}
