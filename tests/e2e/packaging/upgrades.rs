//! Installing and upgrading with Helm: the CRDs upgrade with the release and their objects
//! survive, and a first install puts the agent's admission policy in force before its DaemonSet.

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};

use super::*;

#[tokio::test]
async fn helm_upgrades_the_crds_with_the_release_their_objects_survive_and_removed_checks_retire()
-> anyhow::Result<()> {
    // It changes the CRDs, so it runs while no other test does.
    let env = TestEnv::alone("helm-upgrade").await?;
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-upgrade-{}", env.id))?;
    let kubeconfig = nodeward_e2e::controlplane::shared().kubeconfig.clone();
    let helm_in = |args: &[&str], chart_dir: Option<&Path>| -> anyhow::Result<String> {
        let mut command = Command::new(helm()?);
        command.args(args);
        if let Some(chart_dir) = chart_dir {
            command.arg(chart_dir);
        }
        command
            .arg("--namespace")
            .arg(&env.namespace)
            .arg("--kubeconfig")
            .arg(&kubeconfig);
        run(&mut command)
    };
    // Workloads and policies of the release stay off every node: this test is about the CRDs.
    let values = dir.join("values.yaml");
    let values_with = |custom: Value| {
        serde_yaml::to_string(&json!({
            "agent": {"nodeSelector": {TEST_LABEL: "none"},
                      "config": {"detectors": {"custom": custom}}},
            "coordinator": {"nodeSelector": {TEST_LABEL: "none"}, "replicas": 1},
            "defaultPolicy": {"enabled": false},
        }))
    };
    // Installed with a custom check that the upgrade removes.
    std::fs::write(
        &values,
        values_with(json!([{"name": "retiring", "condition": "RetiringProblem",
                            "reason": "Failed", "command": ["/bin/true"]}]))?,
    )?;
    let values_arg = values.to_str().context("values path")?;

    // The CRDs exist already, as after an install of 0.1.0 (crds/ directory, never managed
    // by Helm): the README's one-time step lets the release adopt them.
    adopt_crds(&env.client, &env.id, &env.namespace).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    helm_in(
        &["install", &env.id, "--values", values_arg],
        Some(&chart()),
    )?;

    // As JSON (a typed DisruptionPolicy would drop the field the next version adds).
    let policy = |name: &str, probe: Option<&str>| -> anyhow::Result<DynamicObject> {
        let mut spec =
            json!({"maxConcurrent": 1, "nodeSelector": {"matchLabels": {TEST_LABEL: env.id}}});
        if let Some(probe) = probe {
            spec["upgradeProbe"] = json!(probe);
        }
        Ok(serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": name, "labels": {TEST_LABEL: env.id}}, "spec": spec,
        }))?)
    };
    let raw: Api<DynamicObject> = Api::all_with(
        env.client.clone(),
        &kube::api::ApiResource::erase::<DisruptionPolicy>(&()),
    );
    let kept = format!("{}-kept", env.id);
    raw.create(&PostParams::default(), &policy(&kept, None)?)
        .await?;
    // A field the installed schema does not know is pruned.
    let probe = format!("{}-probe", env.id);
    raw.create(&PostParams::default(), &policy(&probe, Some("v1"))?)
        .await?;
    let stored = raw.get(&probe).await?;
    assert!(
        stored.data["spec"]["upgradeProbe"].is_null(),
        "pruned before the upgrade: {:?}",
        stored.data
    );
    raw.delete(&probe, &DeleteParams::default()).await?;

    // A later chart version adds the field to its CRD, as a new release would.
    let next = dir.join("nodeward");
    run(Command::new("cp").arg("-r").arg(chart()).arg(&next))?;
    let crd_file = next.join("files/crds/disruptionpolicies.nodeward.io.yaml");
    let mut crd: Value = serde_yaml::from_str(&std::fs::read_to_string(&crd_file)?)?;
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["upgradeProbe"] =
        json!({"type": "string", "maxLength": 16, "description": "added by the next chart version"});
    std::fs::write(&crd_file, serde_yaml::to_string(&crd)?)?;
    let chart_file = next.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_file)?;
    std::fs::write(
        &chart_file,
        text.replace("\nversion: 0.1.0\n", "\nversion: 0.2.0\n"),
    )?;
    std::fs::write(&values, values_with(json!([]))?)?;
    let said = helm_in(&["upgrade", &env.id, "--values", values_arg], Some(&next))?;
    assert!(said.contains("has been upgraded"), "{said}");

    removed_check_retired(&env).await?;

    // The API server serves the new schema: the field is kept now.
    wait::eventually(
        "the upgraded schema to be served",
        Duration::from_secs(30),
        || async {
            let _ = raw.delete(&probe, &DeleteParams::default()).await;
            raw.create(&PostParams::default(), &policy(&probe, Some("v2"))?)
                .await?;
            let stored = raw.get(&probe).await?;
            Ok((stored.data["spec"]["upgradeProbe"] == "v2").then_some(()))
        },
    )
    .await?;
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let survived = policies.get(&kept).await?;
    assert_eq!(
        survived.spec.max_concurrent,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)
    );

    // Uninstalled: the CRDs and every object of theirs stay.
    helm_in(&["uninstall", &env.id], None)?;
    for crd in nodeward_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        assert!(crds.get_opt(&name).await?.is_some(), "{name} was kept");
    }
    policies.get(&kept).await?;

    // Back to the generated CRDs for the tests that share them.
    for crd in nodeward_api::crds::all() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let mut restored = crd.clone();
        let live = crds.get(&name).await?;
        restored.metadata.resource_version = live.metadata.resource_version;
        restored.metadata.labels = None;
        restored.metadata.annotations = None;
        crds.replace(&name, &PostParams::default(), &restored)
            .await?;
    }
    nodeward_e2e::env::apply_crds(&env.client).await?;
    for name in [&kept, &probe] {
        let _ = policies.delete(name, &DeleteParams::default()).await;
    }
    env.cleanup().await
}

