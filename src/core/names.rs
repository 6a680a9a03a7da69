//! Settings that are a choice among names (a strategy, a balancer, a bin policy...) read and
//! written as their names, so a config file, a scenario and a report all say `queue_depth`
//! and a typo is an error at the moment the text is read, listing the valid names.
//!
//! `serde_by_name!` gives such an enum `Serialize` (its `as_str`) and `Deserialize` (its
//! `FromStr`, whose error names the value and the valid choices). Nothing else lives here.

/// Implements `Serialize` and `Deserialize` for a type with `fn as_str(self) -> &'static
/// str` and a `FromStr` whose error is `Display`: it is written as its name and read back by
/// parsing it, the parse error becoming the deserialisation error.
macro_rules! serde_by_name {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = <String as serde::Deserialize>::deserialize(d)?;
                name.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use serde_by_name;
