//! Hold a lock while doing work, and stop the work if the lock is lost.
//!
//! Start a server (`cargo run --release -p picket -- serve`), then:
//!
//! ```sh
//! cargo run -p picket-client --example hold_lock -- jobs/report
//! ```
//!
//! Run it twice at once: the second waits for the first. Revoke the first one's session
//! (`picket sessions revoke ID`) and watch it stop at once.

use picket_client::{Client, ClientError};
use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), ClientError> {
    let name = std::env::args().nth(1).unwrap_or_else(|| "jobs/report".to_owned());
    let endpoints =
        std::env::var("PICKET_ENDPOINTS").unwrap_or_else(|_| "127.0.0.1:7687".to_owned());
    let client = Client::connect(endpoints.split(',')).await?;
    let session = client.session(Duration::from_secs(10)).await?;
    println!("session {} waiting for {name:?}…", session.id());
    let guard = session.lock(&name).await?;
    println!("holding {name:?} with token {} (sequencer {})", guard.token(), guard.sequencer());
    for step in 1..=5 {
        tokio::select! {
            reason = guard.lost() => {
                println!("lost the lock ({reason:?}): stopping before step {step}");
                return Ok(());
            }
            () = tokio::time::sleep(Duration::from_secs(1)) => {
                // A real job would write here, sending guard.sequencer() with each write so a
                // fenced resource can refuse it once this grant is superseded.
                println!("step {step} done under token {}", guard.token());
            }
        }
    }
    guard.release().await?;
    session.close().await?;
    println!("released");
    Ok(())
}
