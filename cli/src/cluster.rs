//! The verbs' API calls: each reads what it needs, writes what the verb asks for, and says
//! what it did, one line per object. A verb given several names does what it can for each and
//! reports the ones it could not do at the end ([`Error::Refused`]).

use std::{path::Path, sync::Arc};

use k8s_openapi::api::{
    authentication::v1::SelfSubjectReview, coordination::v1::Lease, core::v1::Node,
    events::v1::Event,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};
use nodeward_api::{
    DisruptionPolicy, NodeMaintenance, fleet::LEASE_LABEL, labels::CORDONED_BY_ANNOTATION,
};
use nodeward_decide::round::Objects;
use nodeward_runtime::ApiError;
use serde::de::DeserializeOwned;

use crate::{
    Error,
    request::{self, Verb},
    status, why,
};

/// Who the plugin says it is to the API server.
const USER_AGENT: &str = concat!("kubectl-nodeward/", env!("CARGO_PKG_VERSION"));

/// A client as kubectl would make it: `kubeconfig` (else `$KUBECONFIG`, `~/.kube/config`, or
/// the in-cluster service account) and its `context` (else the current one).
pub async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> Result<Client, Error> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let mut config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Error::Connect(format!("reading {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Error::Connect(format!("loading {}: {e}", path.display())))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Connect(e.to_string()))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| Error::Connect(e.to_string()))?,
    };
    config.headers.push((
        hyper::header::USER_AGENT,
        hyper::header::HeaderValue::from_static(USER_AGENT),
    ));
    Client::try_from(config).map_err(|e| Error::Connect(e.to_string()))
}

/// The user the API server knows this client as (for `requestedBy`).
pub async fn requester(client: &Client) -> String {
    let reviews: Api<SelfSubjectReview> = Api::all(client.clone());
    reviews
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .ok()
        .and_then(|r| r.status?.user_info?.username)
        .unwrap_or_else(|| "kubectl-nodeward".to_owned())
}

/// `reboot` / `patch` / `drain`: a maintenance of each node that exists and has none under
/// way (`urgent`: an emergency).
pub async fn request(
    client: &Client,
    nodes: &[String],
    verb: Verb,
    message: Option<&str>,
    urgent: bool,
) -> Result<(), Error> {
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let existing = every_maintenance(&maintenances).await?;
    let by = requester(client).await;
    let node_api: Api<Node> = Api::all(client.clone());
    // A patch says which policy's update it runs, and whether it reboots.
    let policies: Vec<DisruptionPolicy> = if verb == Verb::Patch {
        Api::<DisruptionPolicy>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| ApiError::new("listing", "DisruptionPolicies".into(), e))?
            .items
    } else {
        Vec::new()
    };
    let mut refused = Vec::new();
    for node in nodes {
        let labels = match node_api.get_opt(node).await {
            Err(e) => {
                refused.push(ApiError::new("reading", format!("Node {node}"), e).to_string());
                continue;
            }
            Ok(None) => {
                refused.push(format!("{node}: no such node (kubectl get nodes)"));
                continue;
            }
            Ok(Some(n)) => n.labels().clone(),
        };
        if let Some(why) = request::refusal(&existing, node) {
            refused.push(why);
            continue;
        }
        let m = request::maintenance(node, verb, &by, message, urgent, jiff::Timestamp::now());
        match maintenances.create(&PostParams::default(), &m).await {
            Ok(created) => println!(
                "nodemaintenance/{} created: {node} is {} once the coordinator admits it (kubectl nodeward why {node})",
                created.name_any(),
                request::outcome(
                    verb,
                    urgent,
                    request::update_of(&policies, &labels).as_ref()
                )
            ),
            Err(e) => refused.push(
                ApiError::new("creating", format!("NodeMaintenance {}", m.name_any()), e)
                    .to_string(),
            ),
        }
    }
    done(refused)
}

