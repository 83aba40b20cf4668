//! The opening of a system test, said once: its environment, kwok nodes, their agents'
//! heartbeats, policies and a coordinator, built in that order. (Maintenances are the test's
//! own: each test creates them between the assertions on what becomes of them.)
//!
//! ```ignore
//! let scene = Scenario::new("admit-fifty")
//!     .nodes(&vec![NodeSpec::worker("a"); 50])
//!     .reporting()
//!     .policy("pool", json!({"maxConcurrent": 3}))
//!     .coordinator(&[])
//!     .start()
//!     .await?;
//! ```

use std::time::Duration;

use serde_json::Value;

use crate::{NodeSpec, TestEnv, daemon::Daemon};

/// How long a daemon of a scenario has to get ready.
const READY: Duration = Duration::from_secs(60);

/// A system test's cluster, to be built by [`Scenario::start`].
#[derive(Debug, Default)]
#[must_use = "a scenario does nothing until started"]
pub struct Scenario {
    test: String,
    nodes: Vec<NodeSpec>,
    reporting: bool,
    policies: Vec<(String, Value)>,
    coordinator: Option<Vec<String>>,
    alone: bool,
}

/// A scenario built: what the test goes on with.
pub struct Scene {
    pub env: TestEnv,
    /// The kwok nodes' names, in the order given.
    pub nodes: Vec<String>,
    /// The policies' names (prefixed with the test's id), in the order given.
    pub policies: Vec<String>,
    /// The coordinator, ready; stopped when the scene is dropped.
    pub coordinator: Option<Daemon>,
}

impl Scenario {
    /// A scenario named `test` (a short name, in every object it creates).
    pub fn new(test: &str) -> Self {
        Self {
            test: test.to_owned(),
            ..Self::default()
        }
    }

    /// Kwok nodes as `specs` say, named `<id>-n<index>`.
    pub fn nodes(mut self, specs: &[NodeSpec]) -> Self {
        self.nodes.extend_from_slice(specs);
        self
    }

    /// One worker node in zone `a`.
    pub fn worker(self) -> Self {
        self.nodes(&[NodeSpec::worker("a")])
    }

    /// The nodes' NodeReports and Leases say their agents are alive (a heartbeat written
    /// now), for a test that runs no agent: the coordinator admits nothing to a node without.
    pub fn reporting(mut self) -> Self {
        self.reporting = true;
        self
    }

    /// A DisruptionPolicy `name` with `spec` (selecting this test's nodes unless it says).
    pub fn policy(mut self, name: &str, spec: Value) -> Self {
        self.policies.push((name.to_owned(), spec));
        self
    }

    /// The workspace's coordinator with `extra` arguments, started after the policies and
    /// ready when the scenario is. The test then runs alone.
    pub fn coordinator(mut self, extra: &[&str]) -> Self {
        self.coordinator = Some(extra.iter().map(|a| (*a).to_owned()).collect());
        self.alone()
    }

    /// The test runs while no other test of the process does: it acts on the whole cluster
    /// (starts a coordinator of its own, changes the CRDs).
    pub fn alone(mut self) -> Self {
        self.alone = true;
        self
    }

    /// Builds it: environment, nodes, heartbeats, policies, coordinator.
    pub async fn start(self) -> anyhow::Result<Scene> {
        let env = if self.alone {
            TestEnv::alone(&self.test).await?
        } else {
            TestEnv::new(&self.test).await?
        };
        env.create_nodes(&self.nodes).await?;
        let nodes: Vec<String> = (0..self.nodes.len()).map(|i| env.node_name(i)).collect();
        if self.reporting {
            env.heartbeats(&nodes).await?;
        }
        let mut policies = Vec::new();
        for (name, spec) in self.policies {
            policies.push(env.create_policy(&name, spec).await?);
        }
        let coordinator = match &self.coordinator {
            Some(extra) => {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                let coordinator = crate::daemon::coordinator(&env, &extra).await?;
                coordinator.wait_ready(READY).await?;
                Some(coordinator)
            }
            None => None,
        };
        Ok(Scene {
            env,
            nodes,
            policies,
            coordinator,
        })
    }
}
