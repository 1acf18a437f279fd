//! `picket lock` in a terminal (issue 14): the command gets the terminal's foreground, so it
//! can read the terminal and Ctrl-C and Ctrl-Z reach it; Ctrl-Z stops `picket lock` as a job
//! and `fg` resumes the command. Each test runs in a pseudo-terminal of its own session.

use picket_testkit::http;
use picket_testkit::{ServerProcess, wait_until};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PICKET: &str = env!("CARGO_BIN_EXE_picket");

fn start() -> (tempfile::TempDir, ServerProcess) {
    ServerProcess::start_ready(Path::new(PICKET), &[])
}

/// A program running as the only process of a new terminal's session; dropped, every process
/// left in that session is killed, so a failed test leaves nothing stopped behind.
struct InATerminal {
    setsid: std::process::Child,
}

impl InATerminal {
    /// Waits for the program to end, and asserts it ended well.
    fn ends_well(&mut self, what: &str) {
        let status =
            wait_until(what, Duration::from_secs(10), || self.setsid.try_wait().expect("waitable"));
        assert!(status.success(), "{what}: {status:?}");
    }
}

impl Drop for InATerminal {
    fn drop(&mut self) {
        // `setsid --wait` runs the program in a child, whose pid is the session's id.
        let session = std::fs::read_to_string(format!(
            "/proc/{}/task/{}/children",
            self.setsid.id(),
            self.setsid.id()
        ))
        .ok()
        .and_then(|children| children.split_whitespace().next().map(str::to_owned));
        if let Some(session) = session {
            let _ = Command::new("pkill").args(["-KILL", "-s", &session]).status();
        }
        let _ = self.setsid.kill();
        let _ = self.setsid.wait();
    }
}

/// Runs `program` as the only process of a new terminal's session (a pseudo-terminal that
/// `setsid --ctty` makes the controlling terminal of a new session); returns the terminal's
/// master side and the running program.
fn in_a_terminal(program: &[&str]) -> (std::fs::File, InATerminal) {
    let pty = nix::pty::openpty(None, None).expect("a pseudo-terminal");
    let terminal = std::fs::File::from(pty.slave);
    let setsid = Command::new("setsid")
        .args(["--ctty", "--wait"])
        .args(program)
        .stdin(terminal.try_clone().expect("a descriptor"))
        .stdout(terminal.try_clone().expect("a descriptor"))
        .stderr(terminal)
        .spawn()
        .expect("setsid runs");
    (std::fs::File::from(pty.master), InATerminal { setsid })
}

/// What the terminal shows, read by one thread for the terminal's whole life.
struct Screen {
    receiver: std::sync::mpsc::Receiver<Vec<u8>>,
    seen: String,
}

impl Screen {
    fn of(master: &std::fs::File) -> Self {
        use std::io::Read;
        let (sender, receiver) = std::sync::mpsc::channel();
        let mut reader = master.try_clone().expect("a descriptor");
        std::thread::spawn(move || {
            let mut chunk = [0_u8; 1024];
            // The read fails once every process holding the terminal has ended.
            while let Ok(read @ 1..) = reader.read(&mut chunk) {
                if sender.send(chunk[..read].to_vec()).is_err() {
                    break;
                }
            }
        });
        Self { receiver, seen: String::new() }
    }

    /// Waits until `wanted` shows after what earlier waits found, for at most `limit`.
    fn wait_for(&mut self, wanted: &str, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.seen.contains(wanted) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.receiver.recv_timeout(left) {
                Ok(bytes) => self.seen.push_str(&String::from_utf8_lossy(&bytes)),
                Err(_) => panic!(
                    "{wanted:?} did not show within {limit:?}; the terminal showed {:?}",
                    self.seen
                ),
            }
        }
        let after = self.seen.find(wanted).expect("shown") + wanted.len();
        self.seen.drain(..after);
    }
}

/// A command that says it is ready, reads a line from the terminal and echoes it.
const READS_A_LINE: &str = "printf 'ready\\n'; read line; echo \"got:$line\"";

/// Issue 14: a command under `picket lock` in a terminal reads the terminal. It ran in a
/// process group of its own outside the terminal's foreground, so reading stopped it (SIGTTIN)
/// and it hung.
#[test]
fn lock_gives_a_command_in_a_terminal_the_terminal() {
    use std::io::Write;
    let (_dir, server) = start();
    let lock = [PICKET, "--endpoints", &server.addr, "lock", "tty", "--", "sh", "-c", READS_A_LINE];
    let (mut master, mut child) = in_a_terminal(&lock);
    let mut screen = Screen::of(&master);
    screen.wait_for("ready", Duration::from_secs(20));
    master.write_all(b"hello\n").expect("typed");
    screen.wait_for("got:hello", Duration::from_secs(10));
    child.ends_well("picket lock to end");
    assert_eq!(http::get(&server.addr, "/v1/locks/tty").body["holder"], Value::Null);
}

/// Ctrl-Z stops the command and `picket lock` with it, so a shell with job control gets its
/// job back; `fg` gives the command the terminal again and continues it.
#[test]
fn ctrl_z_stops_picket_lock_as_a_job_and_fg_resumes_its_command() {
    use std::io::Write;
    let (_dir, server) = start();
    let lock = format!(
        "set -m; {PICKET} --endpoints {} lock job -- sh -c '{}'; fg",
        server.addr,
        READS_A_LINE.replace('\'', "'\\''")
    );
    let (mut master, mut child) = in_a_terminal(&["sh", "-c", &lock]);
    let mut screen = Screen::of(&master);
    screen.wait_for("ready", Duration::from_secs(20));
    // What is typed after Ctrl-Z must not be flushed with it.
    let mut modes = nix::sys::termios::tcgetattr(&master).expect("terminal modes");
    modes.local_flags.insert(nix::sys::termios::LocalFlags::NOFLSH);
    nix::sys::termios::tcsetattr(&master, nix::sys::termios::SetArg::TCSANOW, &modes)
        .expect("terminal modes set");
    // The terminal's suspend character. If the command stopped alone, the shell would wait
    // for `picket lock` for ever and the line typed next would never be read.
    master.write_all(&[0x1a]).expect("typed");
    master.write_all(b"again\n").expect("typed");
    screen.wait_for("got:again", Duration::from_secs(20));
    child.ends_well("the shell to end");
}

/// Started in the background (`&`), `picket lock` leaves the terminal to the shell; its
/// command, reading the terminal, is stopped and so is the job; `fg` brings the job to the
/// foreground and the command gets the terminal then. (The shell waits until it sees the job
/// stopped: `jobs` polled, a condition rather than a guessed delay.)
#[test]
fn lock_started_in_the_background_gives_the_terminal_once_brought_to_the_foreground() {
    use std::io::Write;
    let (dir, server) = start();
    // `jobs` in a pipeline would run in a subshell, which has no jobs: it writes to a file.
    let jobs = dir.path().join("jobs");
    let lock = format!(
        "set -m; {PICKET} --endpoints {} lock bg -- sh -c '{}' & \
         until jobs > {jobs} && grep -q Stopped {jobs}; do sleep 0.05; done; fg",
        server.addr,
        READS_A_LINE.replace('\'', "'\\''"),
        jobs = jobs.display()
    );
    let (mut master, mut child) = in_a_terminal(&["sh", "-c", &lock]);
    let mut screen = Screen::of(&master);
    screen.wait_for("ready", Duration::from_secs(20));
    master.write_all(b"later\n").expect("typed");
    screen.wait_for("got:later", Duration::from_secs(20));
    child.ends_well("the shell to end");
}
