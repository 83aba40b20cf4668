//! The chart rendered: `helm lint` and `helm template` with the default values and with every
//! option on, the CRDs it carries against the generated ones, the agent's admission policy's
//! condition list, and `systemd-analyze verify` on the host-mode unit.

use super::*;

#[tokio::test]
async fn the_chart_lints_and_renders_with_default_and_all_on_values() -> anyhow::Result<()> {
    let all_on = chart().join("ci/all-on-values.yaml");
    for values in [None, Some(all_on.as_path())] {
        let mut lint = Command::new(helm()?);
        lint.arg("lint").arg("--strict").arg(chart());
        if let Some(file) = values {
            lint.arg("--values").arg(file);
        }
        let said = run(&mut lint)?;
        assert!(said.contains("0 chart(s) failed"), "{said}");
    }

    let defaults = render("nodeward", "nodeward-system", &[])?;
    let expected = [
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "ClusterRoleBinding",
        "ConfigMap",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "CustomResourceDefinition",
        "DaemonSet",
        "Deployment",
        "DisruptionPolicy",
        "PodDisruptionBudget",
        // Each daemon's in nodeward's namespace (the agent: its Lease, what the coordinator
        // publishes for it).
        "Role",
        "Role",
        "RoleBinding",
        "RoleBinding",
        "Service",
        "Service",
        "Service",
        "ServiceAccount",
        "ServiceAccount",
        // The agent's and the coordinator's admission policies and the one for host commands
        // in maintenances, each with its binding, and the agent's first-install copy (a
        // pre-install hook).
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingAdmissionPolicyBinding",
        "ValidatingWebhookConfiguration",
    ];
    assert_eq!(kinds(&defaults), expected);
    let all = render("nodeward", "nodeward-system", &[&all_on])?;
    let mut with_monitoring: Vec<&str> = expected.to_vec();
    with_monitoring.extend(["PrometheusRule", "ServiceMonitor", "ServiceMonitor"]);
    with_monitoring.sort();
    assert_eq!(kinds(&all), with_monitoring);

    // The agent: every node, host network, no capabilities but raw sockets, read-only root,
    // only the host paths it uses.
    let ds = find(&defaults, "DaemonSet")?;
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["tolerations"], json!([{"operator": "Exists"}]));
    let security = &pod["containers"][0]["securityContext"];
    assert_eq!(
        security["capabilities"],
        json!({"drop": ["ALL"], "add": ["NET_RAW"]})
    );
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["seccompProfile"]["type"], "RuntimeDefault");
    let host_paths: Vec<&str> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str())
        .collect();
    // The host's journal (where the kernel log is read by default) read-only, through the
    // parents of its directories; never /dev/kmsg, and never privileged.
    assert_eq!(
        host_paths,
        [
            "/run/dbus/system_bus_socket",
            "/etc/systemd/logind.conf.d",
            "/var/log",
            "/run/log"
        ]
    );
    for journal in ["/host/var/log", "/host/run/log"] {
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["mountPath"] == journal);
        assert_eq!(
            mount.map(|m| m["readOnly"] == true),
            Some(true),
            "{journal}"
        );
    }
    assert!(security["privileged"].is_null(), "{security}");
    // The drop-in directory is writable (writeDropIn is on by default: a stock node's 5 s
    // leaves a drain nothing), read-only when it is turned off.
    let logind_conf_read_only = |pod: &Value| {
        pod["containers"][0]["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["name"] == "logind-conf")
            .map(|m| m["readOnly"] == true)
    };
    assert_eq!(logind_conf_read_only(pod), Some(false));
    assert!(pod["containers"][0]["resources"]["limits"]["memory"].is_string());
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-chart-{}", std::process::id()))?;
    let no_drop_in = dir.join("no-drop-in.yaml");
    std::fs::write(
        &no_drop_in,
        "agent: {shutdownGuard: {writeDropIn: false}}\n",
    )?;
    let without = render("nodeward", "nodeward-system", &[&no_drop_in])?;
    let without_pod = &find(&without, "DaemonSet")?["spec"]["template"]["spec"];
    assert_eq!(logind_conf_read_only(without_pod), Some(true));

    // Fencing: the watchdog device mounted, which only a privileged container may use.
    let fenced = &find(&all, "DaemonSet")?["spec"]["template"]["spec"];
    assert_eq!(
        fenced["containers"][0]["securityContext"]["privileged"],
        true
    );
    let watchdog = fenced["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == "watchdog");
    assert_eq!(
        watchdog.map(|v| &v["hostPath"]),
        Some(&json!({"path": "/dev/watchdog1", "type": "CharDevice"}))
    );
    let config = find(&all, "ConfigMap")?["data"]["agent.yaml"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(config.contains("fenceAfter: 2m"), "{config}");

    coordinator_spread_and_hardened(&defaults)?;
    agent_accepts_what_is_rendered(&dir, &[("default", &defaults), ("all-on", &all)])?;
    Ok(())
}

#[test]
fn the_systemd_unit_verifies() -> anyhow::Result<()> {
    let unit = std::fs::read_to_string(repo_root().join("systemd/nodeward-agent.service"))?;
    // systemd-analyze checks that ExecStart's program exists: point it at the built agent.
    let agent = sibling_binary("nodeward-agent")?;
    assert!(unit.contains("/usr/local/bin/nodeward-agent"));
    let dir = nodeward_e2e::scratch::dir(&format!("nodeward-unit-{}", std::process::id()))?;
    let file = dir.join("nodeward-agent.service");
    std::fs::write(&file, unit.replace("/usr/local/bin/nodeward-agent", &agent))?;
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&file)
        .output()?;
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "systemd-analyze verify failed: {said}"
    );
    assert!(
        !said.contains("nodeward-agent.service"),
        "systemd-analyze has something to say about the unit: {said}"
    );
    let dropin =
        std::fs::read_to_string(repo_root().join("systemd/logind.conf.d/zz-nodeward.conf"))?;
    assert!(
        dropin.contains("[Login]\nInhibitDelayMaxSec=120\n"),
        "{dropin}"
    );
    Ok(())
}

