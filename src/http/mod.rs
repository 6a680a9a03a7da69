//! HTTP/1.1 messages: request heads parsed and framed with hard limits ([`parse`], over the
//! common-head scanner [`head_scan`] and the known header names of [`header_name`]), responses
//! and OpenAI-shaped error bodies written straight into a buffer ([`response`]), and the
//! number writers both use ([`number`]).
//!
//! This is the ground floor of the front end: [`crate::api`] and the server
//! ([`crate::server`]) build on it. Nothing here imports from the rest of abe (no api, no
//! runtime, no config), does I/O, or reads a clock; bytes in, values or bytes out.

pub mod head_scan;
pub mod header_name;
pub mod number;
pub mod parse;
pub mod response;
