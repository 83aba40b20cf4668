//! The inventory: what the host runs (its OS image and kernel, the versions of the packages
//! the configuration names, and how many upgrades its package manager knows of), read by
//! read-only commands on the host ([`crate::host::commands`]) at the agent's start, every
//! `inventory.interval`, and when the maintenance executor asks (before and after an update or
//! reboot). Each reading goes into the NodeReport's `status.inventory` (under a field manager
//! of its own, beside the reporter's fields) and the metrics.

mod read;

use std::{sync::Arc, time::Duration};

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use kube::{Api, Client, runtime::events::EventType};
use nodeward_api::{
    NodeReport,
    inventory::{Inventory, PACKAGE_NAME_LIMIT, PACKAGES_LIMIT},
    labels::AGENT_FIELD_MANAGER,
};
use nodeward_runtime::{
    WRITE_REFUSED,
    backoff::Backoff,
    stop::{self, Stopping},
    write::{self, Part},
};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::{
    flags::{self, Flag},
    metrics::{InventoryMetrics, Metrics, PackageLabels, SystemLabels},
};

/// The flags of the `inventory` section.
pub fn flags() -> Vec<Flag> {
    flags::declare! {
        "inventory-interval" ("NODEWARD_INVENTORY_INTERVAL") => "interval": Text, "How often the host's OS, kernel and named packages are read, e.g. 1h";
        "inventory-packages" ("NODEWARD_INVENTORY_PACKAGES") => "packages": List, "A package whose installed version the NodeReport shows (repeat the flag for more)";
        "inventory-pending-updates" ("NODEWARD_INVENTORY_PENDING_UPDATES") => "pendingUpdates": Scalar, "Also count the upgrades the package manager knows of, from its local metadata (true/false)";
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct InventoryConfig {
    /// How often the host is read (besides at the start and around maintenances).
    #[serde(deserialize_with = "crate::values::duration")]
    pub interval: Duration,
    /// Packages whose installed versions are reported (dpkg or rpm names).
    pub packages: Vec<String>,
    /// Also count the upgrades the package manager knows of (`apt-get -s dist-upgrade`,
    /// `dnf -C check-update`, `zypper --no-refresh list-updates`): from the metadata as last
    /// refreshed by whatever refreshes it; nodeward never does.
    pub pending_updates: bool,
    /// How long one reading may take on the host.
    #[serde(deserialize_with = "crate::values::duration")]
    pub timeout: Duration,
}

impl Default for InventoryConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(3600),
            packages: Vec::new(),
            pending_updates: false,
            timeout: Duration::from_secs(60),
        }
    }
}

impl InventoryConfig {
    pub fn validate(&self, place: &str) -> Result<(), String> {
        if !(Duration::from_secs(60)..=Duration::from_secs(7 * 86_400)).contains(&self.interval) {
            return Err(format!("{place}.interval: must be from 1m to 7d"));
        }
        if !(Duration::from_secs(1)..=Duration::from_secs(600)).contains(&self.timeout) {
            return Err(format!("{place}.timeout: must be from 1s to 10m"));
        }
        if self.packages.len() > PACKAGES_LIMIT {
            return Err(format!(
                "{place}.packages: at most {PACKAGES_LIMIT} packages, not {}",
                self.packages.len()
            ));
        }
        for (i, name) in self.packages.iter().enumerate() {
            if !package_name(name) {
                return Err(format!(
                    "{place}.packages[{i}]: {name:?} is no package name (1 to {PACKAGE_NAME_LIMIT} of a-z, A-Z, 0-9 and . + - _ :, starting with a letter or digit)"
                ));
            }
            if self.packages[..i].contains(name) {
                return Err(format!("{place}.packages[{i}]: {name:?} is named twice"));
            }
        }
        Ok(())
    }
}

/// A dpkg or rpm package name (Debian's rule, with the capitals and `_` rpm allows).
fn package_name(name: &str) -> bool {
    name.len() <= PACKAGE_NAME_LIMIT
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".+-_:".contains(c))
}

