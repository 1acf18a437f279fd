//! `picket serve` on one node, driven over HTTP/JSON as `curl` would: every lock operation a user
//! relies on, and bad input that must be refused without changing anything.

use picket_testkit::http::{self, Reply};
use picket_testkit::{ServerProcess, wait_until};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

fn start() -> (tempfile::TempDir, ServerProcess) {
    ServerProcess::start_ready(Path::new(env!("CARGO_BIN_EXE_picket")), &[])
}

fn open_session(addr: &str, ttl_ms: u64, lock_delay_ms: u64) -> u64 {
    let reply = http::post(
        addr,
        "/v1/sessions",
        &json!({ "ttl_ms": ttl_ms, "lock_delay_ms": lock_delay_ms }),
    );
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body["session_id"].as_u64().unwrap()
}

fn acquire(addr: &str, name: &str, session: u64, wait_ms: Option<u64>) -> Reply {
    let mut body = json!({ "name": name, "session_id": session });
    if let Some(wait_ms) = wait_ms {
        body["wait_ms"] = json!(wait_ms);
    }
    http::post(addr, "/v1/locks/acquire", &body)
}

fn release(addr: &str, name: &str, session: u64, token: u64) -> Reply {
    http::post(
        addr,
        "/v1/locks/release",
        &json!({ "name": name, "session_id": session, "token": token }),
    )
}

fn token_of(reply: &Reply) -> u64 {
    assert_eq!(reply.status, 200, "{}", reply.text);
    reply.body["token"].as_u64().unwrap()
}

/// Acquire, read, check and release, with tokens and sequencers as the README documents them.
#[test]
fn acquire_check_release_over_http() {
    let (_dir, server) = start();
    let addr = &server.addr;
    let session = open_session(addr, 10_000, 0);
    let granted = acquire(addr, "jobs/nightly report", session, Some(0));
    let token = token_of(&granted);
    let sequencer = granted.body["sequencer"].as_str().unwrap().to_owned();
    assert_eq!(sequencer, format!("p1.{token}.jobs/nightly%20report"));

    let lock = http::get(addr, "/v1/locks/jobs/nightly%20report");
    assert_eq!(lock.status, 200);
    assert_eq!(lock.body["holder"]["session_id"], session);
    assert_eq!(lock.body["holder"]["token"], token);

    let check = http::get(addr, &format!("/v1/check?sequencer={sequencer}"));
    assert_eq!(check.body, json!({ "status": "current", "current_token": token }));

    // Acquiring again in the same session returns the same grant.
    let again = acquire(addr, "jobs/nightly report", session, None);
    assert_eq!(token_of(&again), token);
    assert_eq!(again.body["already_held"], true);

    assert_eq!(release(addr, "jobs/nightly report", session, token).status, 200);
    let check = http::get(addr, &format!("/v1/check?sequencer={sequencer}"));
    assert_eq!(check.body["status"], "superseded", "a released grant is over");
    let lock = http::get(addr, "/v1/locks/jobs/nightly%20report");
    assert_eq!(lock.body["holder"], Value::Null);
    // A free lock keeps no record, but the view bounds its last token: every token it had is at
    // most the revision it was read at, and the next grant's is above it.
    let revision = lock.body["revision"].as_u64().expect("a revision");
    assert!(revision >= token, "{}", lock.text);

    let listed = http::get(addr, "/v1/locks?prefix=jobs/");
    assert_eq!(listed.body["locks"], json!([]));
    let sessions = http::get(addr, "/v1/sessions");
    assert_eq!(sessions.body["sessions"][0]["session_id"], session);
}

