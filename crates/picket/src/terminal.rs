//! `picket lock`'s command and the terminal.
//!
//! The command runs in a process group of its own, so that a lost lock stops everything it
//! started. A group that is not the terminal's foreground group is stopped (SIGTTIN) when it
//! reads the terminal, and neither Ctrl-C nor Ctrl-Z reach it. So when `picket lock` runs in
//! the terminal's foreground, it hands the foreground to the command's group for as long as
//! the command runs, and takes it back when the command ends: an editor or a shell under the
//! lock works as it would without picket.
//!
//! Ctrl-Z then stops the command, not `picket lock`. [`Foreground::follow_stops`] notices,
//! takes the terminal back and stops `picket lock` too, so the shell gets its prompt and sees
//! the job stopped; `fg` continues `picket lock`, which gives the command the terminal again
//! and continues it. While `picket lock` is stopped it sends no keepalives: a job stopped for
//! about the TTL loses its lock, and the watchdog (in a group of its own, so not stopped with
//! the job) stops the command for good before the lease ends, while the job is still stopped.

use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask, raise};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};
use std::io::IsTerminal;
use std::os::fd::AsFd;
use std::time::Duration;

/// How often a command in the foreground is checked for having been stopped (Ctrl-Z).
const STOP_CHECK: Duration = Duration::from_millis(50);

/// The command's group holds the terminal's foreground; dropped, picket's group has it again.
#[derive(Debug)]
pub(crate) struct Foreground {
    own_group: Pid,
    command_group: Pid,
}

impl Foreground {
    /// Takes charge of the command's place on the terminal on standard input, if it is
    /// `picket lock`'s controlling terminal, and gives `command_group` the foreground if
    /// `picket lock`'s own group has it now. Started in the background, `picket lock` gives it
    /// when a `fg` brings its job to the foreground. `None` without a controlling terminal.
    pub(crate) fn give(command_group: Pid) -> Option<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let own_group = getpgrp();
        let foreground = tcgetpgrp(stdin.as_fd()).ok()?;
        let taken = Self { own_group, command_group };
        if foreground == own_group {
            taken.hand_over();
        }
        Some(taken)
    }

    /// Gives the command's group the foreground and continues it: the command may have been
    /// stopped for reading the terminal (or writing to it with `tostop` set) before it had it.
    fn hand_over(&self) {
        if let Err(error) = set_foreground(self.command_group) {
            eprintln!("picket: cannot give the terminal to the command ({error})");
        }
        let _ = killpg(self.command_group, Signal::SIGCONT);
    }

    /// Follows the command through Ctrl-Z and `fg` (see the module documentation); never
    /// resolves. `command` is the pid of the command `picket lock` started
    /// (a member of the group, not its leader: a placeholder leads the group, see `lock_cmd.rs`).
    /// Continued after a stop, the command is continued only if `still_held()` says the lock
    /// still is (a job stopped past its lease lost it); otherwise it stays stopped for
    /// `picket lock` to stop for good.
    pub(crate) async fn follow_stops(
        &self,
        command: Pid,
        still_held: impl Fn() -> bool,
    ) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(STOP_CHECK).await;
            // WSTOPPED alone never reports (or reaps) an exit: tokio's own wait still gets it.
            let stopped = waitid(Id::Pid(command), WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG);
            if !matches!(stopped, Ok(WaitStatus::Stopped(..))) {
                continue;
            }
            let foreground = tcgetpgrp(std::io::stdin().as_fd()).ok();
            // `picket lock` has the foreground (a `fg` after the command was stopped in the
            // background for reading the terminal): the command gets it and goes on.
            if foreground == Some(self.own_group) {
                if still_held() {
                    self.hand_over();
                }
                continue;
            }
            // Ctrl-Z: the terminal goes back to picket's group, which stops as the job. A
            // command stopped in the background leaves the terminal with the shell.
            if foreground == Some(self.command_group) {
                let _ = set_foreground(self.own_group);
            }
            // Stops here until the shell continues the job (`fg`, `bg`).
            let _ = raise(Signal::SIGTSTP);
            if !still_held() {
                continue;
            }
            if tcgetpgrp(std::io::stdin().as_fd()).ok() == Some(self.own_group) {
                self.hand_over();
            } else {
                let _ = killpg(self.command_group, Signal::SIGCONT);
            }
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        // Only while the command's group still has it: after a `bg`, the shell has it.
        let stdin = std::io::stdin();
        if tcgetpgrp(stdin.as_fd()).ok() == Some(self.command_group) {
            let _ = set_foreground(self.own_group);
        }
    }
}

/// Makes `group` the terminal's foreground group. A process outside the foreground group that
/// does this is sent SIGTTOU (which would stop it) unless it blocks the signal, so this thread
/// blocks it for the call.
fn set_foreground(group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut before = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut before))?;
    let set = tcsetpgrp(std::io::stdin().as_fd(), group);
    pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&before), None)?;
    set
}
