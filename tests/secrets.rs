//! Secrets as a user meets them: `abe config show` and the server's log (at debug level,
//! with admin requests right and wrong, an upstream backend that cannot be reached) never
//! print the admin token or an upstream API key, whether they came from the file or from
//! `ABE_*` variables.

use crate::common;

use common::Client;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

const FILE_TOKEN: &str = "tok-from-file-7f3a";
const ENV_TOKEN: &str = "tok-from-env-91c2";
const API_KEY: &str = "sk-upstream-5d8e";

/// A config file of its own for each test (they run in parallel).
fn config_file(test: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("abe-secrets-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("abe.toml");
    // Port 9 (discard) on loopback: nothing listens, so the health checks fail and log.
    let toml = format!(
        "[server]\nadmin_token = \"{FILE_TOKEN}\"\n\n\
         [[backends]]\nname = \"local\"\nkind = \"sim\"\n\
         [[backends.models]]\nname = \"abe-sim\"\ncontext_length = 8192\n\n\
         [[backends]]\nname = \"remote\"\nkind = \"upstream\"\n\
         base_url = \"http://127.0.0.1:9\"\napi_key = \"{API_KEY}\"\n\
         [[backends.models]]\nname = \"abe-sim\"\ncontext_length = 8192\n\n\
         [health]\ncheck_interval = \"50ms\"\n"
    );
    std::fs::write(&path, toml).unwrap();
    path
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in [FILE_TOKEN, ENV_TOKEN, API_KEY] {
        assert!(!text.contains(secret), "{what} printed a secret:\n{text}");
    }
}

#[test]
fn config_show_redacts_the_admin_token_and_upstream_keys_from_file_and_env() {
    let path = config_file("show");
    for env_token in [None, Some(ENV_TOKEN)] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_abe"));
        cmd.args(["config", "show", "--config"]).arg(&path);
        if let Some(t) = env_token {
            cmd.env("ABE_SERVER_ADMIN_TOKEN", t);
        }
        let out = cmd.output().unwrap();
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            shown.contains("admin_token = \"<redacted>\""),
            "the key is still listed: {shown}"
        );
        assert!(
            shown.contains("base_url = \"http://127.0.0.1:9\""),
            "{shown}"
        );
        assert_no_secret("config show", &shown);
        assert_no_secret(
            "config show (stderr)",
            &String::from_utf8_lossy(&out.stderr),
        );
    }
}

#[test]
fn the_server_log_never_prints_the_admin_token_or_an_upstream_key() {
    let path = config_file("serve");
    let mut child = Command::new(env!("CARGO_BIN_EXE_abe"))
        .args(["serve", "--port", "0", "--config"])
        .arg(&path)
        .env("RUST_LOG", "debug")
        .env("ABE_ENGINE_PIN", "false")
        .env("ABE_SERVER_ADMIN_TOKEN", ENV_TOKEN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("abe starts");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("abe listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .parse()
        .unwrap();
    let mut c = Client::connect(addr);
    let wrong = format!("Bearer {FILE_TOKEN}");
    let r = c.request_with(
        "POST",
        "/admin/strategy/fixed",
        None,
        &[("Authorization", &wrong)],
    );
    assert_eq!(
        r.status, 401,
        "the file's token was overridden by the env's"
    );
    assert_no_secret("a 401", &r.text());
    let right = format!("Bearer {ENV_TOKEN}");
    let r = c.request_with(
        "POST",
        "/admin/strategy/fixed",
        None,
        &[("Authorization", &right)],
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // A completion routed to the unreachable upstream, or served locally: either way logged.
    let r = c.request(
        "POST",
        "/v1/completions",
        Some(r#"{"prompt":"hi","max_tokens":2}"#),
    );
    assert!(r.status == 200 || r.status >= 500, "{}", r.text());
    drop(c);
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .unwrap();
    assert!(child.wait().unwrap().success(), "{log}");
    assert!(log.contains("abe serving"), "the log was captured: {log}");
    assert_no_secret("the server log", &log);
    let _ = std::fs::remove_dir_all(path.parent().unwrap());
}
