//! Signing sequencers and verifying them with public keys alone (Ed25519, by `ring`).
//!
//! A cluster signs every grant's sequencer with its signing key; a resource holds the cluster's
//! public keys (several at once while a key is rotated, each known by its id) and checks a
//! presented sequencer before anything else, without asking Picket. Both sides are pure: the
//! caller reads the key files and hands their DER bytes in. Ed25519 signing is deterministic,
//! so nodes that hold the same key render the same sequencer for the same grant.

use crate::sequencer::{KEY_ID_HEX_DIGITS, Seal, Sequencer, is_valid_cluster_id};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair as _, UnparsedPublicKey};
use std::collections::BTreeMap;
use thiserror::Error;

/// The DER prefix of an Ed25519 public key in a `SubjectPublicKeyInfo` (RFC 8410).
const ED25519_SPKI_PREFIX: [u8; 12] =
    [0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00];
/// Most public keys a verifier holds at once.
pub const MAX_VERIFYING_KEYS: usize = 64;

/// Why a key cannot be used, or a sequencer does not verify.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SealError {
    /// The private key is not an Ed25519 key in PKCS#8.
    #[error(
        "the signing key is not an Ed25519 private key in PKCS#8 ({0}); make one with `openssl genpkey -algorithm ed25519`"
    )]
    BadSigningKey(String),
    /// A public key is not an Ed25519 `SubjectPublicKeyInfo`.
    #[error(
        "a public key is not an Ed25519 public key (PEM `PUBLIC KEY`); export one with `openssl pkey -in KEY -pubout`"
    )]
    BadPublicKey,
    /// Too many public keys.
    #[error("more than {MAX_VERIFYING_KEYS} public keys; keep only the keys still in use")]
    TooManyKeys,
    /// The cluster id is not one.
    #[error("{0:?} is not a cluster id: use 1 to 64 letters, digits, '-' or '_'")]
    BadClusterId(String),
    /// The sequencer carries no seal, and this verifier takes only sealed ones.
    #[error(
        "the sequencer is not signed, and this resource takes only signed sequencers: the lock service must run with --signing-key"
    )]
    Unsigned,
    /// The sequencer was signed for another cluster.
    #[error("the sequencer was granted by cluster {found:?}, not {expected:?}")]
    WrongCluster {
        /// The cluster this verifier trusts.
        expected: String,
        /// The sequencer's.
        found: String,
    },
    /// The sequencer names a key this verifier does not hold.
    #[error(
        "the sequencer is signed by key {0}, which this resource does not trust: add its public key, or the sequencer is forged"
    )]
    UnknownKey(String),
    /// The sequencer is not spelled as Picket issued it (another spelling of its name).
    #[error(
        "the sequencer is not spelled as the lock service issued it: pass it on exactly as received"
    )]
    Respelled,
    /// The signature does not match the sequencer.
    #[error(
        "the sequencer's signature does not match its lock, token, session and cluster: it was forged or altered"
    )]
    BadSignature,
}

/// Why a sequencer string was refused by [`SequencerKeys::verify_text`].
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// It is not a sequencer.
    #[error(transparent)]
    Malformed(#[from] crate::sequencer::SequencerError),
    /// It is one, and does not verify.
    #[error(transparent)]
    Seal(#[from] SealError),
}

/// The id of a public key: the first 8 bytes of the SHA-256 of its 32 raw bytes, in hex.
#[must_use]
pub fn key_id(public_key: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, public_key);
    let id: String =
        digest.as_ref()[..KEY_ID_HEX_DIGITS / 2].iter().map(|byte| format!("{byte:02x}")).collect();
    id
}

/// A cluster's signing key.
#[derive(Debug)]
pub struct SequencerSigner {
    cluster: String,
    key_id: String,
    pair: Ed25519KeyPair,
}

