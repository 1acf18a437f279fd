//! Who a request comes from, and what it may do.
//!
//! Principals are listed in an auth file (TOML, `--auth-file`), reread when it changes. A
//! principal authenticates with a bearer token (the file keeps only its SHA-256) or a client
//! certificate that names it (a DNS or URI subject alternative name). Each principal has roles
//! over lock-name prefixes:
//!
//! - `lock`: open sessions, and acquire, release, cancel and abandon under its prefixes, in its
//!   own sessions; keep alive and close its own sessions. It may read what it may lock.
//! - `read`: a lock's status, lists and watches under its prefixes, checks of sequencers.
//! - `admin`: everything, on every lock and every session, plus revoking sessions and changing
//!   the membership.
//!
//! A session belongs to the principal that opened it (the owner is replicated with the
//! session): no other principal may keep it alive, use it or close it; an admin may revoke it.
//! A cluster member (a connection whose certificate chains to the peer CA) acts as an admin.
//! Without an auth file, anyone who reaches the port may do anything.

pub(crate) mod audit;
mod file;

pub use file::{AuthFile, AuthFileError, hex, new_token, token_digest};

use crate::error::ServiceError;
use crate::node::Ownership;
use crate::tls::Caller;
use std::sync::Arc;

/// Most principals an auth file may list.
pub const MAX_PRINCIPALS: usize = 10_000;

/// Most prefixes per role of one principal.
pub const MAX_PREFIXES_PER_ROLE: usize = 1_000;

/// Where audit lines go: `RUST_LOG=picket::audit=info` keeps them apart.
pub(crate) const AUDIT: &str = "picket::audit";

/// What one role of a principal covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Sessions and grants.
    Lock,
    /// Status, lists, watches, checks.
    Read,
}

/// A principal of the auth file.
#[derive(Debug)]
pub struct Principal {
    /// Its name, recorded as the owner of the sessions it opens.
    pub name: String,
    lock: Vec<String>,
    read: Vec<String>,
    admin: bool,
}

impl Principal {
    /// Whether its `role` covers the lock `name`. `lock` implies `read`.
    #[must_use]
    pub fn covers(&self, role: Role, name: &str) -> bool {
        self.admin || self.prefixes(role).any(|prefix| name.starts_with(prefix))
    }

    /// Whether its `role` covers every lock under `prefix`.
    #[must_use]
    pub fn covers_prefix(&self, role: Role, prefix: &str) -> bool {
        // Every name under `prefix` starts with `prefix`, so it is covered when `prefix`
        // itself lies under one of the role's prefixes.
        self.covers(role, prefix)
    }

    fn prefixes(&self, role: Role) -> impl Iterator<Item = &str> {
        let read = if role == Role::Read { self.read.as_slice() } else { &[] };
        self.lock.iter().chain(read).map(String::as_str)
    }

    fn describe(&self, role: Role) -> String {
        let prefixes: Vec<String> =
            self.prefixes(role).map(|prefix| format!("{prefix:?}")).collect();
        if prefixes.is_empty() { "none".to_owned() } else { prefixes.join(", ") }
    }
}

/// Who a request comes from.
#[derive(Clone, Debug)]
pub enum Access {
    /// The node authenticates no one (no auth file): anyone may use any lock and session. On
    /// a plaintext node (loopback, or a network the operator trusts) anyone may also revoke
    /// sessions and change the membership; over TLS only a cluster member may.
    Anyone {
        /// The connection is TLS.
        tls: bool,
    },
    /// A cluster member, by its certificate: acts as an admin.
    Member,
    /// An authenticated principal, and the credential it proved itself with.
    Principal(Arc<Principal>, Credential),
}

/// What a principal authenticated with, so a long-lived request can check it again after the
/// auth file changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// The SHA-256 of its bearer token.
    Token([u8; 32]),
    /// The name its client certificate carried.
    Certificate(String),
}

