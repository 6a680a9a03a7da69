//! One fuzzing campaign: a seed corpus, a seeded RNG, a bounded number of executions of a
//! target, and outcome feedback (an input whose signature is new joins the corpus).
//!
//! The knobs come from the environment so the test command runs a short bounded campaign
//! and a long run is the same test with bigger numbers:
//! `FUZZ_ITERS` (executions; default per target), `FUZZ_SEED` (default 0: the test
//! command is deterministic), `FUZZ_REPLAY=FILE` (run the target once on that input).
//! (Not `ABE_*`: abe refuses environment variables of its own prefix that name no config
//! key, and a test that starts `abe` would inherit them.)
//! A panic in the target is caught, the input written to `target/fuzz-failures/`, and the
//! campaign panics with the seed and iteration that replay it (same seed, same executions,
//! same corpus growth: the target's signatures must be deterministic too).
//!
//! What must never happen here: randomness not drawn from the seed, or a corpus that grows
//! without bound (`CORPUS_MAX`).

use super::mutate::Mutator;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Most corpus entries kept (seeds plus inputs with new signatures).
pub const CORPUS_MAX: usize = 4096;

/// A campaign over one target.
pub struct Campaign {
    name: String,
    corpus: Vec<Vec<u8>>,
    mutator: Mutator,
    seed: u64,
    iters: u64,
}

/// What a campaign did: its figures for RELIABILITY.md.
#[derive(Clone, Debug)]
pub struct Report {
    pub name: String,
    pub seed: u64,
    pub executions: u64,
    pub seeds: usize,
    pub corpus: usize,
    /// Distinct outcome signatures reached.
    pub signatures: usize,
    pub elapsed: Duration,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fuzz {}: seed {}, {} executions in {:.1} s ({:.0}/s), {} seeds -> corpus {}, {} distinct outcomes, 0 crashes",
            self.name,
            self.seed,
            self.executions,
            self.elapsed.as_secs_f64(),
            self.executions as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.seeds,
            self.corpus,
            self.signatures
        )
    }
}

/// Every file in `dir` (sorted by name, so the corpus order is the same everywhere).
pub fn seeds_from_dir(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("seed corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|p| std::fs::read(p).expect("seed file reads"))
        .collect()
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    )
}

impl Campaign {
    /// A campaign named `name` over `seeds`, `iters_default` executions unless
    /// `FUZZ_ITERS` says otherwise.
    pub fn new(
        name: &str,
        seeds: Vec<Vec<u8>>,
        dictionary: &'static [&'static [u8]],
        len_max: usize,
        iters_default: u64,
    ) -> Campaign {
        assert!(!seeds.is_empty(), "fuzz {name}: an empty seed corpus");
        Campaign {
            name: name.to_string(),
            corpus: seeds,
            mutator: Mutator {
                dictionary,
                len_max,
            },
            seed: env_u64("FUZZ_SEED").unwrap_or(0),
            iters: env_u64("FUZZ_ITERS").unwrap_or(iters_default),
        }
    }

    /// Runs `target` on every seed, then on `iters` mutants. `target` returns a signature of
    /// what the input did; it asserts its invariants by panicking.
    pub fn run(mut self, mut target: impl FnMut(&[u8]) -> u64) -> Report {
        let started = Instant::now();
        if let Ok(path) = std::env::var("FUZZ_REPLAY") {
            let input = std::fs::read(&path).expect("FUZZ_REPLAY file reads");
            target(&input);
            return self.report(1, 0, 0, started);
        }
        let seeds = self.corpus.len();
        let mut seen = HashSet::new();
        for i in 0..seeds {
            let input = self.corpus[i].clone();
            seen.insert(self.execute(&mut target, &input, None));
        }
        let mut rng = SmallRng::seed_from_u64(self.seed);
        for iter in 0..self.iters {
            let base = rng.gen_range(0..self.corpus.len());
            let other = rng.gen_range(0..self.corpus.len());
            let input = self
                .mutator
                .mutate(&mut rng, &self.corpus[base], &self.corpus[other]);
            let signature = self.execute(&mut target, &input, Some(iter));
            if seen.insert(signature) && self.corpus.len() < CORPUS_MAX {
                self.corpus.push(input);
            }
        }
        let signatures = seen.len();
        self.report(seeds as u64 + self.iters, seeds, signatures, started)
    }

    fn report(&self, executions: u64, seeds: usize, signatures: usize, started: Instant) -> Report {
        Report {
            name: self.name.clone(),
            seed: self.seed,
            executions,
            seeds,
            corpus: self.corpus.len(),
            signatures,
            elapsed: started.elapsed(),
        }
    }

    /// Runs `target` once; a panic is written out and re-raised with how to replay it.
    fn execute(
        &self,
        target: &mut impl FnMut(&[u8]) -> u64,
        input: &[u8],
        iter: Option<u64>,
    ) -> u64 {
        match catch_unwind(AssertUnwindSafe(|| target(input))) {
            Ok(signature) => signature,
            Err(cause) => {
                let why = cause
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| cause.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fuzz-failures");
                let _ = std::fs::create_dir_all(&dir);
                let file = dir.join(format!(
                    "{}-seed{}-{}.bin",
                    self.name,
                    self.seed,
                    iter.map_or("seed".into(), |i| i.to_string())
                ));
                let _ = std::fs::write(&file, input);
                let replay = match iter {
                    Some(i) => format!("FUZZ_SEED={} FUZZ_ITERS={}", self.seed, i + 1),
                    None => "(a seed file of the corpus)".to_string(),
                };
                panic!(
                    "fuzz {}: {why}\n  input {:?}\n  written to {}\n  replay: {replay} \
                     (or FUZZ_REPLAY={})",
                    self.name,
                    String::from_utf8_lossy(input),
                    file.display(),
                    file.display()
                );
            }
        }
    }
}

/// A signature from anything hashable (an outcome's kind, status, error prefix...).
pub fn signature(outcome: impl std::hash::Hash) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
    // A fixed hasher (not `RandomState`): signatures must be the same in every process.
    BuildHasherDefault::<DefaultHasher>::default().hash_one(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_outcomes_grow_the_corpus_and_a_panic_names_its_replay() {
        let c = Campaign::new("unit", vec![b"ab".to_vec()], &[b"x"], 32, 300);
        let r = c.run(|input| signature(input.len().min(8)));
        assert!(r.signatures > 1 && r.corpus > 1, "{r}");
        let c = Campaign::new("unit-panic", vec![b"ab".to_vec()], &[b"x"], 32, 300);
        let e = catch_unwind(AssertUnwindSafe(|| {
            c.run(|input| {
                assert!(input.len() < 4, "too long");
                0
            })
        }))
        .unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(
            msg.contains("too long") && msg.contains("FUZZ_SEED=0"),
            "{msg}"
        );
    }
}
