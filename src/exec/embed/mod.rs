//! The `embed` executor: a sentence-transformers model (BERT family) run on this machine's
//! CPU: the batches the engine hands the worker, run as forward passes split by length.
//!
//! - [`model_dir`]: reads a model directory (config.json, model.safetensors,
//!   tokenizer.json, modules.json, the pooling config) and names the file that is missing or
//!   wrong; nothing else touches the file system.
//! - [`pooling`]: how token vectors become one sentence vector (mean, CLS, max), and
//!   normalisation, as the directory's pooling config and modules.json say.
//! - [`bert`]: the BERT encoder (candle-transformers' port, with [`gelu`]'s activation).
//! - [`gelu`]: GELU-erf on every core (candle's runs on one).
//! - [`model`]: the loaded encoder and tokenizer: tokenizes one input (truncating or
//!   refusing past max_seq_length), runs a padded batch through the encoder.
//! - [`attention`], [`add_norm`]: the encoder's fused attention and bias + residual +
//!   LayerNorm; [`heap`]: glibc thresholds that keep a pass's buffers on the heap.
//! - [`executor`]: the [`Executor`](super::Executor) workers run: checks each request,
//!   tokenizes, runs the batch's forward passes, answers each item with its vector and its
//!   real token count.
//! - [`seq_len`]: the model's longest input from its directory's JSON alone (always
//!   compiled: the config check reads it when `context_length` is omitted).
//! - [`split`]: which inputs share a pass (sorted by length, cut where padding would cost
//!   more than another pass); no candle, so always compiled and tested.
//! - [`threads`]: how many threads a forward pass runs on (small passes on one, big ones
//!   on every core).
//! - [`stats`]: padding waste and forward time, for `/metrics` (always compiled, so the
//!   metrics code has one shape with or without the feature).
//!
//! Everything but `bert_config`, `seq_len`, `split` and `stats` needs the `embed` cargo feature (candle and tokenizers). What must
//! never happen here: loading a model lazily on a request (a bad directory fails at start),
//! or one bad input failing the batch it rides in.

#[cfg(feature = "embed")]
pub mod add_norm;
#[cfg(feature = "embed")]
pub mod attention;
#[cfg(feature = "embed")]
pub mod bert;
pub mod bert_config;
#[cfg(feature = "embed")]
pub mod executor;
#[cfg(feature = "embed")]
pub mod gelu;
#[cfg(feature = "embed")]
pub mod heap;
#[cfg(feature = "embed")]
pub mod model;
#[cfg(feature = "embed")]
pub mod model_dir;
#[cfg(feature = "embed")]
pub mod pooling;
pub mod seq_len;
pub mod split;
pub mod stats;
#[cfg(feature = "embed")]
pub mod threads;

#[cfg(feature = "embed")]
pub use executor::EmbedExecutor;
#[cfg(feature = "embed")]
pub use model::EmbedModel;
#[cfg(feature = "embed")]
pub use model_dir::LoadError;
pub use stats::{EmbedStats, EmbedTotals};
#[cfg(feature = "embed")]
pub use threads::ComputeThreads;
