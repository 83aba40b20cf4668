//! node-problem-detector's DaemonSet and ConfigMap as nodeward's chart values: the monitor
//! files the agent loads as they are (kmsg, journald and custom plugin monitors,
//! `agent.npd.configs`),
//! what nodeward's own detectors already do (the image's built-in monitors, the journal
//! monitors, the health checkers, system stats), a health gate that waits for the monitors'
//! conditions, and what does not carry over.

use std::collections::BTreeMap;

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{ConfigMap, Container},
};
use serde_json::{Map, Value, json};

use super::Migration;

/// The monitor flags node-problem-detector reads its files from.
const MONITOR_FLAGS: [&str; 3] = [
    "config.system-log-monitor",
    "config.custom-plugin-monitor",
    "config.system-stats-monitor",
];

/// What nodeward does instead of a node-problem-detector monitor it does not load.
fn instead(file: &str, plugin: &str) -> Option<&'static str> {
    let name = file.rsplit('/').next().unwrap_or(file);
    Some(match (name, plugin) {
        (n, _) if n.starts_with("system-stats-monitor") || n.contains("stats-monitor") => {
            "host statistics are the agent's nodeward_host_* metrics (hostStats, on by default)"
        }
        (n, _) if n.starts_with("systemd-monitor") => {
            "kubelet and container runtime restarts are the kubelet (KubeletProblem FrequentRestarts) and containerRuntime (FrequentContainerdRestart) detectors, read from systemd over the bus; for its KubeletStart/ContainerdStart Events put the file in agent.npd.configs (a journald monitor, loaded as it is)"
        }
        (n, _) if n.starts_with("docker-monitor") => {
            "Docker is not a Kubernetes runtime since 1.24; containerd's health is the containerRuntime detector"
        }
        (n, _) if n.starts_with("health-checker-kubelet") => {
            "the kubelet detector checks healthz, the unit and its restarts"
        }
        (n, _)
            if n.starts_with("health-checker-containerd")
                || n.starts_with("health-checker-docker") =>
        {
            "the containerRuntime detector checks the unit, its restarts and (agent.criSocket) the CRI socket"
        }
        (_, "filelog") => {
            "the agent reads the kernel log and programs' messages from the journal; plain log file monitors are not loaded: write a custom check for what they watched"
        }
        _ => return None,
    })
}

/// node-problem-detector's container and its flags (`--flag=value` or `--flag value`).
fn flags(daemonset: &DaemonSet) -> Result<(Container, BTreeMap<String, String>), String> {
    let container = super::program_container(daemonset, "node-problem-detector")?;
    // A repeated flag: the last one counts, as Go's flag package has it.
    let flags = super::container_flags(&container).into_iter().collect();
    Ok((container, flags))
}

/// The text of the file at `path` inside the container, from the ConfigMap mounted there.
fn file_text(
    daemonset: &DaemonSet,
    container: &Container,
    configmaps: &[ConfigMap],
    path: &str,
) -> Option<String> {
    let volumes = super::pod_spec(daemonset).ok()?.volumes.as_ref()?;
    for mount in container.volume_mounts.iter().flatten() {
        let Some(rest) = path.strip_prefix(&format!("{}/", mount.mount_path.trim_end_matches('/')))
        else {
            continue;
        };
        let Some(source) = volumes
            .iter()
            .find(|v| v.name == mount.name)
            .and_then(|v| v.config_map.as_ref())
        else {
            continue;
        };
        // With items, each key is mounted at its own path; without, at its own name.
        let key = match &source.items {
            Some(items) => items.iter().find(|i| i.path == rest)?.key.clone(),
            None => rest.to_owned(),
        };
        let configmap = configmaps
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(source.name.as_str()))?;
        return configmap.data.as_ref()?.get(&key).cloned();
    }
    None
}

/// What the monitor files given to node-problem-detector come to.
#[derive(Default)]
struct Found {
    /// The files the agent loads as they are, by file name.
    configs: Map<String, Value>,
    /// Condition types of those files.
    conditions: Vec<String>,
    /// A monitor of the kernel log is among them.
    kernel_log: bool,
    /// The plugin paths of their rules.
    plugins: Vec<String>,
    notes: Vec<String>,
}