impl Access {
    /// The owner recorded on the sessions this caller opens.
    #[must_use]
    pub fn owner(&self) -> Option<&str> {
        match self {
            Self::Principal(principal, _) => Some(&principal.name),
            Self::Anyone { .. } | Self::Member => None,
        }
    }

    /// The principal's name, or what the caller is, for messages and audit lines.
    #[must_use]
    pub fn who(&self) -> &str {
        match self {
            Self::Anyone { .. } => "anyone",
            Self::Member => "a cluster member",
            Self::Principal(principal, _) => &principal.name,
        }
    }

    /// Whether this caller may do anything.
    #[must_use]
    pub fn is_admin(&self) -> bool {
        match self {
            Self::Anyone { .. } | Self::Member => true,
            Self::Principal(principal, _) => principal.admin,
        }
    }

    /// Whether this caller may revoke sessions and change the membership.
    fn may_administer(&self) -> bool {
        match self {
            Self::Anyone { tls } => !tls,
            Self::Member => true,
            Self::Principal(principal, _) => principal.admin,
        }
    }

    /// Refuses unless the caller is an admin.
    ///
    /// # Errors
    /// [`ServiceError::PermissionDenied`].
    pub fn require_admin(&self, action: &str) -> Result<(), ServiceError> {
        if self.may_administer() {
            tracing::info!(target: AUDIT, principal = self.who(), action, "admin action");
            return Ok(());
        }
        if let Self::Anyone { .. } = self {
            return Err(self.denied(format!(
                "{action} needs a cluster member's certificate (--cert and --key of a node): this TLS node has no auth file to name an admin"
            )));
        }
        Err(self.denied(format!("{action} needs the admin role")))
    }

