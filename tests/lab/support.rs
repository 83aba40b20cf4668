//! What the node-lab tests share: the lab, the chart installed once as users install it
//! ([`release`]), each test's turn on it ([`turns`]) from a settled lab, what a test undoes,
//! the host-mode agent.

use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::{
    apps::v1::{DaemonSet, Deployment},
    authentication::v1::TokenRequest,
    core::v1::{Namespace, Node, Pod, ServiceAccount},
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use nodeward_api::{
    DisruptionPolicy, NodeMaintenance, NodeReport,
    labels::{AGENT_GROUP, AGENT_USER_PREFIX},
    report::{AgentMode, Finding, NodeReportStatus},
};
use nodeward_e2e::{
    controlplane,
    fixtures::{self, MaintenanceSpec},
    nodelab::{self, NodeLab, Vm},
    wait,
};
use serde_json::{Value, json};

use crate::{
    fencing::CUT_OFF_RESTORED,
    network::NETWORK_RESTORED,
    patching::APT_RESTORED,
    release, stories,
    turns::{self, Turn},
};

/// The chart's release and namespace in the lab.
pub const RELEASE: &str = "nodeward";
pub const NAMESPACE: &str = "nodeward-system";
/// The busybox image the lab builds (imported into every node; nothing is pulled).
pub const BUSYBOX: &str = "nodeward.test/busybox:1";
/// Where workload pods write the SIGTERMs they get (a host path on their node).
pub const TERM_LOG_DIR: &str = "/var/lib/nodelab-test";

/// Marks the namespaces and maintenances lab tests create (deleted before the next test
/// starts).
pub const TEST_LABEL: &str = "nodelab.nodeward.io/test";
/// Marks a node whose agent runs in host mode (the chart's agent is kept off it).
pub const HOST_MODE_LABEL: &str = "nodelab.nodeward.io/host-mode";
/// Marks a node a test cordoned as an admin would: the next test's reset uncordons it.
const ADMIN_CORDON_LABEL: &str = "nodelab.nodeward.io/admin-cordon";
/// How a host-mode agent authenticates (README, "Host mode").
#[derive(Clone, Copy, Debug)]
pub enum HostCredential {
    /// A token of the agent's service account bound to the Node.
    NodeToken,
    /// A client certificate for `nodeward:agent:<node>` in the chart's group, issued through
    /// the CSR API.
    Certificate,
}

/// A host-mode agent's `/etc/nodeward/agent.yaml`: the lab's fast kubelet and peer detectors
/// (as [`FAST_DETECTORS`]), a Node missing for 30 s an unregistered kubelet, the reboot gate
/// on, reboots by signal to PID 1, and the patched package's version in its inventory.
pub const HOST_AGENT_CONFIG: &str = "detectors:
  kubelet: {interval: 5s, timeout: 5s, for: 10s, registrationTimeout: 30s}
  peers: {interval: 5s, timeout: 5s, for: 10s}
shutdownGuard:
  rebootGate: true
reboot:
  method: signal
inventory: {packages: [nodeward-lab-patch], pendingUpdates: true}
";
/// Turns the kubelet's own graceful node shutdown on in a guest (its configuration kept aside
/// for [`KUBELET_SHUTDOWN_OFF`]): 30 s, 10 s of them for critical pods; with the drop-in the
/// kubelet writes where logind's delay is shorter than its grace period (`99-kubelet.conf`,
/// 30 s), as on a node where the kubelet's was set up first, and logind reloaded.
pub const KUBELET_SHUTDOWN_ON: &str = "cd /etc/kubernetes && { [ -e kubelet.yaml.lab ] || cp kubelet.yaml kubelet.yaml.lab; } && \
    cp kubelet.yaml.lab kubelet.yaml && \
    printf 'shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n' >> kubelet.yaml && \
    printf '[Login]\nInhibitDelayMaxSec=30\n' > /etc/systemd/logind.conf.d/99-kubelet.conf && \
    systemctl kill -s HUP systemd-logind && \
    systemctl restart kubelet";
/// What the registration test changes on a node (`registration.rs`), undone: the
/// drop-in gone, the CNI configuration back (containerd restarted to read it), the kubelet
/// restarted as the lab runs it.
pub const REGISTRATION_RESTORED: &str = "if [ -e /run/systemd/system/kubelet.service.d/50-nodelab-registration.conf ]; then
      rm -f /run/systemd/system/kubelet.service.d/50-nodelab-registration.conf /etc/kubernetes/unreachable.kubeconfig
      if [ -e /etc/kubernetes/10-lab.conflist.aside ]; then
        mv /etc/kubernetes/10-lab.conflist.aside /etc/cni/net.d/10-lab.conflist
        # containerd reloads its CNI configuration on a change, but not after a reload failed
        # for want of one: only a restart takes it in again (its containers go on).
        systemctl restart containerd
      fi
      systemctl daemon-reload
      systemctl restart kubelet
    fi";

/// Turns it off again: the lab's configuration back, the kubelet's logind drop-in removed and
/// logind reloaded (what a test that failed half-way leaves is undone by the next one's reset).
pub const KUBELET_SHUTDOWN_OFF: &str = "if [ -e /etc/kubernetes/kubelet.yaml.lab ]; then
      mv /etc/kubernetes/kubelet.yaml.lab /etc/kubernetes/kubelet.yaml
      rm -f /etc/systemd/logind.conf.d/99-kubelet.conf
      systemctl kill -s HUP systemd-logind
      systemctl restart kubelet
    fi";
/// The nftables table tests add rules to in a guest (deleted before the next test starts).
pub const FIREWALL_TABLE: &str = "nodelab_test";

/// A node's boot takes about a minute and a half under emulation; a drain up to two minutes.
pub const REBOOT: Duration = Duration::from_secs(600);

pub struct Lab {
    pub lab: &'static NodeLab,
    pub client: Client,
    /// When this test's turn began, and how long the lab took to be ready for it: printed when
    /// the test ends, so a run's log tells where the lab's time goes.
    turn_began: Instant,
    ready_after: Duration,
    /// What of the lab this test may change ([`turns`]).
    turn: Turn,
    _held: turns::Held,
}

impl Drop for Lab {
    fn drop(&mut self) {
        println!(
            "lab time: {:.0} s, {:.0} s of it getting the lab ready",
            self.turn_began.elapsed().as_secs_f64(),
            self.ready_after.as_secs_f64()
        );
    }
}

/// Which of the lab's nodes a test works on.
#[derive(Clone, Copy, Debug)]
pub enum Pick {
    At(usize),
    Last,
}

impl Pick {
    /// The index it picks among `nodes` nodes.
    fn index(self, nodes: usize) -> usize {
        match self {
            Self::At(index) => index,
            Self::Last => nodes.saturating_sub(1),
        }
    }
}

impl Lab {
    /// The whole lab, this test's turn on it, the chart installed, what an earlier test that
    /// failed may have left undone, every node Ready with a Ready agent, both coordinators
    /// Ready, and every VM's clock set to this machine's ([`nodelab::Vm::sync_clock`]).
    pub async fn get() -> anyhow::Result<Self> {
        Self::take(Turn::Whole).await
    }

    async fn take(turn: Turn) -> anyhow::Result<Self> {
        let held = turns::take(turn).await;
        let turn_began = Instant::now();
        let lab = tokio::task::spawn_blocking(nodelab::shared).await?;
        let client = controlplane::admin_client().await?;
        remove_stray_nodes(&client, &lab.nodes).await?;
        release::install_chart(&client, &lab.nodes).await?;
        let mut this = Self {
            lab,
            client,
            turn_began,
            ready_after: Duration::ZERO,
            turn,
            _held: held,
        };
        this.reset().await?;
        this.settled().await?;
        for vm in this.vms() {
            let off = vm.sync_clock().await?;
            println!("{}: clock set, it was {off:+.3} s off", vm.name);
        }
        this.ready_after = turn_began.elapsed();
        Ok(this)
    }

    /// Undoes what a test changes (a test that failed half-way leaves it): the kubelet running
    /// as the lab runs it, the default route and the node's resolver there, no test firewall
    /// table, no host-mode agent, no test maintenance, policy or namespace; on a turn of the
    /// whole lab, the chart's release with the lab's values.
    async fn reset(&self) -> anyhow::Result<()> {
        if self.turn == Turn::Whole && release::upgraded_by_a_test()? {
            release::upgrade_chart(&self.lab.nodes, &[]).await?;
        }
        let ours = self.test_selector();
        delete_tests(&Api::<NodeMaintenance>::all(self.client.clone()), &ours).await?;
        let nodes: Api<Node> = Api::all(self.client.clone());
        let undo = format!(
            "{KUBELET_SHUTDOWN_OFF}
            {REGISTRATION_RESTORED}
            {APT_RESTORED}
            {CUT_OFF_RESTORED}
            {NETWORK_RESTORED}
            systemctl start kubelet && (nft delete table inet {FIREWALL_TABLE} 2>/dev/null; true)
            if [ -e /etc/systemd/system/nodeward-agent.service ]; then
              systemctl disable --now nodeward-agent.service
              rm -rf /etc/systemd/system/nodeward-agent.service /usr/local/bin/nodeward-agent \
                /etc/nodeward /etc/polkit-1/rules.d/50-ops-reboot.rules
              systemctl daemon-reload
            fi"
        );
        let unlabel = Patch::Merge(json!({"metadata": {"labels": {HOST_MODE_LABEL: null}}}));
        // Each VM at once: a command in a guest takes seconds under emulation.
        futures::future::try_join_all(self.vms().into_iter().map(|vm| {
            let (nodes, undo, unlabel) = (&nodes, &undo, &unlabel);
            async move {
                vm.run_when_up(undo, REBOOT).await?;
                nodes
                    .patch(&vm.name, &PatchParams::default(), unlabel)
                    .await?;
                if nodes
                    .get(&vm.name)
                    .await?
                    .labels()
                    .contains_key(ADMIN_CORDON_LABEL)
                {
                    self.admin_cordon(&vm.name, false).await?;
                }
                anyhow::Ok(())
            }
        }))
        .await?;
        delete_tests(&Api::<DisruptionPolicy>::all(self.client.clone()), &ours).await?;
        crate::fencing::restore_default_policy(&self.client).await?;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let left = namespaces
            .list(&ListParams::default().labels(&ours))
            .await?;
        for namespace in left.items {
            self.delete_namespace(&namespace.name_any()).await?;
        }
        Ok(())
    }

    /// Cordons `node` (or uncordons it) as an admin would with `kubectl cordon`, outside
    /// nodeward: the node is marked so that the next test's reset uncordons it.
    pub async fn admin_cordon(&self, node: &str, cordoned: bool) -> anyhow::Result<()> {
        let patch = json!({
            "metadata": {"labels": {ADMIN_CORDON_LABEL: cordoned.then_some("true")}},
            "spec": {"unschedulable": cordoned.then_some(true)},
        });
        Api::<Node>::all(self.client.clone())
            .patch(node, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .with_context(|| format!("cordoning {node} as an admin: {cordoned}"))?;
        Ok(())
    }

    /// The whole lab, and the node (with its VM) a test works on.
    pub async fn with_node(pick: Pick) -> anyhow::Result<(Self, String, Vm)> {
        let lab = Self::get().await?;
        let node = lab.pick(pick)?;
        let vm = lab.vm(&node);
        Ok((lab, node, vm))
    }

    /// A turn on the lane of the node a test works on ([`turns`]): for a test that changes only
    /// that VM and looks only at it, while the other lane's tests run beside it.
    pub async fn beside(pick: Pick) -> anyhow::Result<(Self, String, Vm)> {
        let nodes = tokio::task::spawn_blocking(nodelab::shared)
            .await?
            .nodes
            .len();
        let lab = Self::take(Turn::beside(pick.index(nodes))).await?;
        let node = lab.pick(pick)?;
        let vm = lab.vm(&node);
        Ok((lab, node, vm))
    }

    fn pick(&self, pick: Pick) -> anyhow::Result<String> {
        let nodes = &self.lab.nodes;
        nodes
            .get(pick.index(nodes.len()))
            .cloned()
            .context("the lab has too few nodes")
    }

    /// The VMs this test's turn may change: all of them, or its lane's.
    fn vms(&self) -> Vec<Vm> {
        let mut all = self.lab.vms();
        let ours = self.turn.vms(all.len());
        all.drain(ours).collect()
    }

    /// The value of [`TEST_LABEL`] on what this test creates.
    pub fn test_label(&self) -> &'static str {
        self.turn.label()
    }

    /// The objects a test with this turn created, or (the whole lab's) any test's.
    fn test_selector(&self) -> String {
        match self.turn {
            Turn::Whole => TEST_LABEL.to_owned(),
            lane => format!("{TEST_LABEL}={}", lane.label()),
        }
    }

    pub fn vm(&self, name: &str) -> Vm {
        self.lab.vm(name)
    }

    /// Every node of this test's turn Ready, schedulable and untainted, with a Ready agent pod
    /// (but where an agent runs in host mode), every agent pod of the chart's current template,
    /// and the coordinators Ready: both for a test on their nodes (its disruption takes one,
    /// the other answers the eviction webhook), one for the others.
    pub async fn settled(&self) -> anyhow::Result<()> {
        let vms = self.vms();
        for vm in &vms {
            vm.wait_node_ready(&self.client, REBOOT).await?;
        }
        let daemonsets: Api<DaemonSet> = Api::namespaced(self.client.clone(), NAMESPACE);
        let name = format!("{RELEASE}-agent");
        wait::until(
            &daemonsets,
            &name,
            "every agent pod of the current template",
            REBOOT,
            |ds| {
                ds.and_then(|d| d.status.as_ref())
                    .is_some_and(|s| s.updated_number_scheduled == Some(s.desired_number_scheduled))
            },
        )
        .await?;
        let nodes_api: Api<Node> = Api::all(self.client.clone());
        for vm in &vms {
            let node = nodes_api.get(&vm.name).await?;
            if node.labels().contains_key(HOST_MODE_LABEL) {
                continue;
            }
            let what = format!("the agent pod on {} Ready", vm.name);
            wait::eventually(&what, REBOOT, || async {
                let pod = agent_pod(&self.client, &vm.name).await?;
                Ok(
                    (wait::condition_status(&pod, "Ready").as_deref() == Some("True"))
                        .then_some(()),
                )
            })
            .await?;
        }
        let coordinators = self.turn.coordinators_ready();
        let deployments: Api<Deployment> = Api::namespaced(self.client.clone(), NAMESPACE);
        wait::until(
            &deployments,
            &format!("{RELEASE}-coordinator"),
            &format!("{coordinators} coordinator replicas Ready"),
            REBOOT,
            |d| {
                d.and_then(|d| d.status.as_ref()).is_some_and(|s| {
                    s.ready_replicas >= Some(coordinators) && s.updated_replicas == Some(2)
                })
            },
        )
        .await?;
        // No taint either: the lab's nodes have none of their own, and one a test left
        // (nodeward's shutdown taint, the out-of-service one) would keep the next test's
        // pods off the node.
        for vm in &vms {
            wait::until(
                &nodes_api,
                &vm.name,
                "the node schedulable and untainted",
                REBOOT,
                |n| {
                    n.and_then(|n| n.spec.as_ref()).is_some_and(|s| {
                        s.unschedulable != Some(true) && s.taints.iter().flatten().next().is_none()
                    })
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Runs `vm`'s agent in host mode, as the README installs it: the chart's agent pod leaves
    /// the node (its affinity excludes [`HOST_MODE_LABEL`]), then the static binary from the
    /// agent image, the shipped unit, a kubeconfig with `credential`, and [`HOST_AGENT_CONFIG`];
    /// enabled and started. Returns the report status once the host-mode agent has every
    /// detector's finding.
    pub async fn host_mode(
        &self,
        vm: &Vm,
        credential: HostCredential,
    ) -> anyhow::Result<NodeReportStatus> {
        self.host_mode_with(vm, credential, HOST_AGENT_CONFIG).await
    }

    /// As [`Self::host_mode`], with the agent's configuration `config` in place of
    /// [`HOST_AGENT_CONFIG`].
    pub async fn host_mode_with(
        &self,
        vm: &Vm,
        credential: HostCredential,
        config: &str,
    ) -> anyhow::Result<NodeReportStatus> {
        let node = vm.name.clone();
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                &node,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {HOST_MODE_LABEL: "true"}}})),
            )
            .await?;
        wait::eventually(
            &format!("the chart's agent pod gone from {node}"),
            REBOOT,
            || async { Ok(agent_pod(&self.client, &node).await.is_err().then_some(())) },
        )
        .await?;

        let user = match credential {
            // The token names the node for the admission policy and dies with the Node.
            HostCredential::NodeToken => {
                let uid = nodes.get(&node).await?.uid().context("the Node's uid")?;
                let token = agent_token(
                    &self.client,
                    json!({"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}),
                    86400,
                )
                .await?;
                format!("token: {token}")
            }
            // The user names the node, and needs no Node.
            HostCredential::Certificate => {
                let issued = nodeward_e2e::certificates::issue(
                    &self.client,
                    &format!("nodeward-agent-{node}"),
                    &format!("{AGENT_USER_PREFIX}{node}"),
                    &[AGENT_GROUP],
                )
                .await?;
                let (certificate, key) = issued.kubeconfig_data();
                format!("client-certificate-data: {certificate}\n    client-key-data: {key}")
            }
        };
        let server = vm
            .run("sed -n 's/^ *server: //p' /etc/kubernetes/kubelet.kubeconfig")
            .await?;
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: lab\n  cluster:\n    server: {}\n    certificate-authority: /etc/kubernetes/pki/ca.crt\nusers:\n- name: agent\n  user:\n    {user}\ncontexts:\n- name: lab\n  context: {{cluster: lab, user: agent}}\ncurrent-context: lab\n",
            server.trim()
        );
        let unit = std::fs::read(nodeward_e2e::repo_root().join("systemd/nodeward-agent.service"))?;
        vm.run("install -d -m 0700 /etc/nodeward").await?;
        vm.write_file("/etc/systemd/system/nodeward-agent.service", &unit)
            .await?;
        vm.write_file("/etc/nodeward/kubeconfig", kubeconfig.as_bytes())
            .await?;
        vm.write_file("/etc/nodeward/agent.yaml", config.as_bytes())
            .await?;
        install_agent_binary(vm).await?;
        // A daemon-reload on a guest emulated beside another lane's took over 60 s once.
        vm.run_within(
            "set -e
            chmod 0600 /etc/nodeward/kubeconfig
            systemctl daemon-reload
            systemctl enable --now nodeward-agent.service",
            Duration::from_secs(180),
        )
        .await?;

        let settled = wait::eventually(
            &format!("{node}'s report from its host-mode agent"),
            Duration::from_secs(300),
            || async {
                let status = self.report(&node).await?.status.unwrap_or_default();
                // Each detector reports on its own schedule: the kernel log's first verdict
                // can come after the others'.
                let settled = status.mode == Some(AgentMode::Host)
                    && [
                        "filesystem",
                        "kernel-log/ReadonlyFilesystem",
                        "kubelet",
                        "peers",
                        "apiserver",
                    ]
                    .iter()
                    .all(|d| status.findings.iter().any(|f| f.detector == *d))
                    && status.findings.iter().all(|f| f.status != "Unknown");
                Ok(settled.then_some(status))
            },
        )
        .await;
        match settled {
            Ok(status) => Ok(status),
            Err(e) => {
                let journal = vm.journal(&["nodeward-agent"], 60).await;
                Err(e.context(format!("the agent's journal:\n{journal}")))
            }
        }
    }

    /// Creates the maintenance `name` asking for `spec` (labelled as a test's, so that the next
    /// test's reset removes it), as an operator would.
    pub async fn create_maintenance(
        &self,
        name: &str,
        spec: MaintenanceSpec<'_>,
    ) -> anyhow::Result<()> {
        // Labelled as the lab's (not as the end-to-end tests'): the next test's reset deletes
        // what a test that failed half-way left.
        fixtures::create_maintenance(&self.client, name, spec, (TEST_LABEL, self.test_label()))
            .await
    }

    pub async fn report(&self, node: &str) -> anyhow::Result<NodeReport> {
        Ok(Api::<NodeReport>::all(self.client.clone())
            .get(node)
            .await?)
    }

    /// The finding of `detector` in `node`'s NodeReport once it reports no problem (`what`).
    pub async fn cleared(&self, node: &str, detector: &str, what: &str) -> anyhow::Result<Finding> {
        self.finding(node, detector, what, |f| f.status == "False")
            .await
    }

    /// The finding of `detector` in `node`'s NodeReport once it gives `reason`.
    pub async fn with_reason(
        &self,
        node: &str,
        detector: &str,
        reason: &str,
    ) -> anyhow::Result<Finding> {
        self.finding(node, detector, reason, |f| f.reason == reason)
            .await
    }

    /// The finding of `detector` in `node`'s NodeReport once `accept` takes it (the lab's
    /// kubelet and peer detectors run every 5 s, the others every 30 s or more).
    pub async fn finding(
        &self,
        node: &str,
        detector: &str,
        what: &str,
        accept: impl Fn(&Finding) -> bool,
    ) -> anyhow::Result<Finding> {
        let last = std::sync::Mutex::new(None);
        let found = wait::eventually(
            &format!("{node}'s {detector} finding: {what}"),
            Duration::from_secs(300),
            || async {
                let status = self.report(node).await?.status.unwrap_or_default();
                let finding = status.findings.into_iter().find(|f| f.detector == detector);
                let accepted = finding.as_ref().is_some_and(&accept);
                *last.lock().unwrap_or_else(|p| p.into_inner()) = finding.clone();
                Ok(finding.filter(|_| accepted))
            },
        )
        .await;
        found.with_context(|| {
            let last = last.lock().unwrap_or_else(|p| p.into_inner());
            format!("the last one seen: {last:?}")
        })
    }

    /// `node`'s condition `type_` on its Node, once it is `status` with `reason`.
    pub async fn condition(
        &self,
        node: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let what = format!("{type_} {status} ({reason}) on the Node");
        wait::until(&nodes, node, &what, REBOOT, |n| {
            wait::node_condition(n, type_).is_some_and(|(s, r)| s == status && r == reason)
        })
        .await?;
        Ok(())
    }

    /// A namespace of this test's (deleted first if an earlier run left it).
    pub async fn namespace(&self, name: &str) -> anyhow::Result<String> {
        self.delete_namespace(name).await?;
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": name, "labels": {TEST_LABEL: self.test_label()}}}),
                )?,
            )
            .await?;
        Ok(name.to_owned())
    }

    /// Deletes a test's namespace and waits until it is gone: its pods' SIGTERMs are then in
    /// the TERM logs before the next test clears them. A pod that has exited (Succeeded or
    /// Failed) has nothing left to record: it is deleted at once (grace 0), as
    /// `kubectl delete --force` does. An emulated kubelet took minutes to take such a pod off
    /// the API server after its exit, and the test's lane waited for it.
    pub async fn delete_namespace(&self, name: &str) -> anyhow::Result<()> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), name);
        let reap_exited = async {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                let Ok(list) = pods.list(&ListParams::default()).await else {
                    continue;
                };
                for pod in list.items.iter().filter(|p| exited(p)) {
                    // Gone already, or taken by the kubelet meanwhile: nothing to do.
                    let _ = pods
                        .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                        .await;
                }
            }
        };
        tokio::select! {
            gone = wait::deleted(&namespaces, name, Duration::from_secs(300)) => gone,
            () = reap_exited => unreachable!("the reaper loops until the namespace is gone"),
        }
    }

    /// Applies `manifest` (any kind) server-side.
    pub async fn apply(&self, manifest: Value) -> anyhow::Result<()> {
        let api_version = manifest["apiVersion"].as_str().context("apiVersion")?;
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = manifest["kind"].as_str().context("kind")?;
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let (resource, capabilities) = kube::discovery::pinned_kind(&self.client, &gvk).await?;
        let name = manifest["metadata"]["name"]
            .as_str()
            .context("name")?
            .to_owned();
        let api: Api<kube::api::DynamicObject> = match (
            capabilities.scope,
            manifest["metadata"]["namespace"].as_str(),
        ) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(self.client.clone(), ns, &resource)
            }
            _ => Api::all_with(self.client.clone(), &resource),
        };
        nodeward_e2e::env::apply(&api, kind, &name, &manifest).await?;
        Ok(())
    }

    /// Pods of `namespace` matching `labels`, once `count` of them run Ready.
    pub async fn running(
        &self,
        namespace: &str,
        labels: &str,
        count: usize,
    ) -> anyhow::Result<Vec<Pod>> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let ready = wait::eventually(&format!("{count} pods {labels} Ready"), REBOOT, || async {
            let list = pods.list(&ListParams::default().labels(labels)).await?;
            let ready: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| wait::condition_status(p, "Ready").as_deref() == Some("True"))
                .collect();
            Ok((ready.len() >= count).then_some(ready))
        })
        .await;
        match ready {
            Ok(ready) => Ok(ready),
            Err(e) => Err(e.context(stories::pods_story(&self.client, namespace, labels).await)),
        }
    }
}

