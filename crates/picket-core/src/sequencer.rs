//! Sequencers: a token together with its scope, the lock name, as one opaque string.
//!
//! Two versions, told apart by their prefix:
//!
//! - `p1.<token>.<name>`: the token and the lock.
//! - `p2.<token>.<session>.<cluster>.<key id>.<signature>.<name>`: also the session it was
//!   granted to, the cluster that granted it, and an Ed25519 signature by one of the cluster's
//!   keys over all of it ([`Seal`], [`crate::seal`]), so a resource can tell a forged or altered
//!   sequencer from a real one without asking Picket.
//!
//! The name comes last and is percent-encoded, so the whole string is printable ASCII without
//! spaces: it fits in an HTTP header or an environment variable unchanged. Callers should treat
//! the string as opaque and use [`Sequencer::parse`].

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// The longest sequencer string accepted, so a parser never works on unbounded input.
pub const MAX_SEQUENCER_BYTES: usize = 1_024;

const PREFIX: &str = "p1.";
const SEALED_PREFIX: &str = "p2.";

/// The longest cluster id, in bytes.
pub const MAX_CLUSTER_ID_BYTES: usize = 64;
/// Bytes of an Ed25519 signature.
pub const SIGNATURE_BYTES: usize = 64;
/// Hex digits of a key id.
pub const KEY_ID_HEX_DIGITS: usize = 16;

/// A grant's token and the lock it belongs to, and, when the cluster signs its grants, the
/// seal that proves them.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sequencer {
    /// The lock.
    pub name: String,
    /// The grant's token. Tokens of different locks cannot be compared.
    pub token: u64,
    /// The signature of the cluster that granted it, if it signs grants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seal: Option<Seal>,
}

/// What a signed sequencer carries besides its lock and token.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Seal {
    /// The session the grant was made to.
    pub session: u64,
    /// The cluster that made it: letters, digits, `-` and `_`, at most
    /// [`MAX_CLUSTER_ID_BYTES`].
    pub cluster: String,
    /// The signing key's id: the first 8 bytes of the SHA-256 of its public key, in hex.
    pub key_id: String,
    /// Ed25519 over [`Sequencer::signed_message`].
    pub signature: Vec<u8>,
}

/// Whether `cluster` can be a cluster id.
#[must_use]
pub fn is_valid_cluster_id(cluster: &str) -> bool {
    (1..=MAX_CLUSTER_ID_BYTES).contains(&cluster.len())
        && cluster.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_'))
}

/// Why a string is not a sequencer.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum SequencerError {
    /// Too long to be one.
    #[error(
        "the sequencer is {len_bytes} bytes long, over {MAX_SEQUENCER_BYTES}: pass the sequencer string exactly as Picket issued it"
    )]
    TooLong {
        /// Its length.
        len_bytes: usize,
    },
    /// It does not have the shape `p1.<token>.<name>` or
    /// `p2.<token>.<session>.<cluster>.<key id>.<signature>.<name>`.
    #[error(
        "not a Picket sequencer (expected p1.<token>.<name> or p2.<token>.<session>.<cluster>.<key id>.<signature>.<name>): pass the sequencer string exactly as Picket issued it"
    )]
    Malformed,
    /// A signed sequencer's session, cluster, key id or signature is not well formed.
    #[error(
        "the sequencer's seal (session, cluster, key id or signature) is malformed: pass the sequencer string exactly as Picket issued it"
    )]
    BadSeal,
    /// The token is not a positive decimal number.
    #[error(
        "the sequencer's token is not a positive decimal number: pass the sequencer string exactly as Picket issued it"
    )]
    BadToken,
    /// The name is not valid percent-encoded UTF-8.
    #[error(
        "the sequencer's lock name is not valid percent-encoded UTF-8: pass the sequencer string exactly as Picket issued it"
    )]
    BadName,
}

impl Sequencer {
    /// A sequencer for a grant of `name` under `token`.
    #[must_use]
    pub fn new(name: impl Into<String>, token: u64) -> Self {
        Self { name: name.into(), token, seal: None }
    }

    /// The bytes a seal signs: the format's version, the cluster, the key id, the token, the
    /// session and the lock, each field delimited so no two sequencers share a message.
    #[must_use]
    pub fn signed_message(&self, session: u64, cluster: &str, key_id: &str) -> Vec<u8> {
        let mut message = Vec::with_capacity(64 + cluster.len() + self.name.len());
        message.extend_from_slice(b"picket sequencer v2\n");
        for field in [cluster, key_id, &self.token.to_string(), &session.to_string()] {
            message.extend_from_slice(field.as_bytes());
            message.push(b'\n');
        }
        message.extend_from_slice(self.name.as_bytes());
        message
    }

