//! TLS on a node's port: its certificate, who may present which client certificate, and
//! reloading both without a restart.
//!
//! One port serves clients and peers (ARCHITECTURE.md, "Peers share the client port"). Every
//! node's certificate is signed by the peer CA (`--peer-ca`) directly, with no intermediate, and it is at once the node's
//! server certificate and its client certificate toward its peers. A connection whose client
//! certificate chains to the peer CA is a cluster member; only such a connection may send Raft
//! messages. Client certificates are signed by another CA (`--tls-client-ca`); the two must not
//! share a certificate, or a client's certificate would pass for a member's.

use picket_proto::tls::{self as files, ClientTls, TlsError};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::reload::WatchedFiles;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, UnixTime};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::server::danger::ClientCertVerifier;

/// The files a node's TLS is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// This node's certificate chain (PEM), signed by the peer CA. It must name the host that
    /// clients and peers use to reach the node, and allow both server and client use.
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// The CA that signs every node's certificate (PEM).
    pub peer_ca: PathBuf,
    /// The CA that signs clients' certificates (PEM), if clients authenticate with one.
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    fn paths(&self) -> Vec<PathBuf> {
        [&self.cert, &self.key, &self.peer_ca].into_iter().chain(&self.client_ca).cloned().collect()
    }
}

/// Who is at the other end of a connection, as its TLS handshake proved.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// The address the connection came from.
    pub remote: Option<std::net::SocketAddr>,
    /// The connection is encrypted.
    pub tls: bool,
    /// Its client certificate chains to the peer CA: a cluster member.
    pub member: bool,
    /// Its client certificate, when it presented one (a member's or a client's).
    pub certificate: Option<CertificateDer<'static>>,
    /// The TLS configuration `member` was judged by ([`ServerTls`] counts its reloads): a
    /// connection outlives a reload, and its membership is judged again by the new files.
    pub judged_by: u64,
}

/// The TLS configuration built from [`TlsFiles`], replaced whole when a file changes. A
/// connection's handshake is judged by the one in force when it was accepted; its membership
/// is judged again by the new one at its first request after a reload
/// ([`ServerTls::judge_again`]), so a member dropped from the peer CA loses its rights on the
/// connections it already has.
pub(crate) struct Loaded {
    server: Arc<rustls::ServerConfig>,
    members: Arc<dyn ClientCertVerifier>,
    /// Which load this is: 0 for the files read at start, one more at every reload.
    generation: u64,
}

/// A node's TLS: the acceptor's configuration, how it tells members from clients, and the
/// client configuration its calls to peers use. Reloaded when its files change.
pub struct ServerTls {
    files: TlsFiles,
    loaded: RwLock<Arc<Loaded>>,
    /// The generation of `loaded`, read without its lock: the wire listener asks before every
    /// frame whether a caller must be judged again, and the answer is nearly always no.
    generation: AtomicU64,
    to_peers: ClientTls,
    watched: WatchedFiles,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("files", &self.files).finish_non_exhaustive()
    }
}

impl Loaded {
    /// The acceptor of this configuration.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.server.clone())
    }

    /// Who presented `chain` (the client certificates of a finished handshake, leaf first). A
    /// member's certificate is signed by the peer CA itself: with no intermediates allowed, a
    /// client CA that some peer CA signed does not make its clients members.
    pub(crate) fn caller(
        &self,
        remote: std::net::SocketAddr,
        chain: Option<&[CertificateDer<'static>]>,
    ) -> Caller {
        let Some(leaf) = chain.and_then(<[_]>::first) else {
            return Caller {
                remote: Some(remote),
                tls: true,
                member: false,
                certificate: None,
                judged_by: self.generation,
            };
        };
        Caller {
            remote: Some(remote),
            tls: true,
            member: self.is_member(leaf),
            certificate: Some(leaf.clone()),
            judged_by: self.generation,
        }
    }

    fn is_member(&self, leaf: &CertificateDer<'_>) -> bool {
        self.members.verify_client_cert(leaf, &[], UnixTime::now()).is_ok()
    }
}

impl ServerTls {
    /// Reads the files.
    ///
    /// # Errors
    /// [`TlsError`] when a file cannot be read, the key does not fit the certificate, or the
    /// client CA shares a certificate with the peer CA.
    pub fn load(files: TlsFiles) -> Result<Self, TlsError> {
        let watched = WatchedFiles::new(files.paths());
        let (loaded, to_peers) = build(&files)?;
        Ok(Self {
            files,
            loaded: RwLock::new(Arc::new(loaded)),
            generation: AtomicU64::new(0),
            to_peers: ClientTls::new(to_peers),
            watched,
        })
    }

