//! LoRA adapters by name: which adapters exist, the base model each runs on, and the small
//! integer id the scheduler knows it by (`core::lora::AdapterId`; 0 is the base model).
//!
//! The table has a fixed number of ids (`[lora] max_lora_adapters`), handed out at start
//! to the adapters `[[backends.models]] adapters` (or `[lora] adapters` for the server's
//! own model) list, and at run time by `POST /v1/load_lora_adapter`; an id freed by
//! `POST /v1/unload_lora_adapter` is reused. The names live here, off the engine's hot
//! path: io threads resolve a request's `model` to (base model, id) here only when the
//! router does not know the name, and the engine sees ids alone. The errors and their
//! texts are vLLM's (`vllm/entrypoints/openai/serving_models.py`).
//!
//! What must never happen here: the engine thread taking the lock (it never sees this
//! table), or an id reused while the table still names it.

use crate::core::lora::AdapterId;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;

/// One adapter a model lists: `"sql-lora"` or `{ name = "sql-lora", path = "/adapters/sql" }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AdapterConfig {
    Name(String),
    Table {
        name: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<String>,
    },
}

impl AdapterConfig {
    pub fn name(&self) -> &str {
        match self {
            AdapterConfig::Name(n) | AdapterConfig::Table { name: n, .. } => n,
        }
    }

    /// Where the adapter's weights are (`/v1/models`' `root`); the name when not given.
    pub fn path(&self) -> &str {
        match self {
            AdapterConfig::Table { path: Some(p), .. } => p,
            _ => self.name(),
        }
    }
}

/// One adapter the table names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Adapter {
    pub id: AdapterId,
    pub name: String,
    /// The model it runs on (`/v1/models`' `parent`).
    pub base: String,
    /// `/v1/models`' `root`.
    pub path: String,
    /// How many loads its id had before this one (0: the id's first). The io thread names
    /// prompt blocks under (id, load) (`core::prefix::root_for_load`), so an adapter loaded
    /// under a freed id never finds the KV its id's earlier adapter left cached (vLLM never
    /// reuses a `lora_int_id` for that reason).
    pub load: u32,
}

/// Why a load or an unload was refused; `status` and `kind` are vLLM's.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoraError {
    #[error("Both 'lora_name' and 'lora_path' must be provided.")]
    MissingNameOrPath,
    #[error("either 'lora_name' and 'lora_int_id' needs to be provided.")]
    MissingName,
    #[error("The lora adapter '{0}' has already been loaded.")]
    AlreadyLoaded(String),
    #[error("The lora adapter '{0}' cannot be found.")]
    NotFound(String),
    #[error("cannot load LoRA adapter '{name}': all {capacity} adapter ids ([lora] max_lora_adapters) are taken; unload one first or raise max_lora_adapters")]
    TableFull { name: String, capacity: usize },
    #[error("'{name}' is the name of a model abe serves; an adapter needs a name of its own")]
    NameTaken { name: String },
    #[error("base model '{base}' is not served here; the adapter needs a model abe serves")]
    UnknownBase { base: String },
    /// The engine's control queue is full (it is far behind): nothing was changed.
    #[error("the engine is busy and did not take the change; nothing changed, retry")]
    EngineBusy,
}

impl LoraError {
    /// vLLM's status: 404 for an unknown adapter, 400 otherwise (503: abe's engine busy).
    pub fn status(&self) -> u16 {
        match self {
            LoraError::NotFound(_) => 404,
            LoraError::EngineBusy => 503,
            _ => 400,
        }
    }

    /// vLLM's error `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            LoraError::NotFound(_) => "NotFoundError",
            LoraError::TableFull { .. } => "BadRequestError",
            LoraError::EngineBusy => "ServiceUnavailableError",
            _ => "InvalidUserInput",
        }
    }
}

/// The adapter names, shared by the io threads (see the module doc).
#[derive(Debug)]
pub struct LoraTable {
    /// By `id - 1`: the adapter holding that id, if any. Length `max_lora_adapters`.
    slots: Mutex<Vec<Option<Adapter>>>,
    /// By `id - 1`, the names of the configured adapters: an unloaded one gets its id back
    /// when loaded again, and no other name takes it (the router's per-backend
    /// eligibility, built from the config, knows them by id). Locked before `slots`.
    configured: Mutex<Vec<String>>,
    /// By `id - 1`: how many loads that id has had ([`Adapter::load`]). Locked after `slots`.
    loads: Mutex<Vec<u32>>,
}