impl SequencerSigner {
    /// The key in `pkcs8` (the DER of a PEM `PRIVATE KEY`, as `openssl genpkey -algorithm
    /// ed25519` writes it), signing for `cluster`.
    ///
    /// # Errors
    /// [`SealError::BadSigningKey`], [`SealError::BadClusterId`].
    pub fn from_pkcs8(cluster: &str, pkcs8: &[u8]) -> Result<Self, SealError> {
        Self::with_pair(cluster, Ed25519KeyPair::from_pkcs8_maybe_unchecked(pkcs8))
    }

    /// The key whose 32-byte Ed25519 seed is `seed` (tests, and keys kept outside PKCS#8).
    ///
    /// # Errors
    /// [`SealError::BadSigningKey`], [`SealError::BadClusterId`].
    pub fn from_seed(cluster: &str, seed: &[u8; 32]) -> Result<Self, SealError> {
        Self::with_pair(cluster, Ed25519KeyPair::from_seed_unchecked(seed))
    }

    fn with_pair(
        cluster: &str,
        pair: Result<Ed25519KeyPair, ring::error::KeyRejected>,
    ) -> Result<Self, SealError> {
        if !is_valid_cluster_id(cluster) {
            return Err(SealError::BadClusterId(cluster.to_owned()));
        }
        let pair = pair.map_err(|error| SealError::BadSigningKey(error.to_string()))?;
        let key_id = key_id(pair.public_key().as_ref());
        Ok(Self { cluster: cluster.to_owned(), key_id, pair })
    }

    /// Whether `sequencer` carries a valid signature by this very key, for this cluster; `None`
    /// when it is unsigned or signed by another key (an older one during a rotation), which
    /// this signer cannot judge.
    #[must_use]
    pub fn verify_own(&self, sequencer: &Sequencer) -> Option<Result<(), SealError>> {
        let seal = sequencer.seal.as_ref()?;
        if seal.key_id != self.key_id {
            return None;
        }
        if seal.cluster != self.cluster {
            return Some(Err(SealError::WrongCluster {
                expected: self.cluster.clone(),
                found: seal.cluster.clone(),
            }));
        }
        let message = sequencer.signed_message(seal.session, &seal.cluster, &seal.key_id);
        let public_key = UnparsedPublicKey::new(&ED25519, self.pair.public_key().as_ref());
        Some(public_key.verify(&message, &seal.signature).map_err(|_| SealError::BadSignature))
    }

    /// The key's id.
    #[must_use]
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public key as a DER `SubjectPublicKeyInfo` (for a PEM `PUBLIC KEY` file).
    #[must_use]
    pub fn public_key_spki(&self) -> Vec<u8> {
        let mut spki = ED25519_SPKI_PREFIX.to_vec();
        spki.extend_from_slice(self.pair.public_key().as_ref());
        spki
    }

    /// The signed sequencer of the grant of `name` under `token` to `session`.
    #[must_use]
    pub fn seal(&self, name: &str, token: u64, session: u64) -> Sequencer {
        let mut sequencer = Sequencer::new(name, token);
        let message = sequencer.signed_message(session, &self.cluster, &self.key_id);
        let signature = self.pair.sign(&message).as_ref().to_vec();
        sequencer.seal = Some(Seal {
            session,
            cluster: self.cluster.clone(),
            key_id: self.key_id.clone(),
            signature,
        });
        sequencer
    }
}

/// The public keys a resource trusts, by id, and the cluster they sign for.
#[derive(Clone, Debug)]
pub struct SequencerKeys {
    cluster: String,
    keys: BTreeMap<String, Vec<u8>>,
}

