//! Test support for nodeward's end-to-end tests: a real control plane shared by the whole test
//! run, a namespace and node names per test, and fixtures (kwok nodes, workloads, PDBs).

pub mod certificates;
pub mod chaos;
pub mod controlplane;
pub mod daemon;
pub mod env;
pub mod fixtures;
pub mod helm;
pub mod history;
pub mod http;
pub mod journald;
pub mod logind;
pub mod machine;
pub mod nodelab;
pub mod proxy;
pub mod scratch;
pub mod siege;
pub mod systemd;
pub mod wait;
pub mod workload;

pub use controlplane::Identity;
pub use env::{NodeSpec, PodOptions, Role, TestEnv};

/// The repository this test library was built from.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}

/// Whether `node` carries nothing of nodeward's: not cordoned, no `nodeward.io/` taint, no
/// cordon record.
pub fn node_restored(node: &k8s_openapi::api::core::v1::Node) -> bool {
    let spec = node.spec.clone().unwrap_or_default();
    spec.unschedulable != Some(true)
        && spec
            .taints
            .unwrap_or_default()
            .iter()
            .all(|t| !t.key.starts_with("nodeward.io/"))
        && !node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(nodeward_api::labels::CORDONED_BY_ANNOTATION))
}