/// A try on a taken lock is refused at once with the holder's token; a bounded wait times out;
/// waiters are granted in arrival order with growing tokens.
#[test]
fn try_timeout_and_fifo_over_http() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let holder = open_session(&addr, 10_000, 0);
    let first = token_of(&acquire(&addr, "q", holder, Some(0)));

    let other = open_session(&addr, 10_000, 0);
    let busy = acquire(&addr, "q", other, Some(0));
    assert_eq!(busy.status, 409);
    assert_eq!(busy.body["code"], "lock_busy");
    assert_eq!(busy.body["holder_token"], first);

    let started = Instant::now();
    let timed_out = acquire(&addr, "q", other, Some(300));
    assert_eq!(timed_out.status, 409, "{}", timed_out.text);
    assert_eq!(timed_out.body["code"], "wait_timed_out");
    assert!(started.elapsed() >= Duration::from_millis(300));

    // Three waiters queue in order; each is granted after the previous one releases.
    let waiters: Vec<u64> = (0..3).map(|_| open_session(&addr, 10_000, 0)).collect();
    let handles: Vec<_> = waiters
        .iter()
        .enumerate()
        .map(|(index, &session)| {
            let addr = addr.clone();
            // Queue strictly one after another: wait until the previous waiter is queued.
            wait_until("the previous waiter to queue", Duration::from_secs(5), || {
                let lock = http::get(&addr, "/v1/locks/q");
                (lock.body["waiters"].as_array().unwrap().len() == index).then_some(())
            });
            std::thread::spawn(move || acquire(&addr, "q", session, None))
        })
        .collect();
    wait_until("three waiters", Duration::from_secs(5), || {
        (http::get(&addr, "/v1/locks/q").body["waiters"] == json!(waiters)).then_some(())
    });
    let mut previous = (holder, first);
    for (handle, &session) in handles.into_iter().zip(&waiters) {
        assert_eq!(release(&addr, "q", previous.0, previous.1).status, 200);
        let token = token_of(&handle.join().unwrap());
        assert!(token > previous.1, "token {token} after {}", previous.1);
        previous = (session, token);
    }
}

