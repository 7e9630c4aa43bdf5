//! The fuzz targets' seeds and regression inputs, replayed on stable Rust through the very code
//! `cargo fuzz` runs (`fuzz/src/targets`, included by path), so a fixed crash stays fixed
//! without a nightly toolchain. `scripts/fuzz.sh` runs the targets themselves.

#[path = "../../../fuzz/src/targets/mod.rs"]
mod targets;

mod seeds;

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files directly in `dir`, sorted; none when it does not exist.
fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"))
        .collect();
    files.sort();
    files
}

/// Runs every input of `kind` (`seeds` or `regressions`) through its target; a panic names it.
fn replay(kind: &str) -> usize {
    let mut replayed = 0;
    for (name, run) in targets::TARGETS {
        for input in inputs(&fuzz_dir().join(kind).join(name)) {
            let data = std::fs::read(&input).expect("read a fuzz input");
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("fuzz target {name} fails on {}", input.display());
            }
            replayed += 1;
        }
    }
    replayed
}

#[test]
fn every_regression_input_passes_its_target() {
    replay("regressions");
    for entry in std::fs::read_dir(fuzz_dir().join("regressions")).expect("fuzz/regressions exists") {
        let entry = entry.expect("a directory entry");
        if !entry.path().is_dir() {
            continue;
        }
        let dir = entry.file_name();
        let dir = dir.to_string_lossy();
        assert!(targets::TARGETS.iter().any(|(name, _)| *name == dir), "fuzz/regressions/{dir} names no target");
    }
}

#[test]
fn every_seed_passes_its_target() {
    for (name, _) in targets::TARGETS {
        assert!(!inputs(&fuzz_dir().join("seeds").join(name)).is_empty(), "fuzz/seeds/{name} is empty");
    }
    assert!(replay("seeds") > 0);
}

/// The checked-in seeds are what [`seeds::all`] makes; `TESSERA_BLESS_FUZZ_SEEDS=1` rewrites them.
#[test]
fn seeds_are_generated() {
    let bless = std::env::var_os("TESSERA_BLESS_FUZZ_SEEDS").is_some();
    for (target, file, data) in seeds::all() {
        assert!(targets::TARGETS.iter().any(|(name, _)| *name == target), "seed for unknown target {target}");
        let path = fuzz_dir().join("seeds").join(target).join(file);
        if bless {
            std::fs::create_dir_all(path.parent().expect("a seed has a directory")).expect("create a seed directory");
            std::fs::write(&path, &data).expect("write a seed");
        } else {
            let stored = std::fs::read(&path).unwrap_or_default();
            assert!(
                stored == data,
                "{} is stale: run TESSERA_BLESS_FUZZ_SEEDS=1 cargo test --test e2e fuzz::",
                path.display()
            );
        }
    }
}