/// A first `helm install`: Helm creates admission policies after every kind it knows, the
/// agent DaemonSet among them, so the chart installs a copy of the agents' policy as a
/// pre-install hook. The copy exists before the DaemonSet does, refuses an agent's escalation
/// on its own, and the coordinator (as its own identity) retires it once the release's own
/// binding is in force, never before.
#[tokio::test]
async fn a_first_install_puts_the_agents_admission_policy_in_force_before_the_daemonset()
-> anyhow::Result<()> {
    let (env, node) = TestEnv::with_worker("firstinstall", "a").await?;
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-firstinstall-{}", env.id))?;
    let kubeconfig = nodeward_e2e::controlplane::shared().kubeconfig.clone();
    let values = dir.join("values.yaml");
    std::fs::write(
        &values,
        serde_yaml::to_string(&json!({
            "agent": {"nodeSelector": {TEST_LABEL: env.id}},
            "coordinator": {"nodeSelector": {TEST_LABEL: "none"}, "replicas": 1},
            "defaultPolicy": {"enabled": false},
            "evictionWebhook": {"enabled": false},
        }))?,
    )?;
    let helm_in = |args: &[&str]| -> anyhow::Result<String> {
        run(Command::new(helm()?)
            .args(args)
            .arg("--namespace")
            .arg(&env.namespace)
            .arg("--kubeconfig")
            .arg(&kubeconfig))
    };

    // When the DaemonSet is created, from before the install on.
    let created = first_added(Api::namespaced(env.client.clone(), &env.namespace)).await?;
    adopt_crds(&env.client, &env.id, &env.namespace).await?;
    helm_in(&[
        "install",
        &env.id,
        chart().to_str().context("chart path")?,
        "--values",
        values.to_str().context("values path")?,
    ])?;
    let daemonset_created: u64 = created
        .await??
        .context("the DaemonSet's creation")?
        .parse()?;

    let own = format!("{}-nodeward-agent-own-node", env.id);
    let copy = format!("{own}-bootstrap");
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(env.client.clone());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(env.client.clone());
    copy_created_before(&bindings, &policies, &copy, daemonset_created).await?;

    // Without the release's own binding (as in the moment before Helm creates it), the copy
    // alone refuses an escalation by the agent's identity.
    let own_binding = bindings.get(&own).await?;
    bindings.delete(&own, &DeleteParams::default()).await?;
    let agent = agent_on(&env, &node).await?;
    let as_agent: Api<Node> = Api::all(agent);
    let control_plane = Patch::Merge(
        json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
    );
    // The API server loads policies and bindings from its watches, within moments of their
    // changes: the attack is tried as a dry run (admitted or not, nothing is written) until the
    // copy alone refuses it.
    let dry_run = PatchParams::default().dry_run();
    let said = wait::eventually(
        "a refusal by the copy alone",
        Duration::from_secs(30),
        || async {
            let said = refusal(as_agent.patch(&node, &dry_run, &control_plane).await);
            Ok(said
                .contains(&format!("with binding '{copy}'"))
                .then_some(said))
        },
    )
    .await?;
    assert!(said.starts_with("403"), "{said}");
    assert!(
        said.contains("may change only the nodeward.io/agent label of its Node"),
        "{said}"
    );

    // The coordinator, as the chart's coordinator identity, keeps the copy while the release's
    // binding is missing and retires it once that binding is in force.
    let lease_name = format!("{}-nodeward-coordinator", env.id);
    let coordinator_kubeconfig = dir.join("coordinator.kubeconfig");
    write_kubeconfig(
        Identity::Token(token(&env, &lease_name, None).await?),
        &coordinator_kubeconfig,
    )?;
    let policy_flag = format!("--agent-admission-policy={own}");
    let coordinator = nodeward_e2e::daemon::coordinator_as(
        &env,
        &coordinator_kubeconfig,
        &["--lease-name", &lease_name, &policy_flag],
    )?;
    coordinator
        .wait_ready(Duration::from_secs(60))
        .await
        .with_context(|| coordinator.output())?;
    assert!(
        bindings.get_opt(&copy).await?.is_some(),
        "kept while the release's binding is missing"
    );
    let mut restored = own_binding.clone();
    restored.metadata = kube::api::ObjectMeta {
        name: Some(own.clone()),
        labels: own_binding.metadata.labels.clone(),
        ..Default::default()
    };
    bindings.create(&PostParams::default(), &restored).await?;
    wait::eventually("the copy retired", Duration::from_secs(90), || async {
        let gone =
            bindings.get_opt(&copy).await?.is_none() && policies.get_opt(&copy).await?.is_none();
        Ok(gone.then_some(()))
    })
    .await
    .with_context(|| coordinator.output())?;
    assert!(bindings.get_opt(&own).await?.is_some() && policies.get_opt(&own).await?.is_some());
    drop(coordinator);

    helm_in(&["uninstall", &env.id])?;
    env.cleanup().await
}