/// A session that is not kept alive expires and its lock goes to the next waiter; with
/// lock-delay the lock stays ungrantable for the delay first. The expired grant is superseded.
#[test]
fn session_expiry_releases_the_lock_after_its_lock_delay() {
    let (_dir, server) = start();
    let addr = &server.addr;
    // Measured from before the doomed session opens: its TTL counts from then, and the calls
    // before the wait may take long on a loaded machine.
    let started = Instant::now();
    let doomed = open_session(addr, 1_000, 1_500);
    let doomed_token = token_of(&acquire(addr, "res", doomed, Some(0)));
    let patient = open_session(addr, 30_000, 0);
    // The waiter keeps its own session alive from another thread while it waits.
    let keepalive_addr = addr.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_keepalive = stop.clone();
    let keeper = std::thread::spawn(move || {
        while !stop_keepalive.load(std::sync::atomic::Ordering::Relaxed) {
            let reply = http::post(
                &keepalive_addr,
                &format!("/v1/sessions/{patient}/keepalive"),
                &json!({}),
            );
            assert_eq!(reply.status, 200, "{}", reply.text);
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    let waiter_addr = addr.clone();
    let waiter = std::thread::spawn(move || {
        let granted = acquire(&waiter_addr, "res", patient, Some(20_000));
        (granted, Instant::now())
    });
    // The last time the doomed session was seen holding the lock, taken before the read that
    // saw it: its grant ended after that. (Review: timing from the open alone let slow calls
    // before the wait hide a missing lock-delay.)
    let mut held_last = started;
    wait_until("the doomed session's grant to end", Duration::from_secs(20), || {
        let asked = Instant::now();
        let lock = http::get(addr, "/v1/locks/res").body;
        if lock["holder"]["session_id"] == json!(doomed) {
            held_last = asked;
            return None;
        }
        Some(())
    });
    let (granted, granted_at) = waiter.join().expect("the waiter");
    let waited = granted_at - started;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    keeper.join().unwrap();
    let token = token_of(&granted);
    assert!(token > doomed_token);
    // TTL (1 s), the expiry grace (0.5 s) and the lock-delay (1.5 s) pass between the doomed
    // session's open and the grant; without the lock-delay it came after 1.5 s.
    assert!(waited >= Duration::from_millis(2_800), "granted after only {waited:?}");
    // And the lock-delay itself between the end of the doomed grant and the next one, less 50 ms
    // for the two clocks' rounding; without it the grant follows within a round trip.
    let delayed = granted_at - held_last;
    assert!(delayed >= Duration::from_millis(1_450), "granted {delayed:?} after the doomed grant");
    let gone = http::post(addr, &format!("/v1/sessions/{doomed}/keepalive"), &json!({}));
    assert_eq!(gone.status, 404);
    assert_eq!(gone.body["code"], "unknown_session");
    let check = http::get(addr, &format!("/v1/check?sequencer=p1.{doomed_token}.res"));
    assert_eq!(check.body, json!({ "status": "superseded", "current_token": token }));
}

/// A waiting acquire whose client disconnects leaves no holder and no waiter behind.
#[test]
fn a_disconnected_waiter_leaves_no_ghost() {
    let (_dir, server) = start();
    let addr = &server.addr;
    let holder = open_session(addr, 10_000, 0);
    let token = token_of(&acquire(addr, "g", holder, Some(0)));
    let waiter = open_session(addr, 10_000, 0);
    {
        use std::io::Write;
        let body = json!({ "name": "g", "session_id": waiter }).to_string();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(
            stream,
            "POST /v1/locks/acquire HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        wait_until("the waiter to queue", Duration::from_secs(5), || {
            (http::get(addr, "/v1/locks/g").body["waiters"] == json!([waiter])).then_some(())
        });
        // The connection closes here, with the acquire still waiting.
    }
    wait_until("the waiter to be cancelled", Duration::from_secs(5), || {
        (http::get(addr, "/v1/locks/g").body["waiters"] == json!([])).then_some(())
    });
    assert_eq!(release(addr, "g", holder, token).status, 200);
    let lock = http::get(addr, "/v1/locks/g");
    assert_eq!(lock.body["holder"], Value::Null, "nobody holds the lock: {}", lock.text);
}

/// SPEC: a waiter can cancel. A waiting acquire cancelled by its session (`POST
/// /v1/locks/cancel`) is answered at once, `wait_ended` with the cause `requested`, nothing
/// applied, and the session is out of the queue: the holder's release leaves the lock free.
#[test]
fn a_waiter_that_cancels_is_answered_at_once_and_leaves_the_queue() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let holder = open_session(&addr, 10_000, 0);
    let token = token_of(&acquire(&addr, "c", holder, Some(0)));
    let waiter = open_session(&addr, 10_000, 0);
    let waiting = {
        let addr = addr.clone();
        std::thread::spawn(move || acquire(&addr, "c", waiter, Some(60_000)))
    };
    wait_until("the waiter to queue", Duration::from_secs(5), || {
        (http::get(&addr, "/v1/locks/c").body["waiters"] == json!([waiter])).then_some(())
    });
    let started = Instant::now();
    let cancelled =
        http::post(&addr, "/v1/locks/cancel", &json!({ "name": "c", "session_id": waiter }));
    assert_eq!(cancelled.status, 200, "{}", cancelled.text);
    let answered = waiting.join().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10), "answered at the cancel, not its wait");
    assert_eq!(answered.status, 409, "{}", answered.text);
    assert_eq!(answered.body["code"], "wait_ended", "{}", answered.text);
    assert_eq!(answered.body["outcome"], "not_applied", "{}", answered.text);
    assert!(answered.body["message"].to_string().contains("(requested)"), "{}", answered.text);
    assert_eq!(http::get(&addr, "/v1/locks/c").body["waiters"], json!([]));
    assert_eq!(release(&addr, "c", holder, token).status, 200);
    let lock = http::get(&addr, "/v1/locks/c");
    assert_eq!(lock.body["holder"], Value::Null, "nobody was granted it: {}", lock.text);
}

