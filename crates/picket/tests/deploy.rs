//! The files in `deploy/` stay true: the compose file's and the systemd unit's command lines and
//! the example config parse as `picket serve` settings, the unit passes `systemd-analyze
//! verify`, and `deploy/cluster.sh` starts a three-node cluster that elects a leader and grants
//! a lock, then stops it. (The Dockerfile's image cannot be built here: base images come from a
//! registry this machine does not reach; its command is checked like the others.)

use picket_testkit::cluster::send;
use picket_testkit::{free_ports_in_a_row, temp_dir};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const PICKET: &str = env!("CARGO_BIN_EXE_picket");

fn deploy(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(name)
}

fn read(name: &str) -> String {
    std::fs::read_to_string(deploy(name)).unwrap_or_else(|error| panic!("deploy/{name}: {error}"))
}

/// Runs `picket ARGS --print-config` and returns what it printed; fails on a bad flag.
fn print_config(args: &[String]) -> String {
    let output: Output =
        Command::new(PICKET).args(args).arg("--print-config").output().expect("picket runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "picket {}: {stderr}", args.join(" "));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn the_compose_files_commands_are_valid_serve_flags() {
    let compose = read("docker-compose.yml");
    let commands: Vec<Vec<String>> = compose
        .lines()
        .filter_map(|line| line.trim().strip_prefix("command: "))
        .map(|command| serde_json::from_str(command).expect("a one-line JSON-style command"))
        .collect();
    assert_eq!(commands.len(), 3, "three nodes");
    for (index, command) in commands.iter().enumerate() {
        let printed = print_config(command);
        assert!(printed.contains(&format!("node-id = {}  # flag", index + 1)), "{printed}");
        assert!(printed.contains("peers = \"1=picket1:7687,2=picket2:7687,3=picket3:7687\""));
    }
}

#[test]
fn the_dockerfiles_command_and_environment_are_valid_serve_settings() {
    let dockerfile = read("Dockerfile");
    let command =
        dockerfile.lines().find_map(|line| line.strip_prefix("CMD ")).expect("a CMD line");
    let command: Vec<String> = serde_json::from_str(command).expect("an exec-form CMD");
    let output = Command::new(PICKET)
        .args(&command)
        .arg("--print-config")
        .env("PICKET_DATA_DIR", "/var/lib/picket")
        .env("PICKET_LISTEN", "0.0.0.0:7687")
        .env("PICKET_LOG_FORMAT", "json")
        .output()
        .expect("picket runs");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(printed.contains("listen = \"0.0.0.0:7687\"  # environment"), "{printed}");
    assert!(dockerfile.contains("USER picket"), "the image runs as a non-root user");
}

#[test]
fn the_systemd_unit_verifies_and_runs_the_example_config() {
    let unit = read("picket.service");
    let exec = unit.lines().find_map(|line| line.strip_prefix("ExecStart=")).expect("ExecStart");
    let config = deploy("picket.toml").display().to_string();
    let args: Vec<String> = exec
        .split_whitespace()
        .skip(1)
        .map(|arg| if arg == "/etc/picket/picket.toml" { config.clone() } else { arg.to_owned() })
        .collect();
    let printed = print_config(&args);
    assert!(printed.contains("data-dir = \"/var/lib/picket\"  # file"), "{printed}");
    assert!(printed.contains("log-format = \"json\"  # file"), "{printed}");

    // systemd's own check, on a copy whose paths exist here.
    let dir = temp_dir();
    let copy = dir.path().join("picket.service");
    let unit =
        unit.replace("/usr/local/bin/picket", PICKET).replace("/etc/picket/picket.toml", &config);
    std::fs::write(&copy, unit).expect("written");
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze runs (Debian's systemd package; scripts/test.sh installs it)");
    let complaints = String::from_utf8_lossy(&verified.stderr);
    assert!(verified.status.success() && complaints.trim().is_empty(), "{complaints}");
}

/// Runs `deploy/cluster.sh ACTION DIR` with the test's binary and ports.
fn cluster_script(action: &str, data: &Path, base: u16) -> Output {
    Command::new("bash")
        .arg(deploy("cluster.sh"))
        .args([action, &data.display().to_string()])
        .env("PICKET", PICKET)
        .env("PICKET_BASE_PORT", base.to_string())
        .output()
        .expect("the script runs")
}

/// A cluster started by the script, stopped by it when dropped, whatever the test did.
struct ScriptCluster {
    data: PathBuf,
    base: u16,
}

impl Drop for ScriptCluster {
    fn drop(&mut self) {
        let _ = cluster_script("stop", &self.data, self.base);
    }
}

#[test]
fn the_cluster_script_starts_three_nodes_that_grant_a_lock_and_stops_them() {
    let dir = temp_dir();
    // The script numbers its nodes' ports in a row from the first.
    let base = free_ports_in_a_row(3);
    let cluster = ScriptCluster { data: dir.path().join("cluster"), base };
    let started = cluster_script("start", &cluster.data, base);
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));
    let addrs: Vec<String> = (0..3).map(|offset| format!("127.0.0.1:{}", base + offset)).collect();
    // `send` follows the leader and waits out an election (a node that just became leader
    // answers 503 until it settled), as a client would.
    let post = |path: &str, body: &serde_json::Value| {
        send(&addrs, "POST", path, Some(body), Duration::from_secs(30))
            .expect("the cluster answers")
    };
    let session = post("/v1/sessions", &json!({ "ttl_ms": 10_000 }));
    let session = session.body["session_id"].as_u64().expect("a session");
    let body = json!({ "name": "deploy/check", "session_id": session, "wait_ms": 0 });
    assert_eq!(post("/v1/locks/acquire", &body).status, 200);
    let stopped = cluster_script("stop", &cluster.data, base);
    assert!(stopped.status.success(), "{}", String::from_utf8_lossy(&stopped.stderr));
    for addr in &addrs {
        assert!(std::net::TcpStream::connect(addr).is_err(), "{addr} was stopped");
    }
}
