//! A backend slot's state: active, draining or empty (see `slots` for how backends come
//! and go within the slots abe starts with). Plain data: it lives in the registry's live
//! state and crosses to the engine in a control message. Nothing here does I/O.

/// A backend slot's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SlotState {
    /// Routable (when also healthy with a closed circuit).
    #[default]
    Active,
    /// Removed: nothing new is routed here; what it holds finishes (or times out), then
    /// the engine marks it [`SlotState::Empty`].
    Draining,
    /// Holds nothing and takes nothing; its series are gone from `/metrics`.
    Empty,
}

impl SlotState {
    /// Routable.
    #[inline]
    pub const fn is_active(self) -> bool {
        matches!(self, SlotState::Active)
    }

    /// As shown by `GET /admin/backends`.
    pub const fn as_str(self) -> &'static str {
        match self {
            SlotState::Active => "active",
            SlotState::Draining => "draining",
            SlotState::Empty => "empty",
        }
    }
}
