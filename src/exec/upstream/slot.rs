//! The cell an `upstream` backend slot's client lives in: the workers and the health
//! checker take the current client (an `Arc` clone) at the start of each batch or probe;
//! the control plane (admin API, reload, DNS discovery) puts a client for a new address in
//! when it fills the slot again.
//!
//! The hand-off: a batch that took the old client finishes against the old address (its
//! requests are in flight there); the next batch takes the new one. The lock is held only
//! to clone or swap a value, never across I/O, and never on the engine thread. The cell is
//! generic ([`SlotCell`]) and its lock comes from `sync`, so `loom-tests/tests/slot.rs`
//! checks the real code: a reader sees one whole value, the old or the new, never a mix,
//! and never the old again once it saw the new.

use super::client::UpstreamClient;
use crate::sync::{Arc, Mutex};

/// A value readers clone out and a writer replaces whole. Clones share the cell.
#[derive(Debug)]
pub struct SlotCell<T> {
    cell: Arc<Mutex<T>>,
}

impl<T> Clone for SlotCell<T> {
    fn clone(&self) -> Self {
        SlotCell {
            cell: self.cell.clone(),
        }
    }
}

impl<T: Clone> SlotCell<T> {
    /// A cell holding `value`.
    pub fn new(value: T) -> SlotCell<T> {
        SlotCell {
            cell: Arc::new(Mutex::new(value)),
        }
    }

    /// The value now.
    pub fn current(&self) -> T {
        // A poisoned lock only means a panic elsewhere while cloning; the value is whole.
        self.cell.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `value` from now on; readers that took the old one keep it.
    pub fn replace(&self, value: T) {
        *self.cell.lock().unwrap_or_else(|e| e.into_inner()) = value;
    }
}

/// A backend slot's current client (see the module doc).
pub type UpstreamSlot = SlotCell<UpstreamClient>;

impl SlotCell<UpstreamClient> {
    /// The slot's backend at `base_url` from now on (a new connection pool); batches
    /// already running keep the client they took.
    pub fn retarget(&self, base_url: &str, api_key: Option<String>) {
        self.replace(self.current().retargeted(base_url, api_key));
    }

    /// The slot's backend is `target` from now on (a spare slot filled by another backend);
    /// batches already running keep the client they took.
    pub fn refill(&self, target: super::UpstreamTarget) {
        self.replace(self.current().for_target(target));
    }
}

impl From<UpstreamClient> for UpstreamSlot {
    fn from(client: UpstreamClient) -> UpstreamSlot {
        UpstreamSlot::new(client)
    }
}
