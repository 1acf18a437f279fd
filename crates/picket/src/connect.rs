//! How the client commands reach the cluster: its endpoints, and TLS when it runs TLS.

use anyhow::Context;
use clap::Args;
use picket_client::{Client, ClientConfig, ClientTls, Protocol};
use std::path::PathBuf;
use std::time::Duration;

/// The options every client command shares.
#[derive(Clone, Debug, Args)]
pub struct Connect {
    /// Picket servers to talk to (any member of the cluster), comma-separated HOST:PORT.
    #[arg(
        long,
        global = true,
        env = "PICKET_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7687"
    )]
    pub endpoints: Vec<String>,
    /// Speak TLS to the nodes, trusting the CA certificates in this PEM file (the CA that
    /// signed the nodes' certificates, the servers' --peer-ca).
    // Explicit ids: a subcommand's own argument named `key` (`picket kv put KEY`) must not be
    // mistaken for this one.
    #[arg(long = "ca", id = "connect_ca", value_name = "FILE", global = true, env = "PICKET_CA")]
    pub ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to the nodes; needs --ca and --key.
    #[arg(
        long = "cert",
        id = "connect_cert",
        value_name = "FILE",
        global = true,
        env = "PICKET_CERT",
        requires_all = ["connect_ca", "connect_key"]
    )]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(
        long = "key",
        id = "connect_key",
        value_name = "FILE",
        global = true,
        env = "PICKET_KEY",
        requires = "connect_cert"
    )]
    pub key: Option<PathBuf>,
    /// Authenticate with the bearer token in this file (its first line). The environment
    /// variable PICKET_AUTH_TOKEN may hold the token itself instead.
    #[arg(
        long,
        id = "connect_auth_token_file",
        value_name = "FILE",
        global = true,
        env = "PICKET_AUTH_TOKEN_FILE"
    )]
    pub auth_token_file: Option<PathBuf>,
    /// How calls are framed: `wire` (Picket's own framing of the gRPC calls, cheaper on both
    /// ends; a node of an older build is spoken to in gRPC) or `grpc` (gRPC over HTTP/2, for a
    /// proxy that passes only HTTP).
    #[arg(
        long,
        id = "connect_protocol",
        value_name = "PROTOCOL",
        global = true,
        env = "PICKET_PROTOCOL",
        default_value = "wire"
    )]
    pub protocol: Protocol,
    /// The id of the cluster to talk to (`cluster id` in `picket members`): a node of another
    /// cluster among --endpoints is not used. Without it, the client keeps to the first named
    /// cluster it reaches. (Not `picket serve --cluster-id`, the name signed sequencers carry.)
    #[arg(
        long,
        id = "connect_expect_cluster",
        value_name = "ID",
        global = true,
        env = "PICKET_EXPECT_CLUSTER"
    )]
    pub expect_cluster: Option<String>,
}

impl Connect {
    /// Plaintext to `endpoints` (a local cluster the command started itself).
    #[must_use]
    pub fn plaintext(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            ca: None,
            cert: None,
            key: None,
            auth_token_file: None,
            protocol: Protocol::Wire,
            expect_cluster: None,
        }
    }

    /// TLS as configured, or `None` for plaintext.
    ///
    /// # Errors
    /// When a file cannot be read or the key does not fit the certificate.
    pub fn tls(&self) -> anyhow::Result<Option<ClientTls>> {
        let Some(ca) = &self.ca else { return Ok(None) };
        let identity = self.cert.as_deref().zip(self.key.as_deref());
        Ok(Some(ClientTls::from_files(ca, identity).context("cannot set up TLS")?))
    }

    /// The bearer token: from --auth-token-file, else from PICKET_AUTH_TOKEN.
    ///
    /// # Errors
    /// When the file cannot be read or is empty.
    pub fn bearer_token(&self) -> anyhow::Result<Option<String>> {
        let Some(path) = &self.auth_token_file else {
            return Ok(std::env::var("PICKET_AUTH_TOKEN").ok().filter(|token| !token.is_empty()));
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        let token = text.lines().next().unwrap_or_default().trim();
        anyhow::ensure!(!token.is_empty(), "the token file {} is empty", path.display());
        Ok(Some(token.to_owned()))
    }

    /// Connects to the cluster.
    ///
    /// # Errors
    /// When the TLS or token files are unusable or no endpoint answers.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        self.connect_with(ClientConfig::default()).await
    }

    /// Connects for a session of `ttl`: a single request (a keepalive, a release) gives up
    /// after a third of the TTL (at most the default 5 s), so a node that stopped answering is
    /// left for another while the lease still runs, instead of after it ended.
    ///
    /// # Errors
    /// As [`Connect::connect`].
    pub async fn connect_for_ttl(&self, ttl: Duration) -> anyhow::Result<Client> {
        let defaults = ClientConfig::default();
        let request_timeout = request_timeout_for(ttl, defaults.request_timeout);
        self.connect_with(ClientConfig { request_timeout, ..defaults }).await
    }

    async fn connect_with(&self, config: ClientConfig) -> anyhow::Result<Client> {
        let config = ClientConfig {
            tls: self.tls()?,
            bearer_token: self.bearer_token()?,
            protocol: self.protocol,
            cluster_id: self.expect_cluster.clone(),
            ..config
        };
        Ok(Client::connect_with(self.endpoints.clone(), config).await?)
    }
}

/// A third of `ttl`, between [`MIN_REQUEST_TIMEOUT`] and `default`.
fn request_timeout_for(ttl: Duration, default: Duration) -> Duration {
    (ttl / 3).clamp(MIN_REQUEST_TIMEOUT, default.max(MIN_REQUEST_TIMEOUT))
}

/// The shortest request timeout a TTL scales to: a loaded node answers within it.
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_timeout_follows_the_ttl_within_bounds() {
        let default = Duration::from_secs(5);
        assert_eq!(request_timeout_for(Duration::from_secs(6), default), Duration::from_secs(2));
        assert_eq!(request_timeout_for(Duration::from_secs(60), default), default);
        assert_eq!(request_timeout_for(Duration::from_secs(2), default), MIN_REQUEST_TIMEOUT);
    }
}