/// An adapter the config lists: its name, path, base model, and the backends (by index in
/// the list given) that list it. Its id is its position in [`configured`]'s answer + 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configured {
    pub name: String,
    pub path: String,
    pub base: String,
    pub backends: Vec<usize>,
}

/// The adapters `backends`' models list, in order of first appearance (their ids). An
/// adapter listed by several backends of the same model is one adapter; the same name on
/// two different models, or a model's own name, is refused.
pub fn configured(backends: &[super::BackendConfig]) -> Result<Vec<Configured>, LoraError> {
    let mut out: Vec<Configured> = Vec::new();
    for (i, b) in backends.iter().enumerate() {
        for m in &b.models {
            for a in &m.adapters {
                if backends
                    .iter()
                    .flat_map(|b| &b.models)
                    .any(|m| m.name == a.name())
                {
                    return Err(LoraError::NameTaken {
                        name: a.name().to_string(),
                    });
                }
                match out.iter_mut().find(|c| c.name == a.name()) {
                    Some(c) if c.base == m.name => c.backends.push(i),
                    Some(_) => return Err(LoraError::AlreadyLoaded(a.name().to_string())),
                    None => out.push(Configured {
                        name: a.name().into(),
                        path: a.path().into(),
                        base: m.name.clone(),
                        backends: vec![i],
                    }),
                }
            }
        }
    }
    Ok(out)
}

impl LoraTable {
    /// A table of `capacity` ids holding `adapters` (name, path, base model), ids in order
    /// from 1. Fails like a load would (a duplicate name, too many adapters).
    pub fn new(
        capacity: usize,
        adapters: &[(String, String, String)],
    ) -> Result<LoraTable, LoraError> {
        assert!(
            capacity < usize::from(AdapterId::MAX),
            "adapter ids fit the scheduler's AdapterId"
        );
        let t = LoraTable {
            slots: Mutex::new(vec![None; capacity]),
            loads: Mutex::new(vec![0; capacity]),
            configured: Mutex::new(Vec::new()),
        };
        for (name, path, base) in adapters {
            t.load(name, path, base)?;
        }
        Ok(t)
    }

    /// The table the models of `backends` describe (their `adapters`), with `capacity`
    /// ids. An adapter listed by several backends of the same model is one adapter; the
    /// same name on two different models, or a model's name, is refused.
    pub fn from_backends(
        capacity: usize,
        backends: &[super::BackendConfig],
    ) -> Result<LoraTable, LoraError> {
        let adapters: Vec<(String, String, String)> = configured(backends)?
            .into_iter()
            .map(|c| (c.name, c.path, c.base))
            .collect();
        let t = LoraTable::new(capacity.max(adapters.len()), &adapters)?;
        *t.configured.lock().unwrap_or_else(|e| e.into_inner()) =
            adapters.into_iter().map(|(name, _, _)| name).collect();
        Ok(t)
    }

