//! The live dashboard (`/ui`) in a real headless browser: Debian's Chromium driven over the
//! WebDriver protocol by `chromedriver` (`scripts/test.sh` installs both). The page loads, a
//! lock is acquired through the API, and its holder and token appear on the page without a
//! reload, with the grant in the event stream; a screenshot is saved as a test artifact.

use base64::Engine;
use picket_testkit::http;
use picket_testkit::{ServerProcess, free_port, wait_until};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const PICKET: &str = env!("CARGO_BIN_EXE_picket");
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A running chromedriver, killed on drop.
struct Driver {
    child: Child,
    addr: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    fn start() -> Self {
        for program in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(program).exists(),
                "{program} is missing: install Debian's chromium and chromium-driver (scripts/test.sh does)"
            );
        }
        let port = free_port();
        let child = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let driver = Self { child, addr: format!("127.0.0.1:{port}") };
        wait_until("chromedriver to be ready", Duration::from_secs(20), || {
            let status = http::try_request(&driver.addr, "GET", "/status", None).ok()?;
            (status.body["value"]["ready"] == true).then_some(())
        });
        driver
    }

    /// A headless browser session; the flags keep Chromium off the network beyond loopback.
    fn session(&self) -> Browser<'_> {
        let args = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1400,900",
        ];
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        }}});
        let created = http::request(&self.addr, "POST", "/session", Some(&capabilities));
        assert_eq!(created.status, 200, "{}", created.text);
        let id = created.body["value"]["sessionId"].as_str().expect("a session id").to_owned();
        Browser { driver: self, id }
    }
}

/// One browser session, closed on drop.
struct Browser<'a> {
    driver: &'a Driver,
    id: String,
}

impl Drop for Browser<'_> {
    fn drop(&mut self) {
        let _ =
            http::try_request(&self.driver.addr, "DELETE", &format!("/session/{}", self.id), None);
    }
}

impl Browser<'_> {
    fn command(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let path = format!("/session/{}{path}", self.id);
        let reply = http::request(&self.driver.addr, method, &path, body);
        assert_eq!(reply.status, 200, "{method} {path}: {}", reply.text);
        reply.body["value"].clone()
    }

    fn open(&self, url: &str) {
        self.command("POST", "/url", Some(&json!({ "url": url })));
    }

    /// Runs `script` in the page and returns what it returns.
    fn eval(&self, script: &str) -> Value {
        self.command("POST", "/execute/sync", Some(&json!({ "script": script, "args": [] })))
    }

    fn screenshot(&self, path: &Path) {
        let encoded = self.command("GET", "/screenshot", None);
        let png = base64::engine::general_purpose::STANDARD
            .decode(encoded.as_str().expect("base64 text"))
            .expect("a base64 PNG");
        assert!(png.starts_with(b"\x89PNG"), "a PNG image");
        std::fs::write(path, png).expect("the screenshot is written");
    }
}

fn artifact(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("artifacts");
    std::fs::create_dir_all(&dir).expect("the artifact directory");
    dir.join(name)
}

#[test]
fn dashboard_shows_a_new_holder_and_its_token_without_a_reload() {
    let (_dir, server) = ServerProcess::start_ready(Path::new(PICKET), &[]);
    let driver = Driver::start();
    let browser = driver.session();
    browser.open(&format!("http://{}/ui", server.addr));
    wait_until("the page to show the node's role", Duration::from_secs(20), || {
        (browser.eval("return document.getElementById('role').textContent") == "leader")
            .then_some(())
    });
    let loaded_at = browser.eval("return window.picketLoadedAt");

    let session = http::post(&server.addr, "/v1/sessions", &json!({ "ttl_ms": 30_000 }));
    let session = session.body["session_id"].as_u64().expect("a session id");
    let body = json!({ "name": "ui/report", "session_id": session, "wait_ms": 0 });
    let granted = http::post(&server.addr, "/v1/locks/acquire", &body);
    assert_eq!(granted.status, 200, "{}", granted.text);
    let token = granted.body["token"].as_u64().expect("a token");

    let row = "document.querySelector('tr[data-lock=\"ui/report\"]')";
    let shown = wait_until("the holder and token on the page", Duration::from_secs(20), || {
        let cells = browser.eval(&format!(
            "const row = {row}; return row && [row.querySelector('.holder').textContent, row.querySelector('.token').textContent]"
        ));
        (cells != Value::Null).then_some(cells)
    });
    assert_eq!(shown, json!([session.to_string(), token.to_string()]));
    wait_until("the grant in the event stream", Duration::from_secs(20), || {
        let events = browser.eval("return document.getElementById('events').textContent");
        let expected = format!("granted ui/report to session {session}, token {token}");
        events.as_str()?.contains(&expected).then_some(())
    });
    wait_until("the session and what it holds", Duration::from_secs(20), || {
        let session_row = browser.eval(&format!(
            "const row = document.querySelector('tr[data-session=\"{session}\"]'); return row && row.textContent"
        ));
        session_row.as_str()?.contains("ui/report").then_some(())
    });
    assert_eq!(browser.eval("return window.picketLoadedAt"), loaded_at, "the page did not reload");

    // A refusal shows up too: a release with a stale token.
    let stale = json!({ "name": "ui/report", "session_id": session, "token": token - 1 });
    assert_eq!(http::post(&server.addr, "/v1/locks/release", &stale).status, 409);
    wait_until("the refusal in the event stream", Duration::from_secs(20), || {
        let events = browser.eval("return document.getElementById('events').textContent");
        events.as_str()?.contains("refused 1x: code=").then_some(())
    });

    let screenshot = artifact("dashboard.png");
    browser.screenshot(&screenshot);
    println!("screenshot: {}", screenshot.display());
}
