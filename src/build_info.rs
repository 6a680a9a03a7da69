//! Build information recorded by build.rs: version, git revision, profile.

/// Crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// Git revision the binary was built from ("unknown" outside a git checkout).
pub const GIT_REVISION: &str = env!("BUILDINFO_GIT_REVISION");
/// Cargo profile ("debug" or "release").
pub const PROFILE: &str = env!("BUILDINFO_PROFILE");
/// One line for `abe --version`.
pub const VERSION_LINE: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("BUILDINFO_GIT_REVISION"),
    ", ",
    env!("BUILDINFO_PROFILE"),
    " build)"
);