    /// A table with no ids (LoRA unused).
    pub fn empty() -> LoraTable {
        LoraTable {
            slots: Mutex::new(Vec::new()),
            loads: Mutex::new(Vec::new()),
            configured: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Option<Adapter>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ids the table holds at most.
    pub fn capacity(&self) -> usize {
        self.lock().len()
    }

    /// Adds adapter `name` on model `base`; its id.
    pub fn load(&self, name: &str, path: &str, base: &str) -> Result<AdapterId, LoraError> {
        if name.is_empty() || path.is_empty() {
            return Err(LoraError::MissingNameOrPath);
        }
        let configured = self.configured.lock().unwrap_or_else(|e| e.into_inner());
        let mut slots = self.lock();
        if slots.iter().flatten().any(|a| a.name == name) {
            return Err(LoraError::AlreadyLoaded(name.to_string()));
        }
        let capacity = slots.len();
        let free = match configured.iter().position(|c| c == name) {
            Some(own) => Some(own),
            None => (configured.len()..capacity).find(|&i| slots[i].is_none()),
        };
        let Some(free) = free else {
            return Err(LoraError::TableFull {
                name: name.to_string(),
                capacity,
            });
        };
        let id = AdapterId::try_from(free + 1).expect("checked in new");
        let load = {
            let mut loads = self.loads.lock().unwrap_or_else(|e| e.into_inner());
            let n = loads[free];
            loads[free] = n.wrapping_add(1);
            n
        };
        slots[free] = Some(Adapter {
            id,
            name: name.to_string(),
            base: base.to_string(),
            path: path.to_string(),
            load,
        });
        Ok(id)
    }

    /// Removes adapter `name`; its id is free for the next load. Requests already admitted
    /// with it finish.
    pub fn unload(&self, name: &str) -> Result<AdapterId, LoraError> {
        if name.is_empty() {
            return Err(LoraError::MissingName);
        }
        let mut slots = self.lock();
        let Some(slot) = slots
            .iter_mut()
            .find(|s| s.as_ref().is_some_and(|a| a.name == name))
        else {
            return Err(LoraError::NotFound(name.to_string()));
        };
        Ok(slot.take().expect("found above").id)
    }

    /// The adapter called `name`, if loaded.
    pub fn lookup(&self, name: &str) -> Option<Adapter> {
        self.lock()
            .iter()
            .flatten()
            .find(|a| a.name == name)
            .cloned()
    }

    /// The name of adapter `id`, if loaded.
    pub fn name_of(&self, id: AdapterId) -> Option<String> {
        let i = usize::from(id).checked_sub(1)?;
        self.lock().get(i)?.as_ref().map(|a| a.name.clone())
    }

    /// [`Adapter::load`] of the adapter holding `id`, if any.
    pub fn load_of(&self, id: AdapterId) -> Option<u32> {
        let i = usize::from(id).checked_sub(1)?;
        self.lock().get(i)?.as_ref().map(|a| a.load)
    }

    /// Every adapter loaded, by id.
    pub fn list(&self) -> Vec<Adapter> {
        self.lock().iter().flatten().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> LoraTable {
        LoraTable::new(2, &[("sql".into(), "/a/sql".into(), "m".into())]).unwrap()
    }

    #[test]
    fn each_load_of_an_id_is_counted() {
        let t = LoraTable::new(1, &[]).unwrap();
        assert_eq!(t.load("a", "/a", "m"), Ok(1));
        assert_eq!((t.lookup("a").unwrap().load, t.load_of(1)), (0, Some(0)));
        t.unload("a").unwrap();
        assert_eq!(t.load_of(1), None);
        assert_eq!(t.load("b", "/b", "m"), Ok(1), "the freed id again");
        assert_eq!(t.load_of(1), Some(1), "its second load");
        t.unload("b").unwrap();
        t.load("a", "/a", "m").unwrap();
        assert_eq!(t.load_of(1), Some(2), "a name back is a new load too");
    }

    #[test]
    fn load_unload_and_reuse_ids_with_vllm_errors() {
        let t = table();
        assert_eq!(t.lookup("sql").unwrap().id, 1);
        assert_eq!(t.load("chat", "/a/chat", "m"), Ok(2));
        let e = t.load("sql", "/x", "m").unwrap_err();
        assert_eq!(
            e.to_string(),
            "The lora adapter 'sql' has already been loaded."
        );
        assert_eq!(e.status(), 400);
        assert!(matches!(
            t.load("third", "/t", "m"),
            Err(LoraError::TableFull { .. })
        ));
        assert_eq!(t.load("", "/t", "m"), Err(LoraError::MissingNameOrPath));
        assert_eq!(t.unload("sql"), Ok(1));
        let e = t.unload("sql").unwrap_err();
        assert_eq!(e.to_string(), "The lora adapter 'sql' cannot be found.");
        assert_eq!((e.status(), e.kind()), (404, "NotFoundError"));
        assert_eq!(t.load("third", "/t", "m"), Ok(1), "a freed id is reused");
        assert_eq!(t.name_of(1).as_deref(), Some("third"));
        assert_eq!(t.name_of(9), None);
    }

    #[test]
    fn adapters_parse_as_names_or_tables() {
        #[derive(Deserialize)]
        struct M {
            adapters: Vec<AdapterConfig>,
        }
        let m: M = toml::from_str(r#"adapters = ["a", { name = "b", path = "/w/b" }]"#).unwrap();
        assert_eq!((m.adapters[0].name(), m.adapters[0].path()), ("a", "a"));
        assert_eq!((m.adapters[1].name(), m.adapters[1].path()), ("b", "/w/b"));
    }
}
