//! The coordinator's decision cost alone, without an API server: a full round
//! ([`round::plan`]) and an admission-only round ([`round::admit_new`]) over synthetic
//! clusters of `--nodes` Ready nodes (labels and conditions as a kubelet posts them), a
//! NodeReport each, one policy selecting them all and `--active` admitted maintenances.
//! With `--pending N` the policy allows only the `--active` ones and N more wait denied, as
//! in a rolling reboot of the whole cluster. Single-threaded; medians of `--runs`.
//!
//!   cargo run --release -p nodeward-bench --bin round-cost -- --nodes 1000 5000
//!   cargo run --release -p nodeward-bench --bin round-cost -- --nodes 5000 --active 50 --pending 4950

use std::{collections::BTreeMap, sync::Arc, time::Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::Node;
use nodeward_api::{DisruptionPolicy, NodeMaintenance, NodeReport};
use nodeward_decide::round::{self, Memory, Objects};
use serde_json::json;

#[derive(Parser)]
struct Args {
    /// Cluster sizes to measure.
    #[arg(long, num_args = 1.., default_values_t = [1000, 5000])]
    nodes: Vec<usize>,
    /// Maintenances already admitted (holding slots) in each cluster.
    #[arg(long, default_value_t = 10)]
    active: usize,
    /// Maintenances waiting for a slot besides them (the policy then allows only `--active`).
    #[arg(long, default_value_t = 0)]
    pending: usize,
    /// Timed repetitions of each (the median is reported).
    #[arg(long, default_value_t = 21)]
    runs: usize,
}

fn node(name: &str, now: &str) -> Arc<Node> {
    let conditions: Vec<_> = ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .map(|t| {
            json!({"type": t, "status": if *t == "Ready" {"True"} else {"False"},
                "reason": "KubeletReady", "lastTransitionTime": now, "lastHeartbeatTime": now})
        })
        .collect();
    Arc::new(
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m5.large",
                "topology.kubernetes.io/zone": "zone-a", "pool": "workers"}},
            "status": {"conditions": conditions},
        }))
        .expect("node"),
    )
}

fn report(name: &str, now: &str) -> Arc<NodeReport> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeReport",
            "metadata": {"name": name},
            "spec": {"nodeName": name},
            "status": {"heartbeatTime": now},
        }))
        .expect("report"),
    )
}

fn maintenance(name: &str, node: &str, status: serde_json::Value) -> Arc<NodeMaintenance> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": name, "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": node, "reason": "Reboot", "action": "Reboot"},
            "status": status,
        }))
        .expect("maintenance"),
    )
}

fn cluster(nodes: usize, active: usize, pending: usize, now: &str) -> Objects {
    let names: Vec<String> = (0..nodes).map(|i| format!("node-{i:05}")).collect();
    let slots: Vec<_> = (0..active)
        .map(|i| {
            json!({"maintenance": format!("m{i}"), "uid": format!("uid-m{i}"),
            "nodeName": names[i], "admittedAt": now})
        })
        .collect();
    let policy: DisruptionPolicy = serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
        "metadata": {"name": "workers", "generation": 1},
        "spec": {"nodeSelector": {"matchLabels": {"pool": "workers"}},
            "maxConcurrent": if pending == 0 { json!("100%") } else { json!(active) }},
        "status": {"slots": slots},
    }))
    .expect("policy");
    Objects {
        nodes: names.iter().map(|n| node(n, now)).collect(),
        reports: names.iter().map(|n| report(n, now)).collect(),
        policies: vec![Arc::new(policy)],
        maintenances: (0..active)
            .map(|i| maintenance(&format!("m{i}"), &names[i], json!({"phase": "Draining"})))
            .chain(
                (active..(active + pending).min(nodes))
                    .map(|i| maintenance(&format!("m{i}"), &names[i], json!({"phase": "Pending"}))),
            )
            .collect(),
        ..Objects::default()
    }
}

fn median_ms(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2] * 1000.0
}

fn main() {
    let args = Args::parse();
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!("cores: {cores} (one used)");
    let now = jiff::Timestamp::now();
    for &nodes in &args.nodes {
        let objects = cluster(nodes, args.active, args.pending, &now.to_string());
        let mut memory = Memory::default();
        let mut full = Vec::new();
        let mut standing = round::plan(&objects, &mut memory, now).standing;
        for _ in 0..args.runs {
            let started = Instant::now();
            standing = round::plan(&objects, &mut memory, now).standing;
            full.push(started.elapsed().as_secs_f64());
        }
        let new = [maintenance(
            "new",
            &format!("node-{:05}", nodes - 1),
            json!(null),
        )];
        let mut admission = Vec::new();
        for _ in 0..args.runs {
            let mut fresh = standing.clone();
            let started = Instant::now();
            let plan = round::admit_new(
                &mut fresh,
                &objects.policies,
                &new,
                &BTreeMap::new(),
                &BTreeMap::new(),
                &BTreeMap::new(),
                now,
            )
            .expect("the standing decides");
            admission.push(started.elapsed().as_secs_f64());
            if args.pending == 0 {
                assert_eq!(plan.admit.len(), 1, "the new maintenance is admitted");
            } else {
                assert_eq!(
                    plan.deny.len(),
                    1,
                    "the new maintenance waits with the others"
                );
            }
        }
        let (full, admission) = (median_ms(full), median_ms(admission));
        println!(
            "{nodes} nodes, {} admitted, {} pending: full round {full:.2} ms, admission round {admission:.3} ms ({:.0}x)",
            args.active,
            args.pending,
            full / admission
        );
    }
}
