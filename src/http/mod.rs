//! HTTP/1.1 messages: request heads parsed and framed with hard limits ([`parse`]), responses
//! and OpenAI-shaped error bodies written straight into a buffer ([`response`]), and the
//! number writers both use ([`number`]).
//!
//! This is the ground floor of the front end: [`crate::api`] and the server
//! ([`crate::server`]) build on it. Nothing here imports from the rest of abe (no api, no
//! runtime, no config), does I/O, or reads a clock; bytes in, values or bytes out.

pub mod head_scan;
pub mod number;
pub mod parse;
pub mod response;