/// Installs the static agent binary from the agent image (imported into the VM's containerd)
/// as `/usr/local/bin/nodeward-agent`, as the README's host-mode install does.
pub async fn install_agent_binary(vm: &Vm) -> anyhow::Result<()> {
    // Mounting an image's layers takes longer than a minute on an emulated VM that is busy
    // starting its pods.
    let script = "set -e
        ref=$(ctr -n k8s.io images ls -q | grep '/nodeward-agent:' | head -n1)
        mkdir -p /run/nodelab-agent-image
        ctr -n k8s.io images mount \"$ref\" /run/nodelab-agent-image >/dev/null
        install -m 0755 /run/nodelab-agent-image/nodeward-agent /usr/local/bin/nodeward-agent
        ctr -n k8s.io images unmount /run/nodelab-agent-image >/dev/null";
    let output = vm.exec_with(script, Duration::from_secs(300)).await?;
    anyhow::ensure!(
        output.code == 0,
        "installing the agent binary in {} exited {}: {}{}",
        vm.name,
        output.code,
        output.stdout,
        output.stderr
    );
    Ok(())
}

/// Deletes the Nodes that are not the lab's: the crate tests share this control plane and run
/// first, and one that failed may have left its kwok nodes, which the chart's DaemonSet, its
/// coordinators (kwok fakes their pods Running, serving nothing) and its default policy would
/// take in.
async fn remove_stray_nodes(client: &Client, lab_nodes: &[String]) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for node in nodes.list(&ListParams::default()).await?.items {
        let name = node.name_any();
        if !lab_nodes.contains(&name) {
            nodes
                .delete(&name, &DeleteParams::default())
                .await
                .with_context(|| format!("deleting the stray node {name}"))?;
        }
    }
    Ok(())
}
/// nodeward's logind inhibitor locks in `vm`, one `systemd-inhibit --list` line each (who, uid,
/// user, pid, command, what, why, mode).
pub async fn nodeward_locks(vm: &Vm) -> anyhow::Result<Vec<String>> {
    locks_of(vm, "nodeward").await
}

