//! Micro-benchmarks of the state machine's hot paths: `cargo bench -p picket-core`.
//! Figures are recorded in BENCHMARKS.md; nothing here asserts a timing.

use picket_core::{Command, Input, Limits, RequestId, Response, SessionId, StateMachine, Wait};
use picket_testkit::bench::measure;
use std::hint::black_box;

fn machine_with_sessions(count: u64) -> (StateMachine, Vec<SessionId>) {
    let mut machine = StateMachine::new(Limits::default());
    let sessions = (0..count)
        .map(|_| {
            let applied = machine.apply(&Input::new(
                0,
                Command::OpenSession { ttl_ms: 10_000, lock_delay_ms: 0, owner: None },
            ));
            let Ok(Response::SessionOpened { session, .. }) = applied.result else {
                unreachable!()
            };
            session
        })
        .collect();
    (machine, sessions)
}

fn main() {
    // An acquire and a release of an uncontended lock, among 10,000 live sessions each holding
    // a lock of its own: the uncontended benchmark's whole state machine cost per cycle.
    let (mut machine, sessions) = machine_with_sessions(10_000);
    for (index, session) in sessions.iter().enumerate() {
        machine.apply(&Input::new(
            1,
            Command::Acquire {
                session: *session,
                name: format!("held/{index}"),
                wait: Wait::Try,
                request: RequestId(0),
                attempt: 0,
            },
        ));
    }
    let mut now_ms = 2;
    let session = sessions[0];
    measure("core: acquire + release, uncontended, 10k sessions", 20_000, || {
        now_ms += 1;
        let acquired = machine.apply(&Input::new(
            now_ms,
            Command::Acquire {
                session,
                name: "bench/lock".into(),
                wait: Wait::Try,
                request: RequestId(0),
                attempt: 0,
            },
        ));
        let Ok(Response::Granted { token, .. }) = acquired.result else { unreachable!() };
        let released = machine.apply(&Input::new(
            now_ms,
            Command::Release { session, name: "bench/lock".into(), token },
        ));
        black_box(released);
    });

    // A handoff: the holder releases and the head of an 8-deep queue is granted.
    let (mut machine, sessions) = machine_with_sessions(9);
    for session in &sessions {
        machine.apply(&Input::new(
            1,
            Command::Acquire {
                session: *session,
                name: "contended".into(),
                wait: Wait::Forever,
                request: RequestId(0),
                attempt: 0,
            },
        ));
    }
    measure(
        "core: handoff (release grants the next of 8 waiters, who queues again)",
        20_000,
        || {
            let holder = machine.lock("contended").and_then(|lock| lock.holder).expect("held");
            machine.apply(&Input::new(
                2,
                Command::Release {
                    session: holder.session,
                    name: "contended".into(),
                    token: holder.token,
                },
            ));
            let requeued = machine.apply(&Input::new(
                2,
                Command::Acquire {
                    session: holder.session,
                    name: "contended".into(),
                    wait: Wait::Forever,
                    request: RequestId(0),
                    attempt: 0,
                },
            ));
            black_box(requeued);
        },
    );

    // A tick renewing 10,000 sessions: what keeping many sessions alive costs the log's apply.
    let (mut machine, sessions) = machine_with_sessions(10_000);
    let mut now_ms = 1;
    measure("core: tick renewing 10k sessions", 50, || {
        now_ms += 1;
        black_box(machine.apply(&Input::new(
            now_ms,
            Command::Tick { renew: sessions.clone(), renew_for: Vec::new() },
        )));
    });

    let (machine, _) = machine_with_sessions(10_000);
    measure("core: snapshot of 10k sessions", 20, || {
        black_box(machine.snapshot());
    });
}
