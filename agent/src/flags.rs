//! Settings given as flags (or their environment variables) instead of in the configuration
//! file. The section that owns a field declares its flag ([`Flag`]: kured's and
//! node-problem-detector's names where nodeward has their setting); `--set PATH=VALUE` reaches
//! any field. Both are written into the file's YAML at the field's place before the
//! configuration is parsed, so a flag's value is checked exactly as the file's would be, and an
//! error names the field and the flag.

use clap::{Arg, ArgAction, ArgMatches};
use serde_yaml::{Mapping, Value};

/// A field that may be set by a flag: declared by the section that owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    /// `--long`.
    pub long: &'static str,
    pub env: &'static str,
    /// The field within its section, e.g. `sentinelFile`.
    pub field: &'static str,
    pub kind: Kind,
    pub help: &'static str,
    /// Other fields of the section the flag sets with it, as YAML, e.g. `("writeDropIn",
    /// "true")`.
    pub also: &'static [(&'static str, &'static str)],
}

/// How a flag's text becomes the field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A string as written (paths, URLs, durations).
    Text,
    /// A YAML scalar: a number or `true`/`false`.
    Scalar,
    /// A command: words split on spaces.
    Words,
    /// A list: comma-separated, or the flag repeated.
    List,
}

/// Declares a section's flags, one a line: `"long" ("ENV") => "field": Kind, "help"`, with
/// `also ["field" = "yaml", ...]` for fields it sets with its own.
macro_rules! declare {
    ($($long:literal ($env:literal) => $field:literal: $kind:ident, $help:literal $(, also [$($also:literal = $value:literal),*])?;)*) => {
        vec![$($crate::flags::Flag::new($long, $env, $field, $crate::flags::Kind::$kind, $help)$(.also(&[$(($also, $value)),*]))?),*]
    };
}
pub(crate) use declare;

impl Flag {
    pub const fn new(
        long: &'static str,
        env: &'static str,
        field: &'static str,
        kind: Kind,
        help: &'static str,
    ) -> Self {
        Self {
            long,
            env,
            field,
            kind,
            help,
            also: &[],
        }
    }

    /// The same flag, also setting `also` when given.
    pub const fn also(self, also: &'static [(&'static str, &'static str)]) -> Self {
        Self { also, ..self }
    }
}

/// A declared flag at its section's place (`detectors.peers`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placed {
    pub flag: Flag,
    pub place: String,
}

impl Placed {
    pub fn at(place: &str, flags: &[Flag]) -> Vec<Self> {
        flags
            .iter()
            .map(|flag| Self {
                flag: *flag,
                place: place.to_owned(),
            })
            .collect()
    }

    /// The field's whole path, e.g. `detectors.peers.port`.
    pub fn path(&self) -> String {
        format!("{}.{}", self.place, self.flag.field)
    }

    /// The clap argument: its help names the field it sets.
    pub fn arg(&self) -> Arg {
        let f = &self.flag;
        let action = match f.kind {
            Kind::List => ArgAction::Append,
            _ => ArgAction::Set,
        };
        Arg::new(f.long)
            .long(f.long)
            .env(f.env)
            .action(action)
            .value_name("VALUE")
            .help(format!("{} ({})", f.help, self.path()))
    }
}

/// One setting to write into the configuration: the field's path, its value, and which flag
/// gave it (for errors).
#[derive(Clone, Debug, PartialEq)]
pub struct Given {
    pub path: String,
    pub value: Value,
    pub from: String,
}

/// `--set PATH=VALUE`, repeatable: any field, its value as YAML (`--set
/// detectors.peers.port=9000`, `--set detectors.securityGroups.expected=[a,b]`).
pub fn set_arg() -> Arg {
    Arg::new("set")
        .long("set")
        .env("NODEWARD_SET")
        .value_delimiter(';')
        .action(ArgAction::Append)
        .value_name("PATH=VALUE")
        .help("Set any field of the configuration file, its value as YAML, e.g. --set detectors.peers.port=9000 (repeat it; ';' separates several in the environment variable)")
}

/// What the command line gave: each declared flag that was given, then each `--set`, in that
/// order (a later one wins).
pub fn given(matches: &ArgMatches, flags: &[Placed]) -> Result<Vec<Given>, String> {
    let mut given = Vec::new();
    for placed in flags {
        let f = &placed.flag;
        let Some(values) = matches.get_many::<String>(f.long) else {
            continue;
        };
        let values: Vec<&String> = values.collect();
        let from = format!("--{}", f.long);
        let value = match f.kind {
            Kind::Text => Value::String(values.last().map(|v| (*v).clone()).unwrap_or_default()),
            Kind::Scalar => {
                let text = values.last().map_or("", |v| v.as_str());
                serde_yaml::from_str(text).map_err(|e| format!("{from} {text:?}: {e}"))?
            }
            Kind::Words => Value::Sequence(
                values
                    .last()
                    .map(|v| {
                        v.split_whitespace()
                            .map(|w| Value::String(w.to_owned()))
                            .collect()
                    })
                    .unwrap_or_default(),
            ),
            Kind::List => Value::Sequence(
                values
                    .iter()
                    .flat_map(|v| v.split(','))
                    .map(str::trim)
                    .filter(|v| !v.is_empty())
                    .map(|v| Value::String(v.to_owned()))
                    .collect(),
            ),
        };
        given.push(Given {
            path: placed.path(),
            value,
            from: from.clone(),
        });
        for (field, value) in f.also {
            given.push(Given {
                path: format!("{}.{field}", placed.place),
                value: serde_yaml::from_str(value).map_err(|e| format!("{from}: {e}"))?,
                from: from.clone(),
            });
        }
    }
    for set in matches.get_many::<String>("set").into_iter().flatten() {
        given.push(parse_set(set)?);
    }
    Ok(given)
}

