//! `tailnet-operator crd`: the generated CRDs, the source of `deploy/crds/`.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub struct CrdArgs {
    /// Write one file per CRD into this directory instead of printing a YAML stream.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
}

pub fn run(args: &CrdArgs) -> Result<(), Box<dyn std::error::Error>> {
    let files = tailnet_api::crd::yaml_files()?;
    match &args.output_dir {
        Some(dir) => {
            for (file, yaml) in files {
                let path = dir.join(file);
                std::fs::write(&path, yaml)
                    .map_err(|e| format!("writing {}: {e}", path.display()))?;
            }
        }
        None => {
            for (_, yaml) in files {
                print!("---\n{yaml}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The checked-in CRDs must equal the generated ones (`cargo xtask generate` fixes drift).
    #[test]
    fn checked_in_crds_match_generated() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds");
        for (file, yaml) in tailnet_api::crd::yaml_files().expect("CRDs serialize") {
            let checked_in = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
            assert!(
                checked_in == yaml,
                "deploy/crds/{file} is out of date: run `cargo xtask generate` and commit the result"
            );
        }
    }
}
