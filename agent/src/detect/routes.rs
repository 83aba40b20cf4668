//! Default routes, read from the kernel's routing tables in `/proc/net`: IPv4 always, IPv6
//! when the node has a global IPv6 address (or when configured to require it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nodeward_api::conditions::node::NETWORK_PROBLEM;
use serde::Deserialize;

use super::{
    Finding,
    interfaces::{self, InterfacesConfig},
};

#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase", default)]
pub struct RoutesConfig {
    pub ipv6: Ipv6Mode,
}

/// Whether an IPv6 default route is expected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub enum Ipv6Mode {
    /// Expected when the node has a global IPv6 address.
    #[default]
    Auto,
    Required,
    Ignored,
}

pub const DETECTOR: &str = "default-route";
pub const IPV4_TABLE: &str = "/proc/net/route";
pub const IPV6_TABLE: &str = "/proc/net/ipv6_route";

const RTF_UP: u32 = 0x0001;
const RTF_REJECT: u32 = 0x0200;

/// A usable default route: the interface it leaves by and its gateway, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DefaultRoute {
    pub interface: String,
    pub gateway: Option<IpAddr>,
}

pub async fn observe(interfaces: &InterfacesConfig, config: &RoutesConfig) -> Finding {
    let has_global_ipv6 = interfaces::read()
        .map(|list| interfaces::has_global_ipv6(&list, interfaces))
        .unwrap_or(false);
    let ipv4 = read_table(IPV4_TABLE).await.map(|t| parse_ipv4(&t));
    let ipv6 = read_table(IPV6_TABLE).await.map(|t| parse_ipv6(&t));
    evaluate(&ipv4, &ipv6, has_global_ipv6, config)
}

async fn read_table(path: &str) -> Result<String, String> {
    // A kernel without IPv6 has no ipv6_route file: that is an empty table, not an error.
    match tokio::fs::read_to_string(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == IPV6_TABLE => {
            Ok(String::new())
        }
        other => other.map_err(|e| e.to_string()),
    }
}

/// The default routes in the text of `/proc/net/route`.
pub fn parse_ipv4(table: &str) -> Vec<DefaultRoute> {
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            let (iface, destination, gateway, flags, mask) = (
                fields.first()?,
                fields.get(1)?,
                fields.get(2)?,
                fields.get(3)?,
                fields.get(7)?,
            );
            let flags = u32::from_str_radix(flags, 16).ok()?;
            let is_default = u32::from_str_radix(destination, 16).ok()? == 0
                && u32::from_str_radix(mask, 16).ok()? == 0;
            if !is_default || flags & RTF_UP == 0 || flags & RTF_REJECT != 0 {
                return None;
            }
            // The kernel prints the address in host byte order (little-endian on x86 and arm).
            let gateway = Ipv4Addr::from(u32::from_str_radix(gateway, 16).ok()?.swap_bytes());
            Some(DefaultRoute {
                interface: (*iface).to_owned(),
                gateway: (!gateway.is_unspecified()).then_some(IpAddr::V4(gateway)),
            })
        })
        .collect()
}

/// The default routes in the text of `/proc/net/ipv6_route`.
pub fn parse_ipv6(table: &str) -> Vec<DefaultRoute> {
    table
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // dest dest_len src src_len next_hop metric refcnt use flags iface
            if fields.len() < 10 {
                return None;
            }
            let is_default = u128::from_str_radix(fields[0], 16).ok()? == 0 && fields[1] == "00";
            let flags = u32::from_str_radix(fields[8], 16).ok()?;
            if !is_default || flags & RTF_UP == 0 || flags & RTF_REJECT != 0 || fields[9] == "lo" {
                return None;
            }
            let gateway = Ipv6Addr::from(u128::from_str_radix(fields[4], 16).ok()?);
            Some(DefaultRoute {
                interface: fields[9].to_owned(),
                gateway: (!gateway.is_unspecified()).then_some(IpAddr::V6(gateway)),
            })
        })
        .collect()
}

/// A routing table as read: its default routes, or why it could not be read.
pub type Table = Result<Vec<DefaultRoute>, String>;