/// The logind inhibitor locks in `vm` whose line names `who` (see [`nodeward_locks`]).
pub async fn locks_of(vm: &Vm, who: &str) -> anyhow::Result<Vec<String>> {
    let listed = vm
        .run("systemd-inhibit --list --no-pager --no-legend")
        .await?;
    Ok(listed
        .lines()
        .filter(|l| l.contains(who))
        .map(str::to_owned)
        .collect())
}

/// Whether `locks` (lines of `systemd-inhibit --list`) hold a delay lock on shutdown.
pub fn has_shutdown_delay(locks: &[String]) -> bool {
    locks
        .iter()
        .any(|l| l.contains("shutdown") && l.contains("delay"))
}

/// Deletes the objects of `api` a test left (those `selector` selects), and waits until they
/// are gone.
async fn delete_tests<K>(api: &Api<K>, selector: &str) -> anyhow::Result<()>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + Send
        + serde::Serialize
        + serde::de::DeserializeOwned
        + 'static,
{
    let left = api.list(&ListParams::default().labels(selector)).await?;
    for object in left.items {
        wait::deleted(api, &object.name_any(), REBOOT).await?;
    }
    Ok(())
}

/// A token of the chart's agent service account bound to `object` (a reference with apiVersion,
/// kind, name and uid): what the agent on that object's node holds.
pub async fn agent_token(client: &Client, object: Value, seconds: i64) -> anyhow::Result<String> {
    let request: TokenRequest = serde_json::from_value(json!({"spec": {
        "audiences": ["https://kubernetes.default.svc"], "expirationSeconds": seconds,
        "boundObjectRef": object,
    }}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), NAMESPACE)
        .create_subresource::<TokenRequest, TokenRequest>(
            "token",
            &format!("{RELEASE}-agent"),
            &PostParams::default(),
            &request,
        )
        .await?
        .status
        .map(|s| s.token)
        .context("a token for the agent's service account")
}