/// Issue 14, point 1: two overlapping waiting acquires of one session used to both answer
/// `wait_replaced` while the session stayed queued, and then held the lock with nobody told.
/// Now the second request is refused at once (`already_waiting`), the first keeps waiting and
/// is the one granted, and a retry of the first (same request id) joins its wait.
#[test]
fn two_overlapping_waits_of_one_session_leave_no_ghost_holder() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let holder = open_session(&addr, 10_000, 0);
    let token = token_of(&acquire(&addr, "y", holder, Some(0)));
    let waiter = open_session(&addr, 10_000, 0);
    let first = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            http::post(
                &addr,
                "/v1/locks/acquire",
                &json!({ "name": "y", "session_id": waiter, "request_id": 1 }),
            )
        })
    };
    wait_until("the first request to queue", Duration::from_secs(5), || {
        (http::get(&addr, "/v1/locks/y").body["waiters"] == json!([waiter])).then_some(())
    });
    let second = http::post(
        &addr,
        "/v1/locks/acquire",
        &json!({ "name": "y", "session_id": waiter, "request_id": 2, "wait_ms": 10_000 }),
    );
    assert_eq!(second.status, 409, "{}", second.text);
    assert_eq!(second.body["code"], "already_waiting", "{}", second.text);
    let retry = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            http::post(
                &addr,
                "/v1/locks/acquire",
                &json!({ "name": "y", "session_id": waiter, "request_id": 1 }),
            )
        })
    };
    assert_eq!(release(&addr, "y", holder, token).status, 200);
    let granted = first.join().unwrap();
    let retried = retry.join().unwrap();
    let new_token = token_of(&granted);
    assert_eq!(token_of(&retried), new_token, "the retry hears the same grant");
    let lock = http::get(&addr, "/v1/locks/y");
    assert_eq!(lock.body["holder"]["session_id"], waiter, "{}", lock.text);
    assert_eq!(lock.body["waiters"], json!([]), "{}", lock.text);
    assert_eq!(release(&addr, "y", waiter, new_token).status, 200);
}

/// Issue 14: an attempt that a half-open connection delivers after its own abandon found nothing
/// to undo used to be granted, to a caller that was gone. The abandon is now remembered: the
/// late attempt is refused (`request_abandoned`), the lock stays free, and the caller's retry
/// (the next attempt) is served.
#[test]
fn an_acquire_arriving_after_its_abandon_is_refused_and_leaves_the_lock_free() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let session = open_session(&addr, 10_000, 0);
    let attempt = |attempt: u32| {
        let body = json!({ "name": "h", "session_id": session, "request_id": 7, "attempt": attempt, "wait_ms": 0 });
        http::post(&addr, "/v1/locks/acquire", &body)
    };
    let abandon = http::post(
        &addr,
        "/v1/locks/abandon",
        &json!({ "name": "h", "session_id": session, "request_id": 7, "attempt": 0 }),
    );
    assert_eq!(abandon.status, 200, "an abandon that finds nothing succeeds: {}", abandon.text);
    let late = attempt(0);
    assert_eq!(late.status, 409, "{}", late.text);
    assert_eq!(late.body["code"], "request_abandoned", "{}", late.text);
    assert_eq!(late.body["outcome"], "not_applied", "{}", late.text);
    let lock = http::get(&addr, "/v1/locks/h");
    assert_eq!(lock.body["holder"], Value::Null, "nobody holds the lock: {}", lock.text);
    let retry = attempt(1);
    assert_eq!(retry.status, 200, "{}", retry.text);
    assert_eq!(release(&addr, "h", session, token_of(&retry)).status, 200);
}

