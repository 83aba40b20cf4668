//! The committed CRD YAML must be exactly what the types generate.

use std::{fs, path::PathBuf};

#[test]
fn committed_crds_match_the_types() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(nodeward_api::crds::CHART_CRD_DIR);
    let rendered = nodeward_api::crds::rendered().expect("CRDs render as YAML");
    assert_eq!(rendered.len(), 3);
    let mut stale = Vec::new();
    for (name, yaml) in &rendered {
        let committed = fs::read_to_string(dir.join(name)).unwrap_or_default();
        if &committed != yaml {
            stale.push(name.clone());
        }
    }
    let mut on_disk: Vec<String> = fs::read_dir(&dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    on_disk.sort();
    let mut expected: Vec<String> = rendered.iter().map(|(n, _)| n.clone()).collect();
    expected.sort();
    assert!(
        stale.is_empty() && on_disk == expected,
        "charts/nodeward/files/crds is out of date (stale: {stale:?}, on disk: {on_disk:?}, expected: {expected:?}); \
         run `cargo run -p nodeward-api --bin crdgen` and commit the result"
    );
}