/// What a fresh reading may take beyond the readings' own bound (writing it, scheduling).
const FRESH_MARGIN: Duration = Duration::from_secs(10);

/// The running inventory: its last reading, and fresh ones on request.
#[derive(Clone)]
pub struct Inventories {
    latest: watch::Receiver<Option<Inventory>>,
    asks: mpsc::Sender<oneshot::Sender<Inventory>>,
    /// How long one reading may take (`inventory.timeout`).
    reading: Duration,
}

impl Inventories {
    /// The last reading, if there was one.
    pub fn latest(&self) -> Option<Inventory> {
        self.latest.borrow().clone()
    }

    /// A reading taken now (written to the report as well); `None` when the inventory task
    /// has stopped or the reading did not come in time. In time is within two readings' bound
    /// and a little: one may be under way when asked, then comes the one taken for the ask. A
    /// shorter wait would record an older reading as the versions before an update on a slow
    /// host (seen under emulation: a reading from before the package was installed, and
    /// nothing for the rollback to reinstall).
    pub async fn fresh(&self) -> Option<Inventory> {
        let (tx, rx) = oneshot::channel();
        self.asks.send(tx).await.ok()?;
        let within = self.reading * 2 + FRESH_MARGIN;
        tokio::time::timeout(within, rx).await.ok()?.ok()
    }
}

/// Who reads: the node, its boot, where to write.
pub struct Reader {
    pub config: InventoryConfig,
    pub client: Client,
    pub node_name: String,
    pub boot_id: Option<String>,
    pub metrics: Arc<Metrics>,
}

impl Reader {
    /// Starts reading; the task ends when the agent stops.
    pub fn start(self, stopping: Stopping, tasks: &mut tokio::task::JoinSet<()>) -> Inventories {
        let (publish, latest) = watch::channel(None);
        let (asks, asked) = mpsc::channel(8);
        let reading = self.config.timeout;
        tasks.spawn(self.run(publish, asked, stopping));
        Inventories {
            latest,
            asks,
            reading,
        }
    }

