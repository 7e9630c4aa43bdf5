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

/// A small, fast pseudo-random source (xorshift64*) for the smoke below.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

/// One to four random edits of `input`, as libFuzzer's simplest mutators make them: flipped
/// bits, edge values, inserted, dropped or repeated bytes, a cut, or a splice with `other`.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut data = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(data.len() + 1);
        match rng.below(7) {
            0 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = at.min(data.len() - 1);
                data[i] = [0, 1, 0x7f, 0x80, 0xff][rng.below(5)];
            }
            2 => data.insert(at, rng.next() as u8),
            3 if at < data.len() => {
                data.remove(at);
            }
            4 if at < data.len() => {
                let end = (at + 1 + rng.below(16)).min(data.len());
                let chunk = data[at..end].to_vec();
                data.splice(at..at, chunk);
            }
            5 => data.truncate(at),
            _ if !other.is_empty() => {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(64)).min(other.len());
                data.splice(at..at, other[from..end].iter().copied());
            }
            _ => {}
        }
    }
    data
}

/// A bounded fuzz smoke on stable Rust, for CI (`scripts/fuzz.sh` is the real, coverage-guided
/// run): every target gets `TESSERA_FUZZ_SMOKE_MS` (default 1500) of random mutations of its
/// seeds and regression inputs. An input that breaks a target is kept in
/// `fuzz/regressions/<target>/` (so the replay above keeps catching it) and fails the test.
#[test]
fn mutated_seeds_never_break_a_target() {
    let budget = std::env::var("TESSERA_FUZZ_SMOKE_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(1500);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
    let mut rng = Rng(seed | 1);
    let mut report = Vec::new();
    for (name, run) in targets::TARGETS {
        let mut corpus: Vec<Vec<u8>> = ["seeds", "regressions"]
            .iter()
            .flat_map(|kind| inputs(&fuzz_dir().join(kind).join(name)))
            .map(|path| std::fs::read(path).expect("read a fuzz input"))
            .collect();
        corpus.push(Vec::new());
        let started = std::time::Instant::now();
        let mut runs = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(budget) {
            let input = &corpus[rng.below(corpus.len())];
            let other = &corpus[rng.below(corpus.len())];
            let data = mutate(&mut rng, input, other);
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                let dir = fuzz_dir().join("regressions").join(name);
                let kept = dir.join(format!("smoke-{seed:016x}-{runs}"));
                let _ = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&kept, &data));
                panic!("fuzz target {name} breaks on a mutated input, kept as {}", kept.display());
            }
            runs += 1;
        }
        report.push(format!("{name} {runs}"));
    }
    eprintln!("fuzz smoke (seed {seed:#x}), executions per target: {}", report.join(", "));
}
