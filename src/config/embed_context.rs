//! An `embed` model's `context_length`, when its `[[backends.models]]` table omits it: the
//! model directory's longest input (`exec::embed::seq_len`: `sentence_bert_config.json`'s
//! `max_seq_length`, else `config.json`'s `max_position_embeddings`), so the router never
//! holds a limit the model does not have.
//!
//! The one file read [`Config::check`](super::Config::check) makes, and only these two small
//! JSON files: the weights and tokenizer are read when the model is loaded, at serve start.
//! What must never happen here: a default that is not the model's own (a missing or broken
//! file is an error naming it), or a `context_length` the table set being replaced.

use super::error::{invalid, ConfigError};
use crate::exec::embed::seq_len;
use crate::router::{BackendConfig, BackendKindName};
use std::path::Path;

/// `backends` with every omitted `embed` model `context_length` read from its backend's
/// `model_dir`. Other tables are left as they are (the router judges them).
pub(crate) fn fill(mut backends: Vec<BackendConfig>) -> Result<Vec<BackendConfig>, ConfigError> {
    for b in &mut backends {
        if b.kind != BackendKindName::Embed {
            continue;
        }
        let Some(dir) = b.model_dir.as_deref().filter(|d| !d.trim().is_empty()) else {
            continue; // the router names the missing model_dir
        };
        let mut read = None;
        for m in b.models.iter_mut().filter(|m| m.context_length.is_none()) {
            let len = match &read {
                Some(len) => *len,
                None => {
                    let len = seq_len::read(Path::new(dir)).map_err(|e| {
                        invalid(
                            &format!("backends['{}'].models['{}'].context_length", b.name, m.name),
                            "(omitted)",
                            format!(
                                "is read from model_dir when omitted, and {}: {}; set it, or \
                                 fix model_dir",
                                e.path.display(),
                                e.why
                            ),
                        )
                    })?;
                    *read.insert(u32::try_from(len).unwrap_or(u32::MAX))
                }
            };
            m.context_length = Some(len);
        }
    }
    Ok(backends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::ModelConfig;

    fn embed(dir: &Path, context_length: Option<u32>) -> BackendConfig {
        let mut b = BackendConfig::default_sim("m", 1);
        b.name = "e".into();
        b.kind = BackendKindName::Embed;
        b.model_dir = Some(dir.to_string_lossy().into_owned());
        b.models = vec![ModelConfig {
            name: "all-MiniLM-L6-v2".into(),
            context_length,
            capabilities: Default::default(),
            adapters: Vec::new(),
        }];
        b
    }

    fn minilm_dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("abe-embed-ctx-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("config.json"), r#"{"max_position_embeddings": 512}"#).unwrap();
        std::fs::write(
            d.join("sentence_bert_config.json"),
            r#"{"max_seq_length": 256}"#,
        )
        .unwrap();
        d
    }

    #[test]
    fn an_omitted_embed_context_is_the_directorys_and_a_set_one_stays() {
        let d = minilm_dir("fill");
        let out = fill(vec![embed(&d, None), embed(&d, Some(300))]).unwrap();
        assert_eq!(out[0].models[0].context_length, Some(256));
        assert_eq!(out[1].models[0].context_length, Some(300));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_broken_directory_is_an_error_naming_the_key_and_the_file() {
        let d = std::env::temp_dir().join(format!("abe-embed-ctx-{}-none", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let e = fill(vec![embed(&d, None)]).unwrap_err().to_string();
        assert!(
            e.contains("backends['e'].models['all-MiniLM-L6-v2'].context_length")
                && e.contains(&*d.to_string_lossy())
                && e.contains("is not a directory"),
            "{e}"
        );
        // Set explicitly, nothing is read.
        assert!(fill(vec![embed(&d, Some(512))]).is_ok());
        // A directory without the encoder's config.json: the file is named.
        std::fs::create_dir_all(&d).unwrap();
        let e = fill(vec![embed(&d, None)]).unwrap_err().to_string();
        assert!(e.contains("config.json"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn sim_and_upstream_tables_are_left_to_the_router() {
        let mut s = BackendConfig::default_sim("m", 1);
        s.models[0].context_length = None;
        let out = fill(vec![s]).unwrap();
        assert_eq!(out[0].models[0].context_length, None);
    }
}