impl Found {
    /// Takes in the monitor `file` of `flag`, whose text is `text` (none: not in a mounted
    /// ConfigMap).
    fn monitor(&mut self, flag: &str, file: &str, text: Option<String>) -> Result<(), String> {
        let Some(text) = text else {
            let note = instead(file, "").unwrap_or(
                "not in a ConfigMap this DaemonSet mounts (the image's own file?); nodeward's kernel-log defaults are node-problem-detector's kernel monitor, and its filesystem detector and ReadonlyFilesystem pattern cover the read-only monitor",
            );
            self.notes.push(format!("--{flag} {file}: {note}"));
            return Ok(());
        };
        let monitor: Value =
            serde_json::from_str(&text).map_err(|e| format!("--{flag} {file}: not JSON: {e}"))?;
        let plugin = monitor["plugin"].as_str().unwrap_or_default();
        let loaded = matches!(
            (flag, plugin),
            ("config.system-log-monitor", "kmsg" | "journald")
                | ("config.custom-plugin-monitor", "custom")
        );
        if !loaded {
            self.notes.push(format!(
                "--{flag} {file} ({plugin}): {}",
                instead(file, plugin).unwrap_or("not a monitor the agent loads")
            ));
            return Ok(());
        }
        let name = file.rsplit('/').next().unwrap_or(file).to_owned();
        self.configs.insert(name, json!(text));
        self.kernel_log |= plugin == "kmsg"
            || (plugin == "journald" && monitor["pluginConfig"]["source"] == "kernel");
        let types = monitor["conditions"].as_array().into_iter().flatten();
        self.conditions
            .extend(types.filter_map(|c| c["type"].as_str()).map(str::to_owned));
        let rules = monitor["rules"].as_array().into_iter().flatten();
        self.plugins
            .extend(rules.filter_map(|r| r["path"].as_str()).map(str::to_owned));
        if let Some(note) = instead(file, plugin) {
            self.notes
                .push(format!("--{flag} {file}: loaded as it is; also: {note}"));
        }
        Ok(())
    }
}

/// node-problem-detector's other flags, and what the agent does instead.
const OTHER_FLAGS: [(&str, &str); 4] = [
    (
        "prometheus-address",
        "the agent serves /metrics on --listen (0.0.0.0:9470); its problem series is nodeward_finding{type}",
    ),
    (
        "prometheus-port",
        "the agent serves /metrics on --listen (0.0.0.0:9470); its problem series is nodeward_finding{type}",
    ),
    (
        "enable-k8s-exporter",
        "the agent always writes Node conditions and Events",
    ),
    (
        "config.custom-plugin-monitor-heartbeat",
        "conditions are written when they change, with a Lease as the agent's heartbeat",
    ),
];

