//! Patching's commands run as root on nodes: with the chart applied, an operator who may
//! create NodeMaintenances but not update DisruptionPolicies may ask for an update preset and
//! for nothing that names its own program (an update command, hooks); an administrator may.
//! The CRD refuses a malformed update or hook with the field named, and keeps them as created.

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

use super::*;

fn maintenance(name: &str, node: &str, spec: Value) -> anyhow::Result<NodeMaintenance> {
    let mut full = json!({"nodeName": node, "reason": "Manual", "action": "Reboot"});
    if let (Some(full), Some(extra)) = (full.as_object_mut(), spec.as_object()) {
        full.extend(extra.clone());
    }
    Ok(serde_json::from_value(json!({
        "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
        "metadata": {"name": name, "labels": {TEST_LABEL: "host-commands"}},
        "spec": full,
    }))?)
}

#[tokio::test]
async fn only_who_may_update_policies_may_put_a_host_command_in_a_maintenance() -> anyhow::Result<()>
{
    let (env, _dir, documents) = own_chart("host-commands").await?;
    let node = env.node_name(0);
    let operator = format!("{}-operator", env.id);
    let release = json!({"app.kubernetes.io/instance": env.id});
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-maintainer", env.id), "labels": release},
        "rules": [{"apiGroups": ["nodeward.io"], "resources": ["nodemaintenances"], "verbs": ["create", "get", "update", "delete"]}],
    }))?;
    Api::<ClusterRole>::all(env.client.clone())
        .create(&PostParams::default(), &role)
        .await?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("{}-maintainer", env.id), "labels": release},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role.name_any()},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": operator}],
    }))?;
    Api::<ClusterRoleBinding>::all(env.client.clone())
        .create(&PostParams::default(), &binding)
        .await?;
    let as_operator: Api<NodeMaintenance> = Api::all(
        client_as(Identity::Impersonate {
            user: operator.clone(),
            groups: vec!["system:authenticated".into()],
        })
        .await?,
    );
    let as_admin: Api<NodeMaintenance> = Api::all(env.client.clone());

    // A preset is the node's own package manager: the operator may (once RBAC has the binding).
    let preset = maintenance(
        &format!("{}-preset", env.id),
        &node,
        json!({"update": {"preset": "Apt"}}),
    )?;
    wait::eventually(
        "the operator's ClusterRoleBinding to take effect",
        Duration::from_secs(30),
        || {
            let (api, preset) = (as_operator.clone(), preset.clone());
            async move { Ok(api.create(&PostParams::default(), &preset).await.ok()) }
        },
    )
    .await?;

    // The chart's admission policy in force (the API server loads a new one within seconds): a
    // probe with a program of its own is refused by it once it is; one let through before is
    // deleted. By it: the other tests' releases have the same policy, cluster-wide, and one
    // deleted a second before may still refuse a request (this test once took such a refusal
    // for its own policy's, and the next request went through).
    let ours = format!(
        "ValidatingAdmissionPolicy '{}-nodeward-host-commands'",
        env.id
    );
    let tries = std::sync::atomic::AtomicU32::new(0);
    wait::eventually(
        "the host-commands admission policy in force",
        Duration::from_secs(60),
        || async {
            let n = tries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let name = format!("{}-probe-{n}", env.id);
            let probe = maintenance(&name, &node, json!({"update": {"command": ["/bin/true"]}}))?;
            match as_operator.create(&PostParams::default(), &probe).await {
                Ok(_) => {
                    as_admin.delete(&name, &Default::default()).await?;
                    Ok(None)
                }
                Err(kube::Error::Api(s)) if s.code == 403 => {
                    Ok(s.message.contains(&ours).then_some(()))
                }
                Err(e) => Err(e.into()),
            }
        },
    )
    .await?;

    // A rollback preset is the node's own tools too: still the operator's to ask for.
    as_operator
        .create(
            &PostParams::default(),
            &maintenance(
                &format!("{}-preset-rollback", env.id),
                &node,
                json!({"update": {"preset": "Apt", "rollback": {"preset": "Apt"}}}),
            )?,
        )
        .await
        .context("the operator creating an update with a rollback preset")?;
    let own_programs = [
        (
            "command",
            json!({"update": {"command": ["/usr/local/bin/patch-node"]}}),
        ),
        (
            "hooks",
            json!({"hooks": {"afterBoot": {"command": ["/bin/true"]}}}),
        ),
        (
            "rollback-command",
            json!({"update": {"preset": "Apt", "rollback": {"command": ["/usr/local/bin/undo"]}}}),
        ),
        (
            "preset-and-hook",
            json!({"update": {"preset": "Apt"}, "hooks": {"beforeDrain": {"command": ["/bin/true"]}}}),
        ),
    ];
    for (what, spec) in &own_programs {
        let name = format!("{}-{what}", env.id);
        let said = refusal(
            as_operator
                .create(
                    &PostParams::default(),
                    &maintenance(&name, &node, spec.clone())?,
                )
                .await,
        );
        assert!(
            said.starts_with("403")
                && said.contains(&format!("{operator} may not create NodeMaintenance {name}"))
                && said.contains("spec.update.command, spec.update.rollback.command or spec.hooks")
                && said.contains(&format!("root on node {node}")),
            "{what}: {said}"
        );
        // The administrator (who may update policies) may.
        as_admin
            .create(
                &PostParams::default(),
                &maintenance(&name, &node, spec.clone())?,
            )
            .await
            .with_context(|| format!("the admin creating {what}"))?;
    }

    for m in as_admin
        .list(&ListParams::default().labels(&format!("{TEST_LABEL}=host-commands")))
        .await?
    {
        as_admin
            .delete(&m.name_any(), &DeleteParams::default())
            .await?;
    }
    remove_chart(env, &documents).await
}

