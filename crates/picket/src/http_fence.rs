//! Fence on acquire over HTTP: a new grant is registered with a fenced resource by `POST URL`
//! carrying its sequencer (`picket kv serve` answers it at `/fence/<prefix>`). Used through the
//! client library's [`Guard::fenced`](picket_client::Guard::fenced) by `picket lock --fence`
//! and by `picket bench --kv`.

use futures_util::future::BoxFuture;
use picket_client::{FenceRegistration, RegistrationError};
use picket_core::Sequencer;
use picket_fence::http::SEQUENCER_HEADER;
use picket_proto::http1;

/// A fenced resource reached over HTTP.
#[derive(Clone, Debug)]
pub struct HttpFence {
    url: String,
}

impl HttpFence {
    /// The resource whose registration endpoint is `url`.
    pub fn new(url: impl Into<String>) -> Self {
        Self { url: url.into() }
    }

    async fn post(&self, sequencer: &Sequencer) -> anyhow::Result<()> {
        let headers = [(SEQUENCER_HEADER, sequencer.to_string())];
        let reply = http1::send(hyper::Method::POST, &self.url, &headers, Vec::new()).await?;
        if !(200..300).contains(&reply.status) {
            anyhow::bail!("refused ({}): {}", reply.status, reply.text());
        }
        Ok(())
    }
}

impl FenceRegistration for HttpFence {
    fn register(&self, sequencer: &Sequencer) -> BoxFuture<'_, Result<(), RegistrationError>> {
        let sequencer = sequencer.clone();
        Box::pin(async move {
            self.post(&sequencer).await.map_err(|error| RegistrationError {
                resource: self.url.clone(),
                cause: error.into(),
            })
        })
    }
}
