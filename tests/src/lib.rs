//! Test support for nodeward's end-to-end tests: a real control plane shared by the whole test
//! run, a namespace and node names per test, and fixtures (kwok nodes, workloads, PDBs).

pub mod controlplane;
pub mod daemon;
pub mod env;
pub mod fixtures;
pub mod helm;
pub mod history;
pub mod http;
pub mod logind;
pub mod nodelab;
pub mod proxy;
pub mod siege;
pub mod systemd;
pub mod wait;

pub use controlplane::Identity;
pub use env::{NodeSpec, PodOptions, Role, TestEnv};

/// The repository this test library was built from.
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default()
}
