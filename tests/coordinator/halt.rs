//! A halted rollout admits no one: two coordinators both acting as leader, the failure that
//! spends a policy's budget landing as it frees the policy's only slot, and agents whose
//! clocks are ahead of the coordinators' (an agent stamps `finishedAt` by its own clock). The
//! newcomer's rollout of 2026-12-07 had the next node admitted in the second of the halt.

use super::*;

/// How far ahead of the coordinators' clock each group's agent stamps its failure, in seconds:
/// every group is one try of the race, with its own policy and three nodes.
const AGENT_CLOCK_AHEAD: [i64; 10] = [0, 1, 2, 3, 5, 0, 1, 2, 3, 5];

const GROUP_LABEL: &str = "e2e.nodeward.io/group";

#[tokio::test]
async fn a_failure_that_spends_the_budget_as_it_frees_the_slot_admits_no_one_under_two_leaders()
-> anyhow::Result<()> {
    let groups = AGENT_CLOCK_AHEAD.len();
    let specs: Vec<NodeSpec> = (0..groups * 3)
        .map(|i| NodeSpec::worker("a").label(GROUP_LABEL, &format!("g{}", i / 3)))
        .collect();
    let env = scenario("halt-race", &specs).await?;
    let history = nodeward_e2e::history::watch(&env);
    let mut policies = Vec::new();
    for g in 0..groups {
        let selector = json!({"matchLabels": {TEST_LABEL: env.id, GROUP_LABEL: format!("g{g}")}});
        policies.push(
            env.create_policy(
                &format!("g{g}"),
                json!({"nodeSelector": selector, "maxConcurrent": 1,
                    "failureBudget": {"maxFailures": 1}}),
            )
            .await?,
        );
    }
    let a = start(&env, "a", &["--leader-elect=false"]).await?;
    let b = start(&env, "b", &["--leader-elect=false"]).await?;
    a.wait_ready(TIMEOUT).await?;
    b.wait_ready(TIMEOUT).await?;

    // Each group: its first node under way, the other two waiting for its slot.
    let node = |g: usize, i: usize| env.node_name(g * 3 + i);
    let mut first = Vec::new();
    for g in 0..groups {
        first.push(create_maintenance(&env, &node(g, 0)).await?);
    }
    for m in &first {
        wait_admitted(&env, m, TIMEOUT).await?;
    }
    let mut waiting = Vec::new();
    for g in 0..groups {
        let next = [
            create_maintenance(&env, &node(g, 1)).await?,
            create_maintenance(&env, &node(g, 2)).await?,
        ];
        for m in &next {
            wait_denied(&env, m, "BudgetExhausted").await?;
        }
        waiting.push(next);
    }

    // Every first node fails at once, each stamped by its agent's clock: the failure frees the
    // only slot and spends the budget in the same write.
    nodeward_e2e::concurrently(first.iter().zip(AGENT_CLOCK_AHEAD), groups, |(m, ahead)| {
        let env = &env;
        async move {
            let stamped = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(ahead);
            env.merge_maintenance_status(
                m,
                json!({"phase": "Failed", "finishedAt": stamped.to_string(),
                    "reason": "RolledBack", "message": "the AfterBoot hook exited with 1"}),
            )
            .await
        }
    })
    .await?;

    // Halted, and the two behind each failure are told so; neither was ever admitted.
    let api: Api<DisruptionPolicy> = Api::all(env.client.clone());
    for policy in &policies {
        wait::until(&api, policy, "Halted=True", TIMEOUT, |p| {
            p.and_then(|p| policy_condition(p, "Halted"))
                .is_some_and(|(status, _, _)| status == "True")
        })
        .await?;
    }
    // Each waiting one is told it waits for the resume, or was admitted (the failure this
    // test is for: counted below, so that a run says in how many groups).
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    for m in waiting.iter().flatten() {
        wait::until(
            &maintenances,
            m,
            "RolloutHalted, or admitted",
            TIMEOUT,
            |m| {
                m.is_some_and(|m| {
                    m.phase() != MaintenancePhase::Pending
                        || admitted_condition(m)
                            .is_some_and(|(_, reason, _)| reason == "RolloutHalted")
                })
            },
        )
        .await
        .with_context(|| format!("{}\n{}", a.output(), b.output()))?;
    }
    let h = history.lock().expect("history").clone();
    let admitted_after_a_failure: Vec<String> = waiting
        .iter()
        .zip(AGENT_CLOCK_AHEAD)
        .flat_map(|(next, ahead)| {
            next.iter()
                .filter(|m| h.admitted.contains_key(*m))
                .map(move |m| format!("{m} (its group's agent {ahead} s ahead)"))
        })
        .collect();
    assert!(
        admitted_after_a_failure.is_empty(),
        "admitted after the failure that spent the budget, in {} of {groups} groups: {}",
        admitted_after_a_failure.len(),
        admitted_after_a_failure.join(", ")
    );
    assert!(h.max_slots <= 1, "at most 1 slot, saw {}", h.max_slots);
    env.cleanup().await
}
