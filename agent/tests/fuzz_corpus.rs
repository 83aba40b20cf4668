//! Every input the fuzzers kept (`fuzz/corpus/`) and every crash they found
//! (`fuzz/artifacts/`) replayed through the agent's parsers: none may panic. `fuzz/run` grows
//! them.

use std::path::PathBuf;

fn inputs(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut found = Vec::new();
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_file() {
                let data = std::fs::read(&path).expect("readable");
                found.push((path, data));
            }
        }
    }
    found.sort();
    found
}

fn replay(target: &str, run: fn(&[u8])) {
    let inputs = inputs(target);
    assert!(
        !inputs.is_empty(),
        "fuzz/corpus/{target} has the seeds at least"
    );
    for (path, data) in inputs {
        let outcome = std::panic::catch_unwind(|| run(&data));
        assert!(outcome.is_ok(), "{} panics", path.display());
    }
}

/// One test per fuzz target: its corpus replayed through its parser.
macro_rules! corpus_tests {
    ($($test:ident: $target:literal => $run:path;)*) => {
        $(
            #[test]
            fn $test() {
                replay($target, $run);
            }
        )*
    };
}

corpus_tests! {
    the_configuration_parser_survives_its_corpus: "agent_config" => nodeward_agent::fuzzing::config;
    the_kernel_log_reader_survives_its_corpus: "kernel_log" => nodeward_agent::fuzzing::kernel_log;
    custom_check_output_survives_its_corpus: "check_output" => nodeward_agent::fuzzing::check_output;
    the_probe_responder_survives_its_corpus_and_never_amplifies: "peer_probe" => nodeward_agent::fuzzing::probe;
}
