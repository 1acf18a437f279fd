use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Answers "current" and counts the calls.
struct Counting(Arc<AtomicUsize>);

impl GrantChecker for Counting {
    fn check<'a>(
        &'a self,
        _sequencer: &'a Sequencer,
    ) -> BoxFuture<'a, Result<CheckOutcome, CheckError>> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(CheckOutcome::Current { session: picket_core::SessionId(1) }) })
    }
}

/// No record yet: every token advances.
struct Empty;

impl Records for Empty {
    fn record(&self, _resource: &str) -> Result<Option<FenceRecord>, RecordsError> {
        Ok(None)
    }
}

fn presented(token: u64) -> Presented {
    Presented::new("l", token)
}

/// A write verified and then kept waiting for its resource longer than the verification
/// bound is verified again before it may land: the grant could have been superseded while
/// it waited.
#[tokio::test(start_paused = true)]
async fn a_verification_that_aged_while_waiting_for_the_resource_is_done_again() {
    let calls = Arc::new(AtomicUsize::new(0));
    let checker: Arc<dyn GrantChecker> = Arc::new(Counting(calls.clone()));
    let config = Arc::new(
        FenceConfig::new(|_: &Parts| None, Arc::new(Empty), Some(checker))
            .with_verify_timeout(Duration::from_millis(50)),
    );
    let resources = [("r".to_owned(), Policy::new("l"))];
    let busy = config.hold(&["r".to_owned()]).await;
    let blocker = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(busy);
    });
    let held = verify_then_hold(&config, &resources, &presented(7)).await;
    assert!(held.is_ok());
    assert_eq!(calls.load(Ordering::SeqCst), 2, "verified once, and again after the wait");
    blocker.await.unwrap();
    drop(held);
    // Not kept waiting: one verification is enough.
    assert!(verify_then_hold(&config, &resources, &presented(8)).await.is_ok());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

/// Found in review: the middleware handed handlers keyed writes that said nothing of what they
/// do, so a handler that did not add a digest itself answered a key reused for another write
/// `duplicate`, dropping that write. A keyed write now says at least its method and target;
/// an unkeyed one needs nothing.
#[tokio::test]
async fn a_keyed_write_says_its_method_and_target() {
    use axum::routing::any;
    use tower::ServiceExt as _;
    let config = Arc::new(FenceConfig::new(
        |_: &Parts| Some(("r".to_owned(), Policy::new("l"))),
        Arc::new(Empty),
        None,
    ));
    let digest_of = |context: axum::Extension<FenceContext>| async move {
        let presented = context.0.presented.expect("a stamp");
        presented.request_digest.unwrap_or_else(|| "none".to_owned())
    };
    let app = axum::Router::new()
        .route("/r/{key}", any(digest_of))
        .layer(axum::middleware::from_fn_with_state(config, fence));
    let sequencer = Sequencer::new("l", 7).to_string();
    let send = |method: &str, target: &str, key: Option<&str>| {
        let mut request = axum::http::Request::builder()
            .method(method)
            .uri(target)
            .header(SEQUENCER_HEADER, sequencer.as_str());
        if let Some(key) = key {
            request = request.header(IDEMPOTENCY_HEADER, key);
        }
        let request = request.body(axum::body::Body::empty()).unwrap();
        let app = app.clone();
        async move {
            let answer = app.oneshot(request).await.unwrap();
            assert_eq!(answer.status(), StatusCode::OK);
            let body = axum::body::to_bytes(answer.into_body(), 1024).await.unwrap();
            String::from_utf8(body.to_vec()).unwrap()
        }
    };
    let put_a = send("PUT", "/r/a", Some("k")).await;
    assert_eq!(put_a.len(), 64, "a SHA-256 in hex: {put_a}");
    assert_eq!(send("PUT", "/r/a", Some("k")).await, put_a, "a retry says the same");
    assert_ne!(send("PUT", "/r/b", Some("k")).await, put_a, "another target");
    assert_ne!(send("DELETE", "/r/a", Some("k")).await, put_a, "another method");
    assert_eq!(send("PUT", "/r/a", None).await, "none", "an unkeyed write needs none");
}

/// Found in review: the lock of every resource name ever held was kept for ever, so a resolver
/// naming a resource per key grew the map with every key a client sent. A resource's entry
/// now goes once no request holds or awaits it, a request given up while it waited included.
#[tokio::test]
async fn a_resource_nobody_holds_or_awaits_is_forgotten() {
    let config = Arc::new(FenceConfig::new(|_: &Parts| None, Arc::new(Empty), None));
    let entries = || config.resource_locks.lock().unwrap().len();
    for n in 0..100 {
        drop(config.hold(&[format!("key/{n}")]).await);
    }
    assert_eq!(entries(), 0);

    let held = config.hold(&["r".to_owned()]).await;
    let waiting = {
        let config = config.clone();
        tokio::spawn(async move { drop(config.hold(&["r".to_owned()]).await) })
    };
    while config.resource_locks.lock().unwrap().get("r").map(Arc::strong_count) != Some(3) {
        tokio::task::yield_now().await;
    }
    waiting.abort();
    let _ = waiting.await;
    drop(held);
    assert_eq!(entries(), 0, "neither the holder nor the waiter given up left it");

    // The other way round: the holder leaves first, then the waiter (which took the lock
    // meanwhile, or is given up before it ran again).
    let held = config.hold(&["r".to_owned()]).await;
    let waiting = {
        let config = config.clone();
        tokio::spawn(async move { config.hold(&["r".to_owned()]).await })
    };
    while config.resource_locks.lock().unwrap().get("r").map(Arc::strong_count) != Some(3) {
        tokio::task::yield_now().await;
    }
    drop(held);
    waiting.abort();
    drop(waiting.await);
    assert_eq!(entries(), 0, "the waiter, given up or done, left nothing either");
}
