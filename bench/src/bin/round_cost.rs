//! The coordinator's decision cost alone, without an API server: a full round
//! ([`round::plan`]) and an admission-only round ([`round::admit_new`]) over synthetic
//! clusters of `--nodes` Ready nodes (labels and conditions as a kubelet posts them), a
//! NodeReport each, one policy selecting them all and `--active` admitted maintenances.
//! With `--pending N` the policy allows only the `--active` ones and N more wait denied, as
//! in a rolling reboot of the whole cluster. With `--policies N` the nodes are split into N
//! pools, each with a policy of its own that has a failure budget and a canary stage, and
//! `--history K` adds K finished maintenances per node, admitted by its pool's policy (what a
//! cluster keeps until they expire): each policy then reads the maintenances of its nodes.
//! Single-threaded; medians of `--runs`.
//!
//!   cargo run --release -p nodeward-bench --bin round-cost -- --nodes 1000 5000
//!   cargo run --release -p nodeward-bench --bin round-cost -- --nodes 5000 --active 50 --pending 4950
//!   cargo run --release -p nodeward-bench --bin round-cost -- --nodes 5000 --policies 50 --history 3

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
    /// Policies, each selecting its own pool of the nodes, with a failure budget and a canary
    /// stage (1: one policy selecting every node, with neither).
    #[arg(long, default_value_t = 1)]
    policies: usize,
    /// Finished (Succeeded) maintenances kept per node, admitted by its pool's policy.
    #[arg(long, default_value_t = 0)]
    history: usize,
    /// Timed repetitions of each (the median is reported).
    #[arg(long, default_value_t = 21)]
    runs: usize,
}

fn node(name: &str, pool: &str, now: &str) -> Arc<Node> {
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
                "topology.kubernetes.io/zone": "zone-a", "pool": pool}},
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

/// The cluster's shape: how many of each object.
struct Shape {
    nodes: usize,
    active: usize,
    pending: usize,
    policies: usize,
    history: usize,
}

impl Shape {
    /// The pool (and policy) of the node numbered `i`.
    fn pool(&self, i: usize) -> String {
        if self.policies == 1 {
            "workers".to_owned()
        } else {
            format!("pool-{:03}", i % self.policies)
        }
    }
}

fn policy(shape: &Shape, pool: &str, slots: Vec<serde_json::Value>) -> Arc<DisruptionPolicy> {
    let mut spec = json!({"nodeSelector": {"matchLabels": {"pool": pool}},
        "maxConcurrent": if shape.pending == 0 { json!("100%") } else { json!(shape.active) }});
    if shape.policies > 1 {
        spec["failureBudget"] = json!({"maxFailures": 3, "window": "24h"});
        spec["canary"] = json!({"nodes": 1, "soak": "0s"});
    }
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": pool, "generation": 1},
            "spec": spec,
            "status": {"slots": slots},
        }))
        .expect("policy"),
    )
}

fn cluster(shape: &Shape, now: &str) -> Objects {
    let names: Vec<String> = (0..shape.nodes).map(|i| format!("node-{i:05}")).collect();
    let mut slots: BTreeMap<String, Vec<serde_json::Value>> = (0..shape.policies)
        .map(|i| (shape.pool(i), Vec::new()))
        .collect();
    for (i, name) in names.iter().enumerate().take(shape.active) {
        slots.entry(shape.pool(i)).or_default().push(
            json!({"maintenance": format!("m{i}"), "uid": format!("uid-m{i}"),
                "nodeName": name, "admittedAt": now}),
        );
    }
    let admitted =
        |i: usize| json!({"policies": [shape.pool(i)], "admittedAt": now, "admittedBy": "c"});
    let history = (0..shape.nodes).flat_map(|i| (0..shape.history).map(move |k| (i, k)));
    Objects {
        nodes: names
            .iter()
            .enumerate()
            .map(|(i, n)| node(n, &shape.pool(i), now))
            .collect(),
        reports: names.iter().map(|n| report(n, now)).collect(),
        policies: slots
            .into_iter()
            .map(|(pool, slots)| policy(shape, &pool, slots))
            .collect(),
        maintenances: (0..shape.active)
            .map(|i| {
                maintenance(
                    &format!("m{i}"),
                    &names[i],
                    json!({"phase": "Draining", "admission": admitted(i)}),
                )
            })
            .chain(
                (shape.active..(shape.active + shape.pending).min(shape.nodes))
                    .map(|i| maintenance(&format!("m{i}"), &names[i], json!({"phase": "Pending"}))),
            )
            .chain(history.map(|(i, k)| {
                maintenance(
                    &format!("h{i}-{k}"),
                    &names[i],
                    json!({"phase": "Succeeded", "admission": admitted(i), "finishedAt": now}),
                )
            }))
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
        let shape = Shape {
            nodes,
            active: args.active,
            pending: args.pending,
            policies: args.policies,
            history: args.history,
        };
        let objects = cluster(&shape, &now.to_string());
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
            );
            let elapsed = started.elapsed().as_secs_f64();
            // A canary stage is a full round's to count: the coordinator then runs one.
            let Some(plan) = plan else { break };
            admission.push(elapsed);
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
        let full = median_ms(full);
        let admission = if admission.is_empty() {
            "left to a full round (a canary stage)".to_owned()
        } else {
            let admission = median_ms(admission);
            format!("{admission:.3} ms ({:.0}x)", full / admission)
        };
        println!(
            "{nodes} nodes, {} policies, {} admitted, {} pending, {} finished per node: \
             full round {full:.2} ms, admission round {admission}",
            args.policies, args.active, args.pending, args.history,
        );
    }
}