/// The chart values, a DisruptionPolicy whose health gate waits for the monitors' conditions,
/// and the notes, for node-problem-detector's `daemonset` with its `configmaps`.
pub fn migrate(daemonset: &DaemonSet, configmaps: &[ConfigMap]) -> Result<Migration, String> {
    let (container, flags) = flags(daemonset)?;
    let mut found = Found::default();
    for flag in MONITOR_FLAGS {
        for file in flags.get(flag).into_iter().flat_map(|v| v.split(',')) {
            let file = file.trim();
            if !file.is_empty() {
                let text = file_text(daemonset, &container, configmaps, file);
                found.monitor(flag, file, text)?;
            }
        }
    }
    let Found {
        configs,
        mut conditions,
        kernel_log,
        mut plugins,
        mut notes,
    } = found;
    for (flag, note) in OTHER_FLAGS {
        if flags.contains_key(flag) {
            notes.push(format!("--{flag}: {note}"));
        }
    }
    plugins.sort();
    plugins.dedup();
    if !plugins.is_empty() {
        notes.push(format!(
            "the plugins run on the host (the agent's image has no shell): put {} on every node, relative paths under agent.npd.pluginRoot (/)",
            plugins.join(", ")
        ));
    }
    let mut agent = Map::new();
    if !configs.is_empty() {
        agent.insert("npd".into(), json!({"configs": configs}));
    }
    if kernel_log {
        agent.insert("kernelLog".into(), json!(true));
        notes.push(
            "agent.kernelLog: the kernel log is read from the host's journal files, mounted read-only (no privileged pod); set agent.kernelLogSource: kmsg on hosts without journald, which runs the pod privileged as node-problem-detector's was".into(),
        );
    }
    let values = match agent.is_empty() {
        true => json!({}),
        false => json!({"agent": agent}),
    };
    conditions.extend(
        nodeward_api::conditions::node::HEALTH_GATE_DEFAULT
            .iter()
            .map(|c| (*c).to_owned()),
    );
    conditions.sort();
    conditions.dedup();
    Ok(Migration {
        policy_spec: json!({"healthGate": {"for": "2m", "problemTypes": conditions}}),
        values,
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// node-problem-detector's own DaemonSet and ConfigMap (kubernetes/node-problem-detector,
    /// deployment/, Apache-2.0), as shipped.
    const NPD_DS: &str = include_str!("testdata/npd-ds.yaml");
    const NPD_CONFIG: &str = include_str!("testdata/npd-config.yaml");

    fn shipped() -> (DaemonSet, ConfigMap) {
        (
            serde_yaml::from_str(NPD_DS).expect("the DaemonSet"),
            serde_yaml::from_str(NPD_CONFIG).expect("the ConfigMap"),
        )
    }

    #[test]
    fn the_shipped_daemonset_becomes_values_that_load_its_monitors_and_a_gate_on_their_conditions()
    {
        let (ds, cm) = shipped();
        let m = migrate(&ds, &[cm]).expect("migrated");
        let configs = &m.values["agent"]["npd"]["configs"];
        let kernel = configs["kernel-monitor.json"]
            .as_str()
            .expect("kernel monitor");
        assert!(kernel.contains("\"plugin\": \"kmsg\""), "{kernel}");
        assert!(configs.get("readonly-monitor.json").is_some(), "{configs}");
        assert_eq!(m.values["agent"]["kernelLog"], json!(true));
        let gate = m.policy_spec["healthGate"]["problemTypes"]
            .as_array()
            .expect("problem types");
        for expected in ["KernelDeadlock", "ReadonlyFilesystem", "KubeletProblem"] {
            assert!(gate.contains(&json!(expected)), "{expected}: {gate:?}");
        }
        let docker = m
            .notes
            .iter()
            .find(|n| n.contains("docker-monitor.json"))
            .expect("a note on the Docker monitor");
        assert!(
            docker.contains("Docker is not a Kubernetes runtime"),
            "{docker}"
        );
        let policy: nodeward_api::DisruptionPolicySpec =
            serde_json::from_value(m.policy_spec).expect("a DisruptionPolicy spec");
        assert!(policy.health_gate.is_some());
    }

    #[test]
    fn a_file_in_no_mounted_configmap_and_plugins_are_named() {
        let (ds, cm) = shipped();
        let m = migrate(&ds, &[]).expect("migrated");
        assert!(m.values.get("agent").is_none(), "{}", m.values);
        assert_eq!(m.notes.len(), 3, "{:?}", m.notes);
        assert!(
            m.notes[0].contains("the image's own file"),
            "{}",
            m.notes[0]
        );

        let mut custom = ds.clone();
        let args = custom
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|s| s.containers.first_mut())
            .and_then(|c| c.command.as_mut())
            .expect("command");
        args.push("--config.custom-plugin-monitor=/config/network-problem-monitor.json".into());
        args.push("--prometheus-port=20257".into());
        let mut cm = cm;
        cm.data.get_or_insert_with(Default::default).insert(
            "network-problem-monitor.json".into(),
            include_str!("../../../agent/src/npd/testdata/network-problem-monitor.json").into(),
        );
        let volume = custom
            .spec
            .as_mut()
            .and_then(|s| s.template.spec.as_mut())
            .and_then(|s| s.volumes.as_mut())
            .and_then(|v| v.iter_mut().find(|v| v.name == "config"))
            .and_then(|v| v.config_map.as_mut())
            .and_then(|c| c.items.as_mut())
            .expect("items");
        volume.push(k8s_openapi::api::core::v1::KeyToPath {
            key: "network-problem-monitor.json".into(),
            path: "network-problem-monitor.json".into(),
            mode: None,
        });
        let m = migrate(&custom, &[cm]).expect("migrated");
        assert!(m.values["agent"]["npd"]["configs"]["network-problem-monitor.json"].is_string());
        assert!(
            m.notes.iter().any(|n| n
                .contains("./config/plugin/dns_problem.sh, ./config/plugin/network_problem.sh")),
            "{:?}",
            m.notes
        );
        assert!(
            m.notes.iter().any(|n| n.starts_with("--prometheus-port")),
            "{:?}",
            m.notes
        );
    }
}