    /// Reads a sequencer back from its string form.
    ///
    /// # Errors
    /// [`SequencerError`] says what is wrong with the string.
    pub fn parse(text: &str) -> Result<Self, SequencerError> {
        if text.len() > MAX_SEQUENCER_BYTES {
            return Err(SequencerError::TooLong { len_bytes: text.len() });
        }
        if let Some(rest) = text.strip_prefix(SEALED_PREFIX) {
            return parse_sealed(rest);
        }
        let rest = text.strip_prefix(PREFIX).ok_or(SequencerError::Malformed)?;
        let (token_text, encoded_name) = rest.split_once('.').ok_or(SequencerError::Malformed)?;
        let token = parse_token(token_text)?;
        Ok(Self { name: parse_name(encoded_name)?, token, seal: None })
    }
}

fn parse_name(encoded: &str) -> Result<String, SequencerError> {
    let name = decode_escaped(encoded).ok_or(SequencerError::BadName)?;
    if name.is_empty() {
        return Err(SequencerError::BadName);
    }
    Ok(name)
}

/// `<token>.<session>.<cluster>.<key id>.<signature>.<name>`, after `p2.`.
fn parse_sealed(rest: &str) -> Result<Sequencer, SequencerError> {
    let fields: Vec<&str> = rest.splitn(6, '.').collect();
    let [token, session, cluster, key_id, signature, name] = fields[..] else {
        return Err(SequencerError::Malformed);
    };
    let token = parse_token(token)?;
    let session = parse_token(session).map_err(|_| SequencerError::BadSeal)?;
    let signature = parse_hex(signature).ok_or(SequencerError::BadSeal)?;
    let name = parse_name(name)?;
    let well_formed = is_valid_cluster_id(cluster)
        && key_id.len() == KEY_ID_HEX_DIGITS
        && key_id.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
        && signature.len() == SIGNATURE_BYTES;
    if !well_formed {
        return Err(SequencerError::BadSeal);
    }
    let seal = Seal { session, cluster: cluster.to_owned(), key_id: key_id.to_owned(), signature };
    Ok(Sequencer { name, token, seal: Some(seal) })
}

/// Lower-case hex only, so every seal has one spelling.
fn parse_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2)
        || !text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f'))
    {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|index| u8::from_str_radix(&text[index..index + 2], 16).ok())
        .collect()
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.seal {
            None => write!(f, "{PREFIX}{}.", self.token)?,
            Some(seal) => {
                write!(
                    f,
                    "{SEALED_PREFIX}{}.{}.{}.{}.",
                    self.token, seal.session, seal.cluster, seal.key_id
                )?;
                for byte in &seal.signature {
                    write!(f, "{byte:02x}")?;
                }
                write!(f, ".")?;
            }
        }
        write!(f, "{}", utf8_percent_encode(&self.name, NAME_ESCAPES))
    }
}

impl std::str::FromStr for Sequencer {
    type Err = SequencerError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::parse(text)
    }
}

fn parse_token(text: &str) -> Result<u64, SequencerError> {
    // Only plain digits: `u64::from_str` would also take a leading `+`, and two spellings of one
    // sequencer would make string comparison of sequencers unreliable.
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) || text.starts_with('0') {
        return Err(SequencerError::BadToken);
    }
    text.parse().map_err(|_| SequencerError::BadToken)
}

/// Every byte but ASCII letters, digits and `-_.~/` is escaped in a sequencer's name, so a
/// sequencer is printable and has one spelling. The same set escapes keys in `picket kv`'s URLs.
pub const NAME_ESCAPES: &AsciiSet =
    &NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~').remove(b'/');

