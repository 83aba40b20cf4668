//! Runs a command in one of the node lab's VMs, through its guest agent:
//!
//!   cargo run -p nodeward-e2e --bin nodelab -- STATE_DIR NODE COMMAND...
//!
//! e.g. `... target/tests-run-nodelab lab1 systemctl status kubelet`. Prints its output and exits
//! with its exit code. (For a shell: `socat -,raw,echo=0 UNIX-CONNECT:STATE_DIR/NODE/console.sock`.)

use std::{path::PathBuf, process::ExitCode, time::Duration};

use nodeward_e2e::nodelab::Vm;

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: nodelab STATE_DIR NODE COMMAND...");
        return ExitCode::from(2);
    }
    let vm = Vm {
        name: args[1].clone(),
        dir: PathBuf::from(&args[0]).join(&args[1]),
    };
    match vm
        .exec_with(&args[2..].join(" "), Duration::from_secs(600))
        .await
    {
        Ok(output) => {
            print!("{}", output.stdout);
            eprint!("{}", output.stderr);
            ExitCode::from(u8::try_from(output.code).unwrap_or(1))
        }
        Err(e) => {
            eprintln!("nodelab: {e:#}");
            ExitCode::FAILURE
        }
    }
}
