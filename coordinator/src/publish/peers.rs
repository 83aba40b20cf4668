//! Where the agents are, for their peer probes: EndpointSlices with one endpoint per node that
//! has an agent, at its InternalIP. Nodes keep their slice as long as they stay, so a node
//! joining or leaving rewrites one slice and the rest of the fleet sees one event, not one per
//! node status change. Pure planning over plain data; `super` writes.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
};

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointSlice};
use kube::api::ObjectMeta;
use nodeward_api::fleet::{PEERS_MANAGED_BY, PEERS_SERVICE};

/// One slice of the directory: its name, whether it holds IPv6 addresses (a slice holds one
/// family), and its endpoints by node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub name: String,
    pub ipv6: bool,
    pub endpoints: BTreeMap<String, IpAddr>,
}

/// A change to the directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Create(Slice),
    Update(Slice),
    Delete(String),
}

/// The changes that make `existing` list exactly `desired` (node to address), at most
/// `per_slice` endpoints a slice: an endpoint stays in its slice (its address updated if it
/// changed within its family), new ones fill the slices of their family with room first, then
/// new slices; a slice left empty goes.
pub fn plan(
    existing: &[Slice],
    desired: &BTreeMap<String, IpAddr>,
    per_slice: usize,
) -> Vec<Change> {
    let mut slices: Vec<Slice> = existing.to_vec();
    slices.sort_by(|a, b| a.name.cmp(&b.name));
    let mut placed = BTreeSet::new();
    for slice in &mut slices {
        slice.endpoints.retain(|node, address| {
            let keep = desired
                .get(node)
                .is_some_and(|d| d.is_ipv6() == slice.ipv6 && !placed.contains(node));
            if keep {
                *address = desired[node];
                placed.insert(node.clone());
            }
            keep
        });
    }
    let mut taken: BTreeSet<String> = slices.iter().map(|s| s.name.clone()).collect();
    for (node, address) in desired {
        if placed.contains(node) {
            continue;
        }
        let ipv6 = address.is_ipv6();
        let room = slices
            .iter_mut()
            .find(|s| s.ipv6 == ipv6 && s.endpoints.len() < per_slice);
        match room {
            Some(slice) => {
                slice.endpoints.insert(node.clone(), *address);
            }
            None => {
                let name = free_name(&taken, ipv6);
                taken.insert(name.clone());
                slices.push(Slice {
                    name,
                    ipv6,
                    endpoints: [(node.clone(), *address)].into(),
                });
            }
        }
    }
    let before: BTreeMap<&str, &Slice> = existing.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut changes = Vec::new();
    for slice in slices {
        match before.get(slice.name.as_str()) {
            None => changes.push(Change::Create(slice)),
            Some(_) if slice.endpoints.is_empty() => changes.push(Change::Delete(slice.name)),
            Some(old) if **old != slice => changes.push(Change::Update(slice)),
            Some(_) => {}
        }
    }
    changes
}

/// Whether `address` may stand in an EndpointSlice: the API server refuses unspecified,
/// loopback, link-local and link-local multicast addresses (a slice with one of them is
/// refused whole, so such a node is left out and says why in the coordinator's log).
pub fn publishable(address: &IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || (v4.octets()[0] == 224 && v4.octets()[1] == 0 && v4.octets()[2] == 0))
        }
        IpAddr::V6(v6) => {
            let link_local = (v6.segments()[0] & 0xffc0) == 0xfe80;
            let link_local_multicast = (v6.segments()[0] & 0xff0f) == 0xff02;
            !(v6.is_unspecified() || v6.is_loopback() || link_local || link_local_multicast)
        }
    }
}

/// The first `nodeward-agents-ipv4-N` (or `-ipv6-N`) not in `taken`.
fn free_name(taken: &BTreeSet<String>, ipv6: bool) -> String {
    let family = if ipv6 { "ipv6" } else { "ipv4" };
    (0..)
        .map(|n| format!("{PEERS_SERVICE}-{family}-{n}"))
        .find(|name| !taken.contains(name))
        .unwrap_or_default()
}

/// The slice as the directory reads it: endpoints with a node name and an address.
pub fn read(slice: &EndpointSlice) -> Option<Slice> {
    let endpoints = slice
        .endpoints
        .iter()
        .filter_map(|e| {
            let node = e.node_name.clone()?;
            let address = e.addresses.first()?.parse().ok()?;
            Some((node, address))
        })
        .collect();
    Some(Slice {
        name: slice.metadata.name.clone()?,
        ipv6: slice.address_type == "IPv6",
        endpoints,
    })
}

