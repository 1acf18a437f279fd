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
//! longer than the TTL loses its lock, and the command is stopped for good when it continues.

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
    /// Gives the terminal on standard input to `command_group`, if `picket lock`'s own group
    /// has it now. `None` without a terminal, or when `picket lock` runs in the background.
    pub(crate) fn give(command_group: Pid) -> Option<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let own_group = getpgrp();
        if tcgetpgrp(stdin.as_fd()).ok()? != own_group {
            return None;
        }
        if let Err(error) = set_foreground(command_group) {
            eprintln!("picket: cannot give the terminal to the command ({error}); it runs without");
            return None;
        }
        // The command started before it had the terminal: if it already read the terminal (or
        // wrote to it with `tostop` set), it was stopped for that, and continues now.
        let _ = killpg(command_group, Signal::SIGCONT);
        Some(Self { own_group, command_group })
    }

    /// Follows the command through Ctrl-Z and `fg` (see the module documentation); never
    /// resolves. `command` is the pid of the group's leader, which `picket lock` started.
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
            // Only a command in the foreground is given back: one stopped in the background
            // (after `bg`, for reading the terminal) leaves the terminal with the shell.
            if tcgetpgrp(std::io::stdin().as_fd()).ok() == Some(self.command_group) {
                let _ = set_foreground(self.own_group);
            }
            // Stops here until the shell continues the job (`fg`, `bg`).
            let _ = raise(Signal::SIGTSTP);
            if !still_held() {
                continue;
            }
            let in_foreground = tcgetpgrp(std::io::stdin().as_fd()).ok() == Some(self.own_group);
            if in_foreground {
                let _ = set_foreground(self.command_group);
            }
            let _ = killpg(self.command_group, Signal::SIGCONT);
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