// Long: most of it is the table of refused specs, one entry per field and rule.
#[tokio::test]
async fn the_crds_name_a_malformed_update_or_hook_and_keep_them_as_created() -> anyhow::Result<()> {
    let env = TestEnv::new("patch-crd").await?;
    let node = env.node_name(0);
    let policies: Api<DisruptionPolicy> = Api::all(env.client.clone());
    let cases = [
        (
            json!({"update": {"preset": "Apt", "command": ["/usr/local/bin/patch"]}}),
            "spec.update",
            "give either preset (Apt, Dnf, Zypper, Bootc, RpmOstree) or command, not both",
        ),
        (
            json!({"update": {"reboot": "Always"}}),
            "spec.update",
            "give either preset",
        ),
        (
            json!({"update": {"command": ["apt-get", "upgrade"]}}),
            "spec.update.command",
            "the program must be an absolute path on the host",
        ),
        (
            json!({"update": {"preset": "Dnf", "rebootSentinel": "/run/x"}}),
            "spec.update",
            "rebootSentinel is for a command",
        ),
        (
            json!({"update": {"preset": "Apt", "timeout": "forever"}}),
            "spec.update.timeout",
            "should match",
        ),
        (
            json!({"update": {"preset": "Apt", "rollback": {"preset": "Apt", "command": ["/usr/local/bin/undo"]}}}),
            "spec.update.rollback",
            "give either preset (Apt, Bootc, RpmOstree) or command, not both",
        ),
        (
            json!({"update": {"preset": "Apt", "rollback": {"command": ["undo.sh"]}}}),
            "spec.update.rollback.command",
            "the program must be an absolute path on the host",
        ),
        (
            json!({"hooks": {"afterBoot": {"command": []}}}),
            "spec.hooks.afterBoot.command",
            "should have at least 1 items",
        ),
        (
            json!({"hooks": {"beforeDrain": {"command": ["quiesce.sh"]}}}),
            "spec.hooks.beforeDrain.command",
            "the program must be an absolute path on the host",
        ),
    ];
    for (index, (spec, field, message)) in cases.into_iter().enumerate() {
        let policy: DisruptionPolicy = serde_json::from_value(json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "DisruptionPolicy",
            "metadata": {"name": format!("{}-bad-{index}", env.id), "labels": {TEST_LABEL: env.id}},
            "spec": spec,
        }))?;
        let said = refusal(policies.create(&PostParams::default(), &policy).await);
        assert!(
            said.starts_with("422") && said.contains(field) && said.contains(message),
            "{spec}: {said}"
        );
    }
    let maintenances: Api<NodeMaintenance> = Api::all(env.client.clone());
    for (what, spec) in [
        ("preset", json!({"update": {"preset": "Apt"}})),
        (
            "hooks",
            json!({"hooks": {"afterBoot": {"command": ["/bin/true"]}}}),
        ),
    ] {
        maintenances
            .create(
                &PostParams::default(),
                &maintenance(&format!("{}-{what}", env.id), &node, spec)?,
            )
            .await?;
    }
    // The CRD: a preset it does not know is named; an update needs a Reboot; neither it nor
    // the hooks change once created.
    let unknown = |name: &str, update: Value| {
        json!({
            "apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
            "metadata": {"name": format!("{}-{name}", env.id)},
            "spec": {"nodeName": node, "reason": "Manual", "action": "Reboot", "update": update},
        })
    };
    let pacman = unknown("pacman", json!({"preset": "Pacman"}));
    let (dynamic, _) = dynamic_api(&env.client, &pacman).await?;
    refused_naming(
        &dynamic,
        pacman,
        "spec.update.preset",
        "supported values: \"Apt\", \"Dnf\"",
    )
    .await?;
    // A rollback preset of a package manager that cannot roll back.
    refused_naming(
        &dynamic,
        unknown(
            "dnf-rollback",
            json!({"preset": "Dnf", "rollback": {"preset": "Dnf"}}),
        ),
        "spec.update.rollback.preset",
        "supported values: \"Apt\", \"Bootc\", \"RpmOstree\"",
    )
    .await?;
    let said = refusal(
        maintenances
            .create(
                &PostParams::default(),
                &maintenance(
                    &format!("{}-drain-only", env.id),
                    &node,
                    json!({"action": "DrainOnly", "update": {"preset": "Apt"}}),
                )?,
            )
            .await,
    );
    assert!(
        said.starts_with("422")
            && said.contains("update runs before a reboot: it needs action Reboot"),
        "{said}"
    );
    for (name, change, says) in [
        (
            format!("{}-preset", env.id),
            json!({"spec": {"update": {"preset": "Dnf"}}}),
            "update is immutable",
        ),
        (
            format!("{}-hooks", env.id),
            json!({"spec": {"hooks": {"afterBoot": {"command": ["/bin/false"]}}}}),
            "hooks are immutable",
        ),
        (
            format!("{}-preset", env.id),
            json!({"spec": {"hooks": {"afterBoot": {"command": ["/bin/false"]}}}}),
            "hooks are immutable",
        ),
    ] {
        let said = refusal(
            maintenances
                .patch(
                    &name,
                    &PatchParams::default(),
                    &Patch::Merge(change.clone()),
                )
                .await,
        );
        assert!(
            said.starts_with("422") && said.contains(says),
            "{change}: {said}"
        );
    }
    env.cleanup().await
}

/// `object` is refused by the CRD (422), naming `field` and saying `says`.
async fn refused_naming(
    dynamic: &Api<kube::api::DynamicObject>,
    object: Value,
    field: &str,
    says: &str,
) -> anyhow::Result<()> {
    let said = refusal(
        dynamic
            .create(&PostParams::default(), &serde_json::from_value(object)?)
            .await,
    );
    assert!(
        said.starts_with("422") && said.contains(field) && said.contains(says),
        "{said}"
    );
    Ok(())
}