/// Watches for the first DaemonSet added in `daemonsets` from now on; its resource version.
async fn first_added(
    daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet>,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Option<String>>>> {
    use kube::api::{WatchEvent, WatchParams};
    let from = daemonsets
        .list(&ListParams::default())
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();
    let watching = daemonsets;
    Ok(tokio::spawn(async move {
        let events = watching
            .watch(&WatchParams::default().timeout(120), &from)
            .await?;
        futures::pin_mut!(events);
        while let Some(event) = events.try_next().await? {
            if let WatchEvent::Added(daemonset) = event {
                return Ok(daemonset.resource_version());
            }
        }
        anyhow::Ok(None)
    }))
}

/// The first-install copy of the agent's policy and its binding were created before the
/// DaemonSet (created at resource version `daemonset_created`).
async fn copy_created_before(
    bindings: &Api<ValidatingAdmissionPolicyBinding>,
    policies: &Api<ValidatingAdmissionPolicy>,
    copy: &str,
    daemonset_created: u64,
) -> anyhow::Result<()> {
    // Never changed since it was created, so its resource version is its creation's (one etcd:
    // the versions of all objects are one sequence).
    let version = |rv: Option<String>, of: &str| -> anyhow::Result<u64> {
        Ok(rv
            .with_context(|| format!("{of}'s resource version"))?
            .parse()?)
    };
    let copy_created = version(bindings.get(copy).await?.resource_version(), "the copy")?;
    let policy_created = version(
        policies.get(copy).await?.resource_version(),
        "the copy's policy",
    )?;
    assert!(
        policy_created < daemonset_created && copy_created < daemonset_created,
        "the copy (policy {policy_created}, binding {copy_created}) before the DaemonSet ({daemonset_created})"
    );

    Ok(())
}

/// The upgraded release's agent policy retires the condition type of the check the upgrade
/// removed (found with `lookup` in the release's policy before): its agents may remove it, not
/// set it.
async fn removed_check_retired(env: &TestEnv) -> anyhow::Result<()> {
    let agents_policy: ValidatingAdmissionPolicy = Api::all(env.client.clone())
        .get(&format!("{}-nodeward-agent-own-node", env.id))
        .await?;
    let variables = agents_policy
        .spec
        .and_then(|s| s.variables)
        .unwrap_or_default();
    let variable = |name: &str| {
        variables
            .iter()
            .find(|v| v.name == name)
            .map(|v| v.expression.clone())
    };
    assert_eq!(
        variable("retiredConditions").as_deref(),
        Some(r#"["RetiringProblem"]"#)
    );
    assert!(
        !variable("agentConditions")
            .unwrap_or_default()
            .contains("RetiringProblem")
    );
    Ok(())
}