/// `cancel` / `uncordon`: deletes every maintenance of each node that is under way; the node's
/// agent undoes the taint and cordon it made (a cordon someone else made stays).
pub async fn cancel(client: &Client, nodes: &[String]) -> Result<(), Error> {
    let maintenances: Api<NodeMaintenance> = Api::all(client.clone());
    let existing = every_maintenance(&maintenances).await?;
    let node_api: Api<Node> = Api::all(client.clone());
    let mut refused = Vec::new();
    for node in nodes {
        let open = request::under_way(&existing, node);
        for m in &open {
            let name = m.name_any();
            let params = DeleteParams {
                preconditions: m.uid().map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match maintenances.delete(&name, &params).await {
                Ok(_) => println!(
                    "nodemaintenance/{name} cancelled ({:?}): {node}'s agent undoes what nodeward did to it",
                    m.phase()
                ),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => refused.push(
                    ApiError::new("deleting", format!("NodeMaintenance {name}"), e).to_string(),
                ),
            }
        }
        if open.is_empty() {
            println!("{node}: no maintenance under way");
        }
        if let Ok(Some(n)) = node_api.get_opt(node).await {
            let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
            if cordoned && !n.annotations().contains_key(CORDONED_BY_ANNOTATION) {
                println!(
                    "{node}: cordoned, not by nodeward: `kubectl uncordon {node}` if that is what you want"
                );
            }
        }
    }
    done(refused)
}

/// `out-of-service`: the out-of-service taint with nodeward's record on each node that is not
/// Ready (one written over the Node as read, so a node that turned Ready meanwhile is not
/// marked).
pub async fn out_of_service(
    client: &Client,
    nodes: &[String],
    message: Option<&str>,
) -> Result<(), Error> {
    let by = requester(client).await;
    let node_api: Api<Node> = Api::all(client.clone());
    let mut refused = Vec::new();
    for name in nodes {
        let mut node = match node_api.get_opt(name).await {
            Ok(Some(node)) => node,
            Ok(None) => {
                refused.push(format!("{name}: no such node (kubectl get nodes)"));
                continue;
            }
            Err(e) => {
                refused.push(ApiError::new("reading", format!("Node {name}"), e).to_string());
                continue;
            }
        };
        if nodeward_api::node::is_ready(&node) {
            refused.push(format!(
                "{name}: Ready, so it is running: only a node known to be off is marked out of service"
            ));
            continue;
        }
        let why = format!(
            "marked by {by} (kubectl nodeward out-of-service){}",
            message.map(|m| format!(": {m}")).unwrap_or_default()
        );
        if !nodeward_api::node::out_of_service(&mut node, true, &why) {
            println!("{name}: already out of service");
            continue;
        }
        match node_api.replace(name, &PostParams::default(), &node).await {
            Ok(_) => println!(
                "node/{name} marked out of service: its pods are deleted and start elsewhere; nodeward takes the taint away once it is Ready"
            ),
            Err(e) => refused.push(
                ApiError::new("marking out of service", format!("Node {name}"), e).to_string(),
            ),
        }
    }
    done(refused)
}

/// `pause` / `resume`: sets each policy's `spec.paused`; a resume also forgives the failures
/// its `failureBudget` counted until now (`countSince`), which lifts a halt.
pub async fn set_paused(client: &Client, policies: &[String], paused: bool) -> Result<(), Error> {
    let api: Api<DisruptionPolicy> = Api::all(client.clone());
    let mut refused = Vec::new();
    for name in policies {
        let budgeted = match api.get_opt(name).await {
            Ok(Some(policy)) => policy.spec.failure_budget.is_some(),
            Ok(None) => {
                refused.push(format!(
                    "{name}: no such policy (kubectl get disruptionpolicies)"
                ));
                continue;
            }
            Err(e) => {
                refused.push(
                    ApiError::new("reading", format!("DisruptionPolicy {name}"), e).to_string(),
                );
                continue;
            }
        };
        let forgive = budgeted && !paused;
        let mut spec = serde_json::json!({"paused": paused});
        if forgive {
            let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
            spec["failureBudget"] = serde_json::json!({"countSince": now});
        }
        let patch = Patch::Merge(serde_json::json!({ "spec": spec }));
        match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(_) if paused => println!(
                "disruptionpolicy/{name} paused: nothing new is admitted under it; maintenances under way finish"
            ),
            Ok(_) if forgive => println!(
                "disruptionpolicy/{name} resumed; the failures its failureBudget counted until now are forgiven"
            ),
            Ok(_) => println!("disruptionpolicy/{name} resumed"),
            Err(e) => refused
                .push(ApiError::new("patching", format!("DisruptionPolicy {name}"), e).to_string()),
        }
    }
    done(refused)
}