/// Issue 14, "a retry gets the same answer": a retry of an acquire whose wait timed out (its
/// answer lost on a broken connection, say) is answered `wait_timed_out` again, instead of
/// waiting a second time; a new request waits.
#[test]
fn a_retry_of_a_timed_out_wait_gets_the_same_answer_not_a_second_wait() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let holder = open_session(&addr, 30_000, 0);
    let held = token_of(&acquire(&addr, "busy", holder, Some(0)));
    let waiter = open_session(&addr, 30_000, 0);
    let attempt = |attempt: u32, request_id: u64| {
        let body = json!({ "name": "busy", "session_id": waiter, "request_id": request_id, "attempt": attempt, "wait_ms": 300 });
        http::post(&addr, "/v1/locks/acquire", &body)
    };
    let first = attempt(0, 5);
    assert_eq!(first.status, 409, "{}", first.text);
    assert_eq!(first.body["code"], "wait_timed_out", "{}", first.text);
    // The retry asks to wait long. Were it waiting (as before), the lock freed meanwhile
    // would go to it: it must be answered at once instead.
    let retry = std::thread::spawn({
        let addr = addr.clone();
        move || {
            let body = json!({ "name": "busy", "session_id": waiter, "request_id": 5, "attempt": 1, "wait_ms": 30_000 });
            http::post(&addr, "/v1/locks/acquire", &body)
        }
    });
    wait_until("the retry to be answered or to wait", Duration::from_secs(10), || {
        let lock = http::get(&addr, "/v1/locks/busy");
        (retry.is_finished() || lock.body["waiters"] != json!([])).then_some(())
    });
    assert_eq!(release(&addr, "busy", holder, held).status, 200);
    let retry = retry.join().expect("the retry's thread");
    assert_eq!(retry.status, 409, "{}", retry.text);
    assert_eq!(retry.body["code"], "wait_timed_out", "{}", retry.text);
    assert_eq!(retry.body["outcome"], "not_applied", "{}", retry.text);
    assert_eq!(retry.body["holder_token"], first.body["holder_token"], "{}", retry.text);
    let fresh = attempt(0, 6);
    assert_eq!(fresh.status, 200, "a new request gets the free lock: {}", fresh.text);
}

/// Issue 14: a caller that gave up on request 1 and asked again as request 2 was answered
/// `already_held` with request 1's grant; request 1's abandon, landing late, released what
/// request 2's caller was told it holds. Now the grant ends only with the last request told of
/// it.
#[test]
fn a_late_abandon_leaves_the_grant_to_the_request_told_it_is_already_held() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let session = open_session(&addr, 10_000, 0);
    let ask = |request_id: u64| {
        let body = json!({ "name": "told", "session_id": session, "request_id": request_id, "wait_ms": 0 });
        http::post(&addr, "/v1/locks/acquire", &body)
    };
    let abandon = |request_id: u64| {
        let body = json!({ "name": "told", "session_id": session, "request_id": request_id });
        http::post(&addr, "/v1/locks/abandon", &body)
    };
    let first = ask(1);
    assert_eq!(first.status, 200, "{}", first.text);
    let second = ask(2);
    assert_eq!(second.body["already_held"], true, "{}", second.text);
    let late = abandon(1);
    assert_eq!(late.status, 200, "{}", late.text);
    assert_eq!(late.body["released_token"], Value::Null, "{}", late.text);
    let lock = http::get(&addr, "/v1/locks/told");
    assert_eq!(lock.body["holder"]["token"], first.body["token"], "still held: {}", lock.text);
    let last = abandon(2);
    assert_eq!(last.body["released_token"], first.body["token"], "{}", last.text);
}

