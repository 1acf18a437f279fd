//! TLS for Picket's connections: reading PEM files, and the client side of a connection (the
//! Rust client's calls to a node, a node's calls to its peers).
//!
//! rustls with the `ring` provider, chosen explicitly everywhere a configuration is built, so a
//! process that links another provider never hits rustls's "no process-level provider" panic.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use thiserror::Error;
use tokio_rustls::rustls;
use tokio_rustls::rustls::RootCertStore;
use tokio_rustls::rustls::crypto::CryptoProvider;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// The ALPN protocols Picket speaks: HTTP/2 (gRPC and HTTP/JSON), and HTTP/1.1 for HTTP/JSON.
pub const ALPN_PROTOCOLS: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// Why a TLS file or configuration cannot be used.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file cannot be read, or is not PEM.
    #[error("cannot read {path}: {detail}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// A certificate file holds no certificate.
    #[error("{path} holds no PEM certificate (-----BEGIN CERTIFICATE-----)")]
    NoCertificate {
        /// The file.
        path: PathBuf,
    },
    /// The certificates or key do not make a usable configuration.
    #[error("{what}: {source}")]
    Invalid {
        /// Which part, in words.
        what: String,
        /// rustls's reason.
        source: rustls::Error,
    },
}

/// The one crypto provider Picket uses.
#[must_use]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every certificate in a PEM file, in order (a certificate chain starts with the leaf).
///
/// # Errors
/// [`TlsError::Read`] when the file cannot be read or parsed, [`TlsError::NoCertificate`] when
/// it holds none.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read_error = |detail: String| TlsError::Read { path: path.to_owned(), detail };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| read_error(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| read_error(error.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate { path: path.to_owned() });
    }
    Ok(certificates)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
///
/// # Errors
/// [`TlsError::Read`] when the file cannot be read or holds no private key.
pub fn read_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|error| TlsError::Read {
        path: path.to_owned(),
        detail: format!("{error} (expected a PEM private key)"),
    })
}

/// The DER of every `PUBLIC KEY` (`SubjectPublicKeyInfo`) in a PEM file, such as the public
/// keys of a cluster's sequencer signing keys.
///
/// # Errors
/// [`TlsError::Read`] when the file cannot be read or holds no public key.
pub fn read_public_keys(path: &Path) -> Result<Vec<Vec<u8>>, TlsError> {
    use tokio_rustls::rustls::pki_types::SubjectPublicKeyInfoDer;
    let read_error = |detail: String| TlsError::Read { path: path.to_owned(), detail };
    let keys = SubjectPublicKeyInfoDer::pem_file_iter(path)
        .map_err(|error| read_error(error.to_string()))?
        .map(|key| key.map(|key| key.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| read_error(error.to_string()))?;
    if keys.is_empty() {
        return Err(read_error("it holds no PEM PUBLIC KEY".into()));
    }
    Ok(keys)
}

/// The DER of the PKCS#8 `PRIVATE KEY` in a PEM file (as `openssl genpkey` writes).
///
/// # Errors
/// [`TlsError::Read`] when the file cannot be read or holds no such key.
pub fn read_pkcs8(path: &Path) -> Result<Vec<u8>, TlsError> {
    use tokio_rustls::rustls::pki_types::PrivatePkcs8KeyDer;
    PrivatePkcs8KeyDer::from_pem_file(path).map(|key| key.secret_pkcs8_der().to_vec()).map_err(
        |error| TlsError::Read {
            path: path.to_owned(),
            detail: format!("{error} (expected a PEM PRIVATE KEY in PKCS#8)"),
        },
    )
}

/// The certificates of a PEM file as trust anchors.
///
/// # Errors
/// As [`read_certificates`], and [`TlsError::Invalid`] for a certificate that cannot anchor
/// trust.
pub fn read_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots.add(certificate).map_err(|source| TlsError::Invalid {
            what: format!("a certificate in {} cannot be a trusted CA", path.display()),
            source,
        })?;
    }
    Ok(roots)
}

/// The client side of TLS: whom to trust, and which certificate to present if any. Cheap to
/// clone; clones share the configuration, and [`ClientTls::replace`] changes it for every
/// connection opened afterwards (a node reloads its certificate without restarting).
#[derive(Clone, Debug)]
pub struct ClientTls {
    config: Arc<RwLock<Arc<rustls::ClientConfig>>>,
}

impl ClientTls {
    /// Trusts the CA certificates in `ca` and presents `identity` (certificate chain file,
    /// private key file) when given.
    ///
    /// # Errors
    /// [`TlsError`] when a file cannot be read or the key does not match the certificate.
    pub fn from_files(ca: &Path, identity: Option<(&Path, &Path)>) -> Result<Self, TlsError> {
        Ok(Self::new(client_config(ca, identity)?))
    }

    /// Uses `config` as it is, with Picket's ALPN protocols added.
    #[must_use]
    pub fn new(config: rustls::ClientConfig) -> Self {
        Self { config: Arc::new(RwLock::new(Arc::new(with_alpn(config)))) }
    }

    /// The configuration new connections use.
    #[must_use]
    pub fn current(&self) -> Arc<rustls::ClientConfig> {
        self.config.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Replaces the configuration for connections opened from now on.
    pub fn replace(&self, config: rustls::ClientConfig) {
        *self.config.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Arc::new(with_alpn(config));
    }
}

fn with_alpn(mut config: rustls::ClientConfig) -> rustls::ClientConfig {
    config.alpn_protocols = vec![ALPN_PROTOCOLS[0].to_vec()];
    config
}

/// A client configuration trusting `ca` and presenting `identity` when given.
///
/// # Errors
/// As [`ClientTls::from_files`].
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, TlsError> {
    let roots = read_roots(ca)?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|source| TlsError::Invalid { what: "TLS versions".into(), source })?
        .with_root_certificates(roots);
    match identity {
        None => Ok(builder.with_no_client_auth()),
        Some((certificate, key)) => builder
            .with_client_auth_cert(read_certificates(certificate)?, read_private_key(key)?)
            .map_err(|source| TlsError::Invalid {
                what: format!(
                    "the key in {} does not fit the certificate in {}",
                    key.display(),
                    certificate.display()
                ),
                source,
            }),
    }
}

/// The name a server's certificate must carry for `endpoint` (`host:port`, `[v6]:port`): its
/// host, as an IP address or a DNS name.
///
/// # Errors
/// A sentence when the endpoint has no valid host.
pub fn server_name(endpoint: &str) -> Result<ServerName<'static>, String> {
    let host = endpoint.rsplit_once(':').map_or(endpoint, |(host, _port)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_owned())
        .map_err(|error| format!("{endpoint:?} has no host a certificate can name ({error})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_names_come_from_the_host() {
        assert_eq!(server_name("127.0.0.1:7687").unwrap().to_str(), "127.0.0.1");
        assert_eq!(server_name("[::1]:7687").unwrap().to_str(), "::1");
        assert_eq!(server_name("node-1.example:7687").unwrap().to_str(), "node-1.example");
        assert!(server_name(":7687").is_err());
    }

    #[test]
    fn missing_and_empty_files_say_which_file() {
        let error = read_certificates(Path::new("/nonexistent/ca.pem")).unwrap_err();
        assert!(error.to_string().contains("/nonexistent/ca.pem"), "{error}");
        let dir = std::env::temp_dir().join(format!("picket-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        assert!(matches!(read_certificates(&empty), Err(TlsError::NoCertificate { .. })));
        assert!(read_private_key(&empty).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
