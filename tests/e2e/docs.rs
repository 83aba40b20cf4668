//! What the documentation names exists: every repository path in the README, ARCHITECTURE,
//! CONTRIBUTING, BENCHMARKS and `docs/` is a file or folder of the repository, and every
//! command line of nodeward's own programs (`kubectl nodeward VERB`, `nodeward-agent SUB`,
//! `nodeward-coordinator SUB`) names a subcommand and flags that the built program accepts (its
//! `--help` lists them). A renamed file or a dropped flag fails here until the docs follow.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    process::Command,
};

use nodeward_e2e::daemon::sibling_binary;

/// The repository's top-level folders: a word starting with one of them and a `/` is a path.
const ROOTS: &[&str] = &[
    "api/",
    "decide/",
    "runtime/",
    "agent/",
    "coordinator/",
    "cli/",
    "tests/",
    "bench/",
    "charts/",
    "dist/",
    "systemd/",
    "fuzz/",
    "docs/",
];

/// Paths the docs name that the tools make at run time, not the repository.
const MADE_AT_RUN_TIME: &[&str] = &["fuzz/artifacts/"];

/// nodeward's programs as the docs write them, and the binary each is.
const PROGRAMS: &[(&str, &str)] = &[
    ("kubectl nodeward", "kubectl-nodeward"),
    ("kubectl-nodeward", "kubectl-nodeward"),
    ("nodeward-agent", "nodeward-agent"),
    ("nodeward-coordinator", "nodeward-coordinator"),
];

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repository")
        .to_path_buf()
}

/// The documentation files: the top-level guides and everything in docs/.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "BENCHMARKS.md",
    ]
    .iter()
    .map(|f| root.join(f))
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The repository paths in `text`: words that start with a top-level folder, cut at the first
/// character a path does not have; templates (`<x>`, `*`, `{a,b}`, `$VAR`) are skipped.
fn paths(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text.char_indices() {
        let rest = &text[i..];
        let Some(root) = ROOTS.iter().find(|r| rest.starts_with(**r)) else {
            continue;
        };
        let before = text[..i].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || "_-./~$".contains(c)) {
            continue; // part of a longer path or word (target/tests-run, /etc/..., ../x)
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || "_-./".contains(c)))
            .unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches(['.', ',']);
        let next = rest[end..].chars().next();
        if path.len() <= root.len() || next.is_some_and(|c| "<*{$".contains(c)) {
            continue;
        }
        found.insert(path.to_owned());
    }
    found
}

#[test]
fn every_repository_path_in_the_docs_exists() {
    let root = repository();
    let mut missing = BTreeMap::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).expect("a document");
        for path in paths(&text) {
            if MADE_AT_RUN_TIME.iter().any(|p| path.starts_with(p)) {
                continue;
            }
            checked += 1;
            if !root.join(&path).exists() {
                missing.entry(path).or_insert_with(Vec::new).push(
                    doc.strip_prefix(&root)
                        .unwrap_or(&doc)
                        .display()
                        .to_string(),
                );
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} paths found: is the parser broken?"
    );
    assert!(
        missing.is_empty(),
        "paths the docs name that do not exist: {missing:#?}"
    );
}

/// The command lines of nodeward's programs in `text`: each line (of a code block, or an
/// inline code span) that starts with one of [`PROGRAMS`], as (binary, words after it).
fn commands(text: &str) -> Vec<(&'static str, Vec<String>)> {
    let mut found = Vec::new();
    let mut candidates: Vec<&str> = Vec::new();
    let mut in_block = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        if in_block {
            candidates.push(
                line.trim()
                    .trim_start_matches("$ ")
                    .trim_start_matches("# "),
            );
        } else {
            candidates.extend(line.split('`').skip(1).step_by(2));
        }
    }
    for line in candidates {
        let line = line.split(" #").next().unwrap_or(line);
        for (written, binary) in PROGRAMS {
            if let Some(rest) = line.strip_prefix(written).filter(|r| r.starts_with(' ')) {
                let words = rest
                    .split_whitespace()
                    .take_while(|w| !["|", ">", "&&", ";", "<"].contains(w))
                    .map(str::to_owned)
                    .collect();
                found.push((*binary, words));
            }
        }
    }
    found
}