#[test]
fn the_admission_policy_lets_the_agent_write_its_detectors_conditions_and_the_configured_ones()
-> anyhow::Result<()> {
    let allowed = |documents: &[Value]| -> anyhow::Result<Vec<String>> {
        let policy = find(documents, "ValidatingAdmissionPolicy")?;
        let variable = policy["spec"]["variables"]
            .as_array()
            .and_then(|v| v.iter().find(|v| v["name"] == "agentConditions"))
            .context("the agentConditions variable")?;
        let expression = variable["expression"].as_str().context("its expression")?;
        Ok(serde_json::from_str(expression)?)
    };
    let defaults = render("nodeward", "nodeward-system", &[])?;
    assert_eq!(
        allowed(&defaults)?,
        nodeward_api::conditions::node::WRITTEN_BY_AGENT
    );
    let configured = render_values(
        "conditions",
        "agent:\n  config:\n    detectors:\n      custom:\n      - {name: ntp, condition: NTPProblem, reason: Skew, command: [/bin/true]}\n      kernelLog:\n        patterns:\n        - {reason: Stuck, regex: stuck, condition: NetDeviceStuck}\n        - {reason: Oops, regex: oops}\n",
    )?;
    let mut expected: Vec<&str> = nodeward_api::conditions::node::WRITTEN_BY_AGENT.to_vec();
    expected.extend(["NTPProblem", "NetDeviceStuck"]);
    assert_eq!(allowed(&configured)?, expected);
    Ok(())
}

#[test]
fn the_crds_the_chart_renders_are_the_ones_generated_from_the_types() -> anyhow::Result<()> {
    let rendered = render("nodeward", "nodeward-system", &[])?;
    let crds: Vec<&Value> = rendered
        .iter()
        .filter(|d| d["kind"] == "CustomResourceDefinition")
        .collect();
    let generated = nodeward_api::crds::all();
    assert_eq!(crds.len(), generated.len());
    for crd in generated {
        let name = crd.metadata.name.clone().unwrap_or_default();
        let ours = crds
            .iter()
            .find(|d| d["metadata"]["name"] == name.as_str())
            .with_context(|| format!("{name} is not rendered"))?;
        assert_eq!(
            whole_numbers_as_integers(ours["spec"].clone()),
            whole_numbers_as_integers(serde_json::to_value(&crd.spec)?),
            "{name}: the rendered schema is the generated one"
        );
        assert_eq!(
            ours["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
            "{name}: kept on uninstall"
        );
    }
    // Managed apart (GitOps applying files/crds/ first): not rendered.
    let without = render_values("crds", "crds: {install: false}\n")?;
    assert!(!kinds(&without).contains(&"CustomResourceDefinition".to_owned()));
    Ok(())
}

/// `value` with every whole floating-point number as an integer: a schema's `minimum: 0` is a
/// float in the CRD type (0.0) and an integer once helm has rendered it, the same number.
fn whole_numbers_as_integers(value: Value) -> Value {
    match value {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => json!(f as i64),
            _ => Value::Number(n),
        },
        Value::Array(items) => items.into_iter().map(whole_numbers_as_integers).collect(),
        Value::Object(fields) => Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k, whole_numbers_as_integers(v)))
                .collect(),
        ),
        other => other,
    }
}

/// The coordinator: two replicas on different nodes, non-root, read-only root.
fn coordinator_spread_and_hardened(rendered: &[Value]) -> anyhow::Result<()> {
    let deployment = find(rendered, "Deployment")?;
    assert_eq!(deployment["spec"]["replicas"], 2);
    let spec = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        spec["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    assert_eq!(
        spec["containers"][0]["securityContext"]["capabilities"],
        json!({"drop": ["ALL"]})
    );

    Ok(())
}

/// The agent accepts the configuration each rendering gives it (`check` exits 2 on an
/// invalid one); the files go in `dir`.
fn agent_accepts_what_is_rendered(
    dir: &std::path::Path,
    renderings: &[(&str, &Vec<Value>)],
) -> anyhow::Result<()> {
    for (name, documents) in renderings {
        let config = find(documents, "ConfigMap")?["data"]["agent.yaml"]
            .as_str()
            .context("agent.yaml")?;
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, config)?;
        let output = Command::new(sibling_binary("nodeward-agent")?)
            .args(["check", "--output", "json", "--config"])
            .arg(&file)
            .output()?;
        assert_ne!(
            output.status.code(),
            Some(2),
            "the agent refused the {name} configuration:\n{config}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(())
}
