//! The admission rules as documented (docs/coordinator.md, "Admission rules") are the rules the
//! code checks: the same names, reasons, inputs and waivers, in the same order. A rule added, removed or
//! reworded in `RULES` fails this test until the table is written again (the failure prints it).

use nodeward_decide::admission::rules::RULES;

const BEGIN: &str =
    "<!-- admission-rules: generated from RULES; decide/tests/rules_documented.rs checks it -->";
const END: &str = "<!-- end admission-rules -->";

fn table() -> String {
    let mut out =
        String::from("| rule | denies with | decides on | waived for |\n|---|---|---|---|\n");
    for rule in RULES {
        let reasons: Vec<String> = rule.reasons.iter().map(|r| format!("`{r}`")).collect();
        let waived: Vec<String> = rule
            .waived_for
            .iter()
            .map(|e| format!("`{}`", e.field()))
            .collect();
        let waived = if waived.is_empty() {
            "none".to_owned()
        } else {
            waived.join(", ")
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {waived} |\n",
            rule.name,
            reasons.join(", "),
            rule.input
        ));
    }
    out
}

#[test]
fn the_documented_admission_rules_are_the_rules_the_code_checks() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/coordinator.md");
    let doc = std::fs::read_to_string(path).expect("docs/coordinator.md");
    let start = doc
        .find(BEGIN)
        .expect("the admission-rules marker in docs/coordinator.md")
        + BEGIN.len();
    let end = doc[start..].find(END).expect("the end marker") + start;
    let documented = doc[start..end].trim();
    let expected = table();
    assert_eq!(
        documented,
        expected.trim(),
        "docs/coordinator.md's admission rules differ from RULES; the table as it should read:\n{expected}"
    );
}