    async fn run(
        self,
        publish: watch::Sender<Option<Inventory>>,
        mut asked: mpsc::Receiver<oneshot::Sender<Inventory>>,
        mut stopping: Stopping,
    ) {
        let mut next = tokio::time::Instant::now();
        let mut unwritten: Option<Inventory> = None;
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(300));
        let mut retry_at: Option<tokio::time::Instant> = None;
        loop {
            let mut waiting = Vec::new();
            tokio::select! {
                () = stop::asked(&mut stopping) => return,
                () = tokio::time::sleep_until(next) => {}
                Some(reply) = asked.recv() => waiting.push(reply),
                () = async { tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)).await }, if retry_at.is_some() => {
                    retry_at = None;
                    if let Some(inventory) = unwritten.take() {
                        unwritten = self.written(inventory, &mut backoff, &mut retry_at).await;
                    }
                    continue;
                }
            }
            // A jittered interval: a fleet started together does not read (and write) together.
            next = tokio::time::Instant::now() + jittered(self.config.interval);
            let inventory = self.read().await;
            measure(&self.metrics.inventory, &inventory);
            publish.send_replace(Some(inventory.clone()));
            for reply in waiting {
                let _ = reply.send(inventory.clone());
            }
            retry_at = None;
            backoff.reset();
            unwritten = self.written(inventory, &mut backoff, &mut retry_at).await;
        }
    }

    /// Reads the host now.
    async fn read(&self) -> Inventory {
        let argv = read::argv(&self.config.packages, self.config.pending_updates);
        let (output, ended) = match crate::host::commands::run(&argv, self.config.timeout).await {
            Ok(ran) => {
                let ended = match ran.code {
                    Some(0) => Ok(()),
                    Some(code) => Err(format!("the reading on the host exited with {code}")),
                    None => Err(format!(
                        "the reading on the host did not end within {}s",
                        self.config.timeout.as_secs()
                    )),
                };
                (String::from_utf8_lossy(&ran.output).into_owned(), ended)
            }
            Err(why) => (String::new(), Err(why)),
        };
        let mut inventory = read::parse(&output, ended, &self.config.packages);
        inventory.kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .ok()
            .map(|k| nodeward_api::bounds::cut(k.trim(), 128));
        inventory.boot_id.clone_from(&self.boot_id);
        inventory.read_at = Some(Time(Timestamp::now()));
        if let Some(error) = &inventory.error {
            tracing::warn!(node = %self.node_name, %error, "the inventory could not read everything");
        }
        inventory
    }

    /// Writes `inventory` into the NodeReport; what is left to write (and when to retry)
    /// when that failed, as when the report does not exist yet. A write the cluster refuses
    /// is a Warning Event on the Node as well (one per try; the tries back off to 5 minutes).
    async fn written(
        &self,
        inventory: Inventory,
        backoff: &mut Backoff,
        retry_at: &mut Option<tokio::time::Instant>,
    ) -> Option<Inventory> {
        #[derive(Debug, Serialize)]
        struct Status<'a> {
            inventory: &'a Inventory,
        }
        let reports: Api<NodeReport> = Api::all(self.client.clone());
        let manager = format!("{AGENT_FIELD_MANAGER}/inventory");
        let status = Status {
            inventory: &inventory,
        };
        match write::apply(&reports, &self.node_name, Part::Status, &manager, &status).await {
            write::Outcome::Written(_) => {
                self.metrics.api_write("nodereports/status", true);
                None
            }
            write::Outcome::Gone(e) | write::Outcome::Conflict(e) | write::Outcome::Failed(e) => {
                self.metrics.api_write("nodereports/status", false);
                if e.is_refusal() {
                    // Shown where the node is looked at, not only in the agent's log.
                    let note = format!("the API server refused nodeward-agent's inventory: {e}");
                    let node = crate::node_reference(&self.node_name);
                    crate::events(self.client.clone(), &self.node_name)
                        .publish(&node, EventType::Warning, "Inventory", WRITE_REFUSED, note)
                        .await;
                }
                tracing::debug!(node = %self.node_name, error = %e, "writing the inventory into the NodeReport failed; retrying");
                *retry_at = Some(tokio::time::Instant::now() + backoff.next_delay());
                Some(inventory)
            }
        }
    }
}

/// `inventory` in the metrics, in place of the reading before.
fn measure(metrics: &InventoryMetrics, inventory: &Inventory) {
    let InventoryMetrics {
        system,
        package,
        updates_pending,
    } = metrics;
    system.clear();
    system
        .get_or_create(&SystemLabels {
            os_image: inventory.os_image.clone().unwrap_or_default(),
            kernel: inventory.kernel.clone().unwrap_or_default(),
        })
        .set(1);
    package.clear();
    for p in &inventory.packages {
        package
            .get_or_create(&PackageLabels {
                package: p.name.clone(),
                version: p.version.clone().unwrap_or_default(),
            })
            .set(1);
    }
    updates_pending.set(inventory.updates_pending.map_or(-1, i64::from));
}

