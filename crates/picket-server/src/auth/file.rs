//! The auth file: its TOML format, bearer tokens kept as SHA-256 digests, and the principals
//! indexed by how they authenticate, reread when the file changes.

use super::{AUDIT, Access, Credential, MAX_PREFIXES_PER_ROLE, MAX_PRINCIPALS, Principal};
use crate::error::ServiceError;
use crate::reload::WatchedFiles;
use picket_core::MAX_OWNER_BYTES;
use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

/// The auth file's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileFormat {
    #[serde(default, rename = "principal")]
    principals: Vec<Entry>,
}

/// One `[[principal]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    /// Hex SHA-256 digests of the principal's bearer tokens (several while one is rotated).
    #[serde(default)]
    token_sha256: Vec<String>,
    /// DNS or URI subject alternative names of client certificates that authenticate it.
    #[serde(default)]
    certificate_names: Vec<String>,
    #[serde(default)]
    lock: Vec<String>,
    #[serde(default)]
    read: Vec<String>,
    #[serde(default)]
    admin: bool,
}

/// The principals, indexed by how they authenticate.
#[derive(Debug, Default)]
pub(super) struct Table {
    pub(super) by_token: HashMap<[u8; 32], Arc<Principal>>,
    pub(super) by_certificate: HashMap<String, Arc<Principal>>,
    /// Every principal's name.
    pub(super) names: std::collections::HashSet<String>,
}

/// The SHA-256 of a bearer token.
#[must_use]
pub fn token_digest(token: &str) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    digest.as_ref().try_into().expect("SHA-256 is 32 bytes")
}

/// Lower-case hex.
#[must_use]
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
        let _ = write!(text, "{byte:02x}");
        text
    })
}

/// Bytes of randomness in a token: 256 bits, so guessing one is hopeless.
const TOKEN_BYTES: usize = 32;

/// A new bearer token: `pkt_` and 64 hex digits from the system's random source.
///
/// # Errors
/// When the random source fails.
pub fn new_token() -> std::io::Result<String> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0_u8; TOKEN_BYTES];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| std::io::Error::other("the system's random source failed"))?;
    Ok(format!("pkt_{}", hex(&bytes)))
}

fn parse_digest(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut digest = [0_u8; 32];
    for (index, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[index * 2..index * 2 + 2], 16).ok()?;
    }
    Some(digest)
}

pub(super) fn parse(path: &Path, text: &str) -> Result<Table, String> {
    let file: FileFormat = toml::from_str(text).map_err(|error| error.to_string())?;
    if file.principals.len() > MAX_PRINCIPALS {
        return Err(format!("it lists more than {MAX_PRINCIPALS} principals"));
    }
    let mut table = Table::default();
    let mut names = std::collections::HashSet::new();
    for entry in file.principals {
        let name = entry.name;
        if !(1..=MAX_OWNER_BYTES).contains(&name.len()) || name.chars().any(char::is_control) {
            return Err(format!(
                "principal {name:?}: a name has 1 to {MAX_OWNER_BYTES} bytes and no control characters"
            ));
        }
        if !names.insert(name.clone()) {
            return Err(format!("principal {name:?} is listed twice"));
        }
        if entry.lock.len().max(entry.read.len()) > MAX_PREFIXES_PER_ROLE {
            return Err(format!(
                "principal {name:?} has more than {MAX_PREFIXES_PER_ROLE} prefixes in a role"
            ));
        }
        let principal = Arc::new(Principal {
            name: name.clone(),
            lock: entry.lock,
            read: entry.read,
            admin: entry.admin,
        });
        for digest in &entry.token_sha256 {
            let parsed = parse_digest(digest).ok_or_else(|| {
                format!("principal {name:?}: {digest:?} is not a hex SHA-256 (64 hex digits); make one with `picket auth token`")
            })?;
            if table.by_token.insert(parsed, principal.clone()).is_some() {
                return Err(format!(
                    "principal {name:?}: its token digest {digest} belongs to another principal too"
                ));
            }
        }
        for certificate_name in entry.certificate_names {
            if table.by_certificate.insert(certificate_name.clone(), principal.clone()).is_some() {
                return Err(format!(
                    "principal {name:?}: certificate name {certificate_name:?} belongs to another principal too"
                ));
            }
        }
    }
    tracing::debug!(path = %path.display(), principals = names.len(), "auth file read");
    table.names = names;
    Ok(table)
}