/// `binary ARGS --help`, which must succeed.
fn help(binary: &str, args: &[&str]) -> String {
    let path = sibling_binary(binary).expect("the binary (built by cargo test --workspace)");
    let out = Command::new(&path)
        .args(args)
        .arg("--help")
        .output()
        .expect("running --help");
    assert!(
        out.status.success(),
        "{binary} {args:?} --help failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommand names a `--help` lists under "Commands:".
fn subcommands(help: &str) -> BTreeSet<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect()
}

#[test]
fn every_command_line_in_the_docs_names_a_subcommand_and_flags_the_program_accepts() {
    let root = repository();
    let mut wrong = Vec::new();
    let mut checked = 0;
    let mut helps: BTreeMap<(String, String), String> = BTreeMap::new();
    for doc in documents(&root) {
        let text = std::fs::read_to_string(&doc).expect("a document");
        let name = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        for (binary, words) in commands(&text) {
            let Some(sub) = words.first().filter(|w| !w.starts_with('-')) else {
                continue; // `--version`, `--help`: every program has them
            };
            if sub.contains(['<', '$', '.']) || sub.chars().any(char::is_uppercase) {
                continue; // a placeholder (`VERB`, `<verb>`) or prose
            }
            checked += 1;
            let top = helps
                .entry((binary.to_owned(), String::new()))
                .or_insert_with(|| help(binary, &[]))
                .clone();
            if !subcommands(&top).contains(sub) {
                wrong.push(format!(
                    "{name}: `{binary} {}`: no subcommand {sub}",
                    words.join(" ")
                ));
                continue;
            }
            let sub_help = helps
                .entry((binary.to_owned(), sub.clone()))
                .or_insert_with(|| help(binary, &[sub]))
                .clone();
            for flag in words.iter().filter(|w| w.starts_with("--")) {
                let flag = flag.split('=').next().unwrap_or(flag);
                if !sub_help.contains(&format!("{flag} "))
                    && !sub_help.contains(&format!("{flag}\n"))
                    && !sub_help.contains(&format!("{flag}="))
                    && !sub_help.contains(&format!("{flag} <"))
                {
                    wrong.push(format!(
                        "{name}: `{binary} {}`: {sub} has no {flag}",
                        words.join(" ")
                    ));
                }
            }
        }
    }
    assert!(
        checked > 10,
        "only {checked} command lines found: is the parser broken?"
    );
    assert!(
        wrong.is_empty(),
        "commands the docs name that the programs do not accept:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_path_and_command_parsers_find_what_they_are_given() {
    let text = "see `agent/src/detect/mod.rs:12`, tests/run and detect/<x>.rs, not ../api/x or /etc/agent/y\n\
                ```sh\nkubectl nodeward reboot node-a --message hi   # a note\n$ nodeward-agent check --output json | jq\n```\n\
                and `nodeward-coordinator run --listen 0.0.0.0:9471`.";
    assert_eq!(
        paths(text),
        ["agent/src/detect/mod.rs", "tests/run"]
            .map(String::from)
            .into()
    );
    let found = commands(text);
    assert_eq!(
        found,
        vec![
            (
                "kubectl-nodeward",
                ["reboot", "node-a", "--message", "hi"]
                    .map(String::from)
                    .to_vec()
            ),
            (
                "nodeward-agent",
                ["check", "--output", "json"].map(String::from).to_vec()
            ),
            (
                "nodeward-coordinator",
                ["run", "--listen", "0.0.0.0:9471"]
                    .map(String::from)
                    .to_vec()
            ),
        ]
    );
}

/// The whole nodeward objects in the docs' YAML blocks (`apiVersion: nodeward.io/...`).
fn objects(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut block: Option<String> = None;
    for line in text.lines() {
        match (&mut block, line.trim_start().starts_with("```")) {
            (None, true) if line.trim_start().starts_with("```yaml") => block = Some(String::new()),
            (Some(b), true) => {
                if b.contains("apiVersion: nodeward.io/") {
                    found.push(std::mem::take(b));
                }
                block = None;
            }
            (Some(b), false) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    found
}

/// Every DisruptionPolicy and NodeMaintenance the docs show is one the API server accepts as
/// written (OpenAPI and CEL rules; created with dryRun, so nothing is kept).
#[tokio::test]
async fn every_object_the_docs_show_is_accepted_by_the_api_server() -> anyhow::Result<()> {
    use kube::api::{Api, PostParams};
    use nodeward_api::{DisruptionPolicy, NodeMaintenance};
    let env = nodeward_e2e::TestEnv::new("docs").await?;
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let root = repository();
    let mut shown = 0;
    for doc in documents(&root) {
        let name = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        for yaml in objects(&std::fs::read_to_string(&doc)?) {
            let kind: serde_yaml::Value = serde_yaml::from_str(&yaml)?;
            let created = match kind["kind"].as_str() {
                Some("DisruptionPolicy") => Api::<DisruptionPolicy>::all(env.client.clone())
                    .create(&dry_run, &serde_yaml::from_str(&yaml)?)
                    .await
                    .map(drop),
                Some("NodeMaintenance") => Api::<NodeMaintenance>::all(env.client.clone())
                    .create(&dry_run, &serde_yaml::from_str(&yaml)?)
                    .await
                    .map(drop),
                other => anyhow::bail!("{name}: an object of kind {other:?}:\n{yaml}"),
            };
            created.map_err(|e| anyhow::anyhow!("{name}: refused ({e}):\n{yaml}"))?;
            shown += 1;
        }
    }
    anyhow::ensure!(shown > 0, "no nodeward object found in the docs");
    env.cleanup().await
}