/// The findings that say a problem, one line each.
pub fn problems(findings: &[Finding]) -> Vec<String> {
    findings
        .iter()
        .filter(|f| f.status == "True")
        .map(|f| format!("{} {} {}: {}", f.detector, f.type_, f.reason, f.message))
        .collect()
}

/// The agent pod on `node`.
pub async fn agent_pod(client: &Client, node: &str) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(
            &ListParams::default()
                .labels("app.kubernetes.io/component=agent")
                .fields(&format!("spec.nodeName={node}")),
        )
        .await?;
    list.items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .with_context(|| format!("no agent pod on {node}"))
}

/// Waits until the agent on `vm` holds its logind delay lock: what a shutdown's drain rests on.
/// Returns the agent's locks then. A wait that was needed is printed (with logind's restarts),
/// a lock that never came fails with the agent's story and logind's journal.
pub async fn wait_delay_lock(client: &Client, vm: &Vm) -> anyhow::Result<Vec<String>> {
    let started = std::time::Instant::now();
    let held = wait::eventually(
        &format!("nodeward's delay lock held on {}", vm.name),
        Duration::from_secs(180),
        || async {
            let locks = nodeward_locks(vm).await?;
            Ok(has_shutdown_delay(&locks).then_some(locks))
        },
    )
    .await;
    let logind = || async {
        vm.run("journalctl -b -u systemd-logind --no-pager -o short-monotonic | tail -n 20")
            .await
            .unwrap_or_else(|e| format!("(no journal: {e:#})"))
    };
    match held {
        Ok(locks) if started.elapsed() < Duration::from_secs(1) => Ok(locks),
        Ok(locks) => {
            println!(
                "{}: nodeward's delay lock held after {:.1} s of waiting; logind's journal:\n{}",
                vm.name,
                started.elapsed().as_secs_f64(),
                logind().await
            );
            Ok(locks)
        }
        Err(e) => {
            let story = format!(
                "{}\nlogind's journal:\n{}",
                stories::drain_story(client, vm).await,
                logind().await
            );
            Err(e.context(story))
        }
    }
}

