//! Test support for nodeward's end-to-end tests: a real control plane shared by the whole test
//! run, a namespace and node names per test, and fixtures (kwok nodes, workloads, PDBs).

pub mod controlplane;
pub mod daemon;
pub mod env;
pub mod history;
pub mod http;
pub mod logind;
pub mod nodelab;
pub mod proxy;
pub mod systemd;
pub mod wait;

pub use controlplane::Identity;
pub use env::{NodeSpec, PodOptions, Role, TestEnv};