    /// The configuration for a connection accepted now.
    pub(crate) fn current(&self) -> Arc<Loaded> {
        self.loaded.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// `caller` as the files in force now judge it: a connection opened before a reload (a peer
    /// CA rotated to drop a member, say) is judged again, once, by the new files.
    pub(crate) fn judge_again(&self, caller: &mut Caller) {
        if caller.judged_by == self.generation.load(Ordering::Acquire) {
            return;
        }
        let loaded = self.current();
        if caller.judged_by == loaded.generation {
            return;
        }
        caller.member = caller.certificate.as_ref().is_some_and(|leaf| loaded.is_member(leaf));
        caller.judged_by = loaded.generation;
    }

    /// The client side for this node's calls to its peers.
    #[must_use]
    pub fn to_peers(&self) -> &ClientTls {
        &self.to_peers
    }

    /// Rereads the files if any changed since the last look; a failure keeps the configuration
    /// in use and says why. Returns whether a new configuration took effect.
    pub fn reload_if_changed(&self) -> bool {
        if !self.watched.changed() {
            return false;
        }
        match build(&self.files) {
            Ok((mut loaded, to_peers)) => {
                let mut current =
                    self.loaded.write().unwrap_or_else(std::sync::PoisonError::into_inner);
                loaded.generation = current.generation + 1;
                self.generation.store(loaded.generation, Ordering::Release);
                *current = Arc::new(loaded);
                drop(current);
                self.to_peers.replace(to_peers);
                tracing::info!(cert = %self.files.cert.display(), "reloaded the TLS files");
                true
            }
            Err(error) => {
                tracing::error!(
                    %error,
                    "the changed TLS files cannot be used; still serving with the previous ones"
                );
                false
            }
        }
    }
}

fn invalid(what: impl Into<String>) -> impl FnOnce(rustls::Error) -> TlsError {
    let what = what.into();
    move |source| TlsError::Invalid { what, source }
}

fn build(files: &TlsFiles) -> Result<(Loaded, rustls::ClientConfig), TlsError> {
    let peer_roots = files::read_roots(&files.peer_ca)?;
    let mut all_roots = peer_roots.clone();
    if let Some(client_ca) = &files.client_ca {
        let client_certificates = files::read_certificates(client_ca)?;
        let peer_certificates = files::read_certificates(&files.peer_ca)?;
        if client_certificates.iter().any(|certificate| peer_certificates.contains(certificate)) {
            return Err(TlsError::Invalid {
                what: format!(
                    "{} and {} share a CA certificate: a client's certificate would pass for a \
                     cluster member's; sign clients' certificates with a CA of their own",
                    client_ca.display(),
                    files.peer_ca.display()
                ),
                source: rustls::Error::General("the client CA is the peer CA".into()),
            });
        }
        for certificate in client_certificates {
            all_roots.add(certificate).map_err(invalid(format!(
                "a certificate in {} cannot be a trusted CA",
                client_ca.display()
            )))?;
        }
    }
    let provider = files::provider();
    let members =
        WebPkiClientVerifier::builder_with_provider(Arc::new(peer_roots), provider.clone())
            .build()
            .map_err(|error| TlsError::Invalid {
                what: format!("the peer CA in {}", files.peer_ca.display()),
                source: rustls::Error::General(error.to_string()),
            })?;
    // Clients may connect without a certificate (they can authenticate with a bearer token, or
    // not at all when the node asks for nothing); whoever presents one must present a valid one.
    let anyone = WebPkiClientVerifier::builder_with_provider(Arc::new(all_roots), provider.clone())
        .allow_unauthenticated()
        .build()
        .map_err(|error| TlsError::Invalid {
            what: "the client and peer CAs".into(),
            source: rustls::Error::General(error.to_string()),
        })?;
    let chain = files::read_certificates(&files.cert)?;
    let key = files::read_private_key(&files.key)?;
    let fits = format!(
        "the key in {} does not fit the certificate in {}",
        files.key.display(),
        files.cert.display()
    );
    let mut server = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(invalid("TLS versions"))?
        .with_client_cert_verifier(anyone)
        .with_single_cert(chain, key)
        .map_err(invalid(fits))?;
    server.alpn_protocols =
        files::ALPN_PROTOCOLS.iter().map(|protocol| protocol.to_vec()).collect();
    let to_peers = files::client_config(&files.peer_ca, Some((&files.cert, &files.key)))?;
    Ok((Loaded { server: Arc::new(server), members, generation: 0 }, to_peers))
}