/// Issue 14, point 2: a waiting acquire whose first attempt's caller went away, retried and
/// answered `already_held`, used to lose its grant to the first attempt's abandon (the shell
/// released every grant newer than the wait's start), with cause `released`, which a
/// losses-only watch skips: the retrying client held a guard of a lock the next waiter then
/// got. Now the abandon of an attempt leaves a grant a later attempt was told of, and a grant
/// that an abandon does end is a loss the session's watch shows. The abandon the shell sends
/// when an attempt's caller went away is sent here directly, at the moment the race puts it
/// (after the retry was answered); `no_ghost_holders.rs` drives the shell's own through cut
/// connections.
#[test]
fn point_2_a_retry_told_already_held_keeps_its_grant_and_hears_when_an_abandon_ends_it() {
    let (_dir, server) = start();
    let addr = server.addr.clone();
    let holder = open_session(&addr, 10_000, 0);
    let token = token_of(&acquire(&addr, "p2", holder, Some(0)));
    let waiter = open_session(&addr, 10_000, 0);
    let mut losses =
        http::events(&addr, &format!("/v1/watch?session_id={waiter}&losses_only=true"));
    let attempt = |attempt: u32| json!({ "name": "p2", "session_id": waiter, "request_id": 5, "attempt": attempt });
    let first = {
        let (addr, body) = (addr.clone(), attempt(0));
        std::thread::spawn(move || http::post(&addr, "/v1/locks/acquire", &body))
    };
    wait_until("the first attempt to queue", Duration::from_secs(5), || {
        (http::get(&addr, "/v1/locks/p2").body["waiters"] == json!([waiter])).then_some(())
    });
    assert_eq!(release(&addr, "p2", holder, token).status, 200);
    // The first attempt's answer is lost on its way (its caller went away); the retry hears.
    let granted = token_of(&first.join().unwrap());
    let retry = http::post(&addr, "/v1/locks/acquire", &attempt(1));
    assert_eq!((token_of(&retry), &retry.body["already_held"]), (granted, &json!(true)));
    // The shell abandons the attempt whose caller went away: the retry's grant stays.
    let abandon = |attempt: u32| {
        let body =
            json!({ "name": "p2", "session_id": waiter, "request_id": 5, "attempt": attempt });
        http::post(&addr, "/v1/locks/abandon", &body)
    };
    let late = abandon(0);
    assert_eq!(late.body["released_token"], Value::Null, "{}", late.text);
    let lock = http::get(&addr, "/v1/locks/p2");
    assert_eq!(lock.body["holder"]["token"], granted, "still held: {}", lock.text);
    // The client gives up on the retry after all: that abandon ends the grant, as a loss.
    assert_eq!(abandon(1).body["released_token"], granted);
    let lost = losses.next_json();
    assert_eq!(
        (lost["kind"].as_str(), lost["cause"].as_str(), lost["token"].as_u64()),
        (Some("released"), Some("abandoned"), Some(granted)),
        "{lost}"
    );
}

/// Watching a lock over server-sent events shows its grants and releases as they happen.
#[test]
fn watch_streams_grants_and_releases() {
    let (_dir, server) = start();
    let addr = &server.addr;
    let mut events = http::events(addr, "/v1/watch?prefix=w/");
    let session = open_session(addr, 10_000, 0);
    let token = token_of(&acquire(addr, "w/1", session, Some(0)));
    assert_eq!(release(addr, "w/1", session, token).status, 200);
    let granted = events.next_json();
    assert_eq!(
        (granted["kind"].as_str(), granted["name"].as_str(), granted["token"].as_u64()),
        (Some("granted"), Some("w/1"), Some(token))
    );
    let released = events.next_json();
    assert_eq!(
        (released["kind"].as_str(), released["cause"].as_str()),
        (Some("released"), Some("released"))
    );
}

/// A session's losses-only watch skips what the session asked for and shows what it lost.
#[test]
fn a_losses_only_watch_shows_only_what_the_session_lost() {
    let (_dir, server) = start();
    let addr = &server.addr;
    let session = open_session(addr, 10_000, 0);
    let mut losses =
        http::events(addr, &format!("/v1/watch?session_id={session}&losses_only=true"));
    let first = token_of(&acquire(addr, "l/1", session, Some(0)));
    assert_eq!(release(addr, "l/1", session, first).status, 200);
    let second = token_of(&acquire(addr, "l/2", session, Some(0)));
    let revoked = http::post(addr, &format!("/v1/sessions/{session}/revoke"), &json!({}));
    assert_eq!(revoked.status, 200, "{}", revoked.text);
    let lost = losses.next_json();
    assert_eq!(
        (lost["kind"].as_str(), lost["name"].as_str(), lost["token"].as_u64()),
        (Some("released"), Some("l/2"), Some(second))
    );
    assert_eq!(lost["cause"].as_str(), Some("session_revoked"));
    let ended = losses.next_json();
    assert_eq!(ended["kind"].as_str(), Some("session_ended"));
}

