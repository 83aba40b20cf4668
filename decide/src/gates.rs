//! Gates on cluster state (admission rule `gate`): a policy's `spec.gates`, each a CEL
//! expression that must be true of one named object before a maintenance in the policy's
//! scope is admitted. The coordinator reads the objects right before a round, only those of
//! policies that select the node of a pending maintenance ([`wanted`]); what a read means is
//! decided here.
//!
//! A gate holds the rollout when its expression is false or fails (a field the object lacks,
//! a type mismatch), and when its object is missing or could not be read: nothing is admitted
//! on a check that could not be made. An expression that does not compile, or an object the
//! coordinator may not read (its kind unknown, or no RBAC for it), is the policy's own
//! problem: it is invalid, with the field named, until fixed.

use std::collections::{BTreeMap, BTreeSet};

use cel::{Context, ExecutionError, Program, Value};
use nodeward_api::{
    DisruptionPolicy, NodeMaintenance,
    policy::{Gate, GateObject},
};

/// What reading a gate's object gave.
#[derive(Clone, Debug, PartialEq)]
pub enum Looked {
    /// The object, as the API server returned it.
    Found(serde_json::Value),
    /// It does not exist (yet): the gate is closed.
    Missing,
    /// The coordinator may not read it, or its kind is unknown: the policy is invalid.
    Unreadable(String),
    /// The read failed (a timeout, the API server's error): the gate is closed.
    Failed(String),
}

/// The objects to read for a round: those of the gates of every policy that selects the node
/// of a pending maintenance other than a remediation (`selects` as in
/// [`crate::blockers::wanted`]).
pub fn wanted(
    maintenances: &[std::sync::Arc<NodeMaintenance>],
    policies: &[std::sync::Arc<DisruptionPolicy>],
    selects: impl Fn(&DisruptionPolicy, &str) -> Option<bool>,
) -> BTreeSet<GateObject> {
    let mut objects = BTreeSet::new();
    let gated: Vec<&DisruptionPolicy> = policies
        .iter()
        .map(AsRef::as_ref)
        .filter(|p| !p.spec.gates.is_empty())
        .collect();
    if gated.is_empty() {
        return objects;
    }
    for m in maintenances
        .iter()
        .filter(|m| crate::blockers::looked_up_for(m))
    {
        for policy in &gated {
            if selects(policy, &m.spec.node_name) == Some(true) {
                objects.extend(policy.spec.gates.iter().map(|g| g.object.clone()));
            }
        }
    }
    objects
}

/// A policy's gates as judged now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Judged {
    /// What makes the policy invalid: an expression that does not compile, an object the
    /// coordinator may not read; each naming its field.
    pub problems: Vec<String>,
    /// Why the first gate that does not hold holds the rollout.
    pub closed: Option<String>,
}

/// Judges `gates` by the objects `looked` up for this round (a gate whose object was not read
/// is closed: its policy selects no pending maintenance, or one came after the reads).
pub fn judge(gates: &[Gate], looked: &BTreeMap<GateObject, Looked>) -> Judged {
    let mut judged = Judged::default();
    for (index, gate) in gates.iter().enumerate() {
        let field = format!("gates[{index}]");
        let program = match compile(&gate.expression) {
            Ok(program) => program,
            Err(e) => {
                judged.problems.push(format!("{field}.expression: {e}"));
                continue;
            }
        };
        let why = match looked.get(&gate.object) {
            None => Some(format!("{} not read yet", gate.object)),
            Some(Looked::Missing) => Some(format!("{} does not exist", gate.object)),
            Some(Looked::Failed(e)) => Some(format!("reading {} failed: {e}", gate.object)),
            Some(Looked::Unreadable(e)) => {
                judged.problems.push(format!("{field}.object: {e}"));
                continue;
            }
            Some(Looked::Found(object)) => match holds(&program, object) {
                Ok(true) => None,
                Ok(false) => Some(format!("{} is false of {}", gate.expression, gate.object)),
                Err(e) => Some(format!(
                    "{} failed on {}: {e}",
                    gate.expression, gate.object
                )),
            },
        };
        if let Some(why) = why.filter(|_| judged.closed.is_none()) {
            judged.closed = Some(format!("gate {} ({field}): {why}", gate.name));
        }
    }
    judged
}

/// The deepest nesting of brackets a gate's expression may have. The CEL parser recurses
/// deeply for each: a test thread's 2 MiB stack overflowed at 12 nested lists and 15 nested
/// parentheses (a debug build), and an overflow aborts the coordinator.
pub const NESTING_LIMIT: usize = 8;

/// Compiles a gate's expression; the error says where it is wrong.
pub fn compile(expression: &str) -> Result<Program, String> {
    let depth = nesting(expression);
    if depth > NESTING_LIMIT {
        return Err(format!(
            "nested {depth} brackets deep, more than {NESTING_LIMIT}: split it, or test fewer things at once"
        ));
    }
    Program::compile(expression).map_err(|e| {
        format!(
            "not a CEL expression: {}",
            e.to_string().lines().next().unwrap_or_default()
        )
    })
}

/// Whether `program` is true of `object` (bound as `object`); an error for a failure or a
/// result that is not a boolean.
pub fn holds(program: &Program, object: &serde_json::Value) -> Result<bool, String> {
    let mut context = Context::default();
    context.add_variable_from_value("object", cel_value(object));
    match program.execute(&context) {
        Ok(Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!(
            "the result is of type {}, not bool",
            other.type_of()
        )),
        Err(e) => Err(failure(&e)),
    }
}

/// What went wrong, without the object's values: a gate may read an object whose contents
/// not everyone who reads a maintenance's conditions should see.
fn failure(e: &ExecutionError) -> String {
    use ExecutionError as E;
    match e {
        E::InvalidArgumentCount { .. }
        | E::UnexpectedType { .. }
        | E::NoSuchKey(_)
        | E::UndeclaredReference(_)
        | E::MissingArgumentOrTarget => e.to_string(),
        E::FunctionError { function, .. } => format!("function {function} failed"),
        E::NotSupportedAsMethod { method, .. } => {
            format!("method {method} does not apply to that value")
        }
        _ => "an operation on the object's values failed (a type mismatch, an index out of range, a division by zero)".to_owned(),
    }
}

/// The deepest nesting of `(`, `[` and `{` in `expression`, outside its string literals.
fn nesting(expression: &str) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expression.chars() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => quote = Some(c),
                '(' | '[' | '{' => {
                    depth += 1;
                    deepest = deepest.max(depth);
                }
                ')' | ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            },
        }
    }
    deepest
}

/// `value` as CEL sees a Kubernetes object: whole numbers are `int` (as the API server's own
/// CEL has them), so `object.spec.replicas - 1` and `== 3` work.
fn cel_value(value: &serde_json::Value) -> Value {
    use serde_json::Value as Json;
    match value {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(u)) => Value::UInt(u),
            _ => Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(items) => Value::from(items.iter().map(cel_value).collect::<Vec<_>>()),
        Json::Object(fields) => Value::from(
            fields
                .iter()
                .map(|(k, v)| (k.as_str(), cel_value(v)))
                .collect::<std::collections::HashMap<_, _>>(),
        ),
    }
}

#[cfg(test)]
mod tests;