/// The auth file, reread when it changes.
#[derive(Debug)]
pub struct AuthFile {
    path: PathBuf,
    table: RwLock<Arc<Table>>,
    watched: WatchedFiles,
    /// One more at every reload that took effect.
    generation: std::sync::atomic::AtomicU64,
    /// Tells requests that wait (an acquire in a lock's queue) that the file was reloaded, so
    /// they check their caller again.
    reloads: tokio::sync::watch::Sender<u64>,
}

/// Why an auth file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("cannot use the auth file {path}: {reason}")]
pub struct AuthFileError {
    path: PathBuf,
    reason: String,
}

fn read_table(path: &Path) -> Result<Table, AuthFileError> {
    let error = |reason: String| AuthFileError { path: path.to_owned(), reason };
    let text = std::fs::read_to_string(path).map_err(|source| error(source.to_string()))?;
    parse(path, &text).map_err(error)
}

impl AuthFile {
    /// Reads the file.
    ///
    /// # Errors
    /// [`AuthFileError`] when it cannot be read or breaks a rule (each error names the
    /// principal and the rule).
    pub fn load(path: PathBuf) -> Result<Self, AuthFileError> {
        let watched = WatchedFiles::new(vec![path.clone()]);
        let table = read_table(&path)?;
        Ok(Self {
            path,
            table: RwLock::new(Arc::new(table)),
            watched,
            generation: std::sync::atomic::AtomicU64::new(0),
            reloads: tokio::sync::watch::Sender::new(0),
        })
    }

    /// Rereads the file if it changed; a file that cannot be used leaves the principals as they
    /// were and says why.
    pub fn reload_if_changed(&self) -> bool {
        if !self.watched.changed() {
            return false;
        }
        match read_table(&self.path) {
            Ok(table) => {
                *self.table.write().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Arc::new(table);
                let generation =
                    self.generation.fetch_add(1, std::sync::atomic::Ordering::Release) + 1;
                self.reloads.send_replace(generation);
                tracing::info!(target: AUDIT, path = %self.path.display(), "reloaded the auth file");
                true
            }
            Err(error) => {
                tracing::error!(%error, "still using the principals read before");
                false
            }
        }
    }

    /// How many times the file was reread with effect; a long-lived request checks its
    /// caller again when this moved.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Changes at every reload that took effect (its value is the generation).
    #[must_use]
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reloads.subscribe()
    }

    /// The caller as the file now has it: the same credential looked up again, so a revoked
    /// token or a removed principal is refused and changed roles take effect.
    ///
    /// # Errors
    /// [`ServiceError::Unauthenticated`] when the credential is no longer in the file.
    pub fn reauthenticate(&self, access: &Access) -> Result<Access, ServiceError> {
        let Access::Principal(_, credential) = access else { return Ok(access.clone()) };
        let table = self.table();
        let principal = match credential {
            Credential::Token(digest) => table.by_token.get(digest),
            Credential::Certificate(name) => table.by_certificate.get(name),
        };
        principal.map(|principal| Access::Principal(principal.clone(), credential.clone())).ok_or_else(|| {
            tracing::warn!(target: AUDIT, principal = access.who(), "ended a stream: its credentials were revoked");
            ServiceError::Unauthenticated(
                "the credentials this stream was opened with were revoked; authenticate again".into(),
            )
        })
    }

    /// Whether the file, as last read, names principal `name`.
    #[must_use]
    pub fn knows_principal(&self, name: &str) -> bool {
        self.table().names.contains(name)
    }

    pub(super) fn table(&self) -> Arc<Table> {
        self.table.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}