/// The EndpointSlice object of `slice` in `namespace`.
pub fn object(slice: &Slice, namespace: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(slice.name.clone()),
            namespace: Some(namespace.to_owned()),
            labels: Some(
                [
                    (
                        "kubernetes.io/service-name".to_owned(),
                        PEERS_SERVICE.to_owned(),
                    ),
                    (
                        "endpointslice.kubernetes.io/managed-by".to_owned(),
                        PEERS_MANAGED_BY.to_owned(),
                    ),
                ]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        address_type: if slice.ipv6 { "IPv6" } else { "IPv4" }.to_owned(),
        endpoints: slice
            .endpoints
            .iter()
            .map(|(node, address)| Endpoint {
                addresses: vec![address.to_string()],
                node_name: Some(node.clone()),
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..EndpointConditions::default()
                }),
                ..Endpoint::default()
            })
            .collect(),
        ports: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(n: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, n])
    }

    fn desired(nodes: &[(&str, IpAddr)]) -> BTreeMap<String, IpAddr> {
        nodes.iter().map(|(n, a)| ((*n).to_owned(), *a)).collect()
    }

    fn slice(name: &str, nodes: &[(&str, IpAddr)]) -> Slice {
        Slice {
            name: name.to_owned(),
            ipv6: false,
            endpoints: desired(nodes),
        }
    }

    /// What the directory holds after `changes` are written over `existing`.
    fn apply(existing: &[Slice], changes: &[Change]) -> Vec<Slice> {
        let mut all: BTreeMap<String, Slice> = existing
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect();
        for change in changes {
            match change {
                Change::Create(s) | Change::Update(s) => {
                    all.insert(s.name.clone(), s.clone());
                }
                Change::Delete(name) => {
                    all.remove(name);
                }
            }
        }
        all.into_values().collect()
    }

    #[test]
    fn an_empty_directory_is_filled_slice_by_slice() {
        let want: BTreeMap<String, IpAddr> = (0..5u8).map(|i| (format!("n{i}"), ip(i))).collect();
        let changes = plan(&[], &want, 2);
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes.iter().all(|c| matches!(c, Change::Create(_))));
        let after = apply(&[], &changes);
        assert_eq!(after[0].name, "nodeward-agents-ipv4-0");
        assert!(after.iter().all(|s| s.endpoints.len() <= 2));
        assert_eq!(after.iter().map(|s| s.endpoints.len()).sum::<usize>(), 5);
        assert!(plan(&after, &want, 2).is_empty(), "nothing to change after");
    }

    #[test]
    fn a_node_joining_or_leaving_rewrites_one_slice() {
        let existing = vec![
            slice("nodeward-agents-ipv4-0", &[("a", ip(1)), ("b", ip(2))]),
            slice("nodeward-agents-ipv4-1", &[("c", ip(3))]),
        ];
        let joined = desired(&[("a", ip(1)), ("b", ip(2)), ("c", ip(3)), ("d", ip(4))]);
        let changes = plan(&existing, &joined, 2);
        assert_eq!(
            changes,
            [Change::Update(slice(
                "nodeward-agents-ipv4-1",
                &[("c", ip(3)), ("d", ip(4))]
            ))]
        );
        let left = desired(&[("b", ip(2)), ("c", ip(3))]);
        assert_eq!(
            plan(&existing, &left, 2),
            [Change::Update(slice(
                "nodeward-agents-ipv4-0",
                &[("b", ip(2))]
            ))]
        );
        let moved = desired(&[("a", ip(9)), ("b", ip(2)), ("c", ip(3))]);
        assert_eq!(
            plan(&existing, &moved, 2),
            [Change::Update(slice(
                "nodeward-agents-ipv4-0",
                &[("a", ip(9)), ("b", ip(2))]
            ))],
            "a new address stays in the node's slice"
        );
    }

    #[test]
    fn an_emptied_slice_goes_and_families_keep_to_their_own_slices() {
        let existing = vec![slice("nodeward-agents-ipv4-0", &[("a", ip(1))])];
        let v6: IpAddr = "fd00::1".parse().expect("ip");
        let changes = plan(&existing, &desired(&[("a", v6)]), 100);
        assert_eq!(
            changes,
            [
                Change::Delete("nodeward-agents-ipv4-0".into()),
                Change::Create(Slice {
                    name: "nodeward-agents-ipv6-0".into(),
                    ipv6: true,
                    endpoints: desired(&[("a", v6)]),
                }),
            ]
        );
    }

    #[test]
    fn a_node_listed_twice_keeps_one_endpoint() {
        let existing = vec![
            slice("nodeward-agents-ipv4-0", &[("a", ip(1))]),
            slice("nodeward-agents-ipv4-1", &[("a", ip(1)), ("b", ip(2))]),
        ];
        let after = apply(
            &existing,
            &plan(&existing, &desired(&[("a", ip(1)), ("b", ip(2))]), 100),
        );
        let endpoints: Vec<&String> = after.iter().flat_map(|s| s.endpoints.keys()).collect();
        assert_eq!(endpoints, ["a", "b"]);
    }

    #[test]
    fn addresses_the_api_server_refuses_are_not_published() {
        for refused in [
            "127.0.1.1",
            "0.0.0.0",
            "169.254.169.254",
            "224.0.0.5",
            "::1",
            "fe80::1",
            "ff02::1",
            "::",
        ] {
            assert!(!publishable(&refused.parse().expect("ip")), "{refused}");
        }
        for fine in ["10.0.0.5", "192.168.1.1", "fd00::5", "2001:db8::1"] {
            assert!(publishable(&fine.parse().expect("ip")), "{fine}");
        }
    }

    #[test]
    fn objects_are_read_back_as_written() {
        let s = slice("nodeward-agents-ipv4-0", &[("a", ip(1)), ("b", ip(2))]);
        let object = object(&s, "nodeward-system");
        assert_eq!(object.address_type, "IPv4");
        assert_eq!(read(&object), Some(s));
    }
}
