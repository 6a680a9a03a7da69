//! The `embed` executor: what an `embed` backend's worker does with a batch.
//!
//! Each item is checked on its own (an embedding request, `dimensions` within the model's,
//! an input that fits or may be cut); the items that pass run in forward passes, each padded
//! to its longest: one pass, unless lengths differ enough that splitting by length
//! ([`split`](super::split)) computes less. Each item gets its vector and its real token
//! count (`usage.prompt_tokens`).
//! An item that fails gets its own 400 error ([`ExecError::Invalid`]); only a fault of the
//! forward pass itself fails the batch.

use super::model::EmbedModel;
use super::split::Plan;
use super::stats::EmbedStats;
use super::threads::ComputeThreads;
use crate::core::Kind;
use crate::exec::{BatchItem, ExecError, Executor, Output, TokenSink};
use std::sync::Arc;
use std::time::Instant;

/// One worker's executor of an `embed` backend (the model is shared by all its workers).
pub struct EmbedExecutor {
    model: Arc<EmbedModel>,
    backend: Arc<str>,
    /// Cut inputs past max_seq_length (else refuse them).
    truncate: bool,
    stats: Arc<EmbedStats>,
    /// Small passes on one thread, big ones on every core.
    threads: ComputeThreads,
    /// Per batch: (item index, token ids) of the items that run. Kept to reuse its capacity.
    runnable: Vec<(usize, Vec<u32>)>,
    /// Per batch: the passes (by length), and the lengths they are planned from.
    plan: Plan,
    lens: Vec<usize>,
}

impl EmbedExecutor {
    pub fn new(
        model: Arc<EmbedModel>,
        backend: Arc<str>,
        truncate: bool,
        stats: Arc<EmbedStats>,
        threads: ComputeThreads,
    ) -> EmbedExecutor {
        EmbedExecutor {
            model,
            backend,
            truncate,
            stats,
            threads,
            runnable: Vec::new(),
            plan: Plan::default(),
            lens: Vec::new(),
        }
    }

    fn invalid(&self, message: String) -> ExecError {
        ExecError::Invalid {
            backend: self.backend.to_string(),
            message,
        }
    }

    /// The token ids of `item`, or why it cannot run.
    fn check(&self, item: &BatchItem) -> Result<(Vec<u32>, bool), ExecError> {
        let m = &self.model;
        if item.work.kind != Kind::Embedding {
            return Err(
                self.invalid("this is an embedding model: it serves /v1/embeddings only".into())
            );
        }
        if item.work.dimensions as usize > m.dimensions() {
            return Err(self.invalid(format!(
                "'dimensions' is {}, more than the model's {}; ask for at most {} (or leave \
                 it out)",
                item.work.dimensions,
                m.dimensions(),
                m.dimensions()
            )));
        }
        let tokens = m.tokenize(&item.work.prompt).map_err(|e| self.invalid(e))?;
        if tokens.truncated && !self.truncate {
            return Err(self.invalid(format!(
                "the input is longer than the model's max_seq_length of {} tokens; shorten \
                 it, or set truncate = true on the backend to cut it as \
                 sentence-transformers does",
                m.max_seq_length()
            )));
        }
        Ok((tokens.ids, tokens.truncated))
    }
}

impl Executor for EmbedExecutor {
    fn execute(
        &mut self,
        items: &mut [BatchItem],
        _tokens: &mut dyn TokenSink,
    ) -> Result<(), ExecError> {
        let mut runnable = std::mem::take(&mut self.runnable);
        runnable.clear();
        let mut truncated = 0u64;
        for (i, item) in items.iter_mut().enumerate() {
            match self.check(item) {
                Ok((ids, cut)) => {
                    truncated += u64::from(cut);
                    runnable.push((i, ids));
                }
                Err(e) => item.error = Some(e),
            }
        }
        let result = self.run(items, &runnable, truncated);
        self.runnable = runnable;
        result
    }
}

impl EmbedExecutor {
    /// The forward passes over `runnable` (split by length), answers written into `items`.
    /// A pass that fails fails the batch.
    fn run(
        &mut self,
        items: &mut [BatchItem],
        runnable: &[(usize, Vec<u32>)],
        truncated: u64,
    ) -> Result<(), ExecError> {
        if runnable.is_empty() {
            return Ok(());
        }
        self.lens.clear();
        self.lens.extend(runnable.iter().map(|(_, ids)| ids.len()));
        self.plan.make(&self.lens);
        let mut truncated = truncated;
        for pass in self.plan.passes() {
            let inputs: Vec<&[u32]> = pass.iter().map(|&r| runnable[r].1.as_slice()).collect();
            let longest = inputs.iter().map(|i| i.len()).max().unwrap_or(0);
            let model = &self.model;
            let started = Instant::now();
            let vectors = self
                .threads
                .run(inputs.len() * longest, || model.embed(&inputs))
                .map_err(|e| {
                    ExecError::Backend(format!("backend '{}': forward pass: {e}", self.backend))
                })?;
            let forward_ns = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            let real: usize = inputs.iter().map(|i| i.len()).sum();
            self.stats.record(
                inputs.len() as u64,
                real as u64,
                longest as u64,
                std::mem::take(&mut truncated),
                forward_ns,
            );
            if vectors.len() != pass.len() {
                // Every input must get its own vector: rather fail the batch than answer
                // some requests with nothing or another's.
                return Err(ExecError::Backend(format!(
                    "backend '{}': a forward pass over {} inputs gave {} vectors",
                    self.backend,
                    pass.len(),
                    vectors.len()
                )));
            }
            for (&r, mut vector) in pass.iter().zip(vectors) {
                let (i, ids) = &runnable[r];
                let item = &mut items[*i];
                let asked = item.work.dimensions as usize;
                if asked > 0 && asked < vector.len() {
                    // OpenAI's `dimensions`: the first values, unit length again if the
                    // model's vectors are.
                    vector.truncate(asked);
                    if self.model.normalizes() {
                        let norm = vector.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
                        vector.iter_mut().for_each(|v| *v /= norm);
                    }
                }
                item.output = Some(Output::Embedding {
                    vector,
                    prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
                });
            }
        }
        Ok(())
    }
}