/// Decodes a percent-encoded name strictly: `None` when a `%` does not start two hex digits,
/// when a control byte appears, or when the bytes are not UTF-8. Printable characters that are
/// not escaped are taken as they are.
#[must_use]
pub fn decode_escaped(encoded: &str) -> Option<String> {
    // Checked before decoding because `percent_decode_str` keeps a malformed escape as it is:
    // a `%` must start two hex digits (exactly: a sign is not a digit), and no control byte may
    // appear. Other printable characters are taken as they are: Picket escapes them, but a
    // sequencer that went through URL query decoding arrives with its escapes decoded.
    let bytes = encoded.as_bytes();
    for (index, byte) in bytes.iter().enumerate() {
        if byte.is_ascii_control() {
            return None;
        }
        if *byte == b'%' && !bytes.get(index + 1..index + 3)?.iter().all(u8::is_ascii_hexdigit) {
            return None;
        }
    }
    percent_decode_str(encoded).decode_utf8().ok().map(std::borrow::Cow::into_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn renders_printable_ascii_and_parses_back() {
        let sequencer = Sequencer::new("jobs/été report:1", 34);
        let text = sequencer.to_string();
        assert_eq!(text, "p1.34.jobs/%C3%A9t%C3%A9%20report%3A1");
        assert_eq!(Sequencer::parse(&text), Ok(sequencer));
    }

    #[test]
    fn refuses_malformed_strings() {
        assert_eq!(Sequencer::parse(""), Err(SequencerError::Malformed));
        assert_eq!(Sequencer::parse("p1.12"), Err(SequencerError::Malformed));
        assert_eq!(Sequencer::parse("p2.12.x"), Err(SequencerError::Malformed));
        assert_eq!(Sequencer::parse("p3.12.x"), Err(SequencerError::Malformed));
        assert_eq!(Sequencer::parse("p1.0.x"), Err(SequencerError::BadToken));
        assert_eq!(Sequencer::parse("p1.+5.x"), Err(SequencerError::BadToken));
        assert_eq!(Sequencer::parse("p1.012.x"), Err(SequencerError::BadToken));
        assert_eq!(Sequencer::parse("p1.99999999999999999999.x"), Err(SequencerError::BadToken));
        assert_eq!(Sequencer::parse("p1.5."), Err(SequencerError::BadName));
        assert_eq!(Sequencer::parse("p1.5.a\tb"), Err(SequencerError::BadName));
        // Escapes already decoded (by a URL query parser) are accepted as they are.
        assert_eq!(Sequencer::parse("p1.5.a b"), Ok(Sequencer::new("a b", 5)));
        assert_eq!(Sequencer::parse("p1.5.%ZZ"), Err(SequencerError::BadName));
        assert_eq!(Sequencer::parse("p1.5.%FF"), Err(SequencerError::BadName));
        assert_eq!(Sequencer::parse("p1.5.%4"), Err(SequencerError::BadName));
        let long = format!("p1.5.{}", "a".repeat(MAX_SEQUENCER_BYTES));
        assert!(matches!(Sequencer::parse(&long), Err(SequencerError::TooLong { .. })));
    }

    fn sealed(name: &str, token: u64) -> Sequencer {
        let seal = Seal {
            session: 7,
            cluster: "prod-eu_1".into(),
            key_id: "0123456789abcdef".into(),
            signature: (0..64).collect(),
        };
        Sequencer { name: name.into(), token, seal: Some(seal) }
    }

    #[test]
    fn sealed_sequencers_render_every_field_and_parse_back() {
        let sequencer = sealed("jobs/a.b", 34);
        let text = sequencer.to_string();
        let signature: String = (0..64_u8).map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(text, format!("p2.34.7.prod-eu_1.0123456789abcdef.{signature}.jobs/a.b"));
        assert_eq!(Sequencer::parse(&text), Ok(sequencer));
    }

    #[test]
    fn an_escape_is_two_hex_digits() {
        assert_eq!(Sequencer::parse("p1.5.a%+A"), Err(SequencerError::BadName));
    }

    #[test]
    fn malformed_seals_are_refused() {
        let good = sealed("x", 5).to_string();
        let signature: String = (0..64_u8).map(|byte| format!("{byte:02x}")).collect();
        for bad in [
            format!("p2.5.0.prod.0123456789abcdef.{signature}.x"),
            format!("p2.5.7.pr.od.0123456789abcdef.{signature}.x"),
            format!("p2.5.7.prod.0123456789ABCDEF.{signature}.x"),
            format!("p2.5.7.prod.0123456789abcde.{signature}.x"),
            format!("p2.5.7.prod.0123456789abcdef.{}.x", &signature[2..]),
            format!("p2.5.7.prod.0123456789abcdef.{}.x", signature.to_uppercase()),
            format!("p2.5.7..0123456789abcdef.{signature}.x"),
        ] {
            assert!(Sequencer::parse(&bad).is_err(), "{bad}");
        }
        assert!(Sequencer::parse(&good).is_ok());
    }

    #[test]
    fn signed_messages_differ_in_every_field() {
        let base = Sequencer::new("jobs/a", 5);
        let message = base.signed_message(7, "prod", "0123456789abcdef");
        for other in [
            Sequencer::new("jobs/a", 6).signed_message(7, "prod", "0123456789abcdef"),
            Sequencer::new("jobs/b", 5).signed_message(7, "prod", "0123456789abcdef"),
            base.signed_message(8, "prod", "0123456789abcdef"),
            base.signed_message(7, "prod2", "0123456789abcdef"),
            base.signed_message(7, "prod", "0123456789abcdee"),
        ] {
            assert_ne!(message, other);
        }
    }

    proptest! {
        #[test]
        fn every_sealed_sequencer_round_trips(name in "\\PC{1,64}", token in 1u64.., session in 1u64..) {
            let mut sequencer = sealed(&name, token);
            sequencer.seal.as_mut().unwrap().session = session;
            let text = sequencer.to_string();
            prop_assert!(text.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert_eq!(Sequencer::parse(&text), Ok(sequencer));
        }

        #[test]
        fn every_sequencer_round_trips(name in "\\PC{1,64}", token in 1u64..) {
            let sequencer = Sequencer::new(name, token);
            let text = sequencer.to_string();
            prop_assert!(text.bytes().all(|b| b.is_ascii_graphic()));
            prop_assert_eq!(Sequencer::parse(&text), Ok(sequencer));
        }

        #[test]
        fn parsing_arbitrary_text_never_panics(text in "\\PC{0,80}") {
            let _ = Sequencer::parse(&text);
        }
    }
}
