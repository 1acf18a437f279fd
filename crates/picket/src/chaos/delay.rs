//! Slow links for the harness: a TCP proxy in front of each node's peer port that holds every
//! byte for a delay the nemesis sets.
//!
//! This machine's kernel has no `netem`, so the delay lives in the harness. Each node serves
//! its peers on a port of its own (`--peer-listen`) and advertises the proxy's port instead
//! (`--peer-advertise`), so every connection a peer opens to it (replication, votes, clock
//! readings, handed-over abandons) passes through the proxy, and clients never do. A delay
//! applies to both directions of those connections: a request to the node and its answer each
//! arrive that much later, in order, at the rate they were sent (a latency, not a throttle).
//! Cuts stay with nftables ([`super::network`]), which cut a member's packets to the proxy's
//! port as they cut them to any other.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// Chunks in flight in one direction of one connection before the reader waits for the
/// writer: bounds the proxy's memory per connection.
const CHUNKS_IN_FLIGHT: usize = 1_024;

/// The delay of one node's proxy, and the bytes it held back.
#[derive(Debug, Default)]
pub(super) struct Delay {
    delay_ms: AtomicU64,
    delayed_bytes: AtomicU64,
}

impl Delay {
    /// Sets the delay of every byte read from now on.
    pub(super) fn set(&self, delay: Duration) {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.delay_ms.store(delay_ms, Ordering::Relaxed);
    }

    /// The bytes held back by a delay above zero so far.
    pub(super) fn delayed_bytes(&self) -> u64 {
        self.delayed_bytes.load(Ordering::Relaxed)
    }

    /// When a chunk of `bytes` read now must be written.
    fn due(&self, bytes: usize) -> Instant {
        let delay_ms = self.delay_ms.load(Ordering::Relaxed);
        if delay_ms > 0 {
            self.delayed_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        Instant::now() + Duration::from_millis(delay_ms)
    }
}

/// Binds a proxy on a free loopback port that forwards to `target`; returns its port and its
/// delay. The proxy runs on the current Tokio runtime until it ends.
///
/// # Errors
/// When no port can be bound.
pub(super) fn start_proxy(target: SocketAddr) -> anyhow::Result<(u16, Arc<Delay>)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let listener = TcpListener::from_std(listener)?;
    let port = listener.local_addr()?.port();
    let delay = Arc::new(Delay::default());
    let accepting = delay.clone();
    tokio::spawn(async move {
        loop {
            let Ok((inbound, _)) = listener.accept().await else { continue };
            tokio::spawn(forward(inbound, target, accepting.clone()));
        }
    });
    Ok((port, delay))
}

/// Forwards one connection to `target`, each direction delayed. A target that is down closes
/// the connection at once, as a refused connection would end it.
async fn forward(inbound: TcpStream, target: SocketAddr, delay: Arc<Delay>) {
    let Ok(outbound) = TcpStream::connect(target).await else { return };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    tokio::join!(pump(in_read, out_write, &delay), pump(out_read, in_write, &delay));
}

/// Copies `from` to `to`, each chunk written once its delay has passed; ends (and shuts `to`
/// down) when `from` ends or either side fails.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: &Delay,
) {
    let (sender, mut receiver) = tokio::sync::mpsc::channel::<(Instant, Vec<u8>)>(CHUNKS_IN_FLIGHT);
    let reading = async move {
        let mut buffer = vec![0_u8; 64 * 1024];
        loop {
            match from.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    let chunk = buffer[..read].to_vec();
                    if sender.send((delay.due(read), chunk)).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    let writing = async move {
        while let Some((due, chunk)) = receiver.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reading, writing);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server behind the proxy: a round trip takes two delays while one is set, none
    /// once it is cleared, and bytes arrive whole and in order.
    #[tokio::test]
    async fn a_proxy_delays_both_directions_in_order_and_counts_what_it_held() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let (mut read, mut write) = stream.into_split();
                    let _ = tokio::io::copy(&mut read, &mut write).await;
                });
            }
        });
        let (port, delay) = start_proxy(target).unwrap();
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut round_trip = async |message: &[u8]| {
            let started = Instant::now();
            client.write_all(message).await.unwrap();
            let mut answer = vec![0_u8; message.len()];
            client.read_exact(&mut answer).await.unwrap();
            assert_eq!(answer, message);
            started.elapsed()
        };
        round_trip(b"warm").await;
        assert_eq!(delay.delayed_bytes(), 0);
        delay.set(Duration::from_millis(100));
        let message: Vec<u8> = (0..200_000_u32).map(|byte| (byte % 251) as u8).collect();
        assert!(round_trip(&message).await >= Duration::from_millis(200));
        assert_eq!(delay.delayed_bytes(), 2 * message.len() as u64);
        delay.set(Duration::ZERO);
        round_trip(b"quick").await;
        assert_eq!(delay.delayed_bytes(), 2 * message.len() as u64);
    }
}
