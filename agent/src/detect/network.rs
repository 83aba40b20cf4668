//! The network section of the configuration: the interfaces, default-route, DNS and API
//! server detectors run on its schedule.

use std::time::Duration;

use nodeward_api::conditions::node::NETWORK_PROBLEM;

use super::{
    AgentContext, Detector, Section, cluster, dns,
    dns::DnsConfig,
    interfaces::{self, InterfacesConfig},
    routes::{self, RoutesConfig},
};

super::section! {
    pub struct NetworkConfig {
        pub interfaces: InterfacesConfig,
        pub default_route: RoutesConfig,
        pub dns: DnsConfig,
    }
}

impl Default for NetworkConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            hold: Duration::from_secs(30),
            interfaces: InterfacesConfig::default(),
            default_route: RoutesConfig::default(),
            dns: DnsConfig::default(),
        }
    }
}

impl Section for NetworkConfig {
    fn validate(&self, place: &str) -> Result<(), String> {
        self.schedule().validate(place)?;
        self.interfaces.validate(&format!("{place}.interfaces"))
    }

    fn detectors(&self, agent: Option<&AgentContext>) -> Vec<Detector> {
        if !self.enabled {
            return Vec::new();
        }
        let schedule = self.schedule();
        let mut all = vec![
            Detector::new(
                interfaces::DETECTOR,
                NETWORK_PROBLEM,
                schedule,
                self.interfaces.clone(),
                |c| async move { interfaces::observe(&c) },
            ),
            Detector::new(
                routes::DETECTOR,
                NETWORK_PROBLEM,
                schedule,
                self.clone(),
                |c| async move { routes::observe(&c.interfaces, &c.default_route).await },
            ),
        ];
        if !self.dns.names.is_empty() {
            // Each lookup gets most of the timeout, so a slow resolver is a DNS failure
            // rather than a timed-out detector.
            let lookup_timeout = self.timeout.mul_f32(0.9);
            all.push(Detector::new(
                dns::DETECTOR,
                NETWORK_PROBLEM,
                schedule,
                self.dns.names.clone(),
                move |names| async move { dns::observe(&names, lookup_timeout).await },
            ));
        }
        // As the lookups: a silent API server is unreachable, not a timed-out detector.
        let answer_timeout = self.timeout.mul_f32(0.9);
        all.push(Detector::new(
            cluster::APISERVER_DETECTOR,
            NETWORK_PROBLEM,
            schedule,
            agent.map(|a| a.cluster.clone()),
            move |cluster| async move {
                cluster::observe_apiserver(cluster.as_ref(), answer_timeout).await
            },
        ));
        all
    }
}
