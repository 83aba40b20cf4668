//! Reading the objects the policies' gates name, for a round (admission rule `gate`). Which
//! objects and what a read means are decided in [`nodeward_decide::gates`]; this resolves each
//! kind through the API server's discovery and gets the objects, at once, with short-lived
//! caches and a deadline per read.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    time::{Duration, Instant},
};

use futures::StreamExt;
use kube::{
    Api, Client,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    discovery::{self, Scope},
};
use nodeward_api::policy::GateObject;
use nodeward_decide::gates::Looked;

/// How long one read of an object is reused (rounds can follow each other closely).
const OBJECT_TTL: Duration = Duration::from_secs(2);
/// How long a kind's discovery is reused: a CRD installed later is seen within this.
const KIND_TTL: Duration = Duration::from_secs(60);
/// The longest one discovery or read may take before it counts as failed (the gate closed).
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How many objects are read at once.
const READS_AT_ONCE: usize = 16;

/// A kind as discovery resolved it: its resource and whether it is namespaced, or why it
/// cannot be read.
type Resolved = Result<(ApiResource, bool), Looked>;

/// Reads gate objects, with short-lived caches.
pub struct Reads {
    client: Client,
    kinds: HashMap<(String, String), (Instant, Resolved)>,
    objects: BTreeMap<GateObject, (Instant, Looked)>,
}

impl Reads {
    pub fn new(client: Client) -> Self {
        Self {
            client,
            kinds: HashMap::new(),
            objects: BTreeMap::new(),
        }
    }

    /// Each of `wanted` as read now (or within [`OBJECT_TTL`]). The kinds are resolved first
    /// (few, and cached), then the objects read at once, [`READS_AT_ONCE`] at a time: a slow
    /// API server delays a round by about one [`READ_TIMEOUT`], not one per object.
    pub async fn read(&mut self, wanted: &BTreeSet<GateObject>) -> BTreeMap<GateObject, Looked> {
        let now = Instant::now();
        self.objects
            .retain(|_, (at, _)| now.duration_since(*at) < OBJECT_TTL);
        self.kinds
            .retain(|_, (at, _)| now.duration_since(*at) < KIND_TTL);
        let unread: Vec<&GateObject> = wanted
            .iter()
            .filter(|o| !self.objects.contains_key(*o))
            .collect();
        let mut resolved = BTreeMap::new();
        for object in &unread {
            let kind = (object.api_version.clone(), object.kind.clone());
            if let std::collections::btree_map::Entry::Vacant(entry) = resolved.entry(kind) {
                entry.insert(self.resolve(object).await);
            }
        }
        // Each read owns what it needs: a future borrowing this round's locals would not be
        // Send for every lifetime the controller's task needs.
        let reads = unread.into_iter().map(|object| {
            let kind = (object.api_version.clone(), object.kind.clone());
            let resolution = resolved.get(&kind).cloned();
            let (client, object) = (self.client.clone(), object.clone());
            async move {
                let looked = match resolution {
                    Some(Ok((resource, namespaced))) => {
                        get(&client, &object, &resource, namespaced).await
                    }
                    Some(Err(looked)) => looked,
                    None => Looked::Failed("its kind was not resolved".to_owned()),
                };
                (object, looked)
            }
        });
        let fresh: Vec<(GateObject, Looked)> = futures::stream::iter(reads.collect::<Vec<_>>())
            .buffer_unordered(READS_AT_ONCE)
            .collect()
            .await;
        let at = Instant::now();
        for (object, looked) in fresh {
            self.objects.insert(object, (at, looked));
        }
        wanted
            .iter()
            .filter_map(|o| Some((o.clone(), self.objects.get(o)?.1.clone())))
            .collect()
    }

    /// The resource of `object`'s kind, from discovery (cached for [`KIND_TTL`]).
    async fn resolve(&mut self, object: &GateObject) -> Resolved {
        let key = (object.api_version.clone(), object.kind.clone());
        if let Some((_, resolved)) = self.kinds.get(&key) {
            return resolved.clone();
        }
        let (group, version) = object
            .api_version
            .split_once('/')
            .unwrap_or(("", &object.api_version));
        let gvk = GroupVersionKind::gvk(group, version, &object.kind);
        let resolved =
            match tokio::time::timeout(READ_TIMEOUT, discovery::pinned_kind(&self.client, &gvk))
                .await
            {
                Err(_) => Err(Looked::Failed(format!(
                    "discovering {} {} gave no answer within {}s",
                    object.api_version,
                    object.kind,
                    READ_TIMEOUT.as_secs()
                ))),
                Ok(Ok((resource, capabilities))) => {
                    Ok((resource, capabilities.scope == Scope::Namespaced))
                }
                // The group or version is not served (404), or it has no such kind.
                Ok(Err(kube::Error::Api(status))) if status.code == 404 => Err(unknown(object)),
                Ok(Err(kube::Error::Discovery(_))) => Err(unknown(object)),
                Ok(Err(e)) => Err(Looked::Failed(format!(
                    "discovering {} {}: {e}",
                    object.api_version, object.kind
                ))),
            };
        // Only an answer is kept: a failed discovery is asked again next round.
        if !matches!(resolved, Err(Looked::Failed(_))) {
            self.kinds.insert(key, (Instant::now(), resolved.clone()));
        }
        resolved
    }
}

/// Reads `object`, of `resource` (`namespaced` or not).
async fn get(
    client: &Client,
    object: &GateObject,
    resource: &ApiResource,
    namespaced: bool,
) -> Looked {
    let api: Api<DynamicObject> = match (&object.namespace, namespaced) {
        (Some(namespace), true) => Api::namespaced_with(client.clone(), namespace, resource),
        (None, false) => Api::all_with(client.clone(), resource),
        (None, true) => {
            return Looked::Unreadable(format!(
                "{} is namespaced: set object.namespace",
                object.kind
            ));
        }
        (Some(_), false) => {
            return Looked::Unreadable(format!(
                "{} is cluster-scoped: remove object.namespace",
                object.kind
            ));
        }
    };
    match tokio::time::timeout(READ_TIMEOUT, api.get_opt(&object.name)).await {
        Err(_) => Looked::Failed(format!("no answer within {}s", READ_TIMEOUT.as_secs())),
        Ok(Ok(None)) => Looked::Missing,
        Ok(Ok(Some(found))) => match serde_json::to_value(&found) {
            Ok(value) => Looked::Found(value),
            Err(e) => Looked::Failed(format!("the object is not JSON: {e}")),
        },
        Ok(Err(kube::Error::Api(status))) if status.code == 403 => {
            Looked::Unreadable(forbidden(resource, &status.message))
        }
        Ok(Err(e)) => Looked::Failed(e.to_string()),
    }
}

fn unknown(object: &GateObject) -> Looked {
    Looked::Unreadable(format!(
        "the API server serves no kind {} in {} (a CRD not installed, or a typo)",
        object.kind, object.api_version
    ))
}

fn forbidden(resource: &ApiResource, message: &str) -> String {
    let resource = if resource.group.is_empty() {
        resource.plural.clone()
    } else {
        format!("{}.{}", resource.plural, resource.group)
    };
    format!(
        "the coordinator may not get {resource} (grant it in the chart's coordinator.gateReads): {message}"
    )
}
