//! The short chaos soak (see `nodeward_e2e::chaos`; the 30-minute one with 100 nodes is
//! `bench/src/bin/chaos_soak.rs`). A test binary of its own: it restarts the API server, so
//! nothing else may run beside it. `NODEWARD_SOAK_SEED` replays a run (each run prints its seed).

use std::time::Duration;

use nodeward_e2e::{
    TestEnv,
    chaos::{self, Fault},
    daemon::sibling_binary,
};

#[tokio::test]
async fn a_rolling_reboot_under_every_fault_keeps_the_budget_and_leaves_nothing_behind()
-> anyhow::Result<()> {
    let env = TestEnv::new("soak").await?;
    let seed = match std::env::var("NODEWARD_SOAK_SEED") {
        Ok(seed) => seed.parse()?,
        Err(_) => jiff::Timestamp::now().as_nanosecond().unsigned_abs() as u64,
    };
    println!("seed {seed}");
    let settings = chaos::Settings {
        nodes: 6,
        max_concurrent: 2,
        duration: Duration::from_secs(120),
        mean_fault_interval: Duration::from_secs(10),
        max_dead_nodes: 1,
        settle: Duration::from_secs(240),
        seed,
        agent: sibling_binary("nodeward-agent")?,
        coordinator: sibling_binary("nodeward-coordinator")?,
    };
    let report = chaos::run(&env, &settings).await?;
    println!("{}", report.summary());
    assert_eq!(
        report.violations(),
        Vec::<String>::new(),
        "{}",
        report.summary()
    );
    for fault in Fault::ALL {
        assert!(
            report
                .faults
                .get(&fault)
                .is_some_and(|(count, _)| *count > 0),
            "{fault:?} was injected: {}",
            report.summary()
        );
    }
    // A node that never returns fails its maintenance, which spends the policy's failure
    // budget: the halt held until the soak resumed it (the violations above).
    assert!(
        report.halts > 0 && report.resumes > 0,
        "a failure halted the rollout and the soak resumed it: {}",
        report.summary()
    );
    assert!(
        report.succeeded > settings.nodes,
        "the rollout went on: {}",
        report.summary()
    );
    env.cleanup().await
}
