//! How the client commands reach the cluster: its endpoints, and TLS when it runs TLS.

use anyhow::Context;
use clap::Args;
use picket_client::{Client, ClientConfig, ClientTls};
use std::path::PathBuf;

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
    #[arg(long, global = true, env = "PICKET_CA")]
    pub ca: Option<PathBuf>,
    /// Present this client certificate (PEM) to the nodes; needs --ca and --key.
    #[arg(long, global = true, env = "PICKET_CERT", requires_all = ["ca", "key"])]
    pub cert: Option<PathBuf>,
    /// The private key (PEM) of --cert.
    #[arg(long, global = true, env = "PICKET_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
}

impl Connect {
    /// Plaintext to `endpoints` (a local cluster the command started itself).
    #[must_use]
    pub fn plaintext(endpoints: Vec<String>) -> Self {
        Self { endpoints, ca: None, cert: None, key: None }
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

    /// Connects to the cluster.
    ///
    /// # Errors
    /// When the TLS files are unusable or no endpoint answers.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        let config = ClientConfig { tls: self.tls()?, ..ClientConfig::default() };
        Ok(Client::connect_with(self.endpoints.clone(), config).await?)
    }
}
