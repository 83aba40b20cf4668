//! `kubectl-nodeward`: found on the PATH, kubectl runs it as `kubectl nodeward VERB`; it also
//! runs alone. See [`nodeward_cli`].

use std::{path::PathBuf, process::ExitCode};

use clap::{CommandFactory, Parser, Subcommand};
use nodeward_cli::{Error, cluster, request::Verb};

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

#[derive(Subcommand)]
enum Command {
    /// Policies with their budget use, maintenances with their phase, unhealthy nodes.
    Status,
    /// Drain and reboot each NODE, one maintenance each, admitted under the policies' budgets
    /// and windows; the node is uncordoned once its health gate passes.
    Reboot {
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
        /// A note for the maintenance and its Events.
        #[arg(long)]
        message: Option<String>,
    },
    /// Drain each NODE and keep it drained until `cancel` (or `uncordon`) ends it.
    Drain {
        #[arg(required = true, value_name = "NODE")]
        nodes: Vec<String>,
        /// A note for the maintenance and its Events.
        #[arg(long)]
        message: Option<String>,
    },
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
    /// Admit nothing new under each POLICY (maintenances under way finish).
    Pause {
        #[arg(required = true, value_name = "POLICY")]
        policies: Vec<String>,
    },
    /// Admit under each POLICY again.
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
    /// Print a completion script for SHELL, e.g. `kubectl nodeward completion bash >
    /// /etc/bash_completion.d/kubectl-nodeward`.
    Completion {
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
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
    let client = cluster::connect(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    match cli.verb {
        Command::Status => print!("{}", cluster::status(&client).await?),
        Command::Reboot { nodes, message } => {
            cluster::request(&client, &nodes, Verb::Reboot, message.as_deref()).await?;
        }
        Command::Drain { nodes, message } => {
            cluster::request(&client, &nodes, Verb::Drain, message.as_deref()).await?;
        }
        Command::Cancel { nodes } | Command::Uncordon { nodes } => {
            cluster::cancel(&client, &nodes).await?;
        }
        Command::Pause { policies } => cluster::set_paused(&client, &policies, true).await?,
        Command::Resume { policies } => cluster::set_paused(&client, &policies, false).await?,
        Command::Why { node } => print!("{}", cluster::why(&client, &node).await?),
        Command::Completion { .. } => {}
    }
    Ok(())
}
