//! Records build information (git revision, profile) for `abe --version`.
use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    let rev = if dirty { format!("{rev}-dirty") } else { rev };
    println!("cargo:rustc-env=BUILDINFO_GIT_REVISION={rev}");
    println!(
        "cargo:rustc-env=BUILDINFO_PROFILE={}",
        std::env::var("PROFILE").unwrap_or_else(|_| "unknown".into())
    );
    // Where git keeps HEAD and the index: `.git/` in a checkout, `.git/worktrees/NAME/` in a
    // worktree (whose `.git` is a file). A path that does not exist would make cargo rerun
    // this script, and rebuild the crate, on every build.
    for path in git_paths(&["HEAD", "index"]) {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}

/// The paths git uses for `names` (as `git rev-parse --git-path` resolves them), only those
/// that exist; none outside a git checkout.
fn git_paths(names: &[&str]) -> Vec<String> {
    names
        .iter()
        .filter_map(|name| {
            let out = Command::new("git")
                .args(["rev-parse", "--git-path", name])
                .output()
                .ok()
                .filter(|o| o.status.success())?;
            let path = String::from_utf8(out.stdout).ok()?.trim().to_string();
            std::path::Path::new(&path).exists().then_some(path)
        })
        .collect()
}
