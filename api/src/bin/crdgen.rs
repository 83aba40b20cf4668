//! Writes the CRD manifests into the Helm chart (`charts/nodeward/files/crds/`, which the chart templates), replacing what is
//! there. Run from anywhere: `cargo run -p nodeward-api --bin crdgen`.

use std::{fs, path::PathBuf, process::ExitCode};

fn main() -> ExitCode {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(nodeward_api::crds::CHART_CRD_DIR);
    let rendered = match nodeward_api::crds::rendered() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("crdgen: rendering the CRDs as YAML failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = fs::create_dir_all(&dir) {
        eprintln!("crdgen: creating {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    for (name, yaml) in rendered {
        let path = dir.join(&name);
        if let Err(e) = fs::write(&path, yaml) {
            eprintln!("crdgen: writing {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