/// `interval`, 10 % either way.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + rand::random::<f64>() * 0.2)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(yaml: &str) -> String {
        let config: InventoryConfig = serde_yaml::from_str(yaml).expect("parses");
        config.validate("inventory").expect_err("refused")
    }

    #[test]
    fn the_defaults_read_hourly_and_name_no_package() {
        let config = InventoryConfig::default();
        config.validate("inventory").expect("valid");
        assert_eq!(config.interval, Duration::from_secs(3600));
        assert!(config.packages.is_empty() && !config.pending_updates);
    }

    #[test]
    fn bad_packages_and_intervals_are_refused_naming_the_field() {
        assert!(refused("interval: 10s").starts_with("inventory.interval:"));
        assert!(refused("timeout: 1h").starts_with("inventory.timeout:"));
        assert!(refused("packages: ['-rf']").starts_with("inventory.packages[0]:"));
        assert!(refused("packages: [a, 'b c']").starts_with("inventory.packages[1]:"));
        assert!(refused("packages: [a, a]").contains("named twice"));
        let many: Vec<String> = (0..33).map(|i| format!("p{i}")).collect();
        let yaml = format!("packages: [{}]", many.join(", "));
        assert!(refused(&yaml).starts_with("inventory.packages: at most 32"));
        let config: InventoryConfig = serde_yaml::from_str(
            "packages: [linux-image-amd64, kernel-core, libstdc++6, python3.11]",
        )
        .expect("parses");
        config.validate("inventory").expect("real names pass");
    }

    #[test]
    fn a_reading_replaces_the_last_in_the_metrics() {
        let metrics = Metrics::new();
        let reading = |version: Option<&str>, pending| Inventory {
            os_image: Some("Debian GNU/Linux 13 (trixie)".into()),
            kernel: Some("6.12.1".into()),
            packages: vec![nodeward_api::inventory::PackageVersion {
                name: "demo".into(),
                version: version.map(str::to_owned),
            }],
            updates_pending: pending,
            ..Inventory::default()
        };
        assert!(
            metrics.encode().contains("nodeward_updates_pending -1"),
            "unknown at first"
        );
        measure(&metrics.inventory, &reading(Some("1"), Some(2)));
        measure(&metrics.inventory, &reading(Some("2"), None));
        let text = metrics.encode();
        assert!(
            text.contains(r#"nodeward_package_info{package="demo",version="2"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains(r#"version="1""#),
            "the old version is gone: {text}"
        );
        assert!(
            text.contains(
                r#"nodeward_system_info{os_image="Debian GNU/Linux 13 (trixie)",kernel="6.12.1"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("nodeward_updates_pending -1"),
            "no longer known: {text}"
        );
    }

    /// Inventories whose reader answers each ask after `takes` (and never, given none).
    fn answering_after(takes: Option<Duration>) -> Inventories {
        let (_, latest) = watch::channel(None);
        let (asks, mut asked) = mpsc::channel::<oneshot::Sender<Inventory>>(8);
        tokio::spawn(async move {
            let mut unanswered = Vec::new();
            while let Some(reply) = asked.recv().await {
                match takes {
                    Some(takes) => {
                        tokio::time::sleep(takes).await;
                        let _ = reply.send(Inventory {
                            os_image: Some("fresh".to_owned()),
                            ..Inventory::default()
                        });
                    }
                    None => unanswered.push(reply),
                }
            }
        });
        Inventories {
            latest,
            asks,
            reading: Duration::from_secs(30),
        }
    }

    // A reading under way when asked (up to one bound), then the one taken for the ask (up to
    // another): 65 s of 30 s readings is still fresh. The wait was 30 s once, and a slow host's
    // update then recorded the reading from before the package was installed.
    #[tokio::test(start_paused = true)]
    async fn a_fresh_reading_that_takes_two_bounds_is_waited_for() {
        let inventories = answering_after(Some(Duration::from_secs(65)));
        let asked = tokio::time::Instant::now();
        let got = inventories.fresh().await.expect("the fresh reading");
        assert_eq!(got.os_image.as_deref(), Some("fresh"));
        assert_eq!(asked.elapsed(), Duration::from_secs(65));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fresh_reading_that_never_comes_is_given_up_after_two_bounds_and_the_margin() {
        let inventories = answering_after(None);
        let asked = tokio::time::Instant::now();
        assert_eq!(inventories.fresh().await, None);
        assert_eq!(asked.elapsed(), Duration::from_secs(70));
    }

    #[test]
    fn the_interval_is_jittered_within_a_tenth() {
        for _ in 0..100 {
            let got = jittered(Duration::from_secs(100));
            assert!((90.0..=110.0).contains(&got.as_secs_f64()), "{got:?}");
        }
    }
}