/// `status`: the coordinator's report.
pub async fn status(client: &Client) -> Result<String, Error> {
    let objects = watched(client).await?;
    Ok(status::render(&objects, jiff::Timestamp::now()))
}

/// `why NODE`, with the writes about it the cluster refused.
pub async fn why(client: &Client, node: &str) -> Result<String, Error> {
    let objects = watched(client).await?;
    let now = jiff::Timestamp::now();
    let mut out = why::explain(node, &objects, now).map_err(|e| Error::Refused(vec![e]))?;
    match refused_writes(client, node).await {
        Ok(refused) => out.push_str(&why::refusal_lines(&refused, now)),
        // Events are the operator's to read or not: what is known is still said.
        Err(e) => out.push_str(&format!("(refused writes not looked up: {e})\n")),
    }
    Ok(out)
}

/// The Warning Events nodeward's daemons published about `node` because the cluster refused
/// their writes (the coordinator's Node changes, the agent's reports).
async fn refused_writes(client: &Client, node: &str) -> Result<Vec<why::Refused>, ApiError> {
    let events: Api<Event> = Api::all(client.clone());
    let listed = events
        .list(&ListParams::default().fields(&format!(
            "regarding.kind=Node,regarding.name={node},type=Warning"
        )))
        .await
        .map_err(|e| ApiError::new("listing", format!("the Events about node {node}"), e))?;
    Ok(listed
        .items
        .into_iter()
        .filter(|e| {
            matches!(
                e.reason.as_deref(),
                Some(nodeward_runtime::NODE_WRITE_REFUSED | nodeward_runtime::WRITE_REFUSED)
            )
        })
        .map(|e| why::Refused {
            by: e.reporting_controller.unwrap_or_default(),
            // A repeated refusal is one Event with a series: its last time is the newest.
            at: e
                .series
                .map(|s| {
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(s.last_observed_time.0)
                })
                .or(e
                    .event_time
                    .map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.0)))
                .or(e.deprecated_last_timestamp),
            note: e.note.unwrap_or_default(),
        })
        .collect())
}

/// Every kind a coordinator's round watches, listed once (the lookups a round makes before it
/// decides are left empty: `status` and `why` say what the objects alone decide).
async fn watched(client: &Client) -> Result<Objects, Error> {
    async fn list<K>(client: &Client) -> Result<Vec<Arc<K>>, Error>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    {
        let api: Api<K> = Api::all(client.clone());
        let listed = api
            .list(&ListParams::default())
            .await
            .map_err(|e| ApiError::new("listing", K::plural(&()).into_owned(), e))?;
        Ok(listed.items.into_iter().map(Arc::new).collect())
    }
    let leases: Api<Lease> = Api::all(client.clone());
    let leases = leases
        .list(&ListParams::default().labels(LEASE_LABEL))
        .await
        .map_err(|e| ApiError::new("listing", "the agents' leases".into(), e))?;
    Ok(Objects {
        nodes: list(client).await?,
        policies: list(client).await?,
        maintenances: list(client).await?,
        reports: list(client).await?,
        leases: leases.items.into_iter().map(Arc::new).collect(),
        ..Objects::default()
    })
}

async fn every_maintenance(api: &Api<NodeMaintenance>) -> Result<Vec<NodeMaintenance>, Error> {
    Ok(api
        .list(&ListParams::default())
        .await
        .map_err(|e| ApiError::new("listing", "NodeMaintenances".into(), e))?
        .items)
}

fn done(refused: Vec<String>) -> Result<(), Error> {
    if refused.is_empty() {
        Ok(())
    } else {
        Err(Error::Refused(refused))
    }
}
