//! A TCP proxy a test puts between a client and a server, to break the client's connections
//! at a moment the test chooses.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

/// A TCP proxy on a free loopback port in front of `upstream`. [`TcpProxy::cut`] drops every
/// open connection at once (requests in flight break, streams end); while
/// [`TcpProxy::block`]ed, new connections are closed as soon as they are accepted.
#[derive(Debug)]
pub struct TcpProxy {
    /// Where clients connect.
    pub addr: String,
    connections: Arc<Mutex<Vec<AbortHandle>>>,
    blocked: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Starts a proxy to `upstream` on the current tokio runtime.
    ///
    /// # Panics
    /// When no loopback port is free.
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free port");
        let addr = listener.local_addr().expect("an address").to_string();
        let connections: Arc<Mutex<Vec<AbortHandle>>> = Arc::default();
        let blocked = Arc::new(AtomicBool::new(false));
        let accept = tokio::spawn({
            let (connections, blocked) = (connections.clone(), blocked.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if blocked.load(Ordering::SeqCst) {
                        continue;
                    }
                    let upstream = upstream.clone();
                    let forward = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    lock(&connections).push(forward.abort_handle());
                }
            }
        });
        Self { addr, connections, blocked, accept }
    }

    /// Drops every open connection.
    pub fn cut(&self) {
        for connection in lock(&self.connections).drain(..) {
            connection.abort();
        }
    }

    /// Refuses new connections (and drops the open ones) while `blocked`.
    pub fn block(&self, blocked: bool) {
        self.blocked.store(blocked, Ordering::SeqCst);
        if blocked {
            self.cut();
        }
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