/// Decides from both tables; `has_global_ipv6` says whether the node has a usable IPv6
/// address, which is what makes an IPv6 default route expected in `Auto` mode.
pub fn evaluate(
    ipv4: &Table,
    ipv6: &Table,
    has_global_ipv6: bool,
    config: &RoutesConfig,
) -> Finding {
    let want_ipv6 = match config.ipv6 {
        Ipv6Mode::Required => true,
        Ipv6Mode::Auto => has_global_ipv6,
        Ipv6Mode::Ignored => false,
    };
    let mut families = vec![("IPv4", ipv4, IPV4_TABLE)];
    if want_ipv6 {
        families.push(("IPv6", ipv6, IPV6_TABLE));
    }
    let mut found = Vec::new();
    let mut missing = Vec::new();
    for (family, table, path) in families {
        match table {
            Err(e) => {
                return Finding::unknown(
                    DETECTOR,
                    NETWORK_PROBLEM,
                    "RouteTableUnreadable",
                    format!("cannot read the {family} routing table {path}: {e}"),
                );
            }
            Ok(routes) if routes.is_empty() => missing.push(family),
            Ok(routes) => found.push(format!("{family} via {}", describe(&routes[0]))),
        }
    }
    match missing.as_slice() {
        [] => Finding::ok(
            DETECTOR,
            NETWORK_PROBLEM,
            "DefaultRoutePresent",
            found.join("; "),
        ),
        families => {
            let message = format!("no {} default route", families.join(" or "));
            Finding::problem(DETECTOR, NETWORK_PROBLEM, "NoDefaultRoute", message)
        }
    }
}

fn describe(route: &DefaultRoute) -> String {
    match route.gateway {
        Some(gateway) => format!("{gateway} dev {}", route.interface),
        None => format!("dev {}", route.interface),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::Status;

    const IPV4: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
";
    const IPV4_NO_DEFAULT: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
";
    const IPV6: &str = "\
20010db8000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";
    const IPV6_ONLY_UNREACHABLE: &str = "\
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";

    #[test]
    fn parses_the_ipv4_default_route_with_its_gateway() {
        let routes = parse_ipv4(IPV4);
        assert_eq!(
            routes,
            vec![DefaultRoute {
                interface: "eth0".into(),
                gateway: Some("10.0.0.1".parse().expect("ip")),
            }]
        );
        assert!(parse_ipv4(IPV4_NO_DEFAULT).is_empty());
    }

    #[test]
    fn parses_ipv6_default_and_skips_the_unreachable_loopback_route() {
        let routes = parse_ipv6(IPV6);
        assert_eq!(routes.len(), 1);
        assert_eq!(routes[0].gateway, Some("fe80::1".parse().expect("ip")));
        assert!(parse_ipv6(IPV6_ONLY_UNREACHABLE).is_empty());
    }

    #[test]
    fn missing_ipv4_default_is_a_problem() {
        let found = evaluate(
            &Ok(parse_ipv4(IPV4_NO_DEFAULT)),
            &Ok(vec![]),
            false,
            &RoutesConfig::default(),
        );
        found.assert_is(Status::Problem, "NoDefaultRoute");
        assert_eq!(found.message, "no IPv4 default route");
    }

    #[test]
    fn ipv6_default_is_required_only_when_the_node_has_global_ipv6_in_auto_mode() {
        let v4 = Ok(parse_ipv4(IPV4));
        let no_v6 = Ok(parse_ipv6(IPV6_ONLY_UNREACHABLE));
        let config = RoutesConfig::default();
        assert_eq!(evaluate(&v4, &no_v6, false, &config).status, Status::Ok);
        let found = evaluate(&v4, &no_v6, true, &config);
        assert_eq!(
            (found.status, found.message.as_str()),
            (Status::Problem, "no IPv6 default route")
        );
        let ignored = RoutesConfig {
            ipv6: Ipv6Mode::Ignored,
        };
        assert_eq!(evaluate(&v4, &no_v6, true, &ignored).status, Status::Ok);
        let required = RoutesConfig {
            ipv6: Ipv6Mode::Required,
        };
        assert_eq!(
            evaluate(&v4, &no_v6, false, &required).status,
            Status::Problem
        );
        assert_eq!(
            evaluate(&v4, &Ok(parse_ipv6(IPV6)), true, &config).status,
            Status::Ok
        );
    }

    #[test]
    fn unreadable_table_is_unknown_not_a_problem() {
        let found = evaluate(
            &Err("permission denied".into()),
            &Ok(vec![]),
            false,
            &RoutesConfig::default(),
        );
        assert_eq!(found.status, Status::Unknown);
        found.assert_says("/proc/net/route: permission denied");
    }
}