impl SequencerKeys {
    /// Trusts the Ed25519 public keys in `spkis` (DER `SubjectPublicKeyInfo`s) for sequencers of
    /// `cluster`.
    ///
    /// # Errors
    /// [`SealError::BadPublicKey`], [`SealError::TooManyKeys`], [`SealError::BadClusterId`].
    pub fn from_spki<'a>(
        cluster: &str,
        spkis: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<Self, SealError> {
        if !is_valid_cluster_id(cluster) {
            return Err(SealError::BadClusterId(cluster.to_owned()));
        }
        let mut keys = BTreeMap::new();
        for spki in spkis {
            let public_key = spki
                .strip_prefix(ED25519_SPKI_PREFIX.as_slice())
                .filter(|key| key.len() == 32)
                .ok_or(SealError::BadPublicKey)?;
            keys.insert(key_id(public_key), public_key.to_vec());
            if keys.len() > MAX_VERIFYING_KEYS {
                return Err(SealError::TooManyKeys);
            }
        }
        if keys.is_empty() {
            return Err(SealError::BadPublicKey);
        }
        Ok(Self { cluster: cluster.to_owned(), keys })
    }

    /// The ids of the keys held.
    pub fn key_ids(&self) -> impl Iterator<Item = &str> {
        self.keys.keys().map(String::as_str)
    }

    /// Parses `text` and verifies it, and refuses any spelling but the one Picket renders: the
    /// same seal under another spelling of the name (a raw byte for an escape, lower-case hex)
    /// would verify too, and fool whatever compares or caches sequencer strings. Use this on a
    /// sequencer as received (a header); [`SequencerKeys::verify`] on one already parsed.
    ///
    /// # Errors
    /// [`SealError::Respelled`], or why the parsed sequencer does not verify.
    pub fn verify_text(&self, text: &str) -> Result<Sequencer, VerifyError> {
        let sequencer = Sequencer::parse(text)?;
        if sequencer.to_string() != text {
            return Err(SealError::Respelled.into());
        }
        self.verify(&sequencer)?;
        Ok(sequencer)
    }