/// `PATH=VALUE` of `--set`.
pub fn parse_set(set: &str) -> Result<Given, String> {
    let (path, value) = set.split_once('=').ok_or_else(|| {
        format!("--set {set:?}: write PATH=VALUE, e.g. --set detectors.peers.port=9000")
    })?;
    let path = path.trim();
    if path.is_empty() || path.split('.').any(str::is_empty) {
        return Err(format!(
            "--set {set:?}: {path:?} is not a field's path; write it like detectors.peers.port"
        ));
    }
    let value = serde_yaml::from_str(value)
        .map_err(|e| format!("--set {set:?}: the value is not YAML: {e}"))?;
    Ok(Given {
        path: path.to_owned(),
        value,
        from: format!("--set {path}"),
    })
}

/// Writes each of `given` into `document` (the configuration file's YAML) at its path; a path
/// through a field that is not a section is an error naming it.
pub fn write_into(document: &mut Value, given: &[Given]) -> Result<(), String> {
    for g in given {
        let mut node = &mut *document;
        let parts: Vec<&str> = g.path.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            if node.is_null() {
                *node = Value::Mapping(Mapping::new());
            }
            let Value::Mapping(map) = node else {
                return Err(format!(
                    "{}: {} is not a section in the configuration, so {} cannot be set in it",
                    g.from,
                    parts[..i].join("."),
                    g.path
                ));
            };
            let key = Value::String((*part).to_owned());
            if i + 1 == parts.len() {
                map.insert(key, g.value.clone());
                break;
            }
            node = map.entry(key).or_insert(Value::Null);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Command;

    use super::*;

    const FLAGS: &[Flag] = &[
        Flag::new("peer-port", "X_PEER_PORT", "port", Kind::Scalar, "port"),
        Flag::new("groups", "X_GROUPS", "expected", Kind::List, "groups"),
        Flag::new(
            "sentinel-command",
            "X_CMD",
            "sentinelCommand",
            Kind::Words,
            "command",
        ),
        Flag::new("drop-in-dir", "X_DIR", "dropInDir", Kind::Text, "dir")
            .also(&[("writeDropIn", "true")]),
    ];

    fn parse(args: &[&str]) -> Result<Vec<Given>, String> {
        let placed = Placed::at("section", FLAGS);
        let command = placed
            .iter()
            .fold(Command::new("t").arg(set_arg()), |c, p| c.arg(p.arg()));
        let matches = command
            .try_get_matches_from(args)
            .map_err(|e| e.to_string())?;
        given(&matches, &placed)
    }

    #[test]
    fn each_kind_becomes_the_fields_yaml_and_set_reaches_any_field() {
        let given = parse(&[
            "t",
            "--peer-port",
            "9000",
            "--groups",
            "a,b",
            "--groups",
            "c",
            "--sentinel-command",
            "/usr/bin/needs-restarting -r",
            "--drop-in-dir",
            "/run/x",
            "--set",
            "other.list=[1, 2]",
        ])
        .expect("valid");
        let mut document = serde_yaml::from_str("section: {port: 1, keep: yes}\n").expect("yaml");
        write_into(&mut document, &given).expect("written");
        let expected: Value = serde_yaml::from_str(
            "section: {port: 9000, keep: yes, expected: [a, b, c], sentinelCommand: [/usr/bin/needs-restarting, -r], dropInDir: /run/x, writeDropIn: true}\nother: {list: [1, 2]}\n",
        )
        .expect("yaml");
        assert_eq!(document, expected);
    }

    #[test]
    fn bad_settings_name_the_flag_and_the_fix() {
        let err = parse(&["t", "--set", "detectors.peers.port"]).expect_err("no value");
        assert!(err.contains("write PATH=VALUE"), "{err}");
        let err = parse(&["t", "--set", "detectors..port=1"]).expect_err("empty part");
        assert!(err.contains("is not a field's path"), "{err}");
        let mut document: Value = serde_yaml::from_str("section: 5\n").expect("yaml");
        let err = write_into(
            &mut document,
            &parse(&["t", "--peer-port", "1"]).expect("valid"),
        )
        .expect_err("not a section");
        assert!(
            err.starts_with("--peer-port: section is not a section"),
            "{err}"
        );
    }
}
