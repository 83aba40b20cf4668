//! One way to write to the API server: three verbs with one [`Outcome`].
//!
//! - [`apply`]: server-side apply of a typed patch under the caller's field manager, forced.
//!   For what one writer owns alone: a Node's conditions of the agent, a maintenance's drain
//!   progress, one condition of a maintenance ([`apply_condition`]: each condition type under a
//!   field manager of its own, so writing one never drops another, whoever wrote it).
//! - [`swap_status`], [`swap_finalizers`]: compare-and-swap, a merge patch carrying the
//!   resourceVersion that was read, for
//!   what must not be written over a stale view (phases, finalizers); [`Outcome::Conflict`]
//!   when anything changed since. [`replace`] and [`replace_status`] swap a whole object or
//!   status read before (budget slots, the leader Lease).
//! - the Node update ([`crate::cordon`]): read, change, replace with the resourceVersion,
//!   retried on conflict, for nodeward's part of a Node's spec, labels and annotations.
//!
//! [`create`] and [`delete`] answer with the same outcome. It says what the caller needs to
//! decide on: written, lost a race (read again and decide anew), gone (nothing left to do), or
//! failed (with what was being done, to what).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, OwnerReference};
use kube::{
    Api, Resource,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::ApiError;

/// What became of a write. Each refusal keeps the API server's answer, with what was being
/// done to which object.
#[derive(Debug)]
pub enum Outcome<K> {
    /// Written; the object as the API server returned it.
    Written(K),
    /// Refused because the object changed since it was read (409).
    Conflict(ApiError),
    /// The object is gone (404).
    Gone(ApiError),
    Failed(ApiError),
}

impl<K> Outcome<K> {
    fn of(
        result: Result<K, kube::Error>,
        action: &'static str,
        object: impl FnOnce() -> String,
    ) -> Self {
        match result {
            Ok(written) => Self::Written(written),
            Err(e) => {
                let code = match &e {
                    kube::Error::Api(status) => status.code,
                    _ => 0,
                };
                let error = ApiError::new(action, object(), e);
                match code {
                    409 => Self::Conflict(error),
                    404 => Self::Gone(error),
                    _ => Self::Failed(error),
                }
            }
        }
    }

    /// The object written, or why it was not (a lost race and a gone object included).
    pub fn required(self) -> Result<K, ApiError> {
        match self {
            Self::Written(k) => Ok(k),
            Self::Conflict(e) | Self::Gone(e) | Self::Failed(e) => Err(e),
        }
    }

    /// Whether it was written.
    pub fn is_written(&self) -> bool {
        matches!(self, Self::Written(_))
    }

    /// The object written (`Some`), or `None` for a gone object; a lost race or a failure is
    /// an error.
    pub fn or_gone(self) -> Result<Option<K>, ApiError> {
        match self {
            Self::Written(k) => Ok(Some(k)),
            Self::Gone(_) => Ok(None),
            Self::Conflict(e) | Self::Failed(e) => Err(e),
        }
    }
}

/// Which part of the object a write goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Object,
    Status,
}

/// The body of an apply: the kind's identity and name, and the fields the caller owns (at the
/// top for [`Part::Object`], under `status` for [`Part::Status`]).
#[derive(Debug, Serialize)]
struct Applied<'a, P> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'a str,
    metadata: Name<'a>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    fields: Option<&'a P>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a P>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Name<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner_references: Option<[&'a OwnerReference; 1]>,
}

/// Server-side apply of `fields` (a typed struct serializing to the fields it sets: the
/// object's, or its status's for [`Part::Status`]) to `name`, as `manager`, forced: the caller
/// owns exactly what it sets, and a later apply by the same manager that leaves a field out
/// removes it.
pub async fn apply<K, P>(
    api: &Api<K>,
    name: &str,
    part: Part,
    manager: &str,
    fields: &P,
) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    P: Serialize + std::fmt::Debug,
{
    let body = Applied {
        api_version: &K::api_version(&()),
        kind: &K::kind(&()),
        metadata: Name {
            name,
            owner_references: None,
        },
        fields: (part == Part::Object).then_some(fields),
        status: (part == Part::Status).then_some(fields),
    };
    let params = PatchParams::apply(manager).force();
    let patch = Patch::Apply(&body);
    let result = match part {
        Part::Object => api.patch(name, &params, &patch).await,
        Part::Status => api.patch_status(name, &params, &patch).await,
    };
    Outcome::of(result, "applying to", || format!("{} {name}", K::kind(&())))
}

/// Makes `owner` the owner of `name` (applied as `manager`, who then owns that reference).
pub async fn apply_owner<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    owner: &OwnerReference,
) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let body: Applied<'_, ()> = Applied {
        api_version: &K::api_version(&()),
        kind: &K::kind(&()),
        metadata: Name {
            name,
            owner_references: Some([owner]),
        },
        fields: None,
        status: None,
    };
    let result = api
        .patch(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&body),
        )
        .await;
    Outcome::of(result, "setting the owner of", || {
        format!("{} {name}", K::kind(&()))
    })
}

#[derive(Debug, Serialize)]
struct ConditionList<'a> {
    conditions: [&'a Condition; 1],
}

