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