    /// Refuses unless the caller's `role` covers the lock `name`.
    ///
    /// # Errors
    /// [`ServiceError::PermissionDenied`].
    pub fn require(&self, role: Role, name: &str) -> Result<(), ServiceError> {
        match self {
            Self::Principal(principal, _) if !principal.covers(role, name) => {
                Err(self.denied(format!(
                    "its {} role does not cover lock {} (it covers {})",
                    role_name(role),
                    audit::Shown(name),
                    principal.describe(role)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Refuses unless the caller's `role` covers every lock under `prefix`.
    ///
    /// # Errors
    /// [`ServiceError::PermissionDenied`].
    pub fn require_prefix(&self, role: Role, prefix: &str) -> Result<(), ServiceError> {
        match self {
            Self::Principal(principal, _) if !principal.covers_prefix(role, prefix) => {
                Err(self.denied(format!(
                    "its {} role does not cover every lock under {}; ask for a prefix it covers ({})",
                    role_name(role),
                    audit::Shown(prefix),
                    principal.describe(role)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Refuses a caller that may open no session at all.
    ///
    /// # Errors
    /// [`ServiceError::PermissionDenied`].
    pub fn require_some_lock_role(&self) -> Result<(), ServiceError> {
        match self {
            Self::Principal(principal, _) if !principal.admin && principal.lock.is_empty() => {
                Err(self.denied("opening a session needs the lock role on some prefix".into()))
            }
            _ => Ok(()),
        }
    }

    /// The principal a command is sent by, for the state machine to check it owns the session
    /// the command uses: `None` for an admin, a member, or anyone on an open node.
    #[must_use]
    pub fn acting_principal(&self) -> Option<&str> {
        match self {
            Self::Principal(principal, _) if !principal.admin => Some(&principal.name),
            _ => None,
        }
    }

    /// Refuses a session another principal opened (unless the caller is an admin), and, with
    /// `exists_now`, one that does not exist yet: a watch set up on an id no session has yet
    /// would see whoever opens it next. `ownership` says whose the session is for a principal.
    /// A session that ended is left to the operation, which says so itself; the state machine
    /// checks the owner again when it applies a command.
    ///
    /// # Errors
    /// [`ServiceError::PermissionDenied`].
    pub fn require_owner(
        &self,
        session: u64,
        exists_now: bool,
        ownership: impl FnOnce(&str) -> Ownership,
    ) -> Result<(), ServiceError> {
        let Some(name) = self.acting_principal() else { return Ok(()) };
        match ownership(name) {
            Ownership::Foreign => Err(self.denied(format!(
                "session {session} belongs to another principal; only the principal that opened it, or an admin, may use it"
            ))),
            Ownership::NotYet if exists_now => Err(self.denied(format!(
                "session {session} does not exist yet; watch a session once it is open"
            ))),
            Ownership::Owned | Ownership::Ended | Ownership::NotYet => Ok(()),
        }
    }

    fn denied(&self, reason: String) -> ServiceError {
        if let Some(unlogged) = audit::PRINCIPALS.admit(std::time::Instant::now()) {
            tracing::info!(target: AUDIT, principal = self.who(), %reason, unlogged, "refused");
        }
        ServiceError::PermissionDenied(format!("principal {:?}: {reason}", self.who()))
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Lock => "lock",
        Role::Read => "read",
    }
}

/// Who sent a request: a cluster member by its certificate; else, with an auth file, the
/// principal its bearer token (the `authorization` header's value) or client certificate
/// names; else anyone.
///
/// # Errors
/// [`ServiceError::Unauthenticated`] when the node has an auth file and the request proves no
/// principal of it.
pub fn authenticate(
    auth: Option<&AuthFile>,
    caller: Option<&Caller>,
    authorization: Option<&[u8]>,
) -> Result<Access, ServiceError> {
    if caller.is_some_and(|caller| caller.member) {
        return Ok(Access::Member);
    }
    let Some(auth) = auth else {
        return Ok(Access::Anyone { tls: caller.is_some_and(|caller| caller.tls) });
    };
    let table = auth.table();
    let remote = caller.and_then(|caller| caller.remote);
    let refuse = |reason: String| {
        if let Some(unlogged) = audit::UNPROVEN.admit(std::time::Instant::now()) {
            tracing::warn!(target: AUDIT, ?remote, %reason, unlogged, "refused authentication");
        }
        ServiceError::Unauthenticated(reason)
    };
    if let Some(value) = authorization {
        let token = std::str::from_utf8(value)
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| refuse("the authorization header is not `Bearer <token>`".into()))?;
        let digest = token_digest(token);
        return table
            .by_token
            .get(&digest)
            .map(|principal| Access::Principal(principal.clone(), Credential::Token(digest)))
            .ok_or_else(|| {
                refuse(
                    "the bearer token is unknown or was revoked; ask the operator for a valid one"
                        .into(),
                )
            });
    }
    if let Some(certificate) = caller.and_then(|caller| caller.certificate.as_ref()) {
        let names = certificate_names(certificate);
        return names
            .iter()
            .find_map(|name| {
                let principal = table.by_certificate.get(name)?;
                Some(Access::Principal(principal.clone(), Credential::Certificate(name.clone())))
            })
            .ok_or_else(|| {
                refuse(format!(
                    "the client certificate (names {names:?}) belongs to no principal of the auth file; list one of its names under certificate_names"
                ))
            });
    }
    Err(refuse(
        "this node requires credentials: send `authorization: Bearer <token>`, or connect with a client certificate (--cert and --key)".into(),
    ))
}

/// The DNS and URI subject alternative names of a certificate.
fn certificate_names(
    certificate: &tokio_rustls::rustls::pki_types::CertificateDer<'_>,
) -> Vec<String> {
    match webpki::EndEntityCert::try_from(certificate) {
        Ok(parsed) => {
            parsed.valid_dns_names().chain(parsed.valid_uri_names()).map(str::to_owned).collect()
        }
        Err(_) => Vec::new(),
    }
}

#[cfg(test)]
mod tests;