/// Bad input gets a clear error with a stable code, never a crash, and changes nothing.
#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let (_dir, server) = start();
    let addr = &server.addr;
    let session = open_session(addr, 10_000, 0);
    let token = token_of(&acquire(addr, "held", session, Some(0)));
    let before = (
        http::get(addr, "/v1/locks?prefix="),
        http::get(addr, "/v1/sessions"),
        http::get(addr, "/v1/cluster"),
    );

    let cases: Vec<(Reply, u16, &str)> = vec![
        (
            http::request_raw(
                addr,
                "POST",
                "/v1/sessions",
                Some(b"{\"ttl_ms\": "),
                "application/json",
            ),
            400,
            "bad_request",
        ),
        (
            http::request_raw(addr, "POST", "/v1/sessions", Some(b"ttl=5"), "text/plain"),
            400,
            "bad_request",
        ),
        (
            http::post(addr, "/v1/sessions", &json!({ "ttl_ms": 5_000, "extra": true })),
            400,
            "bad_request",
        ),
        (http::post(addr, "/v1/sessions", &json!({ "ttl_ms": 0 })), 400, "ttl_out_of_range"),
        (
            http::post(addr, "/v1/sessions", &json!({ "ttl_ms": 999_999_999_u64 })),
            400,
            "ttl_out_of_range",
        ),
        (http::post(addr, "/v1/sessions", &json!({ "ttl_ms": -5 })), 400, "bad_request"),
        (acquire(addr, "", session, Some(0)), 400, "invalid_name"),
        (acquire(addr, &"x".repeat(300), session, Some(0)), 400, "invalid_name"),
        (acquire(addr, "bad\u{1}name", session, Some(0)), 400, "invalid_name"),
        (acquire(addr, "held", 424_242, Some(0)), 404, "unknown_session"),
        (release(addr, "held", session, token + 100), 409, "token_mismatch"),
        (release(addr, "nothing", session, token), 409, "not_held"),
        (http::post(addr, "/v1/sessions/abc/keepalive", &json!({})), 400, "bad_request"),
        (http::get(addr, "/v1/check?sequencer=garbage"), 400, "bad_request"),
        (http::get(addr, "/v1/locks?limit=many"), 400, "bad_request"),
        (http::get(addr, "/v1/watch"), 400, "bad_request"),
        (http::get(addr, "/v1/watch?name=held&losses_only=true"), 400, "bad_request"),
        (http::get(addr, "/v1/no-such-thing"), 404, "not_found"),
    ];
    for (index, (reply, status, code)) in cases.iter().enumerate() {
        assert_eq!(reply.status, *status, "case {index}: {}", reply.text);
        assert_eq!(reply.body["code"], *code, "case {index}: {}", reply.text);
        assert!(!reply.body["message"].as_str().unwrap_or_default().is_empty(), "case {index}");
    }
    // A body over the limit is refused before it is parsed.
    let huge = format!("{{\"ttl_ms\": 5000, \"pad\": \"{}\"}}", "x".repeat(200_000));
    let too_large =
        http::request_raw(addr, "POST", "/v1/sessions", Some(huge.as_bytes()), "application/json");
    assert_eq!(too_large.status, 413, "{}", too_large.text);

    let after = (
        http::get(addr, "/v1/locks?prefix="),
        http::get(addr, "/v1/sessions"),
        http::get(addr, "/v1/cluster"),
    );
    assert_eq!(before.0.body, after.0.body, "locks changed");
    assert_eq!(before.1.body, after.1.body, "sessions changed");
    assert_eq!(
        before.2.body["applied_revision"], after.2.body["applied_revision"],
        "a refused request advanced the revision"
    );
}