    /// Whether `sequencer` was signed, for its lock, token and session, by one of these keys
    /// for this cluster.
    ///
    /// # Errors
    /// Which check failed.
    pub fn verify(&self, sequencer: &Sequencer) -> Result<(), SealError> {
        let seal = sequencer.seal.as_ref().ok_or(SealError::Unsigned)?;
        if seal.cluster != self.cluster {
            return Err(SealError::WrongCluster {
                expected: self.cluster.clone(),
                found: seal.cluster.clone(),
            });
        }
        let public_key = self
            .keys
            .get(&seal.key_id)
            .ok_or_else(|| SealError::UnknownKey(seal.key_id.clone()))?;
        let message = sequencer.signed_message(seal.session, &seal.cluster, &seal.key_id);
        UnparsedPublicKey::new(&ED25519, public_key)
            .verify(&message, &seal.signature)
            .map_err(|_| SealError::BadSignature)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A fixed test key (a PKCS#8 v1 document as openssl writes it, seed 0..32).
    fn pkcs8(seed: u8) -> Vec<u8> {
        let mut document = vec![
            0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22,
            0x04, 0x20,
        ];
        document.extend((0..32).map(|byte| byte ^ seed));
        document
    }

    fn signer(seed: u8) -> SequencerSigner {
        SequencerSigner::from_pkcs8("prod", &pkcs8(seed)).unwrap()
    }

    fn keys(signers: &[&SequencerSigner]) -> SequencerKeys {
        let spkis: Vec<Vec<u8>> = signers.iter().map(|signer| signer.public_key_spki()).collect();
        SequencerKeys::from_spki("prod", spkis.iter().map(Vec::as_slice)).unwrap()
    }

    #[test]
    fn a_real_sequencer_verifies_through_its_string_form() {
        let signer = signer(1);
        let text = signer.seal("jobs/report", 34, 7).to_string();
        let parsed = Sequencer::parse(&text).unwrap();
        assert_eq!(keys(&[&signer]).verify(&parsed), Ok(()));
    }

    #[test]
    fn forged_and_altered_sequencers_are_refused() {
        let (signer, other) = (signer(1), signer(2));
        let trusted = keys(&[&signer]);
        let real = signer.seal("jobs/report", 34, 7);
        let altered = |change: &dyn Fn(&mut Sequencer)| {
            let mut forged = real.clone();
            change(&mut forged);
            trusted.verify(&forged)
        };
        assert_eq!(altered(&|s| s.token = 35), Err(SealError::BadSignature));
        assert_eq!(altered(&|s| s.token = u64::MAX), Err(SealError::BadSignature));
        assert_eq!(altered(&|s| s.name = "jobs/other".into()), Err(SealError::BadSignature));
        assert_eq!(
            altered(&|s| s.seal.as_mut().unwrap().session = 8),
            Err(SealError::BadSignature)
        );
        assert_eq!(altered(&|s| s.seal = None), Err(SealError::Unsigned));
        assert!(matches!(
            altered(&|s| s.seal.as_mut().unwrap().cluster = "staging".into()),
            Err(SealError::WrongCluster { .. })
        ));
        // Signed by a key the resource does not trust, or claiming a trusted key's id.
        let foreign = other.seal("jobs/report", 34, 7);
        assert!(matches!(trusted.verify(&foreign), Err(SealError::UnknownKey(_))));
        let mut impostor = foreign;
        impostor.seal.as_mut().unwrap().key_id = signer.key_id().to_owned();
        assert_eq!(trusted.verify(&impostor), Err(SealError::BadSignature));
    }

    #[test]
    fn only_the_issued_spelling_verifies_as_text() {
        let signer = signer(1);
        let trusted = keys(&[&signer]);
        let text = signer.seal("jobs/été", 5, 1).to_string();
        assert!(trusted.verify_text(&text).is_ok());
        for other in [
            text.replace("%C3%A9", "%c3%a9"),
            text.replace("%C3%A9", "é"),
            text.replace("jobs/", "jobs%2F"),
        ] {
            assert_eq!(trusted.verify_text(&other), Err(SealError::Respelled.into()), "{other}");
        }
    }

    #[test]
    fn a_signer_judges_only_its_own_signatures() {
        let (signer, other) = (signer(1), signer(2));
        let real = signer.seal("a", 3, 4);
        assert_eq!(signer.verify_own(&real), Some(Ok(())));
        let mut altered = real.clone();
        altered.seal.as_mut().unwrap().session = 5;
        assert_eq!(signer.verify_own(&altered), Some(Err(SealError::BadSignature)));
        assert_eq!(signer.verify_own(&other.seal("a", 3, 4)), None);
        assert_eq!(signer.verify_own(&Sequencer::new("a", 3)), None);
    }

    #[test]
    fn several_keys_verify_during_a_rotation() {
        let (old, new) = (signer(1), signer(2));
        let both = keys(&[&old, &new]);
        assert_eq!(both.verify(&old.seal("a", 1, 1)), Ok(()));
        assert_eq!(both.verify(&new.seal("a", 2, 1)), Ok(()));
        assert_eq!(both.key_ids().count(), 2);
    }

    #[test]
    fn bad_keys_and_cluster_ids_are_refused() {
        assert!(SequencerSigner::from_pkcs8("prod", b"not a key").is_err());
        assert!(SequencerSigner::from_pkcs8("pr.od", &pkcs8(1)).is_err());
        assert_eq!(
            SequencerKeys::from_spki("prod", [b"short".as_slice()]).unwrap_err(),
            SealError::BadPublicKey
        );
        assert_eq!(SequencerKeys::from_spki("prod", []).unwrap_err(), SealError::BadPublicKey);
    }

    proptest! {
        /// Flipping any bit of a real sequencer's string never yields one that verifies.
        #[test]
        fn no_flipped_byte_verifies(token in 1u64.., session in 1u64.., name in "[a-z/]{1,24}", position in any::<prop::sample::Index>(), bit in 0u8..8) {
            let signer = signer(3);
            let trusted = keys(&[&signer]);
            let mut bytes = signer.seal(&name, token, session).to_string().into_bytes();
            let index = position.index(bytes.len());
            bytes[index] ^= 1 << bit;
            if let Ok(text) = String::from_utf8(bytes) {
                prop_assert!(trusted.verify_text(&text).is_err(), "{text} verified");
            }
        }
    }
}
