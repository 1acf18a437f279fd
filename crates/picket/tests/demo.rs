//! `picket demo` runs the canonical race against a fenced and an unfenced store, prints the
//! refusal with both tokens, exits 0, and leaves no process or directory behind.

use std::process::Command;

#[test]
fn demo_shows_the_refusal_with_both_tokens_and_cleans_up() {
    let output = Command::new(env!("CARGO_BIN_EXE_picket")).arg("demo").output().expect("runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}{}", String::from_utf8_lossy(&output.stderr));

    let refusal = stdout.lines().find(|line| line.contains("REFUSED: 409")).expect("a refusal");
    let json_start = refusal.find('{').expect("a JSON body");
    let body: serde_json::Value = serde_json::from_str(&refusal[json_start..]).expect("JSON");
    assert_eq!(body["code"], "stale_token", "{refusal}");
    let presented = body["presented_token"].as_u64().expect("the stale token");
    let highest = body["highest_token"].as_u64().expect("the new token");
    assert!(highest > presented, "{refusal}");
    assert!(stdout.contains(&format!(
        "acquires demo/report in a session with a 1000 ms TTL: token {presented}"
    )));
    assert!(stdout.contains(&format!("acquires demo/report: token {highest}")));
    assert!(stdout.contains("ADMITTED: 200"), "the unfenced store takes the stale write: {stdout}");
    assert!(stdout.contains("now holds \"written by client 1 after its pause\""), "{stdout}");

    // Every process it started is gone (nothing listens on their ports), and so is its directory.
    let addrs: Vec<&str> = stdout
        .lines()
        .filter(|line| line.contains(" on 127.0.0.1:"))
        .filter_map(|line| line.rsplit(" on ").next())
        .collect();
    assert_eq!(addrs.len(), 3, "{stdout}");
    for addr in addrs {
        assert!(std::net::TcpStream::connect(addr).is_err(), "{addr} still listens");
    }
    let removed = stdout
        .lines()
        .find_map(|line| line.strip_prefix("Stopped the three processes and removed "));
    let removed = removed.expect("the directory is named").trim_end_matches('.');
    assert!(!std::path::Path::new(removed).exists(), "{removed} is left behind");
}
