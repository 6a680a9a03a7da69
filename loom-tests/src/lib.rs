//! Intentionally empty: the models live in tests/.
