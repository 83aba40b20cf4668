//! Every AdmissionReview the fuzzer kept (`fuzz/corpus/admission_review`) and every crash it
//! found (`fuzz/artifacts/admission_review`) replayed through the webhook's parser and
//! decision: none may panic. `fuzz/run` grows them.

use std::path::PathBuf;

#[test]
fn the_eviction_webhook_survives_its_corpus() {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut replayed = 0;
    for dir in ["corpus", "artifacts"] {
        let Ok(entries) = std::fs::read_dir(fuzz.join(dir).join("admission_review")) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let data = std::fs::read(&path).expect("readable");
            let outcome =
                std::panic::catch_unwind(|| nodeward_coordinator::fuzzing::admission_review(&data));
            assert!(outcome.is_ok(), "{} panics", path.display());
            replayed += 1;
        }
    }
    assert!(
        replayed > 0,
        "fuzz/corpus/admission_review has the seeds at least"
    );
}