/// `curl -d` labels its body `application/x-www-form-urlencoded`; a JSON body is taken whatever
/// its label, and a body that is not JSON is refused with the reason. Every error says whether
/// the request changed anything.
#[test]
fn json_bodies_are_taken_whatever_their_label_and_errors_say_what_was_applied() {
    let (_dir, server) = start();
    let addr = &server.addr;
    let body = br#"{"ttl_ms": 10000}"#;
    for label in ["application/x-www-form-urlencoded", "text/plain", ""] {
        let opened = http::request_raw(addr, "POST", "/v1/sessions", Some(body), label);
        assert_eq!(opened.status, 200, "labelled {label:?}: {}", opened.text);
    }
    let garbage = http::request_raw(addr, "POST", "/v1/sessions", Some(b"ttl_ms=10000"), "");
    assert_eq!(garbage.status, 400, "{}", garbage.text);
    assert_eq!(garbage.body["code"], "bad_request");
    assert_eq!(garbage.body["outcome"], "not_applied");

    let holder = open_session(addr, 10_000, 0);
    let other = open_session(addr, 10_000, 0);
    assert_eq!(acquire(addr, "outcome", holder, Some(0)).status, 200);
    let busy = acquire(addr, "outcome", other, Some(0));
    assert_eq!(busy.status, 409);
    assert_eq!(
        (&busy.body["code"], &busy.body["outcome"]),
        (&json!("lock_busy"), &json!("not_applied"))
    );
    let unknown = http::post(addr, "/v1/sessions/999999/keepalive", &json!({}));
    assert_eq!(unknown.body["outcome"], "not_applied", "{}", unknown.text);
    // A keepalive takes a reading of its client's clock, and ignores any other parameter, as it
    // did before it took any (review: they were refused with 400 for a while).
    let clocked = format!("/v1/sessions/{holder}/keepalive?clock_id=5&clock_ms=1234.5&trace=abc");
    let kept = http::post(addr, &clocked, &json!({}));
    assert_eq!(kept.status, 200, "{}", kept.text);
    let bad_reading = format!("/v1/sessions/{holder}/keepalive?clock_id=five");
    assert_eq!(http::post(addr, &bad_reading, &json!({})).status, 400);
    // So does an open (issue 21: a new client's first keepalive pairs with it).
    let body = json!({ "ttl_ms": 10_000 });
    let opened = http::post(addr, "/v1/sessions?clock_id=5&clock_ms=1300.5&trace=abc", &body);
    assert_eq!(opened.status, 200, "{}", opened.text);
    assert_eq!(http::post(addr, "/v1/sessions?clock_ms=x", &body).status, 400);
    // The node describes its API.
    let description = http::get(addr, "/v1/openapi.json");
    assert_eq!(description.status, 200);
    assert_eq!(description.body["openapi"], "3.1.0");
    assert!(description.body["paths"]["/v1/locks/acquire"]["post"].is_object());
}

/// A browser's request sent on behalf of another site is refused before it changes anything:
/// the API takes JSON whatever its label, so a web page could otherwise make a visitor's
/// browser post to a node on loopback. Clients that are not browsers send neither header.
#[test]
fn a_browsers_cross_site_request_is_refused() {
    use picket_testkit::http::{As, request_as};
    let (_dir, server) = start();
    let addr = &server.addr;
    let body = json!({ "ttl_ms": 10_000 });
    let with = |headers: &[(&str, String)]| {
        let how = As {
            headers: headers
                .iter()
                .map(|(name, value)| ((*name).to_owned(), value.clone()))
                .collect(),
            ..As::default()
        };
        request_as(addr, &how, "POST", "/v1/sessions", Some(&body)).expect("the node answers")
    };
    for headers in [
        vec![("Origin", "http://evil.example".to_owned())],
        vec![("Origin", "null".to_owned())],
        vec![("Sec-Fetch-Site", "cross-site".to_owned())],
        vec![("Sec-Fetch-Site", "same-site".to_owned())],
    ] {
        let refused = with(&headers);
        assert_eq!(refused.status, 403, "{headers:?}: {}", refused.text);
        assert_eq!(refused.body["code"], "cross_site_request");
    }
    let own_page =
        with(&[("Origin", format!("http://{addr}")), ("Sec-Fetch-Site", "same-origin".to_owned())]);
    assert_eq!(own_page.status, 200, "{}", own_page.text);
    assert_eq!(with(&[]).status, 200, "curl and the clients send neither header");
    let sessions = http::get(addr, "/v1/sessions").body["sessions"].as_array().map(Vec::len);
    assert_eq!(sessions, Some(2), "the refused requests opened nothing");
}