/// Applies one condition of `name`'s status (a list keyed by `type`) under a field manager of
/// its own, `<manager>/<type>`: it owns that entry alone, so neither another writer's
/// conditions nor this writer's other ones are dropped, whatever view the caller had.
pub async fn apply_condition<K>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    condition: &Condition,
) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let manager = format!("{manager}/{}", condition.type_);
    let fields = ConditionList {
        conditions: [condition],
    };
    apply(api, name, Part::Status, &manager, &fields).await
}

/// A merge patch made conditional on the resourceVersion read.
#[derive(Debug, Serialize)]
struct Swapped<'a, S> {
    metadata: Precondition<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<&'a S>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Precondition<'a> {
    resource_version: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    finalizers: Option<&'a [String]>,
}

/// Compare-and-swap of `status` fields (a merge patch of the status subresource): written
/// only if the object is still at the resourceVersion `current` was read at.
pub async fn swap_status<K, S>(api: &Api<K>, current: &K, status: &S) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    S: Serialize + std::fmt::Debug,
{
    let (name, body) = swapped(current, None, Some(status));
    let result = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await;
    Outcome::of(result, "writing the status of", || {
        format!("{} {name}", K::kind(&()))
    })
}

/// Compare-and-swap of the whole finalizer list, as [`swap_status`].
pub async fn swap_finalizers<K>(api: &Api<K>, current: &K, finalizers: &[String]) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let (name, body) = swapped::<K, ()>(current, Some(finalizers), None);
    let result = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await;
    Outcome::of(result, "updating the finalizers of", || {
        format!("{} {name}", K::kind(&()))
    })
}

/// `current`'s name, and the merge patch of `finalizers` and `status` carrying its
/// resourceVersion.
fn swapped<'a, K: Resource, S>(
    current: &'a K,
    finalizers: Option<&'a [String]>,
    status: Option<&'a S>,
) -> (String, Swapped<'a, S>) {
    let name = current.meta().name.clone().unwrap_or_default();
    let resource_version = current
        .meta()
        .resource_version
        .as_deref()
        .unwrap_or_default();
    let body = Swapped {
        metadata: Precondition {
            resource_version,
            finalizers,
        },
        status,
    };
    (name, body)
}

/// Compare-and-swap of a whole status: `updated` carries the resourceVersion it was read at,
/// so the write fails with [`Outcome::Conflict`] if anything changed since.
pub async fn replace_status<K>(api: &Api<K>, updated: &K) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = updated.meta().name.clone().unwrap_or_default();
    let result = api
        .replace_status(&name, &PostParams::default(), updated)
        .await;
    Outcome::of(result, "writing the status of", || {
        format!("{} {name}", K::kind(&()))
    })
}

/// Compare-and-swap of a whole object (e.g. a leader Lease): `updated` carries the
/// resourceVersion it was read at.
pub async fn replace<K>(api: &Api<K>, updated: &K) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let name = updated.meta().name.clone().unwrap_or_default();
    let result = api.replace(&name, &PostParams::default(), updated).await;
    Outcome::of(result, "updating", || format!("{} {name}", K::kind(&())))
}

/// Creates `object`; [`Outcome::Conflict`] if one of its name exists.
pub async fn create<K>(api: &Api<K>, object: &K) -> Outcome<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let result = api.create(&PostParams::default(), object).await;
    Outcome::of(result, "creating", || {
        format!(
            "{} {}",
            K::kind(&()),
            object.meta().name.as_deref().unwrap_or_default()
        )
    })
}

/// Deletes `name` under `params` (e.g. a uid precondition: [`Outcome::Conflict`] when the
/// object of that name is another one now).
pub async fn delete<K>(api: &Api<K>, name: &str, params: &DeleteParams) -> Outcome<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let result = api.delete(name, params).await.map(drop);
    Outcome::of(result, "deleting", || format!("{} {name}", K::kind(&())))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_swap_carries_the_version_read_and_only_what_it_changes() {
        let status = json!({"phase": "Draining"});
        let body = Swapped {
            metadata: Precondition {
                resource_version: "42",
                finalizers: None,
            },
            status: Some(&status),
        };
        assert_eq!(
            serde_json::to_value(&body).expect("serializes"),
            json!({"metadata": {"resourceVersion": "42"}, "status": {"phase": "Draining"}})
        );
        let finalizers = ["nodeward.io/maintenance".to_owned()];
        let body: Swapped<'_, ()> = Swapped {
            metadata: Precondition {
                resource_version: "7",
                finalizers: Some(&finalizers),
            },
            status: None,
        };
        assert_eq!(
            serde_json::to_value(&body).expect("serializes"),
            json!({"metadata": {"resourceVersion": "7", "finalizers": ["nodeward.io/maintenance"]}})
        );
    }

    #[test]
    fn an_apply_names_the_kind_and_the_object_beside_the_fields() {
        let fields = json!({"podsTotal": 3});
        let body = Applied {
            api_version: "nodeward.io/v1alpha1",
            kind: "NodeMaintenance",
            metadata: Name {
                name: "m",
                owner_references: None,
            },
            fields: None,
            status: Some(&fields),
        };
        assert_eq!(
            serde_json::to_value(&body).expect("serializes"),
            json!({"apiVersion": "nodeward.io/v1alpha1", "kind": "NodeMaintenance",
                   "metadata": {"name": "m"}, "status": {"podsTotal": 3}})
        );
    }
}
