//! Certificates for tests of a TLS cluster, made with rcgen: a peer CA that signs the nodes'
//! certificate, a client CA that signs clients' certificates, and a rogue CA that signs a
//! certificate of each kind nobody trusts.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The certificate.
    pub cert: PathBuf,
    /// Its private key.
    pub key: PathBuf,
}

/// The PEM files of a test PKI, under one directory.
#[derive(Clone, Debug)]
pub struct TestPki {
    /// Signs the nodes' certificates; clients trust it to verify nodes.
    pub peer_ca: PathBuf,
    /// A node certificate for 127.0.0.1 and localhost, for server and client use, signed by
    /// the peer CA (every node of a test cluster presents the same one).
    pub node: Identity,
    /// Signs clients' certificates.
    pub client_ca: PathBuf,
    /// A client certificate named `alice` (its DNS name), signed by the client CA.
    pub client: Identity,
    /// A CA nobody is told to trust.
    pub rogue_ca: PathBuf,
    /// A node-like certificate for 127.0.0.1 signed by the rogue CA.
    pub rogue_node: Identity,
    /// A client CA that the peer CA signed (an intermediate): a misconfiguration a node must
    /// survive, since a chain through it reaches the peer CA.
    pub intermediate_client_ca: PathBuf,
    /// A client certificate signed by that intermediate; its file holds the chain (leaf, then
    /// the intermediate).
    pub intermediate_client: Identity,
}

fn ca_params(name: &str) -> CertificateParams {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    CertifiedIssuer::self_signed(ca_params(name), KeyPair::generate().expect("a key"))
        .expect("a CA")
}

fn leaf(
    dir: &Path,
    file: &str,
    name: &str,
    names: &[&str],
    usages: Vec<ExtendedKeyUsagePurpose>,
    issuer: &CertifiedIssuer<'static, KeyPair>,
) -> Identity {
    let names: Vec<String> = names.iter().map(|name| (*name).to_owned()).collect();
    let mut params = CertificateParams::new(names).expect("leaf parameters");
    params.distinguished_name.push(DnType::CommonName, name);
    params.extended_key_usages = usages;
    let key = KeyPair::generate().expect("a key");
    let certificate = params.signed_by(&key, issuer).expect("a signed certificate");
    let identity = Identity {
        cert: dir.join(format!("{file}.pem")),
        key: dir.join(format!("{file}-key.pem")),
    };
    std::fs::write(&identity.cert, certificate.pem()).expect("write a certificate");
    std::fs::write(&identity.key, key.serialize_pem()).expect("write a key");
    identity
}

fn write_ca(dir: &Path, file: &str, issuer: &CertifiedIssuer<'static, KeyPair>) -> PathBuf {
    let path = dir.join(format!("{file}.pem"));
    std::fs::write(&path, issuer.pem()).expect("write a CA certificate");
    path
}

impl TestPki {
    /// Makes fresh keys and certificates and writes them into `dir`.
    ///
    /// # Panics
    /// When a file cannot be written.
    #[must_use]
    pub fn generate(dir: &Path) -> Self {
        use ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        std::fs::create_dir_all(dir).expect("create the PKI directory");
        let node_names = ["127.0.0.1", "localhost"];
        let peer_ca = ca("picket test peer CA");
        let client_ca = ca("picket test client CA");
        let rogue_ca = ca("picket test rogue CA");
        let intermediate = CertifiedIssuer::signed_by(
            ca_params("picket test intermediate client CA"),
            KeyPair::generate().expect("a key"),
            &peer_ca,
        )
        .expect("an intermediate CA");
        let intermediate_client = leaf(
            dir,
            "intermediate-client",
            "mallory",
            &["mallory"],
            vec![ClientAuth],
            &intermediate,
        );
        let chain = std::fs::read_to_string(&intermediate_client.cert).expect("read the leaf");
        std::fs::write(&intermediate_client.cert, chain + &intermediate.pem())
            .expect("write the chain");
        Self {
            intermediate_client_ca: write_ca(dir, "intermediate-client-ca", &intermediate),
            intermediate_client,
            node: leaf(dir, "node", "node", &node_names, vec![ServerAuth, ClientAuth], &peer_ca),
            client: leaf(dir, "client", "alice", &["alice"], vec![ClientAuth], &client_ca),
            rogue_node: leaf(
                dir,
                "rogue-node",
                "node",
                &node_names,
                vec![ServerAuth, ClientAuth],
                &rogue_ca,
            ),
            peer_ca: write_ca(dir, "peer-ca", &peer_ca),
            client_ca: write_ca(dir, "client-ca", &client_ca),
            rogue_ca: write_ca(dir, "rogue-ca", &rogue_ca),
        }
    }

    /// The `picket serve` arguments for a node of this PKI (`--tls-cert`, `--tls-key`,
    /// `--peer-ca`, `--tls-client-ca`).
    #[must_use]
    pub fn serve_args(&self) -> Vec<String> {
        [
            "--tls-cert",
            &self.node.cert.display().to_string(),
            "--tls-key",
            &self.node.key.display().to_string(),
            "--peer-ca",
            &self.peer_ca.display().to_string(),
            "--tls-client-ca",
            &self.client_ca.display().to_string(),
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .collect()
    }
}

/// A new Ed25519 signing key for sequencers, as PEM files in `dir`: the private key (PKCS#8,
/// for `picket serve --signing-key`) and its public key (for `picket kv serve
/// --sequencer-keys`). Returns (private, public).
///
/// # Panics
/// When a file cannot be written.
#[must_use]
pub fn signing_key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    std::fs::create_dir_all(dir).expect("create the key directory");
    let key = KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("an Ed25519 key");
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    std::fs::write(&private, key.serialize_pem()).expect("write the private key");
    std::fs::write(&public, key.public_key_pem()).expect("write the public key");
    (private, public)
}
