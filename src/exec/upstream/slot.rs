//! The cell an `upstream` backend slot's client lives in: the workers and the health
//! checker take the current client (an `Arc` clone) at the start of each batch or probe;
//! the control plane (admin API, reload, DNS discovery) puts a client for a new address in
//! when it fills the slot again.
//!
//! The hand-off: a batch that took the old client finishes against the old address (its
//! requests are in flight there); the next batch takes the new one. The lock is held only
//! to clone or swap an `Arc`, never across I/O, and never on the engine thread. It comes
//! from `sync`, so `loom-tests/tests/slot.rs` checks the swap: a reader sees one whole
//! client, the old or the new, never a mix and never none.

use super::client::UpstreamClient;
use crate::sync::{Arc, Mutex};

/// A backend slot's current client (see the module doc). Clones share the cell.
#[derive(Clone, Debug)]
pub struct UpstreamSlot {
    cell: Arc<Mutex<UpstreamClient>>,
}

impl UpstreamSlot {
    /// A slot holding `client`.
    pub fn new(client: UpstreamClient) -> UpstreamSlot {
        UpstreamSlot {
            cell: Arc::new(Mutex::new(client)),
        }
    }

    /// The client to use now (shares its connection pool).
    pub fn current(&self) -> UpstreamClient {
        // A poisoned lock only means a panic elsewhere while cloning; the client is whole.
        self.cell.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The slot's backend at `base_url` from now on (a new connection pool); batches
    /// already running keep the client they took.
    pub fn retarget(&self, base_url: &str, api_key: Option<String>) {
        let next = self.current().retargeted(base_url, api_key);
        *self.cell.lock().unwrap_or_else(|e| e.into_inner()) = next;
    }
}

impl From<UpstreamClient> for UpstreamSlot {
    fn from(client: UpstreamClient) -> UpstreamSlot {
        UpstreamSlot::new(client)
    }
}
