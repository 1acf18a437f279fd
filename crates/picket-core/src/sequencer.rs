//! Sequencers: a token together with its scope, the lock name, as one opaque string.
//!
//! The format is `p1.<token>.<name>`, where the name is percent-encoded so the whole string
//! is printable ASCII without spaces: it fits in an HTTP header or an environment variable
//! unchanged. `p1` versions the format, so signed sequencers can come later as `p2` without
//! misreading old ones. Callers should treat the string as opaque and use [`Sequencer::parse`].

use serde::{Deserialize, Serialize};
use std::fmt;
use thiserror::Error;

/// The longest sequencer string accepted, so a parser never works on unbounded input.
pub const MAX_SEQUENCER_BYTES: usize = 1_024;

const PREFIX: &str = "p1.";

/// A grant's token and the lock it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Sequencer {
    /// The lock.
    pub name: String,
    /// The grant's token. Tokens of different locks cannot be compared.
    pub token: u64,
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
    /// It does not have the shape `p1.<token>.<name>`.
    #[error(
        "not a Picket sequencer (expected p1.<token>.<name>): pass the sequencer string exactly as Picket issued it"
    )]
    Malformed,
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
        Self { name: name.into(), token }
    }

    /// Reads a sequencer back from its string form.
    ///
    /// # Errors
    /// [`SequencerError`] says what is wrong with the string.
    pub fn parse(text: &str) -> Result<Self, SequencerError> {
        if text.len() > MAX_SEQUENCER_BYTES {
            return Err(SequencerError::TooLong { len_bytes: text.len() });
        }
        let rest = text.strip_prefix(PREFIX).ok_or(SequencerError::Malformed)?;
        let (token_text, encoded_name) = rest.split_once('.').ok_or(SequencerError::Malformed)?;
        let token = parse_token(token_text)?;
        let name = percent_decode(encoded_name).ok_or(SequencerError::BadName)?;
        if name.is_empty() {
            return Err(SequencerError::BadName);
        }
        Ok(Self { name, token })
    }
}

impl fmt::Display for Sequencer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}.", self.token)?;
        for byte in self.name.bytes() {
            if is_unreserved(byte) {
                write!(f, "{}", char::from(byte))?;
            } else {
                write!(f, "%{byte:02X}")?;
            }
        }
        Ok(())
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

fn is_unreserved(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~' | b'/')
}

fn percent_decode(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if byte == b'%' {
            let hex = bytes.get(index + 1..index + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            decoded.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else if !byte.is_ascii_control() {
            // Picket writes every other byte percent-encoded, but a sequencer that went through
            // URL query decoding arrives with its escapes already decoded. Taking printable
            // characters as they are keeps such a sequencer valid.
            decoded.push(byte);
            index += 1;
        } else {
            return None;
        }
    }
    String::from_utf8(decoded).ok()
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

    proptest! {
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
