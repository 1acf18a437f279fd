//! A clean first start of a three-node cluster logs no warning. In a file of its own, so that
//! no other test loads the machine while it runs: a peer that misses a deadline under load is
//! worth a warning, and this test must not see one for that reason.

use picket_testkit::http::try_request;
use picket_testkit::{free_port, temp_dir, wait_until};
use std::time::Duration;

/// A clean first start of a three-node cluster, at the default log level, logs no warning and
/// no error: peers not up yet are expected then, and are logged once, at info.
#[test]
fn a_clean_first_start_of_a_cluster_logs_no_warning() {
    use std::process::{Command, Stdio};
    let dir = temp_dir();
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers =
        (1..=3).map(|id| format!("{id}=127.0.0.1:{}", ports[id - 1])).collect::<Vec<_>>().join(",");
    let mut nodes = Vec::new();
    for id in 1..=3 {
        let log = std::fs::File::create(dir.path().join(format!("node{id}.log"))).unwrap();
        let node = Command::new(env!("CARGO_BIN_EXE_picket"))
            .args(["serve", "--node-id", &id.to_string(), "--peers", &peers])
            .args(["--listen", &format!("127.0.0.1:{}", ports[id - 1]), "--data-dir"])
            .arg(dir.path().join(format!("node{id}")))
            .env_remove("RUST_LOG")
            .env_remove("PICKET_LOG")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        nodes.push(node);
    }
    let addrs: Vec<String> = ports.iter().map(|port| format!("127.0.0.1:{port}")).collect();
    wait_until("a leader every node knows", Duration::from_secs(30), || {
        addrs
            .iter()
            .all(|addr| {
                try_request(addr, "GET", "/readyz", None).is_ok_and(|reply| reply.status == 200)
            })
            .then_some(())
    });
    // Read the logs before stopping anything: a peer's going away is worth a warning.
    let logs: Vec<String> = (1..=3)
        .map(|id| std::fs::read_to_string(dir.path().join(format!("node{id}.log"))).unwrap())
        .collect();
    for mut node in nodes {
        node.kill().ok();
        node.wait().ok();
    }
    for (index, log) in logs.iter().enumerate() {
        let id = index + 1;
        let loud: Vec<&str> =
            log.lines().filter(|line| line.contains("WARN") || line.contains("ERROR")).collect();
        assert!(loud.is_empty(), "node {id} warned on a clean first start:\n{}", loud.join("\n"));
        assert!(log.contains("serving"), "node {id} logged at info: {log}");
    }
}