/// Whether `pod` has exited for good: its phase is Succeeded or Failed.
fn exited(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|phase| matches!(phase, "Succeeded" | "Failed"))
}

/// Waits until systemd has restarted `unit` on `vm` at least `restarts` times in all (its
/// `NRestarts`) and the unit is active again. At least: on a loaded emulated VM a restart can
/// outlast the unit's start timeout, and systemd then counts one more.
pub async fn restarted_by_systemd(vm: &Vm, unit: &str, restarts: u32) -> anyhow::Result<()> {
    let show = format!("systemctl show {unit} --property=NRestarts --property=ActiveState");
    wait::eventually(
        &format!("systemd restarting {unit} ({restarts} restarts)"),
        REBOOT,
        || async {
            let state = vm.run(&show).await?;
            let active = state.lines().any(|l| l == "ActiveState=active");
            let counted = state
                .lines()
                .find_map(|l| l.strip_prefix("NRestarts="))
                .and_then(|n| n.trim().parse::<u32>().ok());
            Ok((active && counted.is_some_and(|n| n >= restarts)).then_some(()))
        },
    )
    .await
}

/// The value of the agent's metric `series` (its name and labels as exposed, such as
/// `nodeward_finding{type="NetworkProblem"}`), read on the guest's loopback: a guest cut off
/// from the API server still answers there, as it does to a Prometheus on another node.
pub async fn agent_gauge(vm: &Vm, series: &str) -> anyhow::Result<String> {
    let exposed = vm
        .run(
            r#"bash -c "exec 3<>/dev/tcp/127.0.0.1/9470 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && grep '^nodeward_' <&3" || true"#,
        )
        .await?;
    Ok(exposed
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_default()
        .trim()
        .to_owned())
}
